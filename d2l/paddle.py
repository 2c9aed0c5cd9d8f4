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

import itertools
import os
import sys
import time
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
    return paddle.CUDAPlace(i) if i < num_gpus() else paddle.CPUPlace()

def try_all_gpus():
    """Return every GPU, or a list holding only the CPU if there are none.

    Defined in :numref:`sec_helpers`"""
    return [paddle.CUDAPlace(i) for i in range(num_gpus())] or [
        paddle.CPUPlace()]

def try_gpus(num_devices):
    """Devices for `num_devices` model copies: GPUs, or the CPU if none.

    Defined in :numref:`sec_helpers`"""
    g = num_gpus()
    if g == 0:
        return [paddle.CPUPlace() for _ in range(num_devices)]
    # A CPU build of Paddle refuses to construct a CUDAPlace, so build
    # GPU places only when GPUs exist.
    return [paddle.CUDAPlace(i) for i in range(min(g, num_devices))]

def describe_devices(devices, num_asked=None, processes=False):
    """One line saying which devices were chosen and why, for training logs.

    Defined in :numref:`sec_helpers`"""
    names, gpu = zip(*_device_names(devices, num_asked))
    k = len(devices)
    if not any(gpu):
        where = 'no GPU found' if num_gpus() == 0 else 'GPUs not used'
        if processes:
            return (f'{k} process{"es" if k > 1 else ""} on the CPU, one '
                    f'core each ({where})')
        copies = f'{k} cop{"y" if k == 1 else "ies"} of the model'
        place = 'the CPU' if len(set(names)) == 1 else ', '.join(names)
        return f'{copies} on {place} ({where})'
    found = num_gpus()
    line = f'using {", ".join(names)}'
    if num_asked is not None and num_asked != k:
        return (f'{num_asked} devices asked, {found} GPU'
                f'{"" if found == 1 else "s"} found: {line}')
    return f'{k} GPU{"" if k == 1 else "s"} ({found} found): {line}'

def use_one_core(local_rank):
    """Give this process one thread on core number `local_rank`; return it.

    Defined in :numref:`sec_helpers`"""
    cores = _usable_cores()
    core = cores[local_rank % len(cores)]
    _one_thread()
    _pin_threads(core)
    return core

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
        _check_positive_int(n, 'n (the number of sums)')
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
    y_hat, y = _labels_and_predictions(y_hat, y, lambda t: t.argmax(axis=1))
    return float((y_hat.astype(y.dtype) == y).astype('int64').sum())

def evaluate_accuracy_gpu(net, data_iter, device=None):
    """Fraction of `data_iter` that `net` classifies correctly, one device.

    Defined in :numref:`sec_helpers`"""
    if isinstance(net, nn.Layer):
        net.eval()
        if device is None and net.parameters():
            device = net.parameters()[0].place
    counts = Accumulator(2)  # correct predictions, examples
    with paddle.no_grad():
        for X, y in _minibatches(data_iter):
            if device is not None:
                X, y = X.to(device), y.to(device)
            counts.add(accuracy(net(X), y), y.shape[0])
    return _fraction_correct(counts, data_iter)

def sgd(params, lr, batch_size):
    """Minibatch SGD on raw tensors, in place; then clears the gradients.

    Defined in :numref:`sec_helpers`"""
    with paddle.no_grad():
        for param in _check_sgd(params, lr, batch_size):
            param.set_value(param - lr * param.grad / batch_size)
            param.clear_gradient()

class Animator:
    """Plot curves that grow one point at a time, redrawn in Jupyter."""
    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None,
                 ylim=None, xscale='linear', yscale='linear',
                 fmts=('-', 'm--', 'g-.', 'r:'), nrows=1, ncols=1,
                 figsize=(3.5, 2.5)):
        """Defined in :numref:`sec_helpers`"""
        # A Figure not registered with pyplot is shown only when we ask,
        # so Jupyter does not print it a second time at the end of the cell.
        from matplotlib.figure import Figure
        _check_positive_int(nrows, 'nrows')
        _check_positive_int(ncols, 'ncols')
        use_svg_display()
        self.fig = Figure(figsize=figsize)
        self.axes = [self.fig.add_subplot(nrows, ncols, i + 1)
                     for i in range(nrows * ncols)]
        self.legend, self.fmts = legend, fmts
        self.style = dict(xlabel=xlabel, ylabel=ylabel, xlim=xlim, ylim=ylim,
                          xscale=xscale, yscale=yscale)
        self.X, self.Y = None, None
        self._shown = None  # the notebook display that add() updates

    def draw(self):
        """Redraw every curve on the first axes.
    
        Defined in :numref:`sec_helpers`"""
        ax = self.axes[0]
        ax.cla()
        for xs, ys, fmt in zip(self.X or [], self.Y or [], self.fmts):
            ax.plot(xs, ys, fmt)
        ax.set(**{k: v for k, v in self.style.items() if v is not None})
        if self.legend:
            ax.legend(self.legend)
        ax.grid(True)
    

    def savefig(self, path):
        """Write the current figure to `path` (SVG, PNG or PDF by extension).
    
        Defined in :numref:`sec_helpers`"""
        self.draw()
        self.fig.savefig(path, bbox_inches='tight')

    def add(self, x, y):
        """Append one point to each curve (`y`: a value or one per curve).
    
        Defined in :numref:`sec_helpers`"""
        xs, ys = _points(x, y, self.Y)
        if self.X is None:
            self.X, self.Y = [[] for _ in ys], [[] for _ in ys]
        for i, (a, b) in enumerate(zip(xs, ys)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)
        self.draw()
        if in_notebook():
            # One output, replaced in place: later prints of the cell appear
            # below it and never clear it.
            from IPython import display
            if self._shown is None:
                self._shown = display.display(self.fig, display_id=True)
            else:
                self._shown.update(self.fig)

QUICK_PER_CLASS = {'train': 10, 'test': 10}

QUICK_MAX_EPOCHS = 1

def quick_mode(gpus_found):
    """Whether to serve the small subset: D2L_QUICK if set, else no GPU.

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

def load_data_fashion_mnist(batch_size, resize=None):
    """Fashion-MNIST as (train, test) loaders of (images, labels) batches.

    Defined in :numref:`sec_helpers`"""
    batch_size, size = _check_loader_args(batch_size, resize)
    quick = quick_mode(num_gpus())
    loaders, sizes = [], []
    for split in ('train', 'test'):
        images, labels = fashion_mnist_arrays(split, quick)
        sizes.append(len(labels))
        loaders.append(paddle.io.DataLoader(
            ArrayDataset(images, labels), batch_size=batch_size,
            shuffle=(split == 'train'), return_list=True,
            collate_fn=lambda batch: _collate_resized(batch, size)))
    _say_once(describe_mode(quick, *sizes))
    return tuple(loaders)

class Residual(nn.Layer):
    """Two 3x3 conv + batch-norm layers, identity or 1x1-conv shortcut.

    Defined in :numref:`sec_helpers`"""
    def __init__(self, input_channels, num_channels, use_1x1conv=False,
                 strides=1):
        super().__init__()
        self.conv1 = nn.Conv2D(input_channels, num_channels, 3,
                               stride=strides, padding=1)
        self.conv2 = nn.Conv2D(num_channels, num_channels, 3, padding=1)
        self.shortcut = nn.Conv2D(input_channels, num_channels, 1,
                                  stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2D(num_channels)
        self.bn2 = nn.BatchNorm2D(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.shortcut is not None:
            X = self.shortcut(X)
        return F.relu(Y + X)

import contextlib
import numpy

_to = lambda x, device: x.to(device)  # the same tensor if already there
_track = lambda x: setattr(x, 'stop_gradient', False)
_on = lambda device: paddle.device.device_guard(device)  # the current device
_no_grad, _record = paddle.no_grad, contextlib.nullcontext
_device_of = lambda x: _typed_place(x.place)
_log_softmax = lambda Z: F.log_softmax(Z, axis=1)
_pick = lambda A, y: paddle.take_along_axis(A, y.reshape([-1, 1]), axis=1)

def copy_to(x, device):
    """A new copy of `x` on `device`, sharing no memory with `x`.

    Defined in :numref:`sec_multi_gpu`"""
    return x.detach().clone().to(device)

def tensor(a, device=None):
    """A framework array holding `a`, on `device` (None: the CPU).

    Defined in :numref:`sec_multi_gpu`"""
    return paddle.to_tensor(a, place=paddle.CPUPlace() if device is None
                            else device)

def _typed_place(place):  # device_guard would run a generic GPU Place on GPU 0
    """The CPUPlace or CUDAPlace that a tensor's generic `place` stands for.

    Defined in :numref:`sec_multi_gpu`"""
    return (paddle.CUDAPlace(place.gpu_device_id()) if place.is_gpu_place()
            else paddle.CPUPlace())

# Weights are (outputs, inputs[, height, width]); biases follow them.
LENET_SHAPES = [
    (6, 1, 5, 5), (6,),      # convolution: 1 -> 6 channels, 5 x 5 kernels
    (16, 6, 5, 5), (16,),    # convolution: 6 -> 16 channels, 5 x 5 kernels
    (120, 400), (120,),      # dense: 16 x 5 x 5 = 400 inputs -> 120 units
    (84, 120), (84,),        # dense: 120 -> 84 units
    (10, 84), (10,)]         # dense: 84 -> 10 class scores

def lenet_init_arrays(seed=0):
    """LeNet's initial NumPy arrays: He-scaled normal weights, zero biases.

    Defined in :numref:`sec_multi_gpu`"""
    rng = numpy.random.default_rng(seed)
    return [numpy.zeros(shape, numpy.float32) if len(shape) == 1 else
            (rng.standard_normal(shape)
             * numpy.sqrt(2 / numpy.prod(shape[1:])))
            .astype(numpy.float32) for shape in LENET_SHAPES]

def lenet_params(seed=0):
    """LeNet's initial parameters as CPU tensors, equal in every framework.

    Defined in :numref:`sec_multi_gpu`"""
    return [tensor(a) for a in lenet_init_arrays(seed)]

def lenet(X, params):
    """LeNet on raw parameters: two conv/pool stages, three dense layers.

    Defined in :numref:`sec_multi_gpu`"""
    W1, b1, W2, b2, W3, b3, W4, b4, W5, b5 = params
    H = F.max_pool2d(F.relu(F.conv2d(X, W1, b1, padding=2)), 2)  # 6 x 14 x 14
    H = F.max_pool2d(F.relu(F.conv2d(H, W2, b2)), 2)             # 16 x 5 x 5
    H = H.reshape([H.shape[0], -1])
    H = F.relu(H @ W3.T + b3)
    H = F.relu(H @ W4.T + b4)
    return H @ W5.T + b5

def cross_entropy_sum(y_hat, y):
    """Cross-entropy of scores `y_hat` against integer labels, summed.

    Defined in :numref:`sec_multi_gpu`"""
    return -_pick(_log_softmax(y_hat), y).sum()

def get_params(params, device):
    """Copy `params` to `device` as new tensors that record their gradients.

    Defined in :numref:`sec_multi_gpu`"""
    copies = [copy_to(p, device) for p in params]  # never shares memory with p
    for p in copies:
        _track(p)
    return copies

def allreduce(data, devices=None):
    """Sum same-shaped arrays on different devices, writing the sum to each.

    Defined in :numref:`sec_multi_gpu`"""
    if devices is None:  # where each array lives
        devices = [_device_of(x) for x in data]
    first = data[0]
    with _no_grad():
        for x in data[1:]:  # reduce: add every array into the first one
            with _on(devices[0]):
                first[:] += _to(x, devices[0])
        for x, device in zip(data[1:], devices[1:]):  # broadcast the sum
            with _on(device):
                x[:] = _to(first, device)

def shard_sizes(n, k):
    """Sizes of `k` nearly equal parts of `n`; the first n % k get one more.

    Defined in :numref:`sec_multi_gpu`"""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]

def split_batch(X, y, devices):
    """Split examples `X` and labels `y` into one shard on each device.

    Defined in :numref:`sec_multi_gpu`"""
    X_shards, y_shards, start = [], [], 0
    for size, device in zip(shard_sizes(X.shape[0], len(devices)), devices):
        X_shards.append(_to(X[start:start + size], device))
        y_shards.append(_to(y[start:start + size], device))
        start += size
    return X_shards, y_shards

def train_batch(X, y, device_params, devices, lr, allreduce_fn=allreduce):
    """One data-parallel SGD step on (X, y); returns the summed loss.

    Defined in :numref:`sec_multi_gpu`"""
    X_shards, y_shards = split_batch(X, y, devices)
    y_hats, losses = [], []
    with _record():
        for X_s, W, device in zip(X_shards, device_params, devices):
            with _on(device):
                y_hats.append(lenet(X_s, W))
        for y_hat, y_s, device in zip(y_hats, y_shards, devices):
            with _on(device):
                losses.append(cross_entropy_sum(y_hat, y_s))
    for loss, device in zip(losses, devices):
        with _on(device):  # each backward pass fills its own replica's .grad
            loss.backward()
    for i in range(len(device_params[0])):
        allreduce_fn([W[i].grad for W in device_params], devices)
    for W, device in zip(device_params, devices):
        with _on(device):  # equal gradients keep the replicas equal
            d2l.sgd(W, lr, X.shape[0])
    return sum(float(l) for l in losses)  # waits for every device

def evaluate_accuracy_replicas(device_params, data_iter, devices):
    """LeNet's accuracy on `data_iter`, each batch split over the devices.

    Defined in :numref:`sec_multi_gpu`"""
    counts = d2l.Accumulator(2)  # correct predictions, examples
    with _no_grad():
        for X, y in data_iter:
            used = devices[:min(len(devices), X.shape[0])]  # short last batch
            X_shards, y_shards = split_batch(X, y, used)
            y_hats = []  # launch every forward pass before reading a result
            for X_s, W, device in zip(X_shards, device_params, used):
                with _on(device):
                    y_hats.append(lenet(X_s, W))
            for y_hat, y_s, device in zip(y_hats, y_shards, used):
                with _on(device):
                    counts.add(d2l.accuracy(y_hat, y_s), y_s.shape[0])
    return counts[0] / counts[1]

def ring_allreduce(data, devices=None):
    """Sum arrays on k devices in place: ring reduce-scatter, all-gather.

    Defined in :numref:`sec_multi_gpu`"""
    if devices is None:  # where each array lives
        devices = [_device_of(x) for x in data]
    with _no_grad():
        flats = []  # views of the arrays, or copies in MXNet's NumPy interface
        for x, device in zip(data, devices):
            with _on(device):
                flats.append(x.reshape((-1,)))
        k, sizes = len(data), shard_sizes(flats[0].shape[0], len(data))
        bounds = [sum(sizes[:c]) for c in range(k + 1)]
        # chunks[i][c] is a view of chunk c of the flat array on device i.
        chunks = [[f[bounds[c]:bounds[c + 1]] for c in range(k)]
                  for f in flats]
        for step in range(k - 1):  # reduce-scatter: add what arrives
            for i in range(k):
                c, j = (i - step) % k, (i + 1) % k
                with _on(devices[j]):
                    chunks[j][c][:] += _to(chunks[i][c], devices[j])
        # Device i now holds the complete sum of chunk (i + 1) % k.
        for step in range(k - 1):  # all-gather: overwrite with what arrives
            for i in range(k):
                c, j = (i + 1 - step) % k, (i + 1) % k
                with _on(devices[j]):
                    chunks[j][c][:] = _to(chunks[i][c], devices[j])
        for x, flat, device in zip(data, flats, devices):
            with _on(device):  # a no-op where flat is a view of x
                x[:] = flat.reshape(x.shape)

import copy  # for the processes
import os
import tempfile
import numpy as np

def init_uniform_fan_in(net):
    """Draw conv/linear weights, biases from U(-b, b), b = 1/sqrt(fan_in).

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
    """ResNet-18 for small images: a 3x3 stem and no max-pooling.

    Defined in :numref:`sec_multi_gpu_concise`"""
    layers = [nn.Conv2D(in_channels, 64, kernel_size=3, padding=1),
              nn.BatchNorm2D(64), nn.ReLU()]
    for in_c, out_c, downsample in [(64, 64, False), (64, 128, True),
                                    (128, 256, True), (256, 512, True)]:
        layers.append(nn.Sequential(
            d2l.Residual(in_c, out_c, use_1x1conv=downsample,
                         strides=2 if downsample else 1),
            d2l.Residual(out_c, out_c)))
    layers += [nn.AdaptiveAvgPool2D((1, 1)), nn.Flatten(),
               nn.Linear(512, num_classes)]
    net = nn.Sequential(*layers)
    d2l.init_uniform_fan_in(net)
    return net

def count_trainable_params(net):
    """Number of values in `net` that receive gradients (no BN statistics).

    Defined in :numref:`sec_multi_gpu_concise`"""
    return sum(p.size for p in net.parameters() if not p.stop_gradient)

def _accuracy_on_devices(forward, data_iter, split_f, devices):
    """Fraction classified correctly, `forward(i, X_i)` scoring shard i.

    Defined in :numref:`sec_multi_gpu_concise`"""
    counts = d2l.Accumulator(2)  # correct predictions, examples
    for X, y in data_iter:
        k = min(len(devices), X.shape[0])
        if k == 0:
            continue
        X_shards, y_shards = split_f(X, y, devices[:k])
        y_hats = [forward(i, X_s) for i, X_s in enumerate(X_shards)]
        for y_hat, y_s in zip(y_hats, y_shards):
            counts.add(d2l.accuracy(y_hat, y_s), y_s.shape[0])
    return counts[0] / counts[1]

def evaluate_accuracy_gpus(net, data_iter, split_f=d2l.split_batch,
                           devices=None):
    """Accuracy of `net` on `data_iter`, each batch split over the devices.

    Defined in :numref:`sec_multi_gpu_concise`"""
    if devices is None:
        devices = d2l.try_all_gpus()
    home = str(net.parameters()[0].place)  # e.g. 'Place(gpu:0)'
    net.eval()  # batch normalisation uses its running statistics
    copies = []
    for d in devices:
        if home in (str(d), f'Place({d})'):  # a Place, or a name like 'gpu:0'
            copies.append(net)
        else:
            with paddle.device.device_guard(d):
                copies.append(copy.deepcopy(net).to(d))
    def forward(i, X_i):
        with paddle.device.device_guard(devices[i]):  # compute where X_i is
            return copies[i](X_i)
    with paddle.no_grad():
        return _accuracy_on_devices(forward, data_iter, split_f, devices)

def train_step_concise(net, X, y, loss, optimizer, devices):
    """One SGD step of this process on its (X, y); returns the summed loss.

    Defined in :numref:`sec_multi_gpu_concise`"""
    X, y = X.to(devices[0]), y.to(devices[0])
    with paddle.device.device_guard(devices[0]):
        l = loss(net(X), y)
        l.backward()  # paddle.DataParallel averages gradients across processes
        optimizer.step()
    optimizer.clear_grad()
    return l.detach() * X.shape[0]

def train_epoch_concise(net, train_iter, loss, optimizer, devices):
    """One data-parallel pass over `train_iter`; (summed loss, examples).

    Defined in :numref:`sec_multi_gpu_concise`"""
    net.train()
    total, n = 0.0, 0
    for X, y in train_iter:
        l = d2l.train_step_concise(net, X, y, loss, optimizer, devices)
        total += float(l)  # waits for the step to finish
        n += X.shape[0]
    return total, n

def _shard_loaders(batch_size, rank, world):
    """This process's sampler, its training loader, its share of the tests.

    Defined in :numref:`sec_multi_gpu_concise`"""
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size // world)
    sampler = paddle.io.DistributedBatchSampler(
        train_iter.dataset, batch_size // world, shuffle=True)
    tests = paddle.io.Subset(test_iter.dataset, list(
        range(rank, len(test_iter.dataset), world)))
    return sampler, paddle.io.DataLoader(
        train_iter.dataset, batch_sampler=sampler,
        collate_fn=train_iter.collate_fn), paddle.io.DataLoader(
        tests, batch_size=batch_size // world,
        collate_fn=test_iter.collate_fn)

def _sum_over_processes(values, world):
    """The sums of `values` (a list of numbers) over all processes.

    Defined in :numref:`sec_multi_gpu_concise`"""
    totals = paddle.to_tensor(values, dtype='float64')
    if world > 1:
        paddle.distributed.all_reduce(totals)
    return totals.tolist()

def train_concise_worker(net_fn, seed, num_epochs, batch_size, lr, folder):
    """Body of each process of train_concise_spawn; returns its record.

    Defined in :numref:`sec_multi_gpu_concise`"""
    rank, world, device = d2l.start_spawned_process(folder)
    paddle.seed(seed)
    model = paddle.DataParallel(net_fn())  # copies rank 0's parameters to all
    sampler, shard_iter, test_iter = _shard_loaders(batch_size, rank, world)
    optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                     parameters=model.parameters())
    loss, timer = nn.CrossEntropyLoss(), d2l.Timer()
    record = dict(device=device, train_loss=[], test_acc=[], epoch_seconds=[])
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every process
        d2l.set_learning_rate(optimizer, d2l.cosine_lr(lr, epoch, num_epochs))
        timer.start()
        loss_sum, n = d2l.train_epoch_concise(model, shard_iter, loss,
                                              optimizer, [device])
        record['epoch_seconds'].append(timer.stop())
        m = len(test_iter.dataset)  # this process's test images
        acc = d2l.evaluate_accuracy_gpus(model._layers, test_iter,
                                         devices=[device])
        sums = _sum_over_processes([loss_sum, n, acc * m, m], world)
        record['train_loss'].append(sums[0] / sums[1])
        record['test_acc'].append(sums[2] / sums[3])
    if rank == 0:
        paddle.save(model._layers.state_dict(),
                    os.path.join(folder, 'trained.pdparams'))
    return record

def train_concise_spawn(net_fn, devices, batch_size, lr, num_epochs, seed=0):
    """Train net_fn() with a process per device; return (model, record).

    Defined in :numref:`sec_multi_gpu_concise`"""
    with tempfile.TemporaryDirectory() as folder:
        records = d2l.spawn_per_device(
            d2l.train_concise_worker, devices, folder,
            net_fn, seed, num_epochs, batch_size, lr, folder)
        paddle.seed(seed)
        net = net_fn()
        net.set_state_dict(paddle.load(os.path.join(folder,
                                                    'trained.pdparams')))
    record = records[0]  # process 0's timings; losses, accuracies global
    record['devices'] = [r['device'] for r in records]
    return net, record

def cosine_lr(lr, epoch, num_epochs):
    """Learning rate of epoch `epoch` (from 0), `lr` along half a cosine.

    Defined in :numref:`sec_multi_gpu_concise`"""
    return lr * (1 + math.cos(math.pi * epoch / num_epochs)) / 2

def set_learning_rate(optimizer, lr):
    """Give a PaddlePaddle optimizer the learning rate `lr`.

    Defined in :numref:`sec_multi_gpu_concise`"""
    optimizer.set_lr(lr)

import contextlib
import ipaddress
import logging
import multiprocessing.connection
import pickle
import signal
import socket
import subprocess
import tempfile
import threading
import traceback

import json
import warnings
import paddle.distributed as dist

def ddp_device(local_rank, local_world_size):
    """The launcher's GPU, else GPU `local_rank` if each gets one, else CPU.

    Defined in :numref:`sec_process_groups`"""
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

    Defined in :numref:`sec_process_groups`"""
    return 'nccl' if str(device).startswith('gpu') else 'gloo'

def free_port(host='127.0.0.1'):
    """Ask the operating system for a TCP port on `host` that is free now.

    Defined in :numref:`sec_process_groups`"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))  # port 0: let the system choose
        return probe.getsockname()[1]

@contextlib.contextmanager
def process_group(rank, world_size, init_method='env://', timeout_s=None,
                  device=None, local_rank=None, local_world_size=None):
    """Join the group the environment describes; yield this rank's device.

    Defined in :numref:`sec_process_groups`"""
    # spawn and the launcher describe the group in environment variables
    _check_rank(rank, world_size)
    _check_timeout(timeout_s)
    _group_from_env(rank, world_size, init_method)
    if local_rank is None:
        local_rank = _int_from_env('PADDLE_LOCAL_RANK', 0, rank)
    if local_world_size is None:
        local_world_size = _int_from_env('PADDLE_LOCAL_SIZE', 1, world_size)
    if device is None:
        device = ddp_device(local_rank, local_world_size)
    _set_group_timeout(timeout_s, device)
    paddle.set_device(device)
    if ddp_backend(device) == 'gloo':
        use_one_core(local_rank)  # a core is a device (sec_helpers)
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

def spawn_ranks(worker, world_size, *args, silence_s=60.0, backend=None):
    """Run worker(rank, world_size, *args) in new processes; their results.

    Defined in :numref:`sec_process_groups`"""
    _check_rank(0, world_size)
    _check_worker(worker, args)
    _check_timeout(silence_s, 'silence_s')
    if backend is None:
        backend = ddp_backend(ddp_device(0, world_size))
    if backend not in ('gloo', 'nccl'):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, "
                         f"got {backend!r}")
    with tempfile.TemporaryDirectory(prefix='d2l-ranks-') as out_dir, \
            _quiet_paddle_children(), _quiet_logger('root'):
        context = dist.spawn(_run_rank, args=(worker, args, out_dir,
                                              os.getpid(), dict(os.environ)),
                             nprocs=world_size, backend=backend, join=False,
                             start_method=_fork_server())
        _join_ranks(context, out_dir, world_size, silence_s)
        return _collect_results(out_dir, world_size)

def all_reduce_demo(rank, world_size, init_method):
    """Join a group, sum rank + 1 over all ranks; return what this rank saw.

    Defined in :numref:`sec_process_groups`"""
    with process_group(rank, world_size, init_method) as device:
        x = paddle.to_tensor([rank + 1.0])
        if world_size > 1:  # PaddlePaddle forms no group for one process
            dist.all_reduce(x)  # every rank receives the sum
        return {'rank': rank, 'pid': os.getpid(), 'device': device,
                'backend': ddp_backend(device), 'sum': x.item()}

def launcher_ranks():
    """(rank, world size, local rank, local world size) from the launcher.

    Defined in :numref:`sec_process_groups`"""
    names = ('PADDLE_TRAINER_ID', 'PADDLE_TRAINERS_NUM')
    missing = [name for name in names if name not in os.environ]
    if missing:
        raise RuntimeError(
            f'{", ".join(missing)} not set: start this script with '
            f'python -m paddle.distributed.launch, for example with '
            f'--nproc_per_node 2 {sys.argv[0]}')
    rank = _int_from_env('PADDLE_TRAINER_ID', 0)
    world_size = _int_from_env('PADDLE_TRAINERS_NUM', 1)
    # spawn describes one machine and leaves the local numbers out
    local_rank = _int_from_env('PADDLE_LOCAL_RANK', 0, rank)
    local_world_size = _int_from_env('PADDLE_LOCAL_SIZE', 1, world_size)
    _check_rank(rank, world_size)
    _check_rank(local_rank, local_world_size, 'local_rank')
    return rank, world_size, local_rank, local_world_size

@contextlib.contextmanager
def launcher_deadline(rank, world_size, timeout_s):
    """Give the body's groups `timeout_s`; end the process if none forms.

    Defined in :numref:`sec_process_groups`"""
    # it also says what this rank waits for
    global _launcher_timeout_s
    _check_rank(rank, world_size)
    _check_timeout(timeout_s)
    if timeout_s is None:
        raise ValueError('timeout_s must be a number of seconds, not None')
    where = _rendezvous_address()
    deadline = time.localtime(time.time() + timeout_s)
    until = time.strftime('%H:%M:%S %Z', deadline)
    print(f'rank {rank} waits for all {world_size} ranks at {where} until '
          f'{until} (timeout {timeout_s:g} s)', flush=True)
    message = (f'rank {rank}: no group formed at {where} within {timeout_s:g}'
               f' s; start all {world_size} ranks with this address, check '
               f'that its port is reachable, or give a larger timeout')
    watchdog = subprocess.Popen([sys.executable, '-c', _WATCHDOG, str(
        os.getpid()), str(timeout_s), message], stdin=subprocess.PIPE)
    done = threading.Event()
    threading.Thread(target=_stand_down, args=(watchdog, done, world_size),
                     daemon=True).start()
    _launcher_timeout_s = timeout_s
    try:
        yield
    finally:
        done.set()
        watchdog.wait()  # it ends when told to stand down
        _launcher_timeout_s = None

def fashion_mnist_tensors(split):
    """Fashion-MNIST images and labels as tensors; a subset in quick mode.

    Defined in :numref:`sec_ddp`"""
    images, labels = fashion_mnist_arrays(split, quick_mode(num_gpus()))
    return paddle.to_tensor(images), paddle.to_tensor(labels)

def _small_mlp(seed):
    """A two-layer MLP for 28x28 images, initialised from `seed`; no BN.

    Defined in :numref:`sec_ddp`"""
    paddle.seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(),
                         nn.Linear(64, 10))

def flat_parameters(net):
    """All parameters of `net` in one flat NumPy vector, in their order.

    Defined in :numref:`sec_ddp`"""
    return np.concatenate([p.numpy().reshape(-1) for p in net.parameters()])

def _wrap_ddp(net, device):
    """`net` in paddle.DataParallel, on the device process_group set.

    Defined in :numref:`sec_ddp`"""
    return paddle.DataParallel(net)

def _sgd(net, lr, momentum=0.0):
    """An SGD optimizer (with `momentum`) over the parameters of `net`.

    Defined in :numref:`sec_ddp`"""
    if momentum:
        return paddle.optimizer.Momentum(learning_rate=lr, momentum=momentum,
                                         parameters=net.parameters())
    return paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())

def shard_of_batch(X, y, step, rank, world_size, batch_size):
    """Rank `rank`'s `batch_size` examples of minibatch `step`, wrapping.

    Defined in :numref:`sec_ddp`"""
    start = (step * world_size + rank) * batch_size
    idx = np.arange(start, start + batch_size) % len(y)
    return X[idx], y[idx]

def sgd_on_shards(net, optimizer, rank, world_size, num_steps, batch_size,
                  device):
    """Take `num_steps` steps, rank `rank` training on its minibatch shard.

    Defined in :numref:`sec_ddp`"""
    X, y = fashion_mnist_tensors('train')
    for step in range(num_steps):
        X_shard, y_shard = shard_of_batch(X, y, step, rank, world_size,
                                          batch_size)
        y_hat = net(X_shard.to(device))
        loss = F.cross_entropy(y_hat, y_shard.to(y_hat.device))
        optimizer.zero_grad()
        loss.backward()  # a wrapped model averages gradients over ranks
        optimizer.step()
    return float(loss) if num_steps else None  # the last step's loss

def ddp_sgd_steps(rank, world_size, init_method, num_steps, batch_size, lr):
    """Worker: `num_steps` SGD steps on `_small_mlp`; returns parameters.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method) as device:
        # Seeds differ on purpose: the wrapper must make the copies agree.
        net = _wrap_ddp(_small_mlp(seed=rank), device)
        sgd_on_shards(net, _sgd(net, lr), rank, world_size, num_steps,
                      batch_size, device)
        return flat_parameters(net)

def sgd_steps_one_process(num_steps, batch_size, lr):
    """The same SGD in this process alone, starting from rank 0's model.

    Defined in :numref:`sec_ddp`"""
    net = _small_mlp(seed=0)
    sgd_on_shards(net, _sgd(net, lr), 0, 1, num_steps, batch_size, 'cpu')
    return flat_parameters(net)

def _timed_step(net, X, y):
    """Seconds that one forward and backward pass of `net` on (X, y) takes.

    Defined in :numref:`sec_ddp`"""
    began = time.perf_counter()
    F.cross_entropy(net(X), y).backward()
    return time.perf_counter() - began

def skew_demo(rank, world_size, init_method, delay_s, report_dir):
    """Time DataParallel steps while rank 1 is late once, then leaves.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method, device='cpu'):
        net = paddle.DataParallel(_small_mlp(seed=0))
        X, y = shard_of_batch(*fashion_mnist_tensors('train'), 0, rank,
                              world_size, 32)
        for _ in range(3):
            _timed_step(net, X, y)  # the first steps set things up
        seen = {'all on time': _timed_step(net, X, y)}
        if rank == 1:
            time.sleep(delay_s)
        seen['rank 1 late'] = _timed_step(net, X, y)
        seen['last step began at'] = time.time()
        with open(os.path.join(report_dir, f'rank{rank}.json'), 'w') as f:
            json.dump(seen, f)
        if rank == 1:
            dist.destroy_process_group()  # leave now, not waiting for rank 0
        else:
            _timed_step(net, X, y)  # finds rank 1 gone: aborts here

def checkpoint_demo(rank, world_size, init_method, path):
    """Train, save on rank 0, load on every rank; parameters before, after.

    Defined in :numref:`sec_ddp`"""
    with process_group(rank, world_size, init_method) as device:
        net = _wrap_ddp(_small_mlp(seed=0), device)
        optimizer = _sgd(net, 0.1, momentum=0.9)
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
    """`_small_mlp` in two: hidden layer on devices[0], output on [1].

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
    """DataParallel worker, model cut in two; its devices and parameters.

    Defined in :numref:`sec_ddp`"""
    devices = ['cpu', 'cpu']  # see the text: both halves on the CPU
    with process_group(rank, world_size, init_method, device=devices[0]):
        net = paddle.DataParallel(_TwoDeviceMLP(devices, seed=rank))
        sgd_on_shards(net, _sgd(net, lr), rank, world_size, num_steps,
                      batch_size, devices[0])
        return {'devices': devices, 'parameters': flat_parameters(net)}

def local_batch_size(batch_size, world_size):
    """Each process's share of a global minibatch of `batch_size`.

    Defined in :numref:`sec_ddp_resnet`"""
    if batch_size < world_size or batch_size % world_size:
        below = max(world_size, batch_size - batch_size % world_size)
        raise ValueError(
            f'a global batch of {batch_size} cannot be shared equally by '
            f'{world_size} processes; use a multiple of {world_size}, such as '
            f'{below} or {below + world_size}')
    return batch_size // world_size

_manual_seed = paddle.seed  # PyTorch calls it torch.manual_seed

def _sharded_loader(rank, world_size, local_batch):
    """This rank's loader over the training images, and its sampler.

    Defined in :numref:`sec_ddp_resnet`"""
    data = paddle.io.TensorDataset(list(fashion_mnist_tensors('train')))
    sampler = paddle.io.DistributedBatchSampler(
        data, local_batch, num_replicas=world_size, rank=rank, shuffle=True)
    return paddle.io.DataLoader(data, batch_sampler=sampler), sampler

def _share_rank0_statistics(net, world_size):
    """Give every rank rank 0's batch-norm statistics (untrained values).

    Defined in :numref:`sec_ddp_resnet`"""
    if world_size == 1:  # PaddlePaddle forms no group for one process
        return
    for p in net.parameters():
        if not p.trainable:
            dist.broadcast(p, src=0)

def _sum_over_ranks(values, device, world_size):
    """Elementwise sums of a list of numbers over all ranks, as floats.

    Defined in :numref:`sec_ddp_resnet`"""
    totals = paddle.to_tensor(values, dtype='float64')  # on the current device
    if world_size > 1:  # PaddlePaddle forms no group for one process
        dist.all_reduce(totals)
    return totals.tolist()

def evaluate_accuracy_ddp(net, device, rank, world_size, batch_size=256):
    """Test accuracy of `net`, each rank scoring every world_size-th image.

    Defined in :numref:`sec_ddp_resnet`"""
    _share_rank0_statistics(net, world_size)
    X, y = fashion_mnist_tensors('test')
    X, y = X[rank::world_size], y[rank::world_size]  # no image counted twice
    batches = [(X[i:i + batch_size], y[i:i + batch_size])
               for i in range(0, len(y), batch_size)]
    correct = round(evaluate_accuracy_gpu(net, batches, device) * len(y))
    correct, n = _sum_over_ranks([correct, len(y)], device, world_size)
    return correct / n

def _ddp_epoch(net, optimizer, train_iter, device, world_size, epoch):
    """One epoch on this rank's shards; return the mean loss over all ranks.

    Defined in :numref:`sec_ddp_resnet`"""
    net.train()
    loss_sum, n = 0.0, 0
    for X, y in train_iter:
        loss = F.cross_entropy(net(X.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += float(loss) * len(y)
        n += len(y)
    loss_sum, n = _sum_over_ranks([loss_sum, n], device, world_size)
    return loss_sum / n

def batch_norm_statistics_demo(rank, world_size, init_method, num_steps):
    """Train a BN perceptron in DataParallel; running mean before, after.

    Defined in :numref:`sec_ddp_resnet`"""
    # "after" is after a broadcast of rank 0's statistics
    with process_group(rank, world_size, init_method) as device:
        paddle.seed(0)
        norm = nn.BatchNorm1D(64)
        net = paddle.DataParallel(nn.Sequential(
            nn.Flatten(), nn.Linear(784, 64), norm, nn.ReLU(),
            nn.Linear(64, 10)))
        sgd_on_shards(net, _sgd(net, 0.1), rank, world_size, num_steps, 32,
                      device)
        trained = norm._mean.numpy().copy()
        dist.broadcast(norm._mean, src=0)
        return trained, norm._mean.numpy()

def warmup_cosine_lr(lr, epoch, num_epochs, warmup=0, start=0.0):
    """Rate of `epoch`: from `start` to `lr` in `warmup` epochs, then down.

    Defined in :numref:`sec_ddp_resnet`"""
    if epoch < warmup:
        return start + (lr - start) * epoch / warmup
    return d2l.cosine_lr(lr, epoch - warmup, num_epochs - warmup)

def _ddp_epochs(net, model, optimizer, loader, device, rank, world_size,
                num_epochs, lr, warmup):
    """The epochs of train_ddp, with a test after each; return a summary.

    Defined in :numref:`sec_ddp_resnet`"""
    (train_iter, sampler), timer = loader, Timer()
    summary = {'rank': rank, 'world_size': world_size, 'device': str(device),
               'backend': ddp_backend(device), 'train_loss': [],
               'test_acc': [], 'epoch_s': []}
    for epoch in range(num_epochs):
        set_learning_rate(optimizer, warmup_cosine_lr(
            lr, epoch, num_epochs, warmup, lr / world_size))
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        timer.start()
        summary['train_loss'].append(_ddp_epoch(
            net, optimizer, train_iter, device, world_size, epoch))
        summary['epoch_s'].append(timer.stop())
        summary['test_acc'].append(
            evaluate_accuracy_ddp(model, device, rank, world_size))
    sizes = [len(fashion_mnist_tensors(s)[1]) for s in ('train', 'test')]
    summary['data'] = describe_mode(quick_mode(num_gpus()), *sizes)
    summary['train_images'] = sizes[0]
    return summary

def train_ddp(rank, world_size, init_method, num_epochs, batch_size, lr,
              local_rank=None, local_world_size=None, warmup=0):
    """Train d2l.resnet18 on Fashion-MNIST at global batch `batch_size`.

    Defined in :numref:`sec_ddp_resnet`"""
    local_batch = local_batch_size(batch_size, world_size)
    with process_group(rank, world_size, init_method, local_rank=local_rank,
                       local_world_size=local_world_size) as device:
        loader = _sharded_loader(rank, world_size, local_batch)
        _manual_seed(0)
        model = resnet18(10)
        net = _wrap_ddp(model, device)
        # Tests use the bare model: the wrapper may exchange buffers.
        return _ddp_epochs(net, model, _sgd(net, lr), loader, device, rank,
                           world_size, num_epochs, lr, warmup)

def describe_ddp_run(summary):
    """A few lines about a distributed training run, from a rank's summary.

    Defined in :numref:`sec_ddp_resnet`"""
    if not summary.get('epoch_s'):
        raise ValueError('summary holds no epoch: pass what train_ddp '
                         'returned for num_epochs of at least 1')
    s = summary
    losses = ', '.join(f'{l:.3f}' for l in s['train_loss'])
    accuracies = ', '.join(f'{a:.3f}' for a in s['test_acc'])
    k = s['world_size']
    return (f'{k} process{"es" if k > 1 else ""}, backend {s["backend"]}, '
            f'rank {s["rank"]} on {s["device"]}\n{s["data"]}\n'
            f'training loss per epoch: {losses}\n'
            f'test accuracy per epoch: {accuracies}\n'
            f'test accuracy {s["test_acc"][-1]:.3f}, '
            f'{sum(s["epoch_s"]) / len(s["epoch_s"]):.1f} s/epoch')

def timing_batch(global_batch):
    """The first `global_batch` training images and labels, for timing runs.

    Defined in :numref:`sec_ddp_resnet`"""
    return shard_of_batch(*fashion_mnist_tensors('train'), 0, 0, 1,
                          global_batch)

def _use_threads(threads):
    """On a CPU, let this process run `threads` threads on all usable cores.

    Defined in :numref:`sec_ddp_resnet`"""
    if threads > 1:
        if hasattr(os, 'sched_setaffinity'):  # undo use_one_core's pinning
            for thread in os.listdir('/proc/self/task'):
                try:
                    os.sched_setaffinity(int(thread), range(os.cpu_count()))
                except OSError:  # a thread that ended meanwhile
                    pass
        _set_threads(threads)

_set_threads = paddle.base.core.set_num_threads

def time_steps(net, optimizer, X, y, num_steps, warmup, device):
    """Average seconds per SGD step on (X, y) after `warmup` untimed steps.

    Defined in :numref:`sec_ddp_resnet`"""
    for n in (warmup, num_steps):
        began = time.perf_counter()
        for _ in range(n):
            optimizer.clear_grad()
            F.cross_entropy(net(X), y).backward()
            optimizer.step()
        if num_gpus():
            paddle.device.cuda.synchronize()  # GPUs run ahead of Python
    return (time.perf_counter() - began) / num_steps

def _timing_model(model_fn, device):
    """The model to time (ResNet-18 by default) on `device`, its optimizer.

    Defined in :numref:`sec_ddp_resnet`"""
    paddle.seed(0)
    net = _wrap_ddp(model_fn() if model_fn else resnet18(10), device)
    return net, _sgd(net, 0.01)

def time_ddp(world_size, global_batch, num_steps, warmup=1, model_fn=None,
             threads=1):
    """Seconds per step of `world_size` processes sharing `global_batch`.

    Defined in :numref:`sec_ddp_resnet`"""
    local_batch_size(global_batch, world_size)  # fail here, not in a child
    init_method = _timing_rendezvous()
    with _environment(_thread_environment(threads)):
        return spawn_ranks(_time_ddp_worker, world_size, init_method,
                           global_batch, num_steps, warmup, model_fn,
                           threads)[0]

def _time_ddp_worker(rank, world_size, init_method, global_batch, num_steps,
                     warmup, model_fn, threads):
    """One process of time_ddp: time its shard; the slowest rank's time.

    Defined in :numref:`sec_ddp_resnet`"""
    with process_group(rank, world_size, init_method) as device:
        if not num_gpus():
            _use_threads(threads)
        net, optimizer = _timing_model(model_fn, device)
        X, y = shard_of_batch(*fashion_mnist_tensors('train'), 0, rank,
                              world_size, global_batch // world_size)
        seconds = [0.0] * world_size
        X, y = _to_device(X, device), _to_device(y, device)
        seconds[rank] = time_steps(net, optimizer, X, y, num_steps, warmup,
                                   device)
        return max(_sum_over_ranks(seconds, device, world_size))

def _thread_environment(threads):
    """Defined in :numref:`sec_ddp_resnet`"""
    return {}  # set in the process: _use_threads

def _timing_rendezvous():
    """Defined in :numref:`sec_ddp_resnet`"""
    return 'env://'

def _to_device(x, device):
    """`x` on `device` (the current device already holds it).

    Defined in :numref:`sec_ddp_resnet`"""
    return x

import math

def _check_per_device(data, name):
    """Reject an empty list or tensors of different shapes, naming the argument.

    Defined in :numref:`sec_sharded_data_parallel`"""
    if not isinstance(data, (list, tuple)):
        raise ValueError(f'{name} must be a list with one tensor per device; '
                         f'got {type(data).__name__}')
    if len(data) == 0:
        raise ValueError(f'{name} is empty; pass one tensor per device')
    if any(tuple(x.shape) != tuple(data[0].shape) for x in data):
        raise ValueError(f'{name} must hold tensors of one shape, got '
                         f'{[tuple(x.shape) for x in data]}')

def _flat(x):
    """`x` as a 1-D tensor outside any autograd graph.

    Defined in :numref:`sec_sharded_data_parallel`"""
    return x.detach().reshape([-1])

def _tensors_on(device):
    """A context in which new tensors are made on `device`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    return paddle.device.device_guard(device)

def _device(x):
    """The device that holds `x`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    return _typed_place(x.place)

_concat, _zeros_like = paddle.concat, paddle.zeros_like

def reduce_scatter(data):
    """Sum same-shaped tensors on k devices; device i gets shard i of it.

    Defined in :numref:`sec_sharded_data_parallel`"""
    bounds = [0, *itertools.accumulate(
        shard_sizes(math.prod(data[0].shape), len(data)))]
    shards = []
    for i, x in enumerate(data):
        lo, hi, device = bounds[i], bounds[i + 1], _device(x)
        with _tensors_on(device):
            total = d2l.copy_to(_flat(x)[lo:hi], device)
            for j, other in enumerate(data):
                if j != i and hi > lo:  # MXNet cannot add empty arrays
                    # shard i of device j's tensor
                    total += d2l.copy_to(_flat(other)[lo:hi], device)
        shards.append(total)
    return shards

def all_gather(shards):
    """Concatenate the flat shards of k devices, the whole on every device.

    Defined in :numref:`sec_sharded_data_parallel`"""
    if len(shards) == 0 or any(len(s.shape) != 1 for s in shards):
        raise ValueError('shards must be a non-empty list of 1-D tensors, '
                         'one per device (flatten them first)')
    gathered = []
    for x in shards:
        with _tensors_on(_device(x)):
            gathered.append(
                _concat([d2l.copy_to(s, _device(x)) for s in shards]))
    return gathered

def unflatten(flat, shapes):
    """Views of the flat tensor `flat` in the given `shapes`, in order.

    Defined in :numref:`sec_sharded_data_parallel`"""
    sizes = [math.prod(shape) for shape in shapes]
    if len(flat.shape) != 1 or flat.shape[0] != sum(sizes):
        raise ValueError(f'flat must be a 1-D tensor of {sum(sizes)} elements '
                         f'for these shapes; got shape {tuple(flat.shape)}')
    bounds = [0, *itertools.accumulate(sizes)]
    return [flat[lo:hi].reshape(tuple(shape))
            for lo, hi, shape in zip(bounds, bounds[1:], shapes)]

def lenet_flat_grad(flat, X, y):
    """Gradient of LeNet's summed loss on (X, y) at flat parameters `flat`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    with paddle.device.device_guard(_typed_place(flat.place)):
        w = flat.detach()
        w.stop_gradient = False
        cross_entropy_sum(lenet(X, unflatten(w, LENET_SHAPES)), y).backward()
    return w.grad

def check_stage(stage):
    """Reject a ZeRO stage other than 0 (plain data parallelism), 1, 2 or 3.

    Defined in :numref:`sec_sharded_data_parallel`"""
    if not d2l._is_int(stage) or not 0 <= stage <= 3:
        raise ValueError(f'stage must be 0 (plain data parallelism), 1, 2 '
                         f'or 3, got {stage!r}')

def _check_zero_args(params, devices):
    """Reject an empty parameter list or device list, saying what to pass.

    Defined in :numref:`sec_sharded_data_parallel`"""
    if not isinstance(params, (list, tuple)) or len(params) == 0:
        raise ValueError('params must be a non-empty list of tensors, such '
                         'as d2l.lenet_params()')
    if not isinstance(devices, (list, tuple)) or len(devices) == 0:
        raise ValueError('devices must be a non-empty list of devices, such '
                         'as d2l.try_gpus(2)')

def _check_zero_states(states, devices, stage):
    """Reject states that zero_init did not build for these devices and `stage`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    _check_zero_args(states, devices)
    if len(states) != len(devices):
        raise ValueError(f'states holds {len(states)} device states but '
                         f'devices names {len(devices)}; pass what zero_init '
                         f'returned for these devices')
    n = sum(math.prod(shape) for shape in LENET_SHAPES)
    own = shard_sizes(n, len(devices))[0]
    needed = (own if stage == 3 else n, own if stage >= 2 else n,
              own if stage >= 1 else n)
    held = tuple(x.shape[0] for x in states[0].values())  # in zero_init's order
    if held != needed:
        raise ValueError(f'states hold {held} parameters, gradients and '
                         f'momentum on device 0, but stage {stage} needs '
                         f'{needed}; pass the stage given to zero_init')

def zero_init(params, devices, stage):
    """Each device's flat parameters, gradients, momentum for ZeRO `stage`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    flat = _concat([_flat(p) for p in params])
    sizes = shard_sizes(flat.shape[0], len(devices))
    bounds = [0, *itertools.accumulate(sizes)]
    states = []
    for i, device in enumerate(devices):
        with _tensors_on(device):
            mine = d2l.copy_to(flat[bounds[i]:bounds[i + 1]], device)
            full = mine if stage == 3 else d2l.copy_to(flat, device)
            states.append({
                'params': full,
                'grads': _zeros_like(mine if stage >= 2 else full),
                'momentum': _zeros_like(mine if stage >= 1 else full)})
    return states

def zero_step(X, y, states, devices, stage, lr, momentum=0.9):
    """One momentum-SGD step of LeNet on k devices with ZeRO `stage`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    # stage 0 is plain data parallelism
    X_shards, y_shards = split_batch(X, y, devices)
    fulls = [s['params'] for s in states]
    if stage == 3:  # gathered just before use ...
        fulls = all_gather(fulls)
    grads = [lenet_flat_grad(w, X_s, y_s)
             for w, X_s, y_s in zip(fulls, X_shards, y_shards)]
    del fulls  # ... and freed right after
    if stage == 0:
        allreduce(grads)
    else:  # an update needs only the summed gradient of its own shard
        grads = reduce_scatter(grads)
    bounds = [0, *itertools.accumulate(shard_sizes(
        sum(math.prod(shape) for shape in LENET_SHAPES), len(devices)))]
    owned = [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    _zero_update(states, grads, owned, devices, stage, lr / X.shape[0],
                 momentum)

def _zero_update(states, grads, owned, devices, stage, lr, momentum):
    """Momentum-SGD update of the parameters each device owns, in place.

    Defined in :numref:`sec_sharded_data_parallel`"""
    for s, g, own, device in zip(states, grads, owned, devices):
        with _tensors_on(device):
            if stage == 1:  # the full-size buffer receives its shard
                s['grads'][own] = g
            else:
                s['grads'][:] = g
            g = s['grads'][own] if stage == 1 else s['grads']
            s['momentum'][:] = momentum * s['momentum'] + g
            if stage in (1, 2):  # slice assignment writes into the state
                s['params'][own] = s['params'][own] - lr * s['momentum']
            else:
                s['params'][:] = s['params'] - lr * s['momentum']
    if stage in (1, 2):  # everybody needs everybody's new parameters
        new = all_gather([s['params'][own] for s, own in zip(states, owned)])
        for s, w, device in zip(states, new, devices):
            with _tensors_on(device):
                s['params'][:] = w

def state_bytes(state):
    """Bytes that one device's ZeRO state holds, per kind of tensor.

    Defined in :numref:`sec_sharded_data_parallel`"""
    if not isinstance(state, dict):
        raise ValueError('state must be one device\'s dictionary from '
                         'zero_init, such as states[0]')
    return {kind: x.size * x.element_size() for kind, x in state.items()}

def zero_params(states, stage):
    """A ZeRO run's full flat parameters as a NumPy array, sharded or not.

    Defined in :numref:`sec_sharded_data_parallel`"""
    check_stage(stage)
    if not isinstance(states, (list, tuple)) or len(states) == 0:
        raise ValueError('states must be the non-empty list from zero_init')
    if stage == 3:
        return np.concatenate([s['params'].numpy() for s in states])
    return states[0]['params'].numpy()

import queue

def split_stages(layers, num_stages):
    """Cut a list of layers into `num_stages` consecutive groups.

    Defined in :numref:`sec_pipeline`"""
    layers = list(layers)
    if num_stages > len(layers):
        raise ValueError(f'num_stages={num_stages} exceeds the {len(layers)} '
                         f'layers; every stage needs at least one layer')
    bounds = [0, *itertools.accumulate(shard_sizes(len(layers), num_stages))]
    return [layers[lo:hi] for lo, hi in zip(bounds, bounds[1:])]

def pipeline_mlp(depth, width, seed=0):
    """An MLP on flat images as a list of `depth` blocks, 10 scores out.

    Defined in :numref:`sec_pipeline`"""
    _manual_seed(seed)
    sizes = [784] + [int(width)] * (int(depth) - 1) + [10]
    return [nn.Sequential(nn.Linear(a, b), nn.ReLU()) if j < depth - 1
            else nn.Linear(a, b)
            for j, (a, b) in enumerate(zip(sizes, sizes[1:]))]

def bubble_fraction(num_stages, num_microbatches):
    """Idle share (p-1)/(m+p-1) of a pipeline of equal steps.

    Defined in :numref:`sec_pipeline`"""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)

def pipeline_schedule(kind, num_stages, num_microbatches):
    """Steps (stage, 'F' or 'B', micro-batch) of GPipe or 1F1B.

    Defined in :numref:`sec_pipeline`"""
    if kind not in ('gpipe', '1f1b'):
        raise ValueError(f"kind must be 'gpipe' or '1f1b', got {kind!r}")
    p, m = num_stages, num_microbatches
    orders = []
    for s in range(p):
        ahead = m if kind == 'gpipe' else min(p - 1 - s, m)
        order = [('F', i) for i in range(ahead)]
        for i in range(m - ahead):  # one forward, one backward
            order += [('F', ahead + i), ('B', i)]
        orders.append(order + [('B', i) for i in range(m - ahead, m)])
    return _interleave(orders)

def check_schedule(schedule, num_stages, num_microbatches):
    """Refuse a schedule that misses, repeats or misorders a step.

    Defined in :numref:`sec_pipeline`"""
    p, m = num_stages, num_microbatches
    steps = {(s, op, i) for s in range(p) for op in 'FB' for i in range(m)}
    schedule = [tuple(t) if isinstance(t, (tuple, list)) else t
                for t in schedule]
    for j, step in enumerate(schedule):
        if step not in steps or step in schedule[:j]:
            raise ValueError(f'step {step!r} ' + (
                'appears twice' if step in steps else f"is not (stage < {p}"
                f", 'F' or 'B', micro-batch < {m})"))
    if steps - set(schedule):
        raise ValueError(f'the schedule never runs step(s) '
                         f'{sorted(steps - set(schedule))}')
    for j, step in enumerate(schedule):
        missing = [n for n in _needs(*step, p) if n not in schedule[:j]]
        if missing:
            raise ValueError(f'step {step!r} comes before {missing[0]!r}, '
                             f'which it needs')

def _grads(layers):
    """The parameters' gradients as NumPy arrays, then cleared.

    Defined in :numref:`sec_pipeline`"""
    params = [p for layer in layers for p in layer.parameters()]
    grads = [p.grad.numpy() for p in params]
    for p in params:
        p.clear_gradient()
    return grads

_place = lambda layers, device: [l.to(device=device) for l in layers]
_thread_setup = lambda: None  # nothing to prepare in a new thread
_sync = lambda x: x.place.is_gpu_place() and paddle.device.synchronize()
_rendezvous = lambda: 'env://'  # spawn_ranks describes the group

def _forward(layers, x, y, num_examples):
    """Record a forward pass of `layers`, with the loss if y is given.

    Defined in :numref:`sec_pipeline`"""
    _track(x)  # x is a fresh copy: it collects the gradient to pass back
    outs = []
    with _record():
        for layer in layers:
            outs.append(layer(outs[-1] if outs else x))
        if y is not None:
            outs.append(cross_entropy_sum(outs[-1], y) / num_examples)
    _sync(outs[-1])
    return x, outs

def _backward(x, out, grad):
    """Backward pass from `out` with gradient `grad`; x's gradient.

    Defined in :numref:`sec_pipeline`"""
    out.backward(grad)
    _sync(x.grad)
    return x.grad

def run_stage(layers, stage, num_stages, steps, Xs, ys, device, send, recv):
    """Run one stage's steps (op, micro-batch); times, peak bytes, loss.

    Defined in :numref:`sec_pipeline`"""
    last, n = stage == num_stages - 1, sum(x.shape[0] for x in Xs)
    held, held_bytes, peak, loss, times = {}, 0, 0, 0.0, []
    for op, i in steps:
        if op == 'F':
            x = Xs[i] if stage == 0 else recv(stage - 1, 'F', i)
            start = time.perf_counter()
            y = d2l.copy_to(ys[i], device) if last else None
            x, outs = _forward(layers, d2l.copy_to(x, device), y, n)
            nbytes = 4 * sum(math.prod(t.shape) for t in [x, *outs])  # fp32
            held[i], held_bytes = (x, outs[-1], nbytes), held_bytes + nbytes
            peak = max(peak, held_bytes)
            loss += float(outs[-1].detach()) if last else 0.0
            times.append((stage, op, i, start, time.perf_counter()))
            if not last:
                send(stage + 1, 'F', i, outs[-1])
        else:
            grad = None if last else recv(stage + 1, 'B', i)
            start = time.perf_counter()
            x, out, nbytes = held.pop(i)
            g = _backward(x, out, None if last else d2l.copy_to(grad, device))
            held_bytes -= nbytes
            times.append((stage, op, i, start, time.perf_counter()))
            if stage > 0:
                send(stage - 1, 'B', i, g)
    return {'times': times, 'peak_bytes': peak, 'loss': loss}

def split_microbatches(X, y, num_microbatches):
    """Cut a minibatch into `num_microbatches` nearly equal parts.

    Defined in :numref:`sec_pipeline`"""
    if num_microbatches > X.shape[0]:
        raise ValueError(f'num_microbatches={num_microbatches} exceeds the '
                         f'{X.shape[0]} examples of the minibatch')
    sizes = shard_sizes(X.shape[0], num_microbatches)
    parts = [(sum(sizes[:j]), sum(sizes[:j + 1])) for j in range(len(sizes))]
    return [X[lo:hi] for lo, hi in parts], [y[lo:hi] for lo, hi in parts]

def run_pipeline(stages, schedule, X, y, num_microbatches, timeout_s=60.0):
    """Run `schedule` with a thread per stage; times, peak bytes, loss.

    Defined in :numref:`sec_pipeline`"""
    p = len(stages)
    check_schedule(schedule, p, num_microbatches)
    Xs, ys = split_microbatches(X, y, num_microbatches)
    devices, failed, records, errors = try_gpus(p), threading.Event(), \
        [None] * p, []
    send, recv = _queue_link(p, num_microbatches, timeout_s, failed)
    def body(s):
        _thread_setup()
        device = devices[s % len(devices)]
        try:
            _place(stages[s], device)
            records[s] = run_stage(stages[s], s, p, [
                (op, i) for st, op, i in schedule if st == s], Xs, ys,
                device, send, recv)
        except BaseException as error:
            errors.append((isinstance(error, TimeoutError), s, error))
            failed.set()
    threads = [threading.Thread(target=body, args=(s,), daemon=True)
               for s in range(p)]
    for t in threads:
        t.start()
    for t in threads:  # a bound for the whole run
        t.join(timeout_s * (2 * num_microbatches + 1))
    if errors or any(t.is_alive() for t in threads):  # the cause, not a wait
        _, s, error = min(errors, default=(0, '?', 'deadline passed'))
        raise RuntimeError(f'stage {s} failed: {error}')
    return _merge(records)

def _pipeline_worker(rank, world_size, init_method, runs, X, y, depth, width,
                     timeout_s):
    """Worker: run each (schedule, m) of `runs` as stage `rank`.

    Defined in :numref:`sec_pipeline`"""
    with process_group(rank, world_size, init_method) as device:
        stages = split_stages(pipeline_mlp(depth, width), world_size)
        X, y = tensor(X), tensor(y)
        shapes = {m: [_stage_shapes(stages, x) for x in
                      split_microbatches(X, y, m)[0]] for _, m in runs}
        _place(stages[rank], device)
        records = []
        for schedule, m in runs:
            Xs, ys = split_microbatches(X, y, m)
            send, recv, finish = _p2p_link(shapes[m], timeout_s, device)
            dist.barrier()  # the stages start each run together
            records.append(run_stage(stages[rank], rank, world_size, [
                (op, i) for s, op, i in schedule if s == rank], Xs, ys,
                device, send, recv))
            finish()
            grads = _grads(stages[rank])
        records[-1]['grads'] = grads
        return records

def time_pipeline(runs, num_stages, X, y, depth, width, timeout_s=60.0):
    """Run each (schedule, m) of `runs` with a process per stage.

    Defined in :numref:`sec_pipeline`"""
    ranks = spawn_ranks(_pipeline_worker, num_stages, _rendezvous(), runs,
                        X.cpu().numpy(), y.cpu().numpy(), depth, width,
                        timeout_s)
    records = [_merge([r[j] for r in ranks]) for j in range(len(runs))]
    records[-1]['grads'] = [g for r in ranks for g in r[-1]['grads']]
    return records

def idle_fraction(times):
    """Share of the stages' time in a run that no step used.

    Defined in :numref:`sec_pipeline`"""
    if not times:
        raise ValueError("times must hold a run's steps, as run_pipeline's")
    span = max(t[4] for t in times) - min(t[3] for t in times)
    busy = sum(end - start for *_, start, end in times)
    return 1 - busy / (len({t[0] for t in times}) * span)

class CountingAllreduce:
    """Sums tensors in place over the ranks of `group`; counts the bytes."""
    def __init__(self, group=None):
        """Defined in :numref:`sec_tensor_parallelism`"""
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.sent = {}  # bytes by exchange name

    def __call__(self, x, name):
        if self.size > 1:  # one rank sends nothing
            self.sent[name] = self.sent.get(name, 0) + _nbytes(x)
            dist.all_reduce(x, group=self.group)
        return x

class _CopyToRanks(paddle.autograd.PyLayer):
    """Identity forward; the backward pass sums the gradient over the ranks.

    Defined in :numref:`sec_tensor_parallelism`"""
    @staticmethod
    def forward(ctx, x, allreduce):
        ctx.allreduce = allreduce
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.allreduce(grad.clone(), 'backward')

class _SumOverRanks(paddle.autograd.PyLayer):
    """The forward pass sums over the ranks; identity backward.

    Defined in :numref:`sec_tensor_parallelism`"""
    @staticmethod
    def forward(ctx, x, allreduce):
        return allreduce(x.clone(), 'forward')

    @staticmethod
    def backward(ctx, grad):
        return grad

class ColumnParallelLinear(nn.Layer):
    """This rank's block of the output columns of the linear layer `linear`.

    Defined in :numref:`sec_tensor_parallelism`"""
    shard_axes = (1, 0)  # weight (in, out) and bias are cut by output

    def __init__(self, linear, allreduce):
        super().__init__()
        _check_arrangement(allreduce, 1, linear.weight.shape,
                           float(linear.weight.sum()))
        cut = _tp_slice(linear.weight.shape[1], allreduce)
        self.weight = _parameter(self, linear.weight.numpy()[:, cut])
        self.bias = _parameter(self, linear.bias.numpy()[cut])
        self.allreduce = allreduce

    def forward(self, X):
        X = _CopyToRanks.apply(X, self.allreduce)
        return X @ self.weight + self.bias

class RowParallelLinear(nn.Layer):
    """This rank's block of the input rows of `linear`; sums the outputs.

    Defined in :numref:`sec_tensor_parallelism`"""
    shard_axes = (0, None)  # the bias is whole on every rank

    def __init__(self, linear, allreduce):
        super().__init__()
        _check_arrangement(allreduce, 2, linear.weight.shape,
                           float(linear.weight.sum()))
        cut = _tp_slice(linear.weight.shape[0], allreduce)
        self.weight = _parameter(self, linear.weight.numpy()[cut])
        self.bias = _parameter(self, linear.bias.numpy())
        self.allreduce = allreduce

    def forward(self, H):
        _check_row_input(H.shape[-1], self.weight.shape[0],
                         self.allreduce.size)
        partial = H @ self.weight
        return _SumOverRanks.apply(partial, self.allreduce) + self.bias

def block_mlp(d, hidden, seed=0):
    """A transformer-style MLP block, d -> hidden -> ReLU -> d, from `seed`.

    Defined in :numref:`sec_tensor_parallelism`"""
    _manual_seed(seed)
    return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(),
                         nn.Linear(hidden, d))

def tp_mlp(mlp, allreduce):
    """This rank's part of `mlp` (linear, ReLU, linear), split in two ways.

    Defined in :numref:`sec_tensor_parallelism`"""
    return nn.Sequential(ColumnParallelLinear(mlp[0], allreduce), mlp[1],
                         RowParallelLinear(mlp[2], allreduce))

def mlp_pass(net, X, Y):
    """Output, loss and gradients (input's, then parameters') of one pass.

    Defined in :numref:`sec_tensor_parallelism`"""
    X = X.clone()
    _track(X)  # the input's gradient is wanted too
    Z = net(X)
    loss = ((Z - Y) ** 2).mean()
    loss.backward()
    return {'Z': _to_numpy(Z), 'loss': loss.item(), 'dX': _to_numpy(X.grad),
            'grads': [_to_numpy(p.grad) for p in net.parameters()]}

def mlp_data(batch_size, d, seed=0):
    """A random minibatch: inputs and targets, both batch_size x d.

    Defined in :numref:`sec_tensor_parallelism`"""
    rng = numpy.random.default_rng(seed)
    return [_from_numpy(rng.standard_normal((batch_size, d)).astype('float32'))
            for _ in range(2)]

def tp_mlp_worker(rank, world_size, init_method, d, hidden, batch_size):
    """Worker: one pass of the tensor-parallel MLP block; results and bytes.

    Defined in :numref:`sec_tensor_parallelism`"""
    with _group(rank, world_size, init_method):
        allreduce = CountingAllreduce()
        net = tp_mlp(block_mlp(d, hidden), allreduce)
        result = mlp_pass(net, *mlp_data(batch_size, d))
        return dict(result, sent=dict(allreduce.sent), axes=_shard_axes(net))

def gather_shards(results, key='grads'):
    """Whole arrays from the slices that the ranks returned under `key`.

    Defined in :numref:`sec_tensor_parallelism`"""
    return [results[0][key][i] if axis is None else
            numpy.concatenate([r[key][i] for r in results], axis)
            for i, axis in enumerate(results[0]['axes'])]

def fleet_tp_demo(rank, world_size, init_method, d, hidden):
    """Worker: try PaddlePaddle's tensor-parallel layers on this device.

    Defined in :numref:`sec_tensor_parallelism`"""
    from paddle.distributed import fleet
    with process_group(rank, world_size, init_method):
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {'dp_degree': 1, 'pp_degree': 1,
                                   'mp_degree': world_size}
        fleet.init(is_collective=True, strategy=strategy)
        layers = fleet.meta_parallel
        column = layers.ColumnParallelLinear(d, hidden, gather_output=False,
                                             has_bias=True)
        shapes = {'column weight': list(column.weight.shape)}
        try:
            column(mlp_data(4, d)[0])
        except RuntimeError as error:  # it names the operation it lacks
            op = 'c_identity' if 'c_identity' in str(error) else 'one step'
            return shapes, f'RuntimeError, no CPU kernel for {op}'
        return shapes, 'ran'

def mesh_allreduces(dp, tp):
    """This rank's (data, tensor) CountingAllreduce in a dp x tp mesh.

    Defined in :numref:`sec_tensor_parallelism`"""
    _check_mesh(dp, tp, dist.get_world_size())
    rank, groups = dist.get_rank(), {}
    for i in range(dp):  # every rank creates every group, in this order
        ranks = [i * tp + j for j in range(tp)]
        groups[tuple(ranks)] = _new_group(ranks)
    for j in range(tp):
        ranks = [i * tp + j for i in range(dp)]
        groups[tuple(ranks)] = _new_group(ranks)
    mine = [g for ranks, g in groups.items() if rank in ranks]
    return CountingAllreduce(mine[1]), CountingAllreduce(mine[0])

def mesh_worker(rank, world_size, init_method, d, hidden, batch_size):
    """Worker: one pass of the MLP block on a 2 x 2 mesh, and its bytes.

    Defined in :numref:`sec_tensor_parallelism`"""
    with _group(rank, world_size, init_method):
        data, tensor = mesh_allreduces(2, 2)
        net = tp_mlp(block_mlp(d, hidden), tensor)
        half = slice(rank // 2 * batch_size // 2,
                     (rank // 2 + 1) * batch_size // 2)
        X, Y = mlp_data(batch_size, d)
        result = mlp_pass(net, X[half], Y[half])
        grads = [_to_numpy(data(_from_numpy(g), 'gradients')) / 2
                 for g in result['grads']]
        return {'grads': grads, 'axes': _shard_axes(net),
                'tensor': dict(tensor.sent), 'data': dict(data.sent)}

import contextlib
import math
import numbers
import statistics
import time

def ring_allreduce_time(num_bytes, k, alpha, beta):
    """Alpha-beta seconds of a ring allreduce of `num_bytes` over `k` ranks.

    Defined in :numref:`sec_cost_model`"""
    return 2 * (k - 1) * (alpha + beta * num_bytes / k)

def naive_allreduce_time(num_bytes, k, alpha, beta):
    """Alpha-beta seconds of a naive allreduce (all through device 0).

    Defined in :numref:`sec_cost_model`"""
    return 2 * (k - 1) * (alpha + beta * num_bytes)

def ps_pushpull_time(num_bytes, k, alpha, beta, servers=1):
    """Seconds of a push and a pull through `servers` parameter servers.

    Defined in :numref:`sec_cost_model`"""
    return 2 * (alpha + beta * num_bytes * max(1, k / servers))

def fit_alpha_beta(num_bytes, seconds, k):
    """Ring-model alpha (s/message) and beta (s/byte) fitted to timings.

    Defined in :numref:`sec_cost_model`"""
    # the timings are allreduces over `k` processes
    num_bytes, seconds = list(num_bytes), list(seconds)
    w = [1 / t ** 2 for t in seconds]  # relative, not absolute, errors
    s0, s1, s2 = (sum(wi * n ** e for wi, n in zip(w, num_bytes))
                  for e in (0, 1, 2))
    st, snt = (sum(wi * n ** e * t for wi, n, t in zip(w, num_bytes, seconds))
               for e in (0, 1))
    det = s0 * s2 - s1 * s1
    a, b = (s2 * st - s1 * snt) / det, (s0 * snt - s1 * st) / det
    if a < 0:  # noise pushed the intercept below zero: no latency at all
        a, b = 0.0, snt / s2
    if not b > 0:
        raise ValueError('the timings do not grow with the size, so no '
                         'bandwidth can be fitted; measure more or larger')
    return a / (2 * (k - 1)), b * k / (2 * (k - 1))

def fit_ps_alpha_beta(num_bytes, seconds, k, servers=1):
    """Alpha and beta of the parameter-server model, fitted to timings.

    Defined in :numref:`sec_cost_model`"""
    # The same line t = a + b n: fit it as a ring of two, then convert.
    a2, b2 = fit_alpha_beta(num_bytes, seconds, 2)  # a = 2 a2, b = b2
    return a2, b2 / (2 * max(1, k / servers))

def ddp_buckets(num_bytes, bucket_cap_mb=25, first_bucket_mb=1):
    """Byte sizes of DDP's gradient buckets for `num_bytes` of gradients.

    Defined in :numref:`sec_cost_model`"""
    # parameter boundaries are ignored
    first = min(num_bytes, first_bucket_mb * 2 ** 20)
    buckets, rest = ([first] if first else []), num_bytes - first
    while rest > 0:
        buckets.append(min(rest, bucket_cap_mb * 2 ** 20))
        rest -= buckets[-1]
    return buckets

def predict_step_time(t_compute, num_bytes, k, alpha, beta, cores=None,
                      threads=1, bucket_cap_mb=25, accumulate=1, overlap=0.0):
    """Predicted seconds per micro-batch of a k-process DDP step.

    Defined in :numref:`sec_cost_model`"""
    # shared-core compute plus the allreduces that compute does not hide
    # Processes taking turns on the CPU's cores; None: a device per process.
    share = 1.0 if cores is None else max(1.0, k * threads / cores)
    comm = sum(ring_allreduce_time(b, k, alpha, beta)
               for b in ddp_buckets(num_bytes, bucket_cap_mb))
    return t_compute * share + (1 - overlap) * comm / accumulate

def predict_pipeline_time(t_stage, num_stages, num_microbatches,
                          message_bytes, alpha, beta):
    """Seconds per pipelined step: the bubble plus the sends that fill it.

    Defined in :numref:`sec_cost_model`"""
    p, m = num_stages, num_microbatches
    return (m + p - 1) / m * t_stage + 2 * (p - 1) * (
        alpha + beta * message_bytes)

def predict_tensor_time(t_compute, k, activation_bytes, alpha, beta,
                        blocks=1, collective=None):
    """Seconds per tensor-parallel pass: compute/k plus 2 allreduces/block.

    Defined in :numref:`sec_cost_model`"""
    exchange = collective or ring_allreduce_time  # or ps_pushpull_time
    return t_compute / k + 2 * blocks * exchange(activation_bytes, k,
                                                 alpha, beta)

def pipeline_work_and_span(times):
    """The busiest stage's step seconds and the run's span, from its times.

    Defined in :numref:`sec_cost_model`"""
    if not times:
        raise ValueError("times must hold a run's steps, as time_pipeline's")
    busy = {}
    for s, _, _, start, end in times:
        busy[s] = busy.get(s, 0.0) + end - start
    return max(busy.values()), max(t[4] for t in times) - min(
        t[3] for t in times)

def time_tensor_parallel(k, d, hidden, batch_size, num_steps=2, reps=3):
    """Median seconds per pass of the whole MLP block and of its k parts.

    Defined in :numref:`sec_cost_model`"""
    return _slowest_medians(spawn_ranks(
        _tp_timing_worker, k, _rendezvous(), d, hidden, batch_size,
        num_steps, reps))

import math
import numbers
import os
import sys
import paddle
import paddle.nn.functional as F

def _is_int(value):
    """Whether `value` is an integer of any type, NumPy's too, but no bool.

    Defined in :numref:`sec_d2l_package`"""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)

def _check_count(value, name, least=0):
    """Reject `value` unless it is an integer of at least `least`; name it.

    Defined in :numref:`sec_d2l_package`"""
    if not _is_int(value) or value < least:
        kind = {0: 'a non-negative integer', 1: 'a positive integer'}.get(
            least, f'an integer of at least {least}')
        raise ValueError(f'{name} must be {kind}, got {value!r}')

def _check_positive_int(value, name):
    """Reject `value` unless it is a positive integer, naming it as `name`.

    Defined in :numref:`sec_d2l_package`"""
    _check_count(value, name, 1)

def _check_gpu_index(i):
    """Reject a GPU index that is not a non-negative integer, saying so.

    Defined in :numref:`sec_d2l_package`"""
    if not _is_int(i) or i < 0:
        raise ValueError(f'GPU index i must be a non-negative integer, got '
                         f'{i!r}')

def _check_num_devices(num_devices, name='num_devices'):
    """Reject a device count that is not a positive integer, saying so.

    Defined in :numref:`sec_d2l_package`"""
    if not _is_int(num_devices) or num_devices < 1:
        raise ValueError(f'{name} must be a positive integer (the number of '
                         f'model copies), got {num_devices!r}')

def _check_rate(value, name, below=None):
    """Reject a rate that is not a finite number >= 0 (and < `below`).

    Defined in :numref:`sec_d2l_package`"""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0 and \
        (below is None or value < below)
    if not ok:
        limit = '' if below is None else f' below {below}'
        raise ValueError(f'{name} must be a finite non-negative number'
                         f'{limit}, got {value!r}')

def _device_name(device):
    """A short name for `device` and whether it is a GPU.

    Defined in :numref:`sec_d2l_package`"""
    if isinstance(device, paddle.CUDAPlace) or device.is_gpu_place():
        return f'gpu:{device.get_device_id()}', True
    if not device.is_cpu_place():
        raise TypeError(f'not a CPU or GPU place: {device!r}')
    return 'cpu', False

def _device_names(devices, num_asked):
    """(name, is_gpu) for each of `devices`, or an error saying what fails.

    Defined in :numref:`sec_d2l_package`"""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, '__len__') \
            or len(devices) == 0:
        raise ValueError('devices must be a non-empty list of devices, such '
                         f'as d2l.try_gpus(2), got {devices!r}')
    if num_asked is not None:
        _check_num_devices(num_asked, 'num_asked')
    named = []
    for i, device in enumerate(devices):
        try:
            named.append(_device_name(device))
        except (AttributeError, TypeError, ValueError, RuntimeError):
            raise TypeError(f'devices[{i}] is not a device of this framework '
                            f'({device!r}); build the list with '
                            f'd2l.try_gpus(k)') from None
    return named

def _labels_and_predictions(y_hat, y, argmax):
    """`y_hat` as N predicted labels and `y` as N labels, or a ValueError.

    Defined in :numref:`sec_d2l_package`"""
    for name, t in (('y_hat', y_hat), ('y', y)):
        if not hasattr(t, 'shape') or not hasattr(t, 'reshape'):
            raise TypeError(f'{name} must be a tensor of this framework, got '
                            f'{type(t).__name__}')
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

def _minibatches(data_iter):
    """An iterator over `data_iter`, or a TypeError that names it.

    Defined in :numref:`sec_d2l_package`"""
    try:
        return iter(data_iter)
    except TypeError:
        raise TypeError('data_iter must be an iterable of (X, y) minibatches, '
                        f'got {type(data_iter).__name__}') from None

def _fraction_correct(counts, data_iter):
    """correct / examples of an Accumulator filled from `data_iter`.

    Defined in :numref:`sec_d2l_package`"""
    # a ValueError if `data_iter` held no examples
    if counts[1] == 0:
        raise ValueError('data_iter yielded no examples: pass an iterator '
                         'over at least one (X, y) minibatch, such as the '
                         'test iterator of load_data_fashion_mnist')
    return counts[0] / counts[1]

def _check_sgd(params, lr, batch_size):
    """Reject arguments of `sgd` that would corrupt the parameters; say why.

    Defined in :numref:`sec_d2l_package`"""
    _check_rate(lr, 'lr')
    if isinstance(batch_size, bool) or not isinstance(
            batch_size, numbers.Real) or not 0 < batch_size < math.inf:
        raise ValueError(f'batch_size must be a positive number (the '
                         f'examples the loss was summed over), got '
                         f'{batch_size!r}')
    params = list(params)
    for i, param in enumerate(params):
        if getattr(param, 'grad', None) is None:
            raise ValueError(
                f'params[{i}] has no gradient: compute the loss from it and '
                f'call backward() before sgd (in MXNet, attach_grad() first)')
    return params

def _check_loss(losses, where):
    """The sum of `losses` as a float; an error naming `where` if infinite.

    Defined in :numref:`sec_d2l_package`"""
    values = losses if isinstance(losses, (list, tuple)) else [losses]
    total = sum(float(v.item() if hasattr(v, 'item') else v) for v in values)
    if not math.isfinite(total):
        raise FloatingPointError(
            f'the training loss became {total} at {where}, so training '
            f'diverged; try a smaller learning rate (or a warm-up), and check '
            f'that the inputs hold no nan or inf')
    return total

def _points(x, y, curves):
    """The x and y values of one `Animator.add` call, one per curve.

    Defined in :numref:`sec_d2l_package`"""
    ys = list(y) if hasattr(y, '__len__') else [y]
    xs = list(x) if hasattr(x, '__len__') else [x] * len(ys)
    if len(xs) != len(ys):
        raise ValueError(f'x has {len(xs)} values but y has {len(ys)}; '
                         f'give one x, or one x per curve')
    if curves is not None and len(ys) != len(curves):
        raise ValueError(f'this animator draws {len(curves)} curves, got '
                         f'{len(ys)} values in y')
    return xs, ys

def _check_loader_args(batch_size, resize):
    """The batch size and (height, width) as ints, or an error saying why.

    Defined in :numref:`sec_d2l_package`"""
    _check_positive_int(batch_size, 'batch_size')
    if resize is None:
        return int(batch_size), None
    size = (resize, resize) if _is_int(resize) else resize
    if not isinstance(size, (tuple, list)) or len(size) != 2 or \
            not all(_is_int(s) and s > 0 for s in size):
        raise ValueError(f'resize must be a positive integer or a (height, '
                         f'width) pair of them, got {resize!r}')
    return int(batch_size), tuple(int(s) for s in size)

def use_svg_display():
    """Make Jupyter render matplotlib figures as SVG.

    Defined in :numref:`sec_d2l_package`"""
    try:
        from matplotlib_inline import backend_inline
        backend_inline.set_matplotlib_formats('svg')
    except ImportError:  # not running under IPython: nothing to configure
        pass

def in_notebook():
    """Whether the code runs inside a Jupyter kernel that can show figures.

    Defined in :numref:`sec_d2l_package`"""
    shell = sys.modules.get('IPython')
    shell = shell.get_ipython() if shell else None
    return shell is not None and 'IPKernelApp' in shell.config

def add_to_class(Class):
    """Decorator: attach the function below it to `Class` as a method.

    Defined in :numref:`sec_d2l_package`"""
    def attach(method):
        setattr(Class, method.__name__, method)
    return attach

def _pin_threads(core):
    """Keep every thread of this process on core `core`, if the OS lets us.

    Defined in :numref:`sec_d2l_package`"""
    if not hasattr(os, 'sched_setaffinity'):  # macOS and Windows
        return False
    for thread in os.listdir('/proc/self/task'):
        try:
            os.sched_setaffinity(int(thread), {core})
        except OSError:  # a thread that ended meanwhile
            pass
    return True

def _usable_cores():
    """The CPU cores this process may run on, in increasing order.

    Defined in :numref:`sec_d2l_package`"""
    if hasattr(os, 'sched_getaffinity'):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))

if 'FLAGS_paddle_num_threads' not in os.environ:
    paddle.base.core.set_num_threads(os.cpu_count() or 1)

def _one_thread():
    """Let every operator of this process run on a single thread.

    Defined in :numref:`sec_d2l_package`"""
    paddle.base.core.set_num_threads(1)

import gzip
import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
import numpy as np
import paddle
import paddle.nn.functional as F

# Of the unpacked IDX bytes, so that any gzip wrapping verifies.
FASHION_MNIST_SHA256 = {
    'train-images-idx3-ubyte':
    'c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888',
    'train-labels-idx1-ubyte':
    'bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9',
    't10k-images-idx3-ubyte':
    '5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b',
    't10k-labels-idx1-ubyte':
    '0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34'}

FASHION_MNIST_MIRROR = ('http://fashion-mnist.s3-website.eu-central-1'
                        '.amazonaws.com/')

FASHION_MNIST_SYSTEM_DIR = '/usr/share/datasets/fashion-mnist'

class DatasetError(RuntimeError):
    """A dataset file is missing, damaged or cannot be downloaded.

    Defined in :numref:`sec_fashion_mnist_files`"""

def fashion_mnist_dirs():
    """Folders searched for Fashion-MNIST, in order, and the download one.

    Defined in :numref:`sec_fashion_mnist_files`"""
    env_dir = os.environ.get('D2L_DATA_DIR', '').strip()
    env_dir = os.path.abspath(os.path.expanduser(env_dir)) if env_dir else ''
    cache_root = os.environ.get('XDG_CACHE_HOME', '').strip() or \
        os.path.join(os.path.expanduser('~'), '.cache')
    cache_dir = os.path.join(os.path.abspath(cache_root), 'd2l',
                             'fashion-mnist')
    search = ([env_dir] if env_dir else []) + [cache_dir,
                                               FASHION_MNIST_SYSTEM_DIR]
    return search, env_dir or cache_dir

_SAID = set()

def _say_once(message, everywhere=False):
    """Print `message` once per process: on rank 0, or stderr `everywhere`.

    Defined in :numref:`sec_fashion_mnist_files`"""
    # Launchers give every process of a job its rank; a report from each of
    # eight processes would bury the one that matters.
    rank = os.environ.get('RANK', os.environ.get('PADDLE_TRAINER_ID', '0'))
    if message not in _SAID:
        _SAID.add(message)
        if everywhere:
            print(message, file=sys.stderr)
        elif rank.strip() in ('', '0'):
            print(message)

def _unpack_and_check(path, name, raw):
    """Unpack `raw` bytes read from `path`, verify them against the hash.

    Defined in :numref:`sec_fashion_mnist_files`"""
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

def _find_idx_file(name, search):
    """Path of the first copy of `name` (packed or not) in `search`; None.

    Defined in :numref:`sec_fashion_mnist_files`"""
    for folder in search:
        for path in (os.path.join(folder, name + '.gz'),
                     os.path.join(folder, name)):
            if os.path.isfile(path):
                return path
    return None

DOWNLOAD_WAIT_S = 600  # how long to wait for another process's download

def _lock_or_wait(file, path):
    """Lock the open `file` at `path`; wait at most DOWNLOAD_WAIT_S for it.

    Defined in :numref:`sec_fashion_mnist_files`"""
    import fcntl
    deadline = time.monotonic() + DOWNLOAD_WAIT_S
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() > deadline:
            file.close()
            raise DatasetError(
                f'another process has held {path} for '
                f'{DOWNLOAD_WAIT_S} s without finishing its download; '
                f'stop it, or set D2L_DATA_DIR to a folder that holds '
                f'the four Fashion-MNIST files')
        _say_once(f'Waiting for another process to download into '
                  f'{os.path.dirname(path)} (at most '
                  f'{DOWNLOAD_WAIT_S} s)', everywhere=True)
        time.sleep(0.2)

class _FileLock:
    """Hold an exclusive lock on `path`; wait at most DOWNLOAD_WAIT_S."""
    def __init__(self, path):
        """Defined in :numref:`sec_fashion_mnist_files`"""
        self.path = path

    def __enter__(self):
        self.file = open(self.path, 'a')
        try:
            import fcntl  # noqa: F401 (whether this system has locks)
        except ImportError:  # Windows: no lock, but renames keep files whole
            return self
        _lock_or_wait(self.file, self.path)
        return self

    def __exit__(self, *exc):
        # Removing the file while holding it is safe: a process that wakes up
        # on it looks for the data again before it downloads anything.
        try:
            os.remove(self.path)
        except OSError:
            pass
        self.file.close()

def _check_download_dir(name, target_dir):
    """Create `target_dir` for downloading `name`, or say why it cannot be.

    Defined in :numref:`sec_fashion_mnist_files`"""
    try:
        os.makedirs(target_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=target_dir).close()  # may we write there?
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise DatasetError(
            f'Fashion-MNIST file {name} is in none of '
            f'{", ".join(fashion_mnist_dirs()[0])}, and it cannot be '
            f'downloaded into {target_dir} ({why}). Set D2L_DATA_DIR to a '
            f'folder that holds the four files or that you may write to, or '
            f'install them: sudo apt-get install dataset-fashion-mnist'
        ) from None

def _write_atomically(path, raw):
    """Write `raw` to `path` by renaming a finished temporary file.

    Defined in :numref:`sec_fashion_mnist_files`"""
    tmp = f'{path}.part-{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            f.write(raw)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        if os.path.exists(tmp):  # the disk filled up or we were interrupted
            os.remove(tmp)
    return path

def _download_fashion_mnist(name, target_dir):
    """Fetch `name`.gz into `target_dir`, verified, written atomically.

    Defined in :numref:`sec_fashion_mnist_files`"""
    url = os.environ.get('D2L_FASHION_MNIST_MIRROR',
                         FASHION_MNIST_MIRROR).rstrip('/') + f'/{name}.gz'
    remedies = (
        f'(1) set D2L_DATA_DIR to a folder holding the four Fashion-MNIST '
        f'files; (2) install the Debian package: sudo apt-get install '
        f'dataset-fashion-mnist; (3) connect to the internet so the files '
        f'can be downloaded into {target_dir}.')
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            raw = response.read()
    except (http.client.IncompleteRead, ConnectionError) as err:
        raise DatasetError(
            f'The download of Fashion-MNIST file {name} from {url} was cut '
            f'off ({type(err).__name__}: {err}); nothing was saved. Run '
            f'again to retry. If it keeps failing: {remedies}') from None
    except (urllib.error.URLError, http.client.HTTPException, OSError,
            ValueError) as err:
        reason = getattr(err, 'reason', err)
        raise DatasetError(
            f'Fashion-MNIST file {name} was not found in any of: '
            f'{", ".join(fashion_mnist_dirs()[0])}; downloading it from {url} '
            f'failed ({reason}). Fix it in one of three ways: {remedies}'
        ) from None
    _unpack_and_check(url, name, raw)
    return _write_atomically(os.path.join(target_dir, f'{name}.gz'), raw)

def read_idx_file(name):
    """Find, verify and parse one Fashion-MNIST IDX file into a NumPy array.

    Defined in :numref:`sec_fashion_mnist_files`"""
    if name not in FASHION_MNIST_SHA256:
        raise ValueError(f'name must be one of {sorted(FASHION_MNIST_SHA256)}'
                         f', got {name!r}')
    search, target_dir = fashion_mnist_dirs()
    path = _find_idx_file(name, search)
    if path is None:
        _check_download_dir(name, target_dir)
        with _FileLock(os.path.join(target_dir, f'{name}.gz.lock')):
            # Another process may have downloaded it while we waited.
            path = _find_idx_file(name, search) or \
                _download_fashion_mnist(name, target_dir)
    with open(path, 'rb') as f:
        data = _unpack_and_check(path, name, f.read())
    _say_once(f'Fashion-MNIST files from {os.path.dirname(path)}')
    # NumPy proper in every framework's module (MXNet's np cannot view bytes).
    import numpy

    # IDX header: two zero bytes, a type code (8 = uint8), the number of
    # dimensions, then one big-endian 32-bit size per dimension.
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                  for i in range(ndim))
    return numpy.frombuffer(data, 'uint8',
                            offset=4 + 4 * ndim).reshape(shape)

def balanced_subset(labels, per_class):
    """Indices of the first `per_class` examples of each class (file order).

    Defined in :numref:`sec_fashion_mnist_files`"""
    _check_positive_int(per_class, 'per_class')
    picks = [(labels == c).nonzero()[0][:per_class].tolist()
             for c in sorted(set(labels.tolist()))]
    return sorted(i for pick in picks for i in pick)

def subset_per_class():
    """Images per class {'train': n, 'test': m} from D2L_SUBSET; None: all.

    Defined in :numref:`sec_fashion_mnist_files`"""
    flag = os.environ.get('D2L_SUBSET', '').strip()
    if not flag:
        return None
    sizes = [part.strip() for part in flag.split(',')]
    if len(sizes) != 2 or not all(n.isdigit() and int(n) > 0 for n in sizes):
        raise ValueError(f'D2L_SUBSET must be two positive numbers of images '
                         f'per class, training then test (e.g. 600,200), '
                         f'got {flag!r}; unset it for the full data')
    return {'train': int(sizes[0]), 'test': int(sizes[1])}

_FASHION_MNIST_CACHE = {}

def fashion_mnist_arrays(split, quick):
    """`split`'s images (float32, N x 1 x 28 x 28, in [0, 1]), int64 labels.

    Defined in :numref:`sec_fashion_mnist_files`"""
    if split not in ('train', 'test'):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if split not in _FASHION_MNIST_CACHE:
        prefix = 'train' if split == 'train' else 't10k'
        images = read_idx_file(f'{prefix}-images-idx3-ubyte')
        labels = read_idx_file(f'{prefix}-labels-idx1-ubyte')
        _FASHION_MNIST_CACHE[split] = images, labels
    images, labels = _FASHION_MNIST_CACHE[split]
    per_class = QUICK_PER_CLASS if quick else subset_per_class()
    fewest = min(int((labels == c).sum()) for c in range(10)) \
        if per_class and not quick else None
    if fewest is not None and per_class[split] > fewest:
        raise ValueError(
            f'D2L_SUBSET asks for {per_class[split]} {split} images per '
            f'class, but the {split} split has {fewest}; ask for at most '
            f'that many, or unset D2L_SUBSET for all of them')
    if per_class:
        keep = balanced_subset(labels, per_class[split])
        images, labels = images[keep], labels[keep]
    images = images.reshape(-1, 1, 28, 28).astype('float32') / 255
    return images, labels.astype('int64')

def describe_mode(quick, n_train, n_test):
    """One line saying which data the loader serves, and how to change it.

    Defined in :numref:`sec_fashion_mnist_files`"""
    if quick:
        why = ('D2L_QUICK=1' if os.environ.get('D2L_QUICK', '').strip()
               else 'no GPU found')
        return (f'Fashion-MNIST, quick mode ({why}; set D2L_QUICK=0 for the '
                f'full data): {n_train} training and {n_test} test images')
    subset = os.environ.get('D2L_SUBSET', '').strip()
    part = f' on a subset (D2L_SUBSET={subset})' if subset else ''
    return (f'Fashion-MNIST, full mode{part}: {n_train} training and {n_test} '
            f'test images')

class ArrayDataset(paddle.io.Dataset):
    """A map-style dataset over equally long NumPy arrays.

    Defined in :numref:`sec_fashion_mnist_files`"""
    def __init__(self, *arrays):
        super().__init__()
        lengths = [len(a) for a in arrays]
        if not arrays or len(set(lengths)) != 1:
            raise ValueError(f'arrays must be one or more arrays of equal '
                             f'length, got lengths {lengths}')
        self.arrays = arrays

    def __getitem__(self, idx):
        return tuple(a[idx] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])

def _collate_resized(batch, size):
    """Stack (image, label) pairs into a minibatch, resizing if asked.

    Defined in :numref:`sec_fashion_mnist_files`"""
    X = paddle.to_tensor(np.stack([x for x, _ in batch]))
    y = paddle.to_tensor(np.array([t for _, t in batch]))
    if size is not None:
        X = F.interpolate(X, size=size, mode='bilinear', align_corners=False)
    return X, y

import contextlib
import logging
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings

_rank_report_dir = None  # set in the processes that spawn_ranks starts

def _record_rank_failure(rank):
    """In a process of spawn_ranks, record the exception handled, if first.

    Defined in :numref:`sec_spawn_machinery`"""
    if _rank_report_dir is None:
        return
    path = os.path.join(_rank_report_dir, f'rank{rank}.error')
    if not os.path.exists(path):  # the first error is the cause
        with open(path + '.part', 'w') as f:
            f.write(f'{time.time()!r}\n{traceback.format_exc()}')
        os.replace(path + '.part', path)  # readers never see half a file

def _collect_results(out_dir, world_size):
    """The results that the ranks of spawn_ranks stored, by rank.

    Defined in :numref:`sec_spawn_machinery`"""
    results = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f'rank{rank}.pkl'), 'rb') as f:
            results.append(pickle.load(f))
    return results

def _check_worker(worker, args):
    """Fail early, in this process, if spawned processes could not import `worker` or unpickle `args`.

    Defined in :numref:`sec_spawn_machinery`"""
    if not callable(worker):
        raise TypeError(f'worker must be a function, got {worker!r}')
    main = sys.modules.get('__main__')
    if getattr(worker, '__module__', None) == '__main__' and \
            not hasattr(main, '__file__'):
        raise ValueError(
            f'worker {worker.__name__} is defined in this notebook or '
            f'interpreter session, which new processes cannot import: save it '
            f'in a module (as the book saves its workers in d2l) and pass that')
    _check_main_guard(main)
    for name, value in (('worker', worker), ('args', args)):
        try:
            pickle.dumps(value)
        except Exception as err:
            raise ValueError(
                f'{name} cannot be sent to new processes ({err}); use a '
                f'function defined at the top level of a module and '
                f'arguments that pickle') from None

def _check_main_guard(main):
    """Fail early if a script starts ranks at its top level, unguarded.

    Defined in :numref:`sec_spawn_machinery`"""
    path, frame = getattr(main, '__file__', None), sys._getframe(2)
    while frame is not None and frame.f_globals is not vars(main):
        frame = frame.f_back  # the script's own frame, if it called us
    if path is None or frame is None or frame.f_code.co_name != '<module>':
        return
    with open(path, errors='replace') as f:
        if '__main__' in f.read():
            return
    raise RuntimeError(
        f'{path} starts processes at its top level, and every new process '
        f'imports that script again: put the code that starts them under '
        f"`if __name__ == '__main__':`")

@contextlib.contextmanager
def _quiet_logger(name):
    """Hide the informational and warning records of logger `name` in the body of a `with` block.

    Defined in :numref:`sec_spawn_machinery`"""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)

def _fork_server():
    """'forkserver', with d2l imported in the server that forks each rank.

    Defined in :numref:`sec_spawn_machinery`"""
    multiprocessing.set_forkserver_preload([__name__])  # this module
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError:  # its socket's path, under TMPDIR, is over 107 bytes
        return 'spawn'
    return 'forkserver'

def _spawn_variables():
    """Names of the variables that paddle.distributed.spawn set here.

    Defined in :numref:`sec_spawn_machinery`"""
    return [name for name in os.environ
            if name.startswith(('PADDLE_', 'FLAGS_selected_'))]

def _take_environment(env, keep=()):
    """Make `env` this process's environment, keeping the names in `keep`.

    Defined in :numref:`sec_spawn_machinery`"""
    kept = {name: os.environ[name] for name in keep if name in os.environ}
    os.environ.clear()
    os.environ.update(env, **kept)

def _die_with_parent(parent_pid):
    """Die when the fork server does; exit now if `parent_pid` is gone.

    Defined in :numref:`sec_spawn_machinery`"""
    # The server ends with the process that started it, parent_pid.
    server = os.getppid()
    if sys.platform.startswith('linux'):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    try:
        os.kill(parent_pid, 0)  # signal 0 only asks whether it exists
    except ProcessLookupError:
        os._exit(1)
    if os.getppid() != server:  # the server ended before we asked
        os._exit(1)

def _start_rank(rank, out_dir, parent_pid, env, keep=()):
    """Prepare a new process: take `env`, log to out_dir, die with parent.

    Defined in :numref:`sec_spawn_machinery`"""
    global _rank_report_dir
    _rank_report_dir = out_dir
    _take_environment(env, keep)
    log = os.open(os.path.join(out_dir, f'rank{rank}.log'),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):  # C++ log lines and dumps bypass sys.stdout/stderr
        os.dup2(log, stream)
    os.close(log)
    _die_with_parent(parent_pid)
    beat = os.path.join(out_dir, f'rank{rank}.alive')
    open(beat, 'w').close()
    threading.Thread(target=_heartbeat, args=(beat,), daemon=True).start()

def _finish_rank(rank, out_dir, result):
    """Store the result of a worker where spawn_ranks collects it.

    Defined in :numref:`sec_spawn_machinery`"""
    with open(os.path.join(out_dir, f'rank{rank}.pkl.part'), 'wb') as f:
        pickle.dump(result, f)
    os.replace(os.path.join(out_dir, f'rank{rank}.pkl.part'),
               os.path.join(out_dir, f'rank{rank}.pkl'))

def _rank_failure(out_dir, world_size, exit_codes):
    """The error to raise for a failed group, given the ranks' exit codes.

    Defined in :numref:`sec_spawn_machinery`"""
    killed = [rank for rank, code in enumerate(exit_codes)
              if code is not None and code < 0 and -code != signal.SIGABRT]
    written = []
    for rank in range(world_size):
        path = os.path.join(out_dir, f'rank{rank}.error')
        if os.path.exists(path):
            with open(path) as f:
                when, trace = f.read().split('\n', 1)
            written.append((float(when), rank, trace))
    if written and not killed:
        _, rank, trace = min(written)
        return RuntimeError(f'rank {rank} of {world_size} failed:\n{trace}')
    rank = killed[0] if killed else next(
        r for r, code in enumerate(exit_codes) if code not in (None, 0))
    code = exit_codes[rank]
    how = (f'signal {signal.Signals(-code).name}' if code < 0
           else f'exit code {code}')
    message = (f'rank {rank} of {world_size} died ({how}) without a Python '
               f'error')
    log = os.path.join(out_dir, f'rank{rank}.log')
    if os.path.exists(log):
        with open(log, errors='replace') as f:
            tail = f.read()[-3000:]
        message += f'.\nThe end of its output:\n{tail}'
    return RuntimeError(message)

def _stop_processes(processes, grace_s=3.0):
    """Terminate running processes, kill those that ignore it, reap all.

    Defined in :numref:`sec_spawn_machinery`"""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()

def _join_ranks(context, out_dir, world_size, silence_s, servers=()):
    """Wait for the processes of spawn_ranks; stop them all if one fails.

    Defined in :numref:`sec_spawn_machinery`"""
    # or if a rank falls silent, or on an interrupt or SIGTERM
    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the clean-up below

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = in_main_thread and signal.signal(signal.SIGTERM, on_sigterm)
    try:
        codes = _wait_for_ranks(context.processes, out_dir, silence_s,
                                servers)
    finally:  # KeyboardInterrupt, SystemExit from SIGTERM, a silent rank
        _stop_processes([*context.processes, *servers])
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    if codes is not None:
        raise _rank_failure(out_dir, world_size, codes) from None

def _heartbeat(path):
    """Touch the file at `path` every second, as a sign of life for spawn_ranks.

    Defined in :numref:`sec_spawn_machinery`"""
    while True:
        os.utime(path)
        time.sleep(1.0)

def _wait_for_ranks(processes, out_dir, silence_s, servers=()):
    """Wait until all ranks end well (None) or one fails (their exit codes); raise if one falls silent or a server ends.

    Defined in :numref:`sec_spawn_machinery`"""
    seen, checked = {}, time.monotonic()  # rank: (heartbeat, when it changed)
    while True:
        codes = [process.exitcode for process in processes]
        if all(code == 0 for code in codes):
            return None
        for server in servers:  # MXNet's: they end well after the workers
            if server.exitcode not in (None, 0):
                raise RuntimeError(
                    f'a parameter-server process ended (exit code '
                    f'{server.exitcode}) while the workers still ran')
        if any(code not in (None, 0) for code in codes):
            # A peer's death may show seconds after the error it caused: a
            # killed process with many threads ends slowly on a busy machine.
            deadline = time.monotonic() + 5
            running = [p.sentinel for p in processes if p.exitcode is None]
            while running and time.monotonic() < deadline:
                multiprocessing.connection.wait(
                    running, deadline - time.monotonic())
                running = [p.sentinel for p in processes
                           if p.exitcode is None]
            return [process.exitcode for process in processes]
        now = time.monotonic()
        if now - checked > 5:  # this process was stopped or suspended too
            seen = {}
        checked = now
        for rank, code in enumerate(codes):
            path = os.path.join(out_dir, f'rank{rank}.alive')
            if code is not None or not os.path.exists(path):
                continue  # ended well, or not started yet
            beat = os.stat(path).st_mtime_ns
            if seen.get(rank, (None,))[0] != beat:
                seen[rank] = (beat, now)
            elif silence_s and now - seen[rank][1] > silence_s:
                raise RuntimeError(
                    f'rank {rank} of {len(processes)} showed no sign of life '
                    f'for {silence_s:g} s (stopped, or hung holding Python\'s '
                    f'lock), so all ranks were stopped; if it needs longer, '
                    f'pass a larger silence_s to spawn_ranks')
        multiprocessing.connection.wait(
            [p.sentinel for p in [*processes, *servers]], 0.2)

def _group_from_env(rank, world_size, init_method):
    """Check a rank and world size against the group that spawn or launch described in the environment.

    Defined in :numref:`sec_spawn_machinery`"""
    if 'PADDLE_TRAINER_ID' not in os.environ:
        raise RuntimeError(
            'no process group is described in the environment: run this code '
            'in a process started by d2l.spawn_ranks, paddle.distributed.spawn '
            'or python -m paddle.distributed.launch')
    given = (_int_from_env('PADDLE_TRAINER_ID', 0),
             _int_from_env('PADDLE_TRAINERS_NUM', 1))
    if (rank, world_size) != given:
        raise ValueError(f'rank {rank} of world_size {world_size} does not '
                         f'match the environment, which says rank {given[0]} '
                         f'of {given[1]}')
    if init_method != 'env://':
        raise ValueError(f"init_method must be 'env://' in PaddlePaddle, which "
                         f'reads the rendezvous from the environment; got '
                         f'{init_method!r}')
    hosts = os.environ.get('PADDLE_TRAINER_ENDPOINTS', '').split(',')
    if all(_is_loopback(host.rsplit(':', 1)[0]) for host in hosts):
        os.environ['GLOO_SOCKET_IFNAME'] = _loopback_interface()

def _set_group_timeout(timeout_s, device):
    """Give an NCCL group `timeout_s` or a launcher's --timeout; refuse one for Gloo, which has none.

    Defined in :numref:`sec_spawn_machinery`"""
    if timeout_s is None and ddp_backend(device) == 'nccl':
        timeout_s = _launcher_timeout_s
    if timeout_s is not None:
        if ddp_backend(device) != 'nccl':
            raise ValueError("timeout_s must be None on the CPU: PaddlePaddle's "
                             'Gloo group has no timeout')
        os.environ['PADDLE_PG_TIMEOUT'] = str(int(timeout_s * 1000))

@contextlib.contextmanager
def _quiet_paddle_children():
    """Keep PaddlePaddle's start-up notices and informational C++ logs out of the parent's output.

    Defined in :numref:`sec_spawn_machinery`"""
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

import contextlib  # for the processes
import logging
import os
import warnings
from paddle import nn

import functools
import inspect

_RULES = dict(  # rule name -> check of one argument, given value and name
    positive=lambda value, name: d2l._check_positive_int(value, name),
    count=lambda value, name: d2l._check_count(value, name),
    rate=lambda value, name: d2l._check_rate(value, name),
    momentum=lambda value, name: d2l._check_rate(value, name, below=1),
    devices=lambda value, name: d2l._check_devices(value),
    devices_or_none=lambda value, name: value is None or
    d2l._check_devices(value),
    seed=lambda value, name: d2l._check_seed(value),
    arrays=lambda value, name: d2l._check_arrays(value, name))

def _nonempty(data_iter, name):
    """Iterate over `data_iter`; fail at its end if it gave no example.

    Defined in :numref:`sec_training_machinery`"""
    num_examples = 0
    for batch in data_iter:
        num_examples += len(batch[1])
        yield batch
    d2l._check_examples(num_examples, name)

def _checked(fn, check=None, batches=(), finite=False, **rules):
    """`fn`, checking its arguments by `rules` and `check` on every call.

    Defined in :numref:`sec_training_machinery`"""
    # check: called with the arguments its parameters name; batches: names
    # of iterables of minibatches; finite: the returned loss (or the first
    # item returned) must be finite
    signature = inspect.signature(fn)
    names = [] if check is None else list(inspect.signature(check).parameters)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        for name, rule in rules.items():
            _RULES[rule](values[name], name)
        if check is not None:
            check(**{name: values[name] for name in names if name in values})
        for name in batches:
            d2l._check_batches(values[name], name)
            values[name] = _nonempty(values[name], name)
        result = fn(*bound.args, **bound.kwargs)
        if finite and result is not None:
            epoch = values.get('epoch')
            where = f'the end of {fn.__name__}' + (
                '' if epoch is None else f' in epoch {epoch + 1}')
            d2l._check_loss(result[0] if isinstance(result, tuple)
                            else result, where)
        return result
    return checked

def _require(ok, message):
    """Raise ValueError with `message` (what to pass instead) unless `ok`.

    Defined in :numref:`sec_training_machinery`"""
    if not ok:
        raise ValueError(message)

def _is_count(value, least=0):
    """Whether `value` is an integer (not a bool) of at least `least`.

    Defined in :numref:`sec_training_machinery`"""
    return d2l._is_int(value) and value >= least

def _check_seed(seed):
    """Raise ValueError, saying what to pass, unless `seed` is a non-negative integer.

    Defined in :numref:`sec_training_machinery`"""
    _require(_is_count(seed), f'seed must be a non-negative integer such as 0; got {seed!r}')

def _check_lenet_args(X, params):
    """Raise ValueError, saying what to pass, unless `X` and `params` fit LeNet.

    Defined in :numref:`sec_training_machinery`"""
    shape = tuple(X.shape) if hasattr(X, 'shape') else type(X).__name__
    _require(shape[1:] == (1, 28, 28), 'X must be a batch of 28 x 28 grayscale '
             f'images, shape (examples, 1, 28, 28); got {shape}')
    n = len(params) if isinstance(params, (list, tuple)) else None
    _require(n == len(LENET_SHAPES), f"params must be a list of LeNet's {len(LENET_SHAPES)}"
             f' tensors, as lenet_params() returns; got {n or params!r:.60}')
    for i, (p, shape) in enumerate(zip(params, LENET_SHAPES)):
        _require(tuple(p.shape) == shape, f'params[{i}] has shape '
                 f'{tuple(p.shape)} but LeNet needs {shape}; use lenet_params()')

def _check_scores_and_labels(y_hat, y):
    """Raise ValueError, saying what to pass, unless `y` holds one class per row of `y_hat`.

    Defined in :numref:`sec_training_machinery`"""
    _require(len(y_hat.shape) == 2, 'y_hat must hold one row of class scores per '
             f'example, shape (examples, classes); got {tuple(y_hat.shape)}')
    n, num_classes = y_hat.shape
    _require(tuple(y.shape) in ((n,), (n, 1)), 'y must hold one label per row of '
             f'y_hat, shape ({n},); got shape {tuple(y.shape)}')
    # MXNet clips labels out of range, Paddle reads negative ones from the end
    low, high = (int(y.min()), int(y.max())) if n else (0, 0)
    _require(0 <= low and high < num_classes, f'y holds labels from {low} to '
             f'{high}, but y_hat scores classes 0 to {num_classes - 1}; pass '
             'labels in that range')

def _check_arrays(arrays, name):
    """Raise ValueError, saying what to pass, unless `arrays` is a non-empty list of arrays.

    Defined in :numref:`sec_training_machinery`"""
    _require(isinstance(arrays, (list, tuple)) and arrays, f'{name} must be a '
             f'non-empty list of arrays; got {arrays!r:.60}')
    for i, x in enumerate(arrays):
        _require(hasattr(x, 'shape'), f'{name}[{i}] is {x!r:.40}, not an array '
                 '(a gradient is None until a backward pass ran)')

def _check_reduce_args(data, devices):
    """Raise ValueError, saying what to pass, unless `data` and `devices` suit an allreduce.

    Defined in :numref:`sec_training_machinery`"""
    _check_arrays(data, 'data')
    shapes = [tuple(x.shape) for x in data]
    _require(all(shape == shapes[0] for shape in shapes), f'data holds arrays of '
             f'different shapes {shapes}; pass the same-shaped arrays of one '
             'parameter, one per device')
    _require(devices is None or (isinstance(devices, (list, tuple)) and len(
        devices) == len(data)), 'devices must be a list with one device per '
        f'array of data ({len(data)}), or None; got {devices!r:.60}')

def _check_split(X, y, devices):
    """Raise ValueError, saying what to change, if a batch cannot be split over the devices.

    Defined in :numref:`sec_training_machinery`"""
    for name, a in (('X', X), ('y', y)):
        _require(len(getattr(a, 'shape', ())), f'{name} must be an array with '
                 f'one row per example; got {a!r:.60}')
    _require(isinstance(devices, (list, tuple)), 'devices must be a list of '
             f'devices such as d2l.try_gpus(2); got {devices!r:.60}')
    n, k = X.shape[0], len(devices)
    _require(n == y.shape[0], f'X holds {n} examples but y holds {y.shape[0]} '
             'labels; pass one label per example')
    _require(k >= 1, 'devices is empty; pass at least one device, e.g. d2l.try_gpus(1)')
    _require(n >= k, f'cannot split {n} examples over {k} devices, each needs at '
             f'least one; use a batch of at least {k} examples or fewer devices')

def _check_replicas(device_params, devices):
    """Raise ValueError, saying what to pass, unless there is one replica per device.

    Defined in :numref:`sec_training_machinery`"""
    for name, value in (('device_params', device_params), ('devices', devices)):
        _require(isinstance(value, (list, tuple)), f'{name} must be a list, one '
                 f'entry per device; got {value!r:.60}')
    _require(len(device_params) == len(devices), f'device_params holds '
             f'{len(device_params)} replicas but devices names {len(devices)} '
             'devices; build one replica per device with get_params')

def _check_resnet_args(num_classes, in_channels):
    """Reject a class or channel count that is not a positive integer, saying which.

    Defined in :numref:`sec_training_machinery`"""
    for name, value in (('num_classes', num_classes), ('in_channels', in_channels)):
        d2l._require(d2l._is_count(value, 1),
                     f'{name} must be a positive integer, got {value!r}')

def _check_devices(devices):
    """Reject an empty device list, saying how to get one.

    Defined in :numref:`sec_training_machinery`"""
    d2l._require(devices, f'devices is empty ({devices!r}); pass at least one '
                 'device, e.g. d2l.try_gpus(1)')

def _check_batches(data_iter, name):
    """Say that argument `name` is no iterable, unless it is one.

    Defined in :numref:`sec_training_machinery`"""
    if not hasattr(data_iter, '__iter__'):
        raise TypeError(f'{name} must be an iterable of (X, y) minibatches, '
                        f'got {type(data_iter).__name__}')

def _check_examples(num_examples, name):
    """Reject an iterator `name` that yielded no examples.

    Defined in :numref:`sec_training_machinery`"""
    d2l._require(num_examples != 0, f'{name} yielded no examples; pass an '
                 'iterator with at least one non-empty minibatch')

def _check_step(X, y, devices):
    """Reject a minibatch or device list that a training step cannot use.

    Defined in :numref:`sec_training_machinery`"""
    d2l._check_devices(devices)
    d2l._require(X.shape[0] == y.shape[0], f'X holds {X.shape[0]} examples but '
                 f'y holds {y.shape[0]} labels; pass one label per example')
    d2l._require(X.shape[0] > 0, 'X is an empty minibatch; pass at least one example')

def _check_model(net, kind, kind_name):
    """Reject `net` unless it is a model of class `kind`, saying what to pass.

    Defined in :numref:`sec_training_machinery`"""
    if not isinstance(net, kind):
        raise TypeError(f'net must be a model ({kind_name}), got '
                        f'{type(net).__name__}; pass e.g. d2l.resnet18(10)')

def _check_warmup(warmup, num_epochs):
    """Reject a warm-up that is not shorter than the run, saying so.

    Defined in :numref:`sec_training_machinery`"""
    d2l._require(warmup < num_epochs, f'warmup must be below num_epochs, '
                 f'got warmup={warmup!r}, num_epochs={num_epochs!r}')

def _check_epoch(epoch, num_epochs):
    """Reject an epoch outside [0, num_epochs), or a bad num_epochs, saying so.

    Defined in :numref:`sec_training_machinery`"""
    d2l._require(d2l._is_count(num_epochs, 1) and d2l._is_count(epoch)
                 and epoch < num_epochs, f'epoch must be an integer in '
                 f'[0, num_epochs) and num_epochs a positive integer, got '
                 f'epoch={epoch!r}, num_epochs={num_epochs!r}')

def _check_model_kind(net):
    """Reject `net` unless it is a paddle.nn.Layer.

    Defined in :numref:`sec_training_machinery`"""
    d2l._check_model(net, nn.Layer, 'paddle.nn.Layer')

def _check_concise_step(X, y, devices):
    """_check_step, and one device: a PaddlePaddle process computes on one.

    Defined in :numref:`sec_training_machinery`"""
    d2l._check_step(X, y, devices)
    d2l._require(
        len(devices) == 1, f'devices names {len(devices)} devices, but a '
        'PaddlePaddle process computes on one; pass [its device] and start '
        'one process per device, as d2l.train_concise_spawn does')

def _check_zero_init(params, devices, stage):
    """Reject a ZeRO stage, or an empty parameter or device list.

    Defined in :numref:`sec_training_machinery`"""
    d2l.check_stage(stage)
    d2l._check_zero_args(params, devices)

def _check_zero_step(states, devices, stage):
    """Reject a ZeRO stage, or states that do not fit it and the devices.

    Defined in :numref:`sec_training_machinery`"""
    d2l.check_stage(stage)
    d2l._check_zero_states(states, devices, stage)

try_gpu = d2l._checked(d2l.try_gpu, d2l._check_gpu_index)

try_gpus = d2l._checked(d2l.try_gpus, d2l._check_num_devices)

use_one_core = d2l._checked(d2l.use_one_core, local_rank='count')

train_epochs = d2l._checked(d2l.train_epochs, num_epochs='positive')

lenet_init_arrays = d2l._checked(d2l.lenet_init_arrays, seed='seed')

lenet = d2l._checked(d2l.lenet, d2l._check_lenet_args)

cross_entropy_sum = d2l._checked(d2l.cross_entropy_sum,
                                 d2l._check_scores_and_labels)

get_params = d2l._checked(d2l.get_params, params='arrays')

allreduce = d2l._checked(d2l.allreduce, d2l._check_reduce_args)

shard_sizes = d2l._checked(d2l.shard_sizes, n='count', k='positive')

split_batch = d2l._checked(d2l.split_batch, d2l._check_split)

train_batch = d2l._checked(d2l.train_batch, d2l._check_replicas,
                           finite=True)

evaluate_accuracy_replicas = d2l._checked(
    d2l.evaluate_accuracy_replicas, d2l._check_replicas,
    batches=('data_iter',))

ring_allreduce = d2l._checked(d2l.ring_allreduce, d2l._check_reduce_args)

resnet18 = d2l._checked(d2l.resnet18, d2l._check_resnet_args)

count_trainable_params = d2l._checked(d2l.count_trainable_params,
                                      d2l._check_model_kind)

_accuracy_on_devices = d2l._checked(d2l._accuracy_on_devices,
                                    batches=('data_iter',))

evaluate_accuracy_gpus = d2l._checked(d2l.evaluate_accuracy_gpus,
                                      devices='devices_or_none')

train_step_concise = d2l._checked(d2l.train_step_concise,
                                  d2l._check_concise_step)

train_epoch_concise = d2l._checked(
    d2l.train_epoch_concise, devices='devices', batches=('train_iter',),
    finite=True)

cosine_lr = d2l._checked(d2l.cosine_lr, d2l._check_epoch, lr='rate')

set_learning_rate = d2l._checked(d2l.set_learning_rate, lr='rate')

_sgd = d2l._checked(d2l._sgd, lr='rate', momentum='momentum')

shard_of_batch = d2l._checked(
    d2l.shard_of_batch, lambda rank, world_size: d2l._check_rank(
        rank, world_size), step='count', batch_size='positive')

sgd_on_shards = d2l._checked(d2l.sgd_on_shards, num_steps='count',
                             finite=True)

local_batch_size = d2l._checked(d2l.local_batch_size, batch_size='positive',
                                world_size='positive')

_ddp_epoch = d2l._checked(d2l._ddp_epoch, finite=True)

warmup_cosine_lr = d2l._checked(d2l.warmup_cosine_lr, d2l._check_warmup,
                                warmup='count', start='rate')

train_ddp = d2l._checked(d2l.train_ddp, num_epochs='positive', lr='rate')

timing_batch = d2l._checked(d2l.timing_batch, global_batch='positive')

time_ddp = d2l._checked(d2l.time_ddp, global_batch='positive',
                        num_steps='positive', warmup='count',
                        threads='positive')

zero_init = d2l._checked(d2l.zero_init, d2l._check_zero_init)

zero_step = d2l._checked(d2l.zero_step, d2l._check_zero_step, lr='rate',
                         momentum='momentum')

@contextlib.contextmanager
def _quiet_spawn():
    """Keep PaddlePaddle's start-up notices out of the output while processes start.

    Defined in :numref:`sec_training_machinery`"""
    quiet = {'GLOG_minloglevel': '2',  # no C++ INFO or WARNING lines
             'PYTHONWARNINGS': 'ignore::UserWarning'}  # import notices
    saved = {key: os.environ.get(key) for key in quiet}  # restored at the end
    os.environ.update(quiet)
    launcher_log = logging.getLogger('root')  # Paddle logs free ports here
    level = launcher_log.level
    launcher_log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='.*CPUONLY mode')
            yield
    finally:
        launcher_log.setLevel(level)
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value

def _check_spawn_args(net_fn, devices, batch_size, lr, num_epochs):
    """Reject arguments of train_concise_spawn that cannot work, saying which.

    Defined in :numref:`sec_training_machinery`"""
    if isinstance(net_fn, nn.Layer) or not callable(net_fn):
        raise TypeError('net_fn must be a function that builds the model, got '
                        f'{type(net_fn).__name__}; pass e.g. '
                        'functools.partial(d2l.resnet18, 10)')
    d2l._check_devices(devices)
    for name, value in (('batch_size', batch_size), ('num_epochs', num_epochs)):
        d2l._require(d2l._is_count(value, 1),
                     f'{name} must be a positive integer, got {value!r}')
    k = len(devices)
    d2l._require(batch_size % k == 0, f'batch_size {batch_size} cannot be shared '
                 f'equally by {k} processes; use a multiple of {k}')
    d2l._check_rate(lr, 'lr')

def spawn_per_device(worker, devices, folder, *args):
    """Run worker(*args) in a process per device; their results by rank.

    Defined in :numref:`sec_training_machinery`"""
    gpus = [str(d.get_device_id()) for d in devices
            if isinstance(d, paddle.CUDAPlace)]
    options = {'backend': 'nccl', 'gpus': ','.join(gpus)} if gpus else {
        'backend': 'gloo'}
    with _quiet_spawn():  # forked with this process's environment
        context = paddle.distributed.spawn(
            _run_in_environment, nprocs=len(devices), join=False,
            args=(worker, args, dict(os.environ), folder),
            start_method=_fork_server(), **options)
    try:  # not context.join(): it can wait for good on a failed process
        codes = _wait_for_ranks(context.processes, folder, None)
    finally:  # after a failure or an interrupt, leave no process behind
        _stop_processes(context.processes)  # SIGKILL if SIGTERM fails
    if codes is not None:  # the earliest error is the cause, as in spawn_ranks
        raise _rank_failure(folder, len(devices), codes) from None
    return [queue.get() for queue in context.return_queues]

def _run_in_environment(worker, args, env, folder):
    """worker(*args) after taking `env`; an error is written to `folder`.

    Defined in :numref:`sec_training_machinery`"""
    global _rank_report_dir
    _take_environment(env, keep=_spawn_variables())  # spawn's own stay
    _rank_report_dir = folder  # as in the processes of spawn_ranks
    try:
        return worker(*args)
    except BaseException:
        _record_rank_failure(int(os.environ.get('PADDLE_TRAINER_ID', '0')))
        raise

def start_spawned_process(folder):
    """Join the group, output to rank<r>.log; return rank, world, device.

    Defined in :numref:`sec_training_machinery`"""
    rank = int(os.environ.get('PADDLE_TRAINER_ID', '0'))
    log = os.open(os.path.join(folder, f'rank{rank}.log'),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):  # start-up notices, C++ log lines, abort reports
        os.dup2(log, stream)
    dist = paddle.distributed
    dist.init_parallel_env()  # also makes this process's GPU the current one
    world = dist.get_world_size()
    device = paddle.get_device()  # 'gpu:<rank's GPU>' or 'cpu'
    if device == 'cpu':  # the processes share the cores
        threads = max(1, (os.cpu_count() or 1) // world)
        paddle.base.core.set_num_threads(threads)
    return rank, world, device

train_concise_spawn = d2l._checked(d2l.train_concise_spawn,
                                   d2l._check_spawn_args)

def _check_rank(rank, world_size, what='rank'):
    """Reject a world size below 1 or a rank outside 0..world_size-1, naming the culprit.

    Defined in :numref:`sec_launchers`"""
    size = what.replace('rank', 'world_size')  # local_rank: local_world_size
    for name, value in ((size, world_size), (what, rank)):
        if not _is_int(value):
            raise ValueError(f'{name} must be an integer, got {value!r}')
    if world_size < 1:
        raise ValueError(f'{size} must be at least 1, got {world_size}')
    if not 0 <= rank < world_size:
        raise ValueError(f'{what} must lie in 0..{world_size - 1} for a '
                         f'{size} of {world_size}, got {rank}')

def _int_from_env(name, least, default=None):
    """The integer in environment variable `name`, at least `least`; `default` if unset.

    Defined in :numref:`sec_launchers`"""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise ValueError(
            f'environment variable {name}={text!r} must be an integer of at '
            f'least {least}: unset it and start the script with the '
            f"framework's launcher, which sets it")
    return value

def _check_timeout(timeout_s, name='timeout_s'):
    """Accept None or a positive number of seconds for a process group's timeout.

    Defined in :numref:`sec_launchers`"""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(
            timeout_s, (int, float)) or not 0 < timeout_s < float('inf')):
        raise ValueError(f'{name} must be a positive number of seconds or '
                         f'None, got {timeout_s!r}')

_launcher_timeout_s = None  # a launcher script's --timeout: launcher_deadline

def _loopback_interface():
    """Name of the network interface that carries this machine's loopback address.

    Defined in :numref:`sec_launchers`"""
    return 'lo0' if sys.platform == 'darwin' else 'lo'

@contextlib.contextmanager
def _environment(values, **more):
    """Set environment variables for the body of a `with` block, then restore them.

    Defined in :numref:`sec_launchers`"""
    values = {**values, **more}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

def _is_loopback(host):
    """Whether `host` names an address of this machine's loopback interface.

    Defined in :numref:`sec_launchers`"""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, TypeError, ValueError):  # no such host, or no host
        return False

def _run_rank(worker, args, out_dir, parent_pid, env):
    """Body of a process of spawn_ranks: run the worker, store its outcome.

    Defined in :numref:`sec_launchers`"""
    rank = _int_from_env('PADDLE_TRAINER_ID', 0)  # set by spawn
    _start_rank(rank, out_dir, parent_pid, env, keep=_spawn_variables())
    try:
        result = worker(rank, _int_from_env('PADDLE_TRAINERS_NUM', 1), *args)
    except BaseException:
        _record_rank_failure(rank)  # unless process_group already did
        raise
    _finish_rank(rank, out_dir, result)

_WATCHDOG = (  # the program of launcher_deadline's watchdog process
    'import os, select, signal, sys\n'
    'pid, seconds = int(sys.argv[1]), float(sys.argv[2])\n'
    'if not select.select([sys.stdin], [], [], seconds)[0]:  # no EOF\n'
    '    print(sys.argv[3], file=sys.stderr, flush=True)\n'
    '    os.kill(pid, signal.SIGKILL)\n')

def _stand_down(watchdog, done, world_size):
    """Tell `watchdog` to stand down once a process group has formed or `done` is set.

    Defined in :numref:`sec_launchers`"""
    while world_size > 1 and not dist.is_initialized() and not done.wait(0.2):
        pass
    watchdog.stdin.close()  # end of its input: the watchdog exits quietly

def _rendezvous_address():
    """host:port of the rendezvous that PaddlePaddle will use, from the environment.

    Defined in :numref:`sec_launchers`"""
    if os.environ.get('MASTER_ADDR') and os.environ.get('MASTER_PORT'):
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return (os.environ.get('PADDLE_MASTER') or os.environ.get(
        'PADDLE_TRAINER_ENDPOINTS', '(unset)').split(',')[0])

def ddp_script_path(framework=None):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'.

    Defined in :numref:`sec_launchers`"""
    # framework=None: the script of this module's framework
    names = {'torch': 'ddp_train.py', 'mxnet': 'ddp_train_mxnet.py',
             'paddle': 'ddp_train_paddle.py'}
    if framework is None:
        framework = __name__.rsplit('.', 1)[-1]  # d2l.torch, for example
    if framework not in names:
        raise ValueError(f"framework must be 'torch', 'mxnet' or "
                         f"'paddle', got {framework!r}")
    name = names[framework]
    # Next to d2l/ in the repository, or beside a downloaded notebook.
    book_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    places = [os.path.join(book_root, 'chapter_multi_gpu', name),
              os.path.join(os.getcwd(), name),
              os.path.join(os.getcwd(), 'chapter_multi_gpu', name)]
    for place in places:
        if os.path.isfile(place):
            return place
    raise FileNotFoundError(f'{name} is in none of ' + ', '.join(places) +
                            ": run from the book's root or notebook folder")

def _needs(stage, op, i, num_stages):
    """The steps that must run before step (stage, op, i).

    Defined in :numref:`sec_parallelism_machinery`"""
    if op == 'F':
        return [(stage - 1, 'F', i)] if stage > 0 else []
    after = [(stage + 1, 'B', i)] if stage < num_stages - 1 else []
    return [(stage, 'F', i)] + after

def _interleave(orders):
    """The stages' orders as one list, each stage stepping when it can.

    Defined in :numref:`sec_parallelism_machinery`"""
    done, schedule, p = set(), [], len(orders)
    while any(orders):
        ready = [(s, *order[0]) for s, order in enumerate(orders)
                 if order and all(n in done for n in _needs(s, *order[0], p))]
        if not ready:
            raise ValueError('the stages wait on each other')
        for step in ready:
            orders[step[0]].pop(0)
        done.update(ready)
        schedule += ready
    return schedule

def _check_stage_number(stage, num_stages):
    """Refuse a stage outside 0..num_stages-1, naming both.

    Defined in :numref:`sec_parallelism_machinery`"""
    if not (_is_int(stage) and _is_int(num_stages)
            and 0 <= stage < num_stages):
        raise ValueError(f'stage must lie in 0..num_stages-1, got stage='
                         f'{stage!r} and num_stages={num_stages!r}')

def _check_pipeline_runs(runs, num_stages, X, y, depth, width):
    """Refuse bad runs or sizes for time_pipeline before anything starts.

    Defined in :numref:`sec_parallelism_machinery`"""
    _check_positive_int(depth, 'depth')
    _check_positive_int(width, 'width')
    split_stages(range(depth), num_stages)  # enough blocks for the stages
    if not isinstance(runs, (list, tuple)) or not runs:
        raise ValueError('runs must list (schedule, num_microbatches) pairs')
    for schedule, m in runs:
        check_schedule(schedule, num_stages, m)
        split_microbatches(X, y, m)  # enough examples

def _stage_shapes(stages, x):
    """The shape of each stage's output for the input x.

    Defined in :numref:`sec_parallelism_machinery`"""
    shapes = []
    with _no_grad():
        for layers in stages:
            for layer in layers:
                x = layer(x)
            shapes.append(tuple(x.shape))
    return shapes

def _queue_link(num_stages, num_microbatches, timeout_s, failed):
    """send and recv between stage threads: a queue per message.

    Defined in :numref:`sec_parallelism_machinery`"""
    boxes = {(s, op, i): queue.Queue() for s in range(num_stages)
             for op in 'FB' for i in range(num_microbatches)}
    send = lambda stage, op, i, x: boxes[stage, op, i].put(x)
    def recv(source, op, i):
        me = source + 1 if op == 'F' else source - 1
        deadline = time.monotonic() + timeout_s
        while not failed.is_set() and time.monotonic() < deadline:
            try:
                return boxes[me, op, i].get(timeout=0.05)
            except queue.Empty:
                pass
        raise TimeoutError(f'stage {me} waited for {op} of micro-batch {i} '
                           f'from stage {source}: ' + ('another stage failed'
                           if failed.is_set() else f'over {timeout_s:g} s'))
    return send, recv

def _merge(records):
    """One run's record from its stages' records.

    Defined in :numref:`sec_parallelism_machinery`"""
    return {'times': sorted(t for r in records for t in r['times']),
            'peak_bytes': [r['peak_bytes'] for r in records],
            'loss': records[-1]['loss']}

def _pump(box, peer, group, sending, shapes, rank, device, errors):
    """Carry this rank's messages to or from `peer` through `box`, in order.

    Defined in :numref:`sec_parallelism_machinery`"""
    try:
        for i in range(len(shapes)):
            if sending:
                dist.send(box.get(), peer, group)
                continue
            x = tensor(numpy.zeros(shapes[i][min(rank, peer)],
                                    numpy.float32), device)
            dist.recv(x, peer, group)
            box.put(x)
    except BaseException as error:
        errors.append(error)
        box.put(error)  # for a waiting recv

def _direction_groups(world_size, _made={}):
    """A group for each neighbour pair and direction ('F', 'B'), made once.

    Defined in :numref:`sec_parallelism_machinery`"""
    if world_size not in _made:  # every rank makes them in the same order
        _made[world_size] = {(s, op): dist.new_group([s, s + 1])
                             for s in range(world_size - 1) for op in 'FB'}
    return _made[world_size]

def _p2p_link(shapes, timeout_s, device):
    """send and recv between neighbour ranks; finish waits for the sends.

    Defined in :numref:`sec_parallelism_machinery`"""
    rank, p = dist.get_rank(), dist.get_world_size()
    groups, boxes, threads, errors = _direction_groups(p), {}, [], []
    for op, peer, sending in (('F', rank + 1, True), ('B', rank - 1, True),
                              ('F', rank - 1, False), ('B', rank + 1, False)):
        if 0 <= peer < p:  # one thread per peer and direction
            boxes[op, peer] = queue.Queue()
            threads.append(threading.Thread(target=_pump, daemon=True, args=(
                boxes[op, peer], peer, groups[min(rank, peer), op], sending,
                shapes, rank, device, errors)))
            threads[-1].start()
    send = lambda stage, op, i, x: boxes[op, stage].put(x.detach())
    def recv(source, op, i):
        try:
            x = boxes[op, source].get(timeout=timeout_s)
        except queue.Empty:
            x = TimeoutError(f'rank {rank} waited {timeout_s:g} s for {op} '
                             f'of micro-batch {i} from rank {source}')
        if isinstance(x, BaseException):
            raise x
        return x
    def finish():
        for thread in threads:
            thread.join(timeout_s)
        if errors or any(thread.is_alive() for thread in threads):
            raise errors[0] if errors else TimeoutError(
                f'rank {rank}: messages unfinished after {timeout_s:g} s')
    return send, recv, finish

def _tp_slice(n, allreduce):
    """The slice of `n` features that this rank keeps.

    Defined in :numref:`sec_parallelism_machinery`"""
    sizes = shard_sizes(n, allreduce.size)
    lo = sum(sizes[:allreduce.rank])
    return slice(lo, lo + sizes[allreduce.rank])

def _shard_axes(net):
    """For each parameter of `net`, the axis its slices are cut along.

    Defined in :numref:`sec_parallelism_machinery`"""
    return [axis for i in range(len(net))
            for axis in getattr(net[i], 'shard_axes', ())]

_from_numpy, _group = paddle.to_tensor, d2l.process_group
_to_numpy = lambda x: x.numpy()
_nbytes = lambda x: x.size * x.element_size()

def _new_group(ranks):
    """A process group of `ranks`, formed before the next one starts.

    Defined in :numref:`sec_parallelism_machinery`"""
    group = dist.new_group(ranks)
    dist.barrier()  # Gloo groups formed at once could fail to connect
    return group

def _parameter(layer, value):
    """A parameter of `layer` holding a copy of the NumPy array `value`.

    Defined in :numref:`sec_parallelism_machinery`"""
    return layer.create_parameter(
        list(value.shape), default_initializer=nn.initializer.Assign(value))

def _check_arrangement(allreduce, kind, shape, checksum):
    """Raise on every rank unless all build one layer from one model.

    Defined in :numref:`sec_parallelism_machinery`"""
    table = numpy.zeros((allreduce.size, 4), 'float32')
    table[allreduce.rank] = [kind, *shape, checksum]
    mine = _from_numpy(table)
    found = _to_numpy(allreduce(mine, 'check'))
    names = {1: 'ColumnParallelLinear', 2: 'RowParallelLinear'}
    def describe(row):
        return f'{names[int(row[0])]}({int(row[1])}, {int(row[2])})'

    for rank, row in enumerate(found):
        if not numpy.array_equal(row[:3], found[0][:3]):
            raise ValueError(
                f'rank {rank} builds {describe(row)} where rank 0 builds '
                f'{describe(found[0])}: every rank must build the same '
                f'layers in the same order')
        if not numpy.isclose(row[3], found[0][3], rtol=1e-5):
            raise ValueError(
                f'rank {rank} builds {describe(row)} from other weights than '
                f'rank 0 (weight sums {row[3]:.4f} and {found[0][3]:.4f}): '
                f'build every rank\'s layers from the same model')

def _check_row_input(got, expected, k):
    """Raise unless a row-parallel layer's input has its slice's columns.

    Defined in :numref:`sec_parallelism_machinery`"""
    if got != expected:
        raise ValueError(
            f"RowParallelLinear expects this rank's {expected} hidden units, "
            f'got {got}: feed it the output of a ColumnParallelLinear over '
            f'the same {k} ranks')

def _check_mlp_sizes(d, hidden, seed):
    """Reject sizes below 1 and seeds below 0, naming the argument.

    Defined in :numref:`sec_parallelism_machinery`"""
    for name, value, least in (('d', d, 1), ('hidden', hidden, 1),
                               ('seed', seed, 0)):
        _check_count(value, name, least)

def _check_mesh(dp, tp, world_size):
    """Reject a mesh whose dp x tp ranks are not the world's.

    Defined in :numref:`sec_parallelism_machinery`"""
    if dp * tp != world_size:
        raise ValueError(f'dp x tp must equal the {world_size} ranks of the '
                         f'world, got dp={dp} and tp={tp}')

def _tp_wrong_worker(rank, world_size, init_method, d, hidden):
    """Worker: three wrong arrangements of the MLP block; the errors raised.

    Defined in :numref:`sec_parallelism_machinery`"""
    with _group(rank, world_size, init_method):
        allreduce, mlp, errors = CountingAllreduce(), block_mlp(d, hidden), []
        X, _ = mlp_data(4, d)
        mistakes = [
            lambda: ColumnParallelLinear(mlp[0], allreduce) if rank == 0
            else RowParallelLinear(mlp[2], allreduce),
            lambda: RowParallelLinear(mlp[2], allreduce)(mlp[1](mlp[0](X))),
            lambda: tp_mlp(block_mlp(d, hidden, seed=rank), allreduce)]
        for mistake in mistakes:
            try:
                mistake()
            except ValueError as error:
                errors.append(str(error))
        return errors

split_stages = d2l._checked(d2l.split_stages, num_stages='positive')

pipeline_mlp = d2l._checked(d2l.pipeline_mlp, depth='positive',
                            width='positive', seed='count')

bubble_fraction = d2l._checked(d2l.bubble_fraction, num_stages='positive',
                               num_microbatches='positive')

pipeline_schedule = d2l._checked(d2l.pipeline_schedule,
                                 num_stages='positive',
                                 num_microbatches='positive')

check_schedule = d2l._checked(d2l.check_schedule, num_stages='positive',
                              num_microbatches='positive')

run_stage = d2l._checked(d2l.run_stage, d2l._check_stage_number)

split_microbatches = d2l._checked(d2l.split_microbatches,
                                  num_microbatches='positive')

run_pipeline = d2l._checked(d2l.run_pipeline, timeout_s='rate')

time_pipeline = d2l._checked(d2l.time_pipeline, d2l._check_pipeline_runs,
                             timeout_s='rate')

block_mlp = d2l._checked(d2l.block_mlp, d2l._check_mlp_sizes)

mlp_data = d2l._checked(d2l.mlp_data, batch_size='positive', d='positive')

mesh_allreduces = d2l._checked(d2l.mesh_allreduces, dp='positive',
                               tp='positive')

reduce_scatter = d2l._checked(d2l.reduce_scatter, lambda data:
                              d2l._check_per_device(data, 'data'))

def _check_number(name, value, positive=False):
    """Reject a value that is not a finite number >= 0 (> 0 if `positive`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise ValueError(f'{name} must be a finite number '
                         f'{"> 0" if positive else ">= 0"}, got {value!r}')

def _check_int(name, value, low, why=''):
    """Reject a value that is not an int >= `low`, naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or value < low:
        raise ValueError(f'{name} must be an int >= {low}{why}, got {value!r}')

def _check_cost_args(num_bytes, k, alpha, beta):
    """Reject negative or infinite sizes or times, and k below 1."""
    for name, value in (('num_bytes', num_bytes), ('alpha', alpha),
                        ('beta', beta)):
        _check_number(name, value)
    _check_int('k (the number of processes)', k, 1)

def _check_world_of_two(world_size):
    """Reject a world size below 2: one process has nothing to allreduce."""
    _check_int('world_size', world_size, 2, ' (one process sends nothing)')

def _check_timings(num_bytes, seconds, k):
    """Reject timings that fit_alpha_beta cannot fit a line to, saying why.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_int('k', k, 2, ' (one process sends nothing)')
    if len(num_bytes) != len(seconds) or len(set(num_bytes)) < 2:
        raise ValueError('num_bytes and seconds must have the same length, '
                         'and num_bytes needs at least two different sizes '
                         f'to fit a line; got {num_bytes!r} and {seconds!r}')
    for name, values in (('num_bytes', num_bytes), ('seconds', seconds)):
        for v in values:
            _check_number(name, v, positive=True)

def _check_step_args(t_compute, cores, threads, accumulate, overlap):
    """Defined in :numref:`sec_cost_model_machinery`"""
    """Reject non-positive arguments of predict_step_time, or an overlap
    outside [0, 1]."""
    _check_number('t_compute', t_compute, positive=True)
    for name, value in (('threads', threads), ('accumulate', accumulate),
                        ('cores', 1 if cores is None else cores)):
        _check_int(name, value, 1)
    _check_number('overlap (the hidden fraction of the allreduce)', overlap)
    if overlap > 1:
        raise ValueError(f'overlap must be at most 1, got {overlap!r}')

def _check_sizes(sizes, reps):
    """Reject an empty or non-positive list of byte sizes, or reps below 1.

    Defined in :numref:`sec_cost_model_machinery`"""
    sizes = list(sizes) or [None]
    for n in sizes:
        _check_int('sizes (a non-empty list of bytes of float32)', n, 4)
    _check_int('reps', reps, 1)
    return sizes

def _alternating_rounds(jobs, reps, wait=lambda: None, sync=lambda: None):
    """Seconds of each function in `jobs` in `reps` alternating rounds.

    Defined in :numref:`sec_cost_model_machinery`"""
    seconds = [[0.0] * len(jobs) for _ in range(reps)]
    for r in range(reps):
        order = range(len(jobs)) if r % 2 == 0 else range(len(jobs))[::-1]
        for i in order:
            wait()  # all processes start each timing together
            began = time.perf_counter()
            jobs[i]()
            sync()  # a GPU's work ends when it is done, not when it is queued
            seconds[r][i] = time.perf_counter() - began
    return seconds

def _slowest_medians(per_process):
    """Per job, the median over rounds of the slowest process's seconds.

    Defined in :numref:`sec_cost_model_machinery`"""
    # rounds: each process's result of _alternating_rounds
    rounds = [[max(col) for col in zip(*rows)] for rows in zip(*per_process)]
    return [statistics.median(col) for col in zip(*rounds)]

def time_all_reduce(world_size, sizes, reps=3, calls=5):
    """Median seconds per all_reduce of each byte size in `sizes`.

    Defined in :numref:`sec_cost_model_machinery`"""
    # each over `world_size` processes, timed over `calls` calls in a row
    sizes = _check_sizes(sizes, reps)
    _check_int('calls', calls, 1)
    _check_world_of_two(world_size)
    # PaddlePaddle's spawn passes the rendezvous in the environment.
    return _slowest_medians(spawn_ranks(
        _all_reduce_worker, world_size, 'env://', sizes, reps, calls))

def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One process of time_all_reduce: its seconds per call for each size.

    Defined in :numref:`sec_cost_model_machinery`"""
    with process_group(rank, world_size, init_method):
        sync = paddle.device.cuda.synchronize if num_gpus() else lambda: None
        return _all_reduce_rounds([paddle.zeros([n // 4]) for n in sizes],
                                  reps, calls, sync)

def _all_reduce_rounds(bufs, reps, calls, sync):
    """Seconds per all_reduce of each buffer in `reps` rounds of `calls`.

    Defined in :numref:`sec_cost_model_machinery`"""
    for x in bufs:
        dist.all_reduce(x)  # untimed: the first call sets up buffers
    seconds = _alternating_rounds(
        [lambda x=x: [dist.all_reduce(x) for _ in range(calls)]
         for x in bufs], reps, dist.barrier, sync)
    return [[s / calls for s in row] for row in seconds]

def _time_runs(runs, X, y, num_steps, warmup, reps, wait=lambda: None):
    """This process's seconds per micro-batch of each run in `runs`.

    Defined in :numref:`sec_cost_model_machinery`"""
    # runs: (net, optimizer, config) triples, timed in alternating rounds
    for net, optimizer, c in runs:  # untimed: DDP also settles its buckets
        _sgd_steps(net, optimizer, X, y, warmup, c['accumulate'], c['bf16'])
    # Plain copies wait for one another after each step, as DDP's processes
    # do at its allreduce: a step lasts as long as the slowest process's.
    jobs = [lambda r=r: _sgd_steps(
                r[0], r[1], X, y, num_steps, r[2]['accumulate'], r[2]['bf16'],
                wait if r[2].get('ddp') is False else lambda: None)
            for r in runs]
    seconds = _alternating_rounds(jobs, reps, wait)
    return [[s / (num_steps * c['accumulate'])
             for s, (_, _, c) in zip(row, runs)] for row in seconds]

def cost_model_net(model):
    """LeNet ('lenet') or the book's ResNet-18 ('resnet18') as a module.

    Defined in :numref:`sec_cost_model_machinery`"""
    if model == 'lenet':
        return nn.Sequential(
            nn.Conv2D(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2D(2),
            nn.Conv2D(6, 16, 5), nn.ReLU(), nn.MaxPool2D(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10))
    if model == 'resnet18':
        return resnet18(10)
    raise ValueError(f"model must be 'lenet' or 'resnet18', got {model!r}")

def gradient_bytes(net):
    """Bytes of float32 gradients one allreduce of `net`'s parameters moves.

    Defined in :numref:`sec_cost_model_machinery`"""
    return sum(p.numel().item() * 4 for p in net.parameters() if p.trainable)

def _sgd_steps(net, optimizer, X, y, num_steps, accumulate=1, bf16=False,
               step_end=lambda: None):
    """Take `num_steps` SGD steps of `accumulate` micro-batches (X, y) each.

    Defined in :numref:`sec_cost_model_machinery`"""
    # step_end is called after each step
    for _ in range(num_steps):
        optimizer.clear_grad()
        for i in range(accumulate):
            # DataParallel's no_sync skips the allreduce of all but the last.
            skip = net.no_sync() if i < accumulate - 1 and hasattr(
                net, 'no_sync') else contextlib.nullcontext()
            with skip:
                with paddle.amp.auto_cast(enable=bf16, dtype='bfloat16'):
                    loss = F.cross_entropy(net(X), y)
                loss.backward()
        optimizer.step()
        step_end()
    if num_gpus():
        paddle.device.cuda.synchronize()

def time_compute(model, batch_size, threads=None, num_steps=2, warmup=1,
                 reps=3, bf16=False):
    """Median seconds per plain SGD step of `model` in this process.

    Defined in :numref:`sec_cost_model_machinery`"""
    # on `batch_size` images, with `threads` CPU threads
    cost_model_net(model)  # rejects an unknown name
    _check_sizes([4], reps)
    if threads is not None:
        paddle.base.core.set_num_threads(threads)
    try:
        paddle.seed(0)
        net = cost_model_net(model)
        runs = [(net, paddle.optimizer.SGD(learning_rate=0.01,
                                           parameters=net.parameters()),
                 dict(accumulate=1, bf16=bf16))]
        X, y = timing_batch(batch_size)
        return _slowest_medians([_time_runs(runs, X, y, num_steps, warmup,
                                            reps)])[0]
    finally:  # Paddle cannot report its setting: back to the package's
        if threads is not None:
            paddle.base.core.set_num_threads(int(os.environ.get(
                'FLAGS_paddle_num_threads', os.cpu_count() or 1)))

def _check_configs(configs):
    """Each DDP configuration with its defaults; unknown keys rejected.

    Defined in :numref:`sec_cost_model_machinery`"""
    defaults = dict(model='resnet18', accumulate=1, bucket_cap_mb=25,
                    bf16=False, compress=False, ddp=True)
    out = []
    for c in configs:
        if not isinstance(c, dict) or set(c) - set(defaults):
            raise ValueError(f'each config must be a dict with keys among '
                             f'{sorted(defaults)}, got {c!r}')
        out.append(dict(defaults, **c))
        cost_model_net(out[-1]['model'])  # rejects an unknown model
        _check_int('accumulate', out[-1]['accumulate'], 1)
        ddp_buckets(1, out[-1]['bucket_cap_mb'])  # rejects a size <= 0
        if not isinstance(out[-1]['ddp'], bool):
            raise ValueError(f"ddp must be True or False, got "
                             f"{out[-1]['ddp']!r}")
        if out[-1]['compress'] and not out[-1]['ddp']:
            raise ValueError('compress=True needs ddp=True: a plain copy '
                             'of the network sends no gradients')
    if not out:
        raise ValueError("configs is empty; give dicts such as "
                         "{'model': 'lenet'}")
    return out

def _ddp_model(c, device):
    """A seeded DataParallel (plain if not c['ddp']) model, and its SGD.

    Defined in :numref:`sec_cost_model_machinery`"""
    paddle.seed(0)
    net = cost_model_net(c['model'])
    if c['ddp']:
        net = paddle.DataParallel(net, comm_buffer_size=c['bucket_cap_mb'])
    return net, paddle.optimizer.SGD(learning_rate=0.01,
                                     parameters=net.parameters())

def time_ddp_configs(world_size, configs, global_batch, num_steps=2,
                     warmup=1, reps=3):
    """Median seconds per micro-batch of DDP training for each config.

    Defined in :numref:`sec_cost_model_machinery`"""
    # `world_size` processes share `global_batch` examples
    configs = _check_configs(configs)
    if any(c['compress'] for c in configs):
        raise ValueError('compress=True: DataParallel has no compression hook')
    _check_sizes([4], reps)
    local_batch_size(global_batch, world_size)  # fail here, not in a child
    if world_size == 1:  # Paddle forms no group of one: time it here,
        paddle.base.core.set_num_threads(1)  # on one core's thread
        try:
            return _slowest_medians([_time_configs(
                configs, global_batch, num_steps, warmup, reps, 0, 1)])
        finally:
            paddle.base.core.set_num_threads(int(os.environ.get(
                'FLAGS_paddle_num_threads', os.cpu_count() or 1)))
    return _slowest_medians(spawn_ranks(
        _ddp_configs_worker, world_size, 'env://', configs, global_batch,
        num_steps, warmup, reps))

def _ddp_configs_worker(rank, world_size, init_method, configs, global_batch,
                        num_steps, warmup, reps):
    """One process of time_ddp_configs: join the group, time the configs.

    Defined in :numref:`sec_cost_model_machinery`"""
    with process_group(rank, world_size, init_method):
        return _time_configs(configs, global_batch, num_steps, warmup, reps,
                             rank, world_size)

def _time_configs(configs, global_batch, num_steps, warmup, reps, rank,
                  world_size):
    """This process's seconds per micro-batch of each config, alternating.

    Defined in :numref:`sec_cost_model_machinery`"""
    device = ddp_device(rank, world_size)
    share = local_batch_size(global_batch, world_size)
    X, y = (t[rank * share:(rank + 1) * share].to(device)
            for t in timing_batch(global_batch))
    runs = [(*_ddp_model(c, device), c) for c in configs]
    # A single process has no group to wait for.
    wait = dist.barrier if world_size > 1 else lambda: None
    return _time_runs(runs, X, y, num_steps, warmup, reps, wait)

_tp_barrier = lambda: dist.barrier()  # all ranks start a timing together

def _tp_timing_worker(rank, world_size, init_method, d, hidden, batch_size,
                      num_steps, reps):
    """Worker: seconds per pass of the whole MLP block and of its part.

    Defined in :numref:`sec_cost_model_machinery`"""
    with _group(rank, world_size, init_method):
        whole = block_mlp(d, hidden)
        part = tp_mlp(block_mlp(d, hidden), CountingAllreduce())
        X, Y = mlp_data(batch_size, d)
        jobs = [lambda net=net: [mlp_pass(net, X, Y)
                                 for _ in range(num_steps)]
                for net in (whole, part)]
        for job in jobs:  # untimed: the first pass sets up buffers
            job()
        seconds = _alternating_rounds(jobs, reps, _tp_barrier)
        return [[s / num_steps for s in row] for row in seconds]

def _check_ps_args(num_bytes, k, alpha, beta, servers):
    """The checks of ps_pushpull_time.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_cost_args(num_bytes, k, alpha, beta)
    _check_int('servers', servers, 1)

def _check_ps_fit(k, servers):
    """The checks of fit_ps_alpha_beta.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_int('k (the number of workers)', k, 1)
    _check_int('servers', servers, 1)

def _check_buckets(num_bytes, bucket_cap_mb, first_bucket_mb):
    """The checks of ddp_buckets.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_cost_args(num_bytes, 1, 0, 0)
    _check_number('bucket_cap_mb', bucket_cap_mb, positive=True)
    _check_number('first_bucket_mb', first_bucket_mb, positive=True)

def _check_step_prediction(t_compute, num_bytes, k, alpha, beta, cores,
                           threads, accumulate, overlap):
    """The checks of predict_step_time.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_cost_args(num_bytes, k, alpha, beta)
    _check_step_args(t_compute, cores, threads, accumulate, overlap)

def _check_pipeline_prediction(t_stage, num_stages, num_microbatches,
                               message_bytes, alpha, beta):
    """The checks of predict_pipeline_time.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_int('num_stages', num_stages, 1)
    _check_cost_args(message_bytes, num_stages, alpha, beta)
    _check_number('t_stage', t_stage, positive=True)
    _check_int('num_microbatches', num_microbatches, 1)

def _check_tensor_prediction(t_compute, k, activation_bytes, alpha, beta,
                             blocks):
    """The checks of predict_tensor_time.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_cost_args(activation_bytes, k, alpha, beta)
    _check_number('t_compute', t_compute, positive=True)
    _check_int('blocks', blocks, 1)

def _check_tensor_timing(k, d, hidden, batch_size, num_steps, reps):
    """The checks of time_tensor_parallel.

    Defined in :numref:`sec_cost_model_machinery`"""
    _check_int('k', k, 2, ' (one process splits nothing)')
    _check_int('hidden', hidden, k, ' (a hidden unit per process)')
    _check_mlp_sizes(d, hidden, 0)
    _check_int('batch_size', batch_size, 1)
    _check_sizes([4], reps)
    _check_int('num_steps', num_steps, 1)

ring_allreduce_time = d2l._checked(d2l.ring_allreduce_time,
                                   d2l._check_cost_args)

naive_allreduce_time = d2l._checked(d2l.naive_allreduce_time,
                                    d2l._check_cost_args)

ps_pushpull_time = d2l._checked(d2l.ps_pushpull_time, d2l._check_ps_args)

fit_alpha_beta = d2l._checked(d2l.fit_alpha_beta, d2l._check_timings)

fit_ps_alpha_beta = d2l._checked(d2l.fit_ps_alpha_beta, d2l._check_ps_fit)

ddp_buckets = d2l._checked(d2l.ddp_buckets, d2l._check_buckets)

predict_step_time = d2l._checked(d2l.predict_step_time,
                                 d2l._check_step_prediction)

predict_pipeline_time = d2l._checked(d2l.predict_pipeline_time,
                                     d2l._check_pipeline_prediction)

predict_tensor_time = d2l._checked(d2l.predict_tensor_time,
                                   d2l._check_tensor_prediction)

time_tensor_parallel = d2l._checked(d2l.time_tensor_parallel,
                                    d2l._check_tensor_timing)