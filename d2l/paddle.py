"""The book's paddle helpers, generated from its #@save cells by `make lib`.

Use it as `from d2l import paddle as d2l`.
"""
import sys

# Saved code refers to its siblings as d2l.name, as the book's cells do.
d2l = sys.modules[__name__]

#################   WARNING   ################
# The below part is generated automatically through:
#    d2lbook build lib
# Don't edit it directly

import gzip
import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
import warnings
import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

def num_gpus():
    """Count the GPUs this process can see.

    Defined in :numref:`sec_helpers`"""
    return paddle.device.cuda.device_count()

def try_gpu(i=0):
    """Return GPU `i` if it exists, otherwise the CPU.

    Defined in :numref:`sec_helpers`"""
    if i < 0:
        raise ValueError(f'GPU index must be non-negative, got {i}')
    return paddle.CUDAPlace(i) if i < num_gpus() else paddle.CPUPlace()

def try_all_gpus():
    """Return every GPU, or a one-element list holding the CPU if there are none.

    Defined in :numref:`sec_helpers`"""
    return [paddle.CUDAPlace(i) for i in range(num_gpus())] or [
        paddle.CPUPlace()]

class Timer:
    """Record wall-clock intervals between start() and stop()."""
    def __init__(self):
        """Defined in :numref:`sec_helpers`"""
        self.times = []
        self.start()

    def start(self):
        """Begin a new interval."""
        self._began = time.perf_counter()

    def stop(self):
        """End the current interval and return its length in seconds."""
        self.times.append(time.perf_counter() - self._began)
        return self.times[-1]

    def avg(self):
        """Mean interval length."""
        return sum(self.times) / len(self.times) if self.times else 0.0

    def sum(self):
        """Total of all intervals."""
        return sum(self.times)

    def cumsum(self):
        """Running totals, one per interval."""
        return np.cumsum(self.times).tolist()

class Accumulator:
    """Keep running sums of `n` quantities."""
    def __init__(self, n):
        """Defined in :numref:`sec_helpers`"""
        self.data = [0.0] * n

    def add(self, *args):
        """Add one value to each running sum."""
        if len(args) != len(self.data):
            raise ValueError(
                f'expected {len(self.data)} values, got {len(args)}')
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self):
        """Set every sum back to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]

def accuracy(y_hat, y):
    """Count the predictions in `y_hat` (scores or labels) that equal `y`.

    Defined in :numref:`sec_helpers`"""
    if y_hat.ndim > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    return float((y_hat.astype(y.dtype) == y).astype('int64').sum())

def evaluate_accuracy_gpu(net, data_iter, device=None):
    """Fraction of examples in `data_iter` that `net` classifies correctly on one device.

    Defined in :numref:`sec_helpers`"""
    net.eval()
    if device is None:
        device = net.parameters()[0].place
    counts = Accumulator(2)  # correct predictions, examples
    with paddle.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            counts.add(accuracy(net(X), y), y.shape[0])
    return counts[0] / counts[1]

def sgd(params, lr, batch_size):
    """Minibatch SGD on raw tensors, in place; clears the gradients afterwards.

    Defined in :numref:`sec_helpers`"""
    with paddle.no_grad():
        for param in params:
            param.set_value(param - lr * param.grad / batch_size)
            param.clear_gradient()

def use_svg_display():
    """Make Jupyter render matplotlib figures as SVG.

    Defined in :numref:`sec_helpers`"""
    try:
        from matplotlib_inline import backend_inline
        backend_inline.set_matplotlib_formats('svg')
    except ImportError:  # not running under IPython: nothing to configure
        pass

def in_notebook():
    """Whether the code runs inside a Jupyter kernel that can show figures.

    Defined in :numref:`sec_helpers`"""
    shell = sys.modules.get('IPython')
    shell = shell.get_ipython() if shell else None
    return shell is not None and 'IPKernelApp' in shell.config

class Animator:
    """Plot curves that grow one point at a time, redrawn in place in Jupyter."""
    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None,
                 ylim=None, xscale='linear', yscale='linear',
                 fmts=('-', 'm--', 'g-.', 'r:'), figsize=(3.5, 2.5)):
        """Defined in :numref:`sec_helpers`"""
        # A Figure not registered with pyplot is shown only when we ask,
        # so Jupyter does not print it a second time at the end of the cell.
        from matplotlib.figure import Figure
        use_svg_display()
        self.fig = Figure(figsize=figsize)
        self.axes = self.fig.add_subplot()
        self.legend, self.fmts = legend, fmts
        self.style = dict(xlabel=xlabel, ylabel=ylabel, xlim=xlim, ylim=ylim,
                          xscale=xscale, yscale=yscale)
        self.X, self.Y = None, None

    def add(self, x, y):
        """Append one point to each curve (`y` may be a list, one value per curve)."""
        ys = list(y) if hasattr(y, '__len__') else [y]
        xs = list(x) if hasattr(x, '__len__') else [x] * len(ys)
        if self.X is None:
            self.X = [[] for _ in ys]
            self.Y = [[] for _ in ys]
        for i, (a, b) in enumerate(zip(xs, ys)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)
        self.draw()
        if in_notebook():
            from IPython import display
            display.display(self.fig)
            display.clear_output(wait=True)

    def draw(self):
        """Redraw every curve on the axes."""
        self.axes.cla()
        for xs, ys, fmt in zip(self.X or [], self.Y or [], self.fmts):
            self.axes.plot(xs, ys, fmt)
        self.axes.set(**{k: v for k, v in self.style.items() if v is not None})
        if self.legend:
            self.axes.legend(self.legend)
        self.axes.grid(True)

    def savefig(self, path):
        """Write the current figure to `path` (SVG, PNG or PDF by extension)."""
        self.draw()
        self.fig.savefig(path, bbox_inches='tight')

FASHION_MNIST_SHA256 = {  # of the unpacked IDX bytes, so any gzip wrapping verifies
    'train-images-idx3-ubyte':
    'c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888',
    'train-labels-idx1-ubyte':
    'bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9',
    't10k-images-idx3-ubyte':
    '5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b',
    't10k-labels-idx1-ubyte':
    '0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34'}

FASHION_MNIST_MIRROR = 'http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/'

FASHION_MNIST_SYSTEM_DIR = '/usr/share/datasets/fashion-mnist'

class DatasetError(RuntimeError):
    """A dataset file is missing, damaged or cannot be downloaded.

    Defined in :numref:`sec_helpers`"""

def fashion_mnist_dirs():
    """Folders searched for Fashion-MNIST, in order, and the one downloads go to.

    Defined in :numref:`sec_helpers`"""
    env_dir = os.environ.get('D2L_DATA_DIR', '').strip()
    local_dir = os.path.join('..', 'data', 'fashion-mnist')
    search = ([env_dir] if env_dir else []) + [local_dir,
                                               FASHION_MNIST_SYSTEM_DIR]
    return search, env_dir or local_dir

def _unpack_and_check(path, name, raw):
    """Unpack `raw` bytes read from `path` and verify them against the known hash.

    Defined in :numref:`sec_helpers`"""
    expected = FASHION_MNIST_SHA256[name]
    try:
        data = gzip.decompress(raw) if path.endswith('.gz') else raw
    except (OSError, EOFError) as err:  # bad gzip stream or cut-off file
        raise DatasetError(
            f'{path} is not a complete gzip file ({err}). Delete it and run '
            f'again; its unpacked contents should have SHA-256 {expected}.'
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DatasetError(
            f'{path} is corrupt or truncated: its unpacked contents have '
            f'SHA-256 {actual}, expected {expected}. Delete it and run again.')
    return data

def _download_fashion_mnist(name, target_dir):
    """Fetch `name`.gz from the mirror into `target_dir`, verified, written atomically.

    Defined in :numref:`sec_helpers`"""
    url = os.environ.get('D2L_FASHION_MNIST_MIRROR',
                         FASHION_MNIST_MIRROR).rstrip('/') + f'/{name}.gz'
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            raw = response.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, 'reason', err)
        raise DatasetError(
            f'Fashion-MNIST file {name} was not found in any of: '
            f'{", ".join(fashion_mnist_dirs()[0])}; downloading it from {url} '
            f'failed ({reason}). Fix it in one of three ways: (1) set '
            f'D2L_DATA_DIR to a folder holding the four Fashion-MNIST files; '
            f'(2) install the Debian package: sudo apt-get install '
            f'dataset-fashion-mnist; (3) connect to the internet so the files '
            f'can be downloaded into {os.path.abspath(target_dir)}.') from None
    path = os.path.join(target_dir, f'{name}.gz')
    data = _unpack_and_check(url, name, raw)
    os.makedirs(target_dir, exist_ok=True)
    tmp = f'{path}.part-{os.getpid()}'
    with open(tmp, 'wb') as f:
        f.write(raw)
    os.replace(tmp, path)  # readers never see a half-written file
    return data

def read_idx_file(name):
    """Find, verify and parse one Fashion-MNIST IDX file into a NumPy array.

    Defined in :numref:`sec_helpers`"""
    search, target_dir = fashion_mnist_dirs()
    data = None
    for folder in search:
        for path in (os.path.join(folder, name + '.gz'),
                     os.path.join(folder, name)):
            if os.path.isfile(path):
                with open(path, 'rb') as f:
                    data = _unpack_and_check(path, name, f.read())
                break
        if data is not None:
            break
    if data is None:
        data = _download_fashion_mnist(name, target_dir)
    # IDX header: two zero bytes, a type code (8 = uint8), the number of
    # dimensions, then one big-endian 32-bit size per dimension.
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                  for i in range(ndim))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)

QUICK_PER_CLASS = {'train': 30, 'test': 20}

def quick_mode(gpus_found):
    """Whether to serve the small subset: D2L_QUICK if set, else when there is no GPU.

    Defined in :numref:`sec_helpers`"""
    flag = os.environ.get('D2L_QUICK', '').strip()
    if flag not in ('', '0', '1'):
        raise ValueError(f'D2L_QUICK must be 0 (full data) or 1 (quick '
                         f'subset), got {flag!r}')
    return gpus_found == 0 if flag == '' else flag == '1'

def balanced_subset(labels, per_class):
    """Indices of the first `per_class` examples of each class, in file order.

    Defined in :numref:`sec_helpers`"""
    picks = [np.flatnonzero(labels == c)[:per_class]
             for c in np.unique(labels)]
    return np.sort(np.concatenate(picks))

_FASHION_MNIST_CACHE = {}

def fashion_mnist_arrays(split, quick):
    """Images (float32, N x 1 x 28 x 28, in [0, 1]) and labels (int64) of `split`.

    Defined in :numref:`sec_helpers`"""
    if split not in ('train', 'test'):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if split not in _FASHION_MNIST_CACHE:
        prefix = 'train' if split == 'train' else 't10k'
        images = read_idx_file(f'{prefix}-images-idx3-ubyte')
        labels = read_idx_file(f'{prefix}-labels-idx1-ubyte')
        _FASHION_MNIST_CACHE[split] = images, labels
    images, labels = _FASHION_MNIST_CACHE[split]
    if quick:
        keep = balanced_subset(labels, QUICK_PER_CLASS[split])
        images, labels = images[keep], labels[keep]
    images = images.reshape(-1, 1, 28, 28).astype(np.float32) / 255
    return images, labels.astype(np.int64)

def describe_mode(quick, n_train, n_test):
    """One line saying which data the loader serves, and how to change it.

    Defined in :numref:`sec_helpers`"""
    if quick:
        why = ('D2L_QUICK=1' if os.environ.get('D2L_QUICK', '').strip()
               else 'no GPU found')
        return (f'Fashion-MNIST, quick mode ({why}; set D2L_QUICK=0 for the '
                f'full data): {n_train} training and {n_test} test images')
    return (f'Fashion-MNIST, full mode: {n_train} training and {n_test} '
            f'test images')

def check_loader_args(batch_size, resize):
    """Reject a batch size or resize target that cannot work, saying why.

    Defined in :numref:`sec_helpers`"""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or \
            batch_size < 1:
        raise ValueError(
            f'batch_size must be a positive integer, got {batch_size!r}')
    if resize is None:
        return None
    size = (resize, resize) if isinstance(resize, int) else tuple(resize)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ValueError(f'resize must be a positive integer or a (height, '
                         f'width) pair of them, got {resize!r}')
    return size

class ArrayDataset(paddle.io.Dataset):
    """A map-style dataset over equally long NumPy arrays.

    Defined in :numref:`sec_helpers`"""
    def __init__(self, *arrays):
        super().__init__()
        self.arrays = arrays

    def __getitem__(self, idx):
        return tuple(a[idx] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])

def load_data_fashion_mnist(batch_size, resize=None):
    """Fashion-MNIST as (train, test) DataLoaders of (images, labels) minibatches.

    Defined in :numref:`sec_helpers`"""
    size = check_loader_args(batch_size, resize)
    quick = quick_mode(num_gpus())
    loaders, sizes = [], []
    for split in ('train', 'test'):
        images, labels = fashion_mnist_arrays(split, quick)
        sizes.append(len(labels))
        loaders.append(paddle.io.DataLoader(
            ArrayDataset(images, labels), batch_size=batch_size,
            shuffle=(split == 'train'), return_list=True,
            collate_fn=lambda batch: _collate_resized(batch, size)))
    print(describe_mode(quick, *sizes))
    return tuple(loaders)

def _collate_resized(batch, size):
    """Stack (image, label) pairs into a minibatch, resizing images if asked.

    Defined in :numref:`sec_helpers`"""
    X = paddle.to_tensor(np.stack([x for x, _ in batch]))
    y = paddle.to_tensor(np.array([t for _, t in batch]))
    if size is not None:
        X = F.interpolate(X, size=size, mode='bilinear', align_corners=False)
    return X, y

class Residual(nn.Layer):
    """Two 3x3 conv + batch-norm layers with an identity or 1x1-conv shortcut.

    Defined in :numref:`sec_helpers`"""
    def __init__(self, in_channels, out_channels, use_1x1conv=False,
                 stride=1):
        super().__init__()
        self.conv1 = nn.Conv2D(in_channels, out_channels, 3, stride=stride,
                               padding=1)
        self.conv2 = nn.Conv2D(out_channels, out_channels, 3, padding=1)
        self.shortcut = nn.Conv2D(in_channels, out_channels, 1,
                                  stride=stride) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2D(out_channels)
        self.bn2 = nn.BatchNorm2D(out_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.shortcut is not None:
            X = self.shortcut(X)
        return F.relu(Y + X)