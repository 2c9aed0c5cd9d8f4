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
import itertools
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

def try_gpus(num_devices):
    """Devices for `num_devices` model copies: GPUs only, or the CPU if there is none.

    Defined in :numref:`sec_helpers`"""
    _check_num_devices(num_devices)
    g = num_gpus()
    if g == 0:
        return [paddle.CPUPlace() for _ in range(num_devices)]
    # A CPU build of Paddle refuses to construct a CUDAPlace, so build
    # GPU places only when GPUs exist.
    return [paddle.CUDAPlace(i) for i in range(min(g, num_devices))]

def _device_name(device):
    """A short name for `device` and whether it is a GPU.

    Defined in :numref:`sec_helpers`"""
    if isinstance(device, paddle.CUDAPlace) or (
            hasattr(device, 'is_gpu_place') and device.is_gpu_place()):
        return f'gpu:{device.get_device_id()}', True
    return 'cpu', False

def _check_num_devices(num_devices, name='num_devices'):
    """Reject a device count that is not a positive integer, saying so.

    Defined in :numref:`sec_helpers`"""
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) \
            or num_devices < 1:
        raise ValueError(f'{name} must be a positive integer (the number of '
                         f'model copies), got {num_devices!r}')

def describe_devices(devices, num_asked=None):
    """One line saying which devices were chosen and why, for training logs.

    Defined in :numref:`sec_helpers`"""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, '__len__') \
            or len(devices) == 0:
        raise ValueError('devices must be a non-empty list of devices, such '
                         f'as d2l.try_gpus(2), got {devices!r}')
    if num_asked is not None:
        _check_num_devices(num_asked, 'num_asked')
    names, gpu = zip(*[_device_name(d) for d in devices])
    k = len(devices)
    if not any(gpu):
        where = 'no GPU found' if num_gpus() == 0 else 'GPUs not used'
        copies = f'{k} cop{"y" if k == 1 else "ies"} of the model'
        place = 'the CPU' if len(set(names)) == 1 else ', '.join(names)
        return f'{copies} on {place} ({where})'
    found = num_gpus()
    line = f'using {", ".join(names)}'
    if num_asked is not None and num_asked != k:
        return (f'{num_asked} devices asked, {found} GPU'
                f'{"" if found == 1 else "s"} found: {line}')
    return f'{k} GPU{"" if k == 1 else "s"} ({found} found): {line}'

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
        return list(itertools.accumulate(self.times))

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

def _labels_and_predictions(y_hat, y, argmax):
    """`y_hat` as N predicted labels and `y` as N labels, or a ValueError.

    Defined in :numref:`sec_helpers`"""
    y_hat_shape, y_shape = tuple(y_hat.shape), tuple(y.shape)
    if len(y_hat_shape) == 2 and y_hat_shape[1] > 1:
        y_hat = argmax(y_hat)
    elif len(y_hat_shape) == 2 and y_hat_shape[1] == 1:
        y_hat = y_hat.reshape((-1,))
    if len(y_shape) == 2 and y_shape[1] == 1:
        y = y.reshape((-1,))
    if len(y_hat.shape) != 1 or len(y.shape) != 1 or \
            y_hat.shape[0] != y.shape[0]:
        raise ValueError(
            f'accuracy needs y_hat of shape (N, num_classes) or (N,) and y of '
            f'shape (N,) for the same N, got y_hat {y_hat_shape} and y '
            f'{y_shape}')
    return y_hat, y

def accuracy(y_hat, y):
    """Count the predictions in `y_hat` (scores or labels) that equal `y`.

    Defined in :numref:`sec_helpers`"""
    y_hat, y = _labels_and_predictions(y_hat, y, lambda t: t.argmax(axis=1))
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
    # NumPy proper in every framework's module (MXNet's np cannot view bytes).
    import numpy
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                  for i in range(ndim))
    return numpy.frombuffer(data, 'uint8',
                            offset=4 + 4 * ndim).reshape(shape)

QUICK_PER_CLASS = {'train': 10, 'test': 10}

QUICK_MAX_EPOCHS = 2

def quick_mode(gpus_found):
    """Whether to serve the small subset: D2L_QUICK if set, else when there is no GPU.

    Defined in :numref:`sec_helpers`"""
    flag = os.environ.get('D2L_QUICK', '').strip()
    if flag not in ('', '0', '1'):
        raise ValueError(f'D2L_QUICK must be 0 (full data) or 1 (quick '
                         f'subset), got {flag!r}')
    return gpus_found == 0 if flag == '' else flag == '1'

def train_epochs(num_epochs):
    """`num_epochs` in full mode; at most QUICK_MAX_EPOCHS in quick mode.

    Defined in :numref:`sec_helpers`"""
    return num_epochs if not quick_mode(num_gpus()) else min(
        num_epochs, QUICK_MAX_EPOCHS)

def balanced_subset(labels, per_class):
    """Indices of the first `per_class` examples of each class, in file order.

    Defined in :numref:`sec_helpers`"""
    picks = [(labels == c).nonzero()[0][:per_class].tolist()
             for c in sorted(set(labels.tolist()))]
    return sorted(i for pick in picks for i in pick)

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
    images = images.reshape(-1, 1, 28, 28).astype('float32') / 255
    return images, labels.astype('int64')

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

LENET_SHAPES = [  # weights are (outputs, inputs[, height, width]); biases follow
    (6, 1, 5, 5), (6,),      # convolution: 1 -> 6 channels, 5 x 5 kernels
    (16, 6, 5, 5), (16,),    # convolution: 6 -> 16 channels, 5 x 5 kernels
    (120, 400), (120,),      # dense: 16 x 5 x 5 = 400 inputs -> 120 units
    (84, 120), (84,),        # dense: 120 -> 84 units
    (10, 84), (10,)]         # dense: 84 -> 10 class scores

def lenet_init_arrays(seed=0):
    """LeNet's initial values as NumPy arrays: He-scaled normal weights, zero biases.

    Defined in :numref:`sec_multi_gpu`"""
    rng = np.random.default_rng(seed)
    arrays = []
    for shape in LENET_SHAPES:
        if len(shape) == 1:
            arrays.append(np.zeros(shape, np.float32))
        else:
            fan_in = int(np.prod(shape[1:]))
            weights = rng.standard_normal(shape) * np.sqrt(2 / fan_in)
            arrays.append(weights.astype(np.float32))
    return arrays

def lenet_params(seed=0):
    """LeNet's initial parameters as a list of CPU tensors (same values in every framework).

    Defined in :numref:`sec_multi_gpu`"""
    return [paddle.to_tensor(a, place=paddle.CPUPlace())
            for a in lenet_init_arrays(seed)]

def lenet(X, params):
    """LeNet-style convnet on raw parameters: two conv/pool stages, three dense layers.

    Defined in :numref:`sec_multi_gpu`"""
    W1, b1, W2, b2, W3, b3, W4, b4, W5, b5 = params
    H = F.max_pool2d(F.relu(F.conv2d(X, W1, b1, padding=2)), 2)  # 6 x 14 x 14
    H = F.max_pool2d(F.relu(F.conv2d(H, W2, b2)), 2)             # 16 x 5 x 5
    H = H.reshape([H.shape[0], -1])
    H = F.relu(paddle.matmul(H, W3, transpose_y=True) + b3)
    H = F.relu(paddle.matmul(H, W4, transpose_y=True) + b4)
    return paddle.matmul(H, W5, transpose_y=True) + b5

def cross_entropy_sum(y_hat, y):
    """Cross-entropy of class scores `y_hat` against integer labels, summed over examples.

    Defined in :numref:`sec_multi_gpu`"""
    log_probs = F.log_softmax(y_hat, axis=1)
    return -paddle.take_along_axis(log_probs, y.reshape([-1, 1]), axis=1).sum()

def get_params(params, device):
    """Copy `params` to `device` as new tensors that record their gradients.

    Defined in :numref:`sec_multi_gpu`"""
    # clone() first: to() hands back the tensor itself when it is already on
    # `device`, and two replicas on one device must not share memory.
    copies = [p.detach().clone().to(device) for p in params]
    for p in copies:
        p.stop_gradient = False
    return copies

def allreduce(data):
    """Sum same-shaped tensors held on different devices, writing the sum into each.

    Defined in :numref:`sec_multi_gpu`"""
    first, rest = data[0], data[1:]
    with paddle.no_grad():  # Paddle refuses in-place writes to recorded tensors
        for x in rest:  # reduce: add every array into the first one
            with paddle.device.device_guard(first.place):
                first[:] += x.to(first.place)
        for x in rest:  # broadcast: copy the sum into every other array
            with paddle.device.device_guard(x.place):
                x[:] = first.to(x.place)

def shard_sizes(n, k):
    """Sizes of `k` nearly equal parts of `n` items; the first `n % k` get one more.

    Defined in :numref:`sec_multi_gpu`"""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]

def check_split(num_examples, num_labels, num_devices):
    """Raise ValueError, saying what to change, if a batch cannot be split over the devices.

    Defined in :numref:`sec_multi_gpu`"""
    if num_examples != num_labels:
        raise ValueError(f'X holds {num_examples} examples but y holds '
                         f'{num_labels} labels; pass one label per example')
    if num_devices < 1:
        raise ValueError('devices is empty; pass at least one device, e.g. '
                         '[d2l.try_gpu()]')
    if num_examples < num_devices:
        raise ValueError(f'cannot split {num_examples} examples over '
                         f'{num_devices} devices, each needs at least one; '
                         f'use a batch of at least {num_devices} examples '
                         f'or fewer devices')

def split_batch(X, y, devices):
    """Split examples `X` and labels `y` into one shard per device, placed there.

    Defined in :numref:`sec_multi_gpu`"""
    check_split(X.shape[0], y.shape[0], len(devices))
    X_shards, y_shards, start = [], [], 0
    for size, device in zip(shard_sizes(X.shape[0], len(devices)), devices):
        X_shards.append(X[start:start + size].to(device))
        y_shards.append(y[start:start + size].to(device))
        start += size
    return X_shards, y_shards

def train_batch(X, y, device_params, devices, lr, allreduce_fn=allreduce):
    """One data-parallel SGD step of LeNet: split, backward per device, sum, update.

    Defined in :numref:`sec_multi_gpu`"""
    X_shards, y_shards = split_batch(X, y, devices)
    for X_s, y_s, W, device in zip(X_shards, y_shards, device_params, devices):
        with paddle.device.device_guard(device):  # run this replica's work there
            cross_entropy_sum(lenet(X_s, W), y_s).backward()
    for i in range(len(device_params[0])):
        allreduce_fn([W[i].grad for W in device_params])
    for W, device in zip(device_params, devices):  # equal gradients, equal steps
        with paddle.device.device_guard(device):
            d2l.sgd(W, lr, X.shape[0])

def evaluate_accuracy_replicas(device_params, data_iter, devices):
    """LeNet's accuracy on `data_iter`, each minibatch split over the replicas' devices.

    Defined in :numref:`sec_multi_gpu`"""
    counts = d2l.Accumulator(2)  # correct predictions, examples
    with paddle.no_grad():
        for X, y in data_iter:
            used = devices[:min(len(devices), X.shape[0])]  # short last batch
            X_shards, y_shards = split_batch(X, y, used)
            # Launch every device's forward pass before reading any result.
            y_hats = []
            for X_s, W, device in zip(X_shards, device_params, used):
                with paddle.device.device_guard(device):
                    y_hats.append(lenet(X_s, W))
            for y_hat, y_s, device in zip(y_hats, y_shards, used):
                with paddle.device.device_guard(device):
                    counts.add(d2l.accuracy(y_hat, y_s), y_s.shape[0])
    return counts[0] / counts[1]

def ring_allreduce(data):
    """Sum same-shaped tensors on k devices by ring reduce-scatter and all-gather, in place.

    Defined in :numref:`sec_multi_gpu`"""
    k = len(data)
    bounds = np.cumsum([0] + shard_sizes(data[0].size, k)).tolist()
    places = [x.place for x in data]
    with paddle.no_grad():
        # chunks[i][c] is a view of chunk c of the tensor on device i.
        chunks = []
        for x, place in zip(data, places):
            with paddle.device.device_guard(place):
                flat = x.reshape([-1])
                chunks.append([flat[bounds[c]:bounds[c + 1]] for c in range(k)])
        for step in range(k - 1):  # reduce-scatter: add what arrives
            for i in range(k):
                c, j = (i - step) % k, (i + 1) % k
                with paddle.device.device_guard(places[j]):
                    chunks[j][c][:] += chunks[i][c].to(places[j])
        # Device i now holds the complete sum of chunk (i + 1) % k.
        for step in range(k - 1):  # all-gather: overwrite with what arrives
            for i in range(k):
                c, j = (i + 1 - step) % k, (i + 1) % k
                with paddle.device.device_guard(places[j]):
                    chunks[j][c][:] = chunks[i][c].to(places[j])

import copy
import os
import tempfile
import numpy as np

def check_resnet_args(num_classes, in_channels):
    """Reject a class or channel count that is not a positive integer, saying which.

    Defined in :numref:`sec_multi_gpu_concise`"""
    for name, value in (('num_classes', num_classes),
                        ('in_channels', in_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f'{name} must be a positive integer, got {value!r}')

def init_uniform_fan_in(net):
    """Draw each conv/linear weight and bias from U(-b, b), b = 1/sqrt(fan_in), as PyTorch does.

    Defined in :numref:`sec_multi_gpu_concise`"""
    for layer in net.sublayers():
        if isinstance(layer, nn.Conv2D):  # weight: out, in, height, width
            fan_in = int(np.prod(layer.weight.shape[1:]))
        elif isinstance(layer, nn.Linear):  # weight: in, out
            fan_in = layer.weight.shape[0]
        else:
            continue
        bound = fan_in ** -0.5
        for param in (layer.weight, layer.bias):
            param.set_value(paddle.uniform(param.shape, min=-bound, max=bound))

def resnet18(num_classes, in_channels=1):
    """ResNet-18 for small images: 3x3 stem, no max-pooling, four stages of two residual blocks.

    Defined in :numref:`sec_multi_gpu_concise`"""
    d2l.check_resnet_args(num_classes, in_channels)
    # Stem for small images: one 3x3 convolution of stride 1, and no pooling.
    layers = [nn.Conv2D(in_channels, 64, kernel_size=3, padding=1),
              nn.BatchNorm2D(64), nn.ReLU()]
    for in_c, out_c, downsample in [(64, 64, False), (64, 128, True),
                                    (128, 256, True), (256, 512, True)]:
        # A stage's first block halves the resolution, widens the channels.
        layers.append(nn.Sequential(
            d2l.Residual(in_c, out_c, use_1x1conv=downsample,
                         stride=2 if downsample else 1),
            d2l.Residual(out_c, out_c)))
    layers += [nn.AdaptiveAvgPool2D((1, 1)), nn.Flatten(),
               nn.Linear(512, num_classes)]
    net = nn.Sequential(*layers)
    d2l.init_uniform_fan_in(net)
    return net

def count_trainable_params(net):
    """Number of values in `net` that receive gradients (batch-norm statistics excluded).

    Defined in :numref:`sec_multi_gpu_concise`"""
    return sum(p.size for p in net.parameters() if not p.stop_gradient)

def check_num_gpus(num_gpus):
    """Reject a device count that is not a positive integer, saying what was passed.

    Defined in :numref:`sec_multi_gpu_concise`"""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or \
            num_gpus < 1:
        raise ValueError(
            f'num_gpus must be a positive integer, got {num_gpus!r}')

def data_parallel_places(num_gpus):
    """Where the processes of a run will compute: up to `num_gpus` GPUs, or the CPU `num_gpus` times.

    Defined in :numref:`sec_multi_gpu_concise`"""
    d2l.check_num_gpus(num_gpus)
    if d2l.num_gpus() == 0:
        return [paddle.CPUPlace() for _ in range(num_gpus)]
    return [paddle.CUDAPlace(i) for i in range(min(num_gpus, d2l.num_gpus()))]

def evaluate_accuracy_gpus(net, data_iter, split_f=d2l.split_batch,
                           devices=None):
    """Fraction of `data_iter` that `net` classifies correctly, each batch split over the devices.

    Defined in :numref:`sec_multi_gpu_concise`"""
    if devices is None:
        devices = d2l.try_all_gpus()
    home = str(net.parameters()[0].place)
    net.eval()  # batch normalisation uses its running statistics
    copies = [net if str(d) == home else copy.deepcopy(net).to(d)
              for d in devices]
    counts = d2l.Accumulator(2)  # correct predictions, examples
    with paddle.no_grad():
        for X, y in data_iter:
            k = min(len(devices), X.shape[0])
            X_shards, y_shards = split_f(X, y, devices[:k])
            y_hats = [m(X_s) for m, X_s in zip(copies, X_shards)]
            for y_hat, y_s in zip(y_hats, y_shards):
                counts.add(d2l.accuracy(y_hat, y_s), y_s.shape[0])
    return counts[0] / counts[1]

def train_step_concise(net, X, y, loss, optimizer):
    """One SGD step of this process on its minibatch (X, y); returns the summed loss.

    Defined in :numref:`sec_multi_gpu_concise`"""
    l = loss(net(X), y)
    l.backward()  # paddle.DataParallel averages gradients across processes
    optimizer.step()
    optimizer.clear_grad()
    return l.detach() * X.shape[0]

def train_epoch_concise(net, train_iter, loss, optimizer):
    """One pass of this process over its part of the data; returns (summed loss, examples).

    Defined in :numref:`sec_multi_gpu_concise`"""
    net.train()
    total, n = paddle.zeros([]), 0
    for X, y in train_iter:
        total += d2l.train_step_concise(net, X, y, loss, optimizer)
        n += X.shape[0]
    return float(total), n

def train_concise_worker(net, num_epochs, batch_size, lr, weights_file):
    """Body of each process of multi-process data-parallel training; returns its record.

    Defined in :numref:`sec_multi_gpu_concise`"""
    dist = paddle.distributed
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    # A model that arrives pickled drifted from the one-process result after
    # the first step under paddle.DataParallel (PaddlePaddle 3.3); a deep copy,
    # which rebuilds every parameter through its constructor, trains correctly.
    net = copy.deepcopy(net)
    net.to(paddle.get_device())  # this process's GPU, or the CPU
    model = paddle.DataParallel(net)  # copies rank 0's parameters to all
    train_iter, _ = d2l.load_data_fashion_mnist(batch_size // world)
    sampler = paddle.io.DistributedBatchSampler(
        train_iter.dataset, batch_size // world, shuffle=True)
    shard_iter = paddle.io.DataLoader(train_iter.dataset, batch_sampler=sampler,
                                      collate_fn=train_iter.collate_fn)
    optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                     parameters=model.parameters())
    loss = nn.CrossEntropyLoss()
    record = {'device': paddle.get_device(), 'train_loss': [],
              'epoch_seconds': []}
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every process
        timer.start()
        loss_sum, n = d2l.train_epoch_concise(model, shard_iter, loss,
                                              optimizer)
        record['epoch_seconds'].append(timer.stop())
        totals = paddle.to_tensor([loss_sum, float(n)], dtype='float64')
        if world > 1:  # add up every process's loss and example count
            dist.all_reduce(totals)
        record['train_loss'].append(float(totals[0] / totals[1]))
    if rank == 0:
        paddle.save(net.state_dict(), weights_file)
    return record

def train_concise_spawn(net, num_gpus, batch_size, lr, num_epochs):
    """Train `net` with one process per device via paddle.DataParallel; return process 0's record.

    Defined in :numref:`sec_multi_gpu_concise`"""
    places = d2l.data_parallel_places(num_gpus)
    if batch_size % len(places):
        raise ValueError(f'batch_size {batch_size} cannot be shared equally by '
                         f'{len(places)} processes; use a multiple of '
                         f'{len(places)}')
    backend = 'nccl' if d2l.num_gpus() else 'gloo'
    with tempfile.TemporaryDirectory() as folder:
        weights_file = os.path.join(folder, 'trained.pdparams')
        context = paddle.distributed.spawn(
            d2l.train_concise_worker, nprocs=len(places), backend=backend,
            args=(net, num_epochs, batch_size, lr, weights_file))
        records = [queue.get() for queue in context.return_queues]
        net.set_state_dict(paddle.load(weights_file))
    record = records[0]  # process 0's timings; the losses are global
    record['devices'] = [r['device'] for r in records]
    return record

import contextlib
import json
import logging
import pickle
import re
import signal
import tempfile
import threading
import traceback
import warnings
import paddle.distributed as dist

def _check_rank(rank, world_size, what='rank'):
    """Reject a world size below 1 or a rank outside 0..world_size-1, naming the culprit.

    Defined in :numref:`sec_ddp`"""
    for name, value in (('world_size', world_size), (what, rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f'{name} must be an int, got {value!r}')
    if world_size < 1:
        raise ValueError(f'world_size must be at least 1, got {world_size}')
    if not 0 <= rank < world_size:
        raise ValueError(f'{what} must lie in 0..{world_size - 1} for a world '
                         f'size of {world_size}, got {rank}')

def ddp_device(local_rank, local_world_size):
    """The GPU the launcher gave this process, else GPU `local_rank` if every local process gets one, else the CPU.

    Defined in :numref:`sec_ddp`"""
    _check_rank(local_rank, local_world_size, 'local_rank')
    if (os.environ.get('PADDLE_DISTRI_BACKEND') == 'gloo'
            or not paddle.device.is_compiled_with_cuda() or num_gpus() == 0):
        return 'cpu'
    given = os.environ.get('FLAGS_selected_gpus', '').strip()
    if given:  # set by paddle.distributed.launch (and by spawn on GPUs)
        return f'gpu:{int(given.split(",")[0])}'
    if num_gpus() >= local_world_size:
        return f'gpu:{local_rank}'
    return 'cpu'

def ddp_backend(device):
    """NCCL for a GPU, Gloo for the CPU.

    Defined in :numref:`sec_ddp`"""
    return 'nccl' if str(device).startswith('gpu') else 'gloo'

@contextlib.contextmanager
def process_group(rank, world_size, init_method='env://', timeout_s=None,
                  device=None, local_rank=None, local_world_size=None):
    """Join the process group that spawn or launch described in the environment; yield this process's device.

    Defined in :numref:`sec_ddp`"""
    _check_rank(rank, world_size)
    _check_timeout(timeout_s)
    if 'PADDLE_TRAINER_ID' not in os.environ:
        raise RuntimeError(
            'no process group is described in the environment: run this code '
            'in a process started by d2l.spawn_ranks, paddle.distributed.spawn '
            'or python -m paddle.distributed.launch')
    given = (int(os.environ['PADDLE_TRAINER_ID']),
             int(os.environ['PADDLE_TRAINERS_NUM']))
    if (rank, world_size) != given:
        raise ValueError(f'rank {rank} of world_size {world_size} does not '
                         f'match the environment, which says rank {given[0]} '
                         f'of {given[1]}')
    if init_method != 'env://':
        raise ValueError(f"init_method must be 'env://' in PaddlePaddle, which "
                         f'reads the rendezvous from the environment; got '
                         f'{init_method!r}')
    local_rank = int(os.environ.get('PADDLE_LOCAL_RANK', rank)) \
        if local_rank is None else local_rank
    local_world_size = int(os.environ.get('PADDLE_LOCAL_SIZE', world_size)) \
        if local_world_size is None else local_world_size
    if device is None:
        device = ddp_device(local_rank, local_world_size)
    if timeout_s is not None:
        if ddp_backend(device) != 'nccl':
            raise ValueError("timeout_s must be None on the CPU: PaddlePaddle's "
                             'Gloo group has no timeout')
        os.environ['PADDLE_PG_TIMEOUT'] = str(int(timeout_s * 1000))
    paddle.set_device(device)
    dist.init_parallel_env()
    try:
        yield device
    except BaseException:
        _record_rank_failure(rank)  # before the others see only a lost peer
        dist.destroy_process_group()
        raise
    if dist.is_initialized():  # unless the body has left the group itself
        dist.barrier()  # leave together: see the text
        dist.destroy_process_group()

def fashion_mnist_tensors(split):
    """Images and labels of a Fashion-MNIST split as tensors (the quick subset in quick mode).

    Defined in :numref:`sec_ddp`"""
    images, labels = fashion_mnist_arrays(split, quick_mode(num_gpus()))
    return paddle.to_tensor(images), paddle.to_tensor(labels)

def shard_of_batch(X, y, step, rank, world_size, batch_size):
    """Rank `rank`'s `batch_size` examples of global minibatch `step`, wrapping around the data.

    Defined in :numref:`sec_ddp`"""
    start = (step * world_size + rank) * batch_size
    idx = paddle.arange(start, start + batch_size) % y.shape[0]
    return paddle.gather(X, idx), paddle.gather(y, idx)

def _small_mlp(seed):
    """A two-layer perceptron for 28x28 images, initialised from `seed`; no batch norm.

    Defined in :numref:`sec_ddp`"""
    paddle.seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(),
                         nn.Linear(64, 10))

def flat_parameters(net):
    """All parameters of `net` in one flat NumPy vector, in registration order.

    Defined in :numref:`sec_ddp`"""
    return np.concatenate([p.numpy().reshape(-1) for p in net.parameters()])

def sgd_on_shards(net, optimizer, rank, world_size, num_steps, batch_size,
                  device):
    """Take `num_steps` optimizer steps, rank `rank` training on its shard of each global minibatch.

    Defined in :numref:`sec_ddp`"""
    X, y = fashion_mnist_tensors('train')
    for step in range(num_steps):
        X_shard, y_shard = shard_of_batch(X, y, step, rank, world_size,
                                          batch_size)
        y_hat = net(X_shard.to(device))
        loss = F.cross_entropy(y_hat, y_shard.to(y_hat.place))
        loss.backward()  # a DataParallel model averages the gradients here
        optimizer.step()
        optimizer.clear_grad()

_rank_report_dir = None  # set in the processes that spawn_ranks starts

def _record_rank_failure(rank):
    """In a process that spawn_ranks started, write down the exception being handled, if it is the first.

    Defined in :numref:`sec_ddp`"""
    if _rank_report_dir is None:
        return
    path = os.path.join(_rank_report_dir, f'rank{rank}.error')
    if not os.path.exists(path):  # the first error is the cause
        with open(path + '.part', 'w') as f:
            f.write(f'{time.time()!r}\n{traceback.format_exc()}')
        os.replace(path + '.part', path)  # readers never see half a file

def _check_timeout(timeout_s):
    """Accept None or a positive number of seconds for a process group's timeout.

    Defined in :numref:`sec_ddp`"""
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not timeout_s > 0 or timeout_s == float('inf'):
        raise ValueError(f'timeout_s must be a positive number of seconds or '
                         f'None (the backend default), got {timeout_s!r}')

def _check_worker(worker, args):
    """Fail early, in this process, if spawned processes could not import `worker` or unpickle `args`.

    Defined in :numref:`sec_ddp`"""
    if not callable(worker):
        raise TypeError(f'worker must be a function, got {worker!r}')
    main = sys.modules.get('__main__')
    if getattr(worker, '__module__', None) == '__main__' and \
            not hasattr(main, '__file__'):
        raise ValueError(
            f'worker {worker.__name__} is defined in this notebook or '
            f'interpreter session, which new processes cannot import: save it '
            f'in a module (as the book saves its workers in d2l) and pass that')
    for name, value in (('worker', worker), ('args', args)):
        try:
            pickle.dumps(value)
        except Exception as err:
            raise ValueError(
                f'{name} cannot be sent to new processes ({err}); use a '
                f'function defined at the top level of a module and '
                f'arguments that pickle') from None

def _start_rank(rank, out_dir, parent_pid):
    """Prepare a process that spawn_ranks started: report to out_dir, log there, die with the parent.

    Defined in :numref:`sec_ddp`"""
    global _rank_report_dir
    _rank_report_dir = out_dir
    log = os.open(os.path.join(out_dir, f'rank{rank}.log'),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):  # C++ log lines and dumps bypass sys.stdout/stderr
        os.dup2(log, stream)
    os.close(log)
    if sys.platform.startswith('linux'):
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before we asked
        os._exit(1)

def _finish_rank(rank, out_dir, result):
    """Store the result of a worker where spawn_ranks collects it.

    Defined in :numref:`sec_ddp`"""
    with open(os.path.join(out_dir, f'rank{rank}.pkl.part'), 'wb') as f:
        pickle.dump(result, f)
    os.replace(os.path.join(out_dir, f'rank{rank}.pkl.part'),
               os.path.join(out_dir, f'rank{rank}.pkl'))

@contextlib.contextmanager
def _quiet_logger(name):
    """Hide the informational and warning records of logger `name` in the body of a `with` block.

    Defined in :numref:`sec_ddp`"""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)

def _stop_processes(processes, grace_s=3.0):
    """Terminate the processes that still run, kill those that ignore it, and reap them all.

    Defined in :numref:`sec_ddp`"""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()

def _rank_failure(out_dir, world_size, spawn_error):
    """The error to raise for a failed group: the first one a rank wrote, or a summary of how a rank died.

    Defined in :numref:`sec_ddp`"""
    written = []
    for rank in range(world_size):
        path = os.path.join(out_dir, f'rank{rank}.error')
        if os.path.exists(path):
            with open(path) as f:
                when, trace = f.read().split('\n', 1)
            written.append((float(when), rank, trace))
    if written:
        _, rank, trace = min(written)
        return RuntimeError(f'rank {rank} of {world_size} failed:\n{trace}')
    said = str(spawn_error).strip() or type(spawn_error).__name__
    found = re.search(r'process (\d+) terminated with (.*)', said, re.I)
    if not found:
        return RuntimeError(f'a rank failed: {said}')
    rank = int(found.group(1))
    message = (f'rank {rank} of {world_size} died '
               f'({found.group(2).rstrip(".")}) without a Python error')
    log = os.path.join(out_dir, f'rank{rank}.log')
    if os.path.exists(log):
        with open(log, errors='replace') as f:
            tail = f.read()[-3000:]
        message += f'.\nThe end of its output:\n{tail}'
    return RuntimeError(message)

def _join_ranks(context, out_dir, world_size):
    """Wait for the processes of spawn_ranks; on a failure, an interrupt or SIGTERM stop them all.

    Defined in :numref:`sec_ddp`"""
    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the clean-up below

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        while not context.join(timeout=0.2):
            pass
    except Exception as err:  # a rank failed
        _stop_processes(context.processes)
        raise _rank_failure(out_dir, world_size, err) from None
    except BaseException:  # KeyboardInterrupt, or SystemExit from SIGTERM
        _stop_processes(context.processes)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)

def _collect_results(out_dir, world_size):
    """The results that the ranks of spawn_ranks stored, by rank.

    Defined in :numref:`sec_ddp`"""
    results = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f'rank{rank}.pkl'), 'rb') as f:
            results.append(pickle.load(f))
    return results

def spawn_ranks(worker, world_size, *args, backend=None):
    """Run worker(rank, world_size, *args) in `world_size` new processes; return their results by rank.

    Defined in :numref:`sec_ddp`"""
    _check_rank(0, world_size)
    _check_worker(worker, args)
    if backend is None:
        backend = ddp_backend(ddp_device(0, world_size))
    if backend not in ('gloo', 'nccl'):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    with tempfile.TemporaryDirectory(prefix='d2l-ranks-') as out_dir, \
            _quiet_paddle_children(), _quiet_logger('root'):
        context = dist.spawn(_run_rank, args=(worker, args, out_dir,
                                              os.getpid()),
                             nprocs=world_size, backend=backend, join=False)
        _join_ranks(context, out_dir, world_size)
        return _collect_results(out_dir, world_size)

@contextlib.contextmanager
def _quiet_paddle_children():
    """Keep PaddlePaddle's start-up notices and informational C++ logs out of the parent's output.

    Defined in :numref:`sec_ddp`"""
    quiet = {'GLOG_minloglevel': '2',  # read when a child imports paddle
             'PYTHONWARNINGS': 'ignore::UserWarning'}
    saved = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)
    try:
        with warnings.catch_warnings():
            # spawn says once per call that a CPU build trains on the CPU.
            warnings.filterwarnings('ignore', message='.*CPUONLY')
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

def _run_rank(worker, args, out_dir, parent_pid):
    """Body of one process of spawn_ranks: run the worker, store its result or its error.

    Defined in :numref:`sec_ddp`"""
    rank = int(os.environ['PADDLE_TRAINER_ID'])  # set by spawn
    _start_rank(rank, out_dir, parent_pid)
    try:
        result = worker(rank, int(os.environ['PADDLE_TRAINERS_NUM']), *args)
    except BaseException:
        _record_rank_failure(rank)  # unless process_group already did
        raise
    _finish_rank(rank, out_dir, result)

def ddp_sgd_steps(rank, world_size, init_method, num_steps, batch_size, lr):
    """DataParallel worker: `num_steps` of SGD on `_small_mlp`, `batch_size` examples per rank; returns the parameters.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method) as device:
        # Seeds differ on purpose: wrapping the model must make the copies agree.
        net = paddle.DataParallel(_small_mlp(seed=rank))
        optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                         parameters=net.parameters())
        sgd_on_shards(net, optimizer, rank, world_size, num_steps, batch_size,
                      device)
        return flat_parameters(net)

def sgd_steps_one_process(num_steps, batch_size, lr):
    """The same SGD in this process alone, on minibatches of `batch_size`, from rank 0's start.

    Defined in :numref:`sec_ddp`"""
    net = _small_mlp(seed=0)
    optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                     parameters=net.parameters())
    sgd_on_shards(net, optimizer, 0, 1, num_steps, batch_size, 'cpu')
    return flat_parameters(net)

def _skew_demo(rank, world_size, init_method, delay_s, report_dir):
    """Time DataParallel steps while rank 1 is late once and then leaves; write each rank's timings.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method, device='cpu'):
        net = paddle.DataParallel(_small_mlp(seed=0))
        X, y = shard_of_batch(*fashion_mnist_tensors('train'), 0, rank,
                              world_size, 32)

        def timed_step():
            began = time.perf_counter()
            F.cross_entropy(net(X), y).backward()
            return time.perf_counter() - began

        for _ in range(3):
            timed_step()  # the set-up of the first steps is not what we time
        seen = {'all on time': timed_step()}
        if rank == 1:
            time.sleep(delay_s)
        seen['rank 1 late'] = timed_step()
        seen['last step began at'] = time.time()
        with open(os.path.join(report_dir, f'rank{rank}.json'), 'w') as f:
            json.dump(seen, f)
        if rank == 1:
            dist.destroy_process_group()  # leave now, without waiting for rank 0
        else:
            timed_step()  # finds rank 1 gone: this process aborts here

def _checkpoint_demo(rank, world_size, init_method, path):
    """Train, save on rank 0, load into a fresh model on every rank; return the parameters before and after.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method) as device:
        net = paddle.DataParallel(_small_mlp(seed=0))
        optimizer = paddle.optimizer.Momentum(
            learning_rate=0.1, momentum=0.9, parameters=net.parameters())
        sgd_on_shards(net, optimizer, rank, world_size, 3, 32, device)
        if rank == 0:  # the copies are equal, so one writer suffices
            paddle.save(net.state_dict(), path)
        if world_size > 1:  # PaddlePaddle forms no group for one process
            dist.barrier()  # nobody reads before rank 0 has finished writing
        fresh = _small_mlp(seed=100 + rank)
        before = flat_parameters(fresh)
        # NumPy arrays carry no device: each parameter keeps its own place.
        fresh.set_state_dict(paddle.load(path, return_numpy=True))
        return {'trained': flat_parameters(net), 'before': before,
                'after': flat_parameters(fresh)}

class _TwoDeviceMLP(nn.Layer):
    """`_small_mlp` cut in two: the hidden layer on devices[0], the output layer on devices[1].

    Defined in :numref:`sec_ddp`"""
    def __init__(self, devices, seed):
        super().__init__()
        paddle.seed(seed)  # same draws, in the same order, as _small_mlp
        self.devices = devices
        self.lower = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU())
        self.upper = nn.Linear(64, 10)
        self.lower.to(device=devices[0])
        self.upper.to(device=devices[1])

    def forward(self, X):
        hidden = self.lower(X.to(self.devices[0]))
        return self.upper(hidden.to(self.devices[1]))  # activations cross over

def model_parallel_ddp_steps(rank, world_size, init_method, num_steps,
                             batch_size, lr):
    """DataParallel worker whose model is cut into two parts; returns its devices and parameters.

    Defined in :numref:`sec_ddp`"""
    devices = ['cpu', 'cpu']  # see the text: both halves on the CPU
    with process_group(rank, world_size, init_method, device=devices[0]):
        net = paddle.DataParallel(_TwoDeviceMLP(devices, seed=rank))
        optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                         parameters=net.parameters())
        sgd_on_shards(net, optimizer, rank, world_size, num_steps, batch_size,
                      devices[0])
        return {'devices': devices, 'parameters': flat_parameters(net)}

def local_batch_size(batch_size, world_size):
    """Each process's share of a global minibatch of `batch_size`, which must split evenly.

    Defined in :numref:`sec_ddp`"""
    if batch_size < world_size or batch_size % world_size:
        below = max(world_size, batch_size - batch_size % world_size)
        raise ValueError(
            f'a global batch of {batch_size} cannot be shared equally by '
            f'{world_size} processes; use a multiple of {world_size}, such as '
            f'{below} or {below + world_size}')
    return batch_size // world_size

def evaluate_accuracy_ddp(net, device, rank, world_size, batch_size=256):
    """Test accuracy of `net` over all ranks: each scores every world_size-th image, then the counts are summed.

    Defined in :numref:`sec_ddp`"""
    # PaddlePaddle forms no group for one process, so we skip the collectives.
    for p in net.parameters():
        if not p.trainable and world_size > 1:  # batch-norm statistics
            dist.broadcast(p, src=0)  # everybody uses rank 0's
    X, y = fashion_mnist_tensors('test')
    X, y = X[rank::world_size], y[rank::world_size]  # no image counted twice
    correct, n = 0.0, 0
    net.eval()
    with paddle.no_grad():
        for i in range(0, y.shape[0], batch_size):
            correct += accuracy(net(X[i:i + batch_size].to(device)),
                                y[i:i + batch_size].to(device))
            n += y[i:i + batch_size].shape[0]
    counts = paddle.to_tensor([correct, float(n)], dtype='float64')
    if world_size > 1:
        dist.all_reduce(counts)  # correct predictions and images of all ranks
    return float(counts[0] / counts[1])

def _batch_norm_statistics_demo(rank, world_size, init_method, num_steps):
    """Train a perceptron with batch norm under DataParallel; return its running mean before and after a broadcast.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method) as device:
        paddle.seed(0)
        norm = nn.BatchNorm1D(64)
        net = paddle.DataParallel(nn.Sequential(
            nn.Flatten(), nn.Linear(784, 64), norm, nn.ReLU(),
            nn.Linear(64, 10)))
        optimizer = paddle.optimizer.SGD(learning_rate=0.1,
                                         parameters=net.parameters())
        sgd_on_shards(net, optimizer, rank, world_size, num_steps, 32, device)
        trained = norm._mean.numpy().copy()
        dist.broadcast(norm._mean, src=0)
        return trained, norm._mean.numpy()

def train_ddp(rank, world_size, init_method, num_epochs, batch_size, lr,
              local_rank=None, local_world_size=None):
    """Train d2l.resnet18 on Fashion-MNIST with DataParallel at global batch `batch_size`; return a summary.

    Defined in :numref:`sec_ddp`"""
    local_batch = local_batch_size(batch_size, world_size)
    with process_group(rank, world_size, init_method, local_rank=local_rank,
                       local_world_size=local_world_size) as device:
        train_set = paddle.io.TensorDataset(list(fashion_mnist_tensors('train')))
        sampler = paddle.io.DistributedBatchSampler(
            train_set, local_batch, num_replicas=world_size, rank=rank,
            shuffle=True)
        train_iter = paddle.io.DataLoader(train_set, batch_sampler=sampler)
        paddle.seed(0)
        net = paddle.DataParallel(resnet18(10))
        optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                         parameters=net.parameters())
        summary = {'rank': rank, 'world_size': world_size,
                   'backend': ddp_backend(device),
                   'device': paddle.get_device(), 'train_loss': [],
                   'epoch_s': []}
        timer = Timer()
        for epoch in range(num_epochs):
            sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
            net.train()
            timer.start()
            loss_sum, n = 0.0, 0
            for X, y in train_iter:
                loss = F.cross_entropy(net(X), y)
                loss.backward()
                optimizer.step()
                optimizer.clear_grad()
                loss_sum += float(loss) * y.shape[0]
                n += y.shape[0]
            totals = paddle.to_tensor([loss_sum, float(n)], dtype='float64')
            if world_size > 1:  # PaddlePaddle forms no group for one process
                dist.all_reduce(totals)  # loss sums and counts of all ranks
            # Reading the result waits for the device, so the clock stops after it.
            summary['train_loss'].append(float(totals[0] / totals[1]))
            summary['epoch_s'].append(timer.stop())
        summary['test_acc'] = evaluate_accuracy_ddp(net, device, rank,
                                                    world_size)
        summary['data'] = describe_mode(quick_mode(num_gpus()), len(train_set),
                                        fashion_mnist_tensors('test')[1].shape[0])
        return summary

def describe_ddp_run(summary):
    """A few lines about a distributed training run, from one rank's summary.

    Defined in :numref:`sec_ddp`"""
    losses = ', '.join(f'{l:.3f}' for l in summary['train_loss'])
    seconds = sum(summary['epoch_s']) / len(summary['epoch_s'])
    return (f'{summary["world_size"]} processes, backend {summary["backend"]}, '
            f'rank {summary["rank"]} on {summary["device"]}\n{summary["data"]}\n'
            f'training loss per epoch: {losses}\n'
            f'test accuracy {summary["test_acc"]:.3f}, {seconds:.1f} s/epoch '
            f'on rank {summary["rank"]}')

def launcher_ranks():
    """(rank, world size, local rank, local world size) as set by paddle.distributed.launch.

    Defined in :numref:`sec_ddp`"""
    names = ('PADDLE_TRAINER_ID', 'PADDLE_TRAINERS_NUM')
    missing = [name for name in names if name not in os.environ]
    if missing:
        raise RuntimeError(
            f'{", ".join(missing)} not set: start this script with '
            f'python -m paddle.distributed.launch, for example with '
            f'--nproc_per_node 2 {sys.argv[0]}')
    rank, world_size = (int(os.environ[name]) for name in names)
    # spawn describes one machine and leaves the local numbers out
    return (rank, world_size,
            int(os.environ.get('PADDLE_LOCAL_RANK', rank)),
            int(os.environ.get('PADDLE_LOCAL_SIZE', world_size)))

def ddp_script_path(framework=None):
    """Path of the book's launcher script for `framework` ('torch' or 'paddle'; default: this module's).

    Defined in :numref:`sec_ddp`"""
    names = {'torch': 'ddp_train.py', 'paddle': 'ddp_train_paddle.py'}
    if framework is None:
        framework = __name__.rsplit('.', 1)[-1]  # d2l.torch or d2l.paddle
    if framework not in names:
        raise ValueError(f"framework must be 'torch' or 'paddle', got {framework!r}")
    name = names[framework]
    # In the repository the script sits in chapter_multi_gpu/ next to d2l/;
    # in a downloaded notebook folder it sits beside the notebook, which is
    # where Jupyter starts; the book's commands run from the repository root.
    book_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    places = [os.path.join(book_root, 'chapter_multi_gpu', name),
              os.path.join(os.getcwd(), name),
              os.path.join(os.getcwd(), 'chapter_multi_gpu', name)]
    for place in places:
        if os.path.isfile(place):
            return place
    raise FileNotFoundError(
        f'{name} is in none of ' + ', '.join(places) + ': run from the '
        f"book's root folder or from the folder of this section's notebook")