"""The book's paddle helpers, generated from its #@save cells by `make lib`.

Use it as `from d2l import paddle as d2l`.
"""
import sys

# Saved code refers to its siblings as d2l.name, as the book's cells do.
d2l = sys.modules[__name__]

# The machinery, written once (d2l/runtime.py), and its PaddlePaddle side
# (d2l/_paddle.py): see the appendix page on the package's machinery.
from d2l.runtime import *  # noqa: F401,F403
from d2l._paddle import *  # noqa: F401,F403

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
    d2l.check_gpu_index(i)
    return paddle.CUDAPlace(i) if i < num_gpus() else paddle.CPUPlace()

def try_all_gpus():
    """Return every GPU, or a list holding only the CPU if there are none.

    Defined in :numref:`sec_helpers`"""
    return [paddle.CUDAPlace(i) for i in range(num_gpus())] or [
        paddle.CPUPlace()]

def try_gpus(num_devices):
    """Devices for `num_devices` model copies: GPUs, or the CPU if none.

    Defined in :numref:`sec_helpers`"""
    d2l.check_num_devices(num_devices)
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
    d2l.check_count(local_rank, 'local_rank')
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
        d2l.check_count(n, 'n (the number of sums)', 1)
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
    d2l.check_count(num_epochs, 'num_epochs', 1)
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
    d2l.check_count(seed, 'seed')
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
    d2l.check_lenet_args(X, params)
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
    d2l.check_scores_and_labels(y_hat, y)
    return -_pick(_log_softmax(y_hat), y).sum()

def get_params(params, device):
    """Copy `params` to `device` as new tensors that record their gradients.

    Defined in :numref:`sec_multi_gpu`"""
    d2l.check_arrays(params, 'params')
    copies = [copy_to(p, device) for p in params]  # never shares memory with p
    for p in copies:
        _track(p)
    return copies

def allreduce(data, devices=None):
    """Sum same-shaped arrays on different devices, writing the sum to each.

    Defined in :numref:`sec_multi_gpu`"""
    d2l.check_reduce_args(data, devices)
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
    d2l.check_count(n, 'n')
    d2l.check_count(k, 'k', 1)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]

def split_batch(X, y, devices):
    """Split examples `X` and labels `y` into one shard on each device.

    Defined in :numref:`sec_multi_gpu`"""
    d2l.check_split(X, y, devices)
    X_shards, y_shards, start = [], [], 0
    for size, device in zip(shard_sizes(X.shape[0], len(devices)), devices):
        X_shards.append(_to(X[start:start + size], device))
        y_shards.append(_to(y[start:start + size], device))
        start += size
    return X_shards, y_shards

def train_batch(X, y, device_params, devices, lr, allreduce_fn=allreduce):
    """One data-parallel SGD step on (X, y); returns the summed loss.

    Defined in :numref:`sec_multi_gpu`"""
    d2l.check_replicas(device_params, devices, allreduce_fn)
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
    # the losses and the new parameters: waits for every device
    return d2l.check_finite(losses, 'train_batch', device_params[0])

def evaluate_accuracy_replicas(device_params, data_iter, devices):
    """LeNet's accuracy on `data_iter`, each batch split over the devices.

    Defined in :numref:`sec_multi_gpu`"""
    d2l.check_replicas(device_params, devices)
    data_iter = d2l.check_batches(data_iter, 'data_iter')
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
    d2l.check_reduce_args(data, devices)
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
    d2l.check_resnet_args(num_classes, in_channels)
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
    d2l.check_model_kind(net)
    return sum(p.size for p in net.parameters() if not p.stop_gradient)

def _accuracy_on_devices(forward, data_iter, split_f, devices):
    """Fraction classified correctly, `forward(i, X_i)` scoring shard i.

    Defined in :numref:`sec_multi_gpu_concise`"""
    data_iter = d2l.check_batches(data_iter, 'data_iter')
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
    d2l.check_devices(devices, allow_none=True)
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
    d2l.check_step(X, y, devices)
    d2l.check(len(devices) == 1, f'devices names {len(devices)} devices, '
              'but a PaddlePaddle process computes on one; pass [its device] '
              'and start one process per device, as train_concise_spawn does')
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
    d2l.check_devices(devices)
    train_iter = d2l.check_batches(train_iter, 'train_iter')
    net.train()
    total, n = 0.0, 0
    for X, y in train_iter:
        l = d2l.train_step_concise(net, X, y, loss, optimizer, devices)
        total += float(l)  # waits for the step to finish
        n += X.shape[0]
    return d2l.check_finite(total, 'train_epoch_concise', net), n

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
    record = dict(device=device, train_loss=[], test_acc=[], epoch_s=[])
    record['data'] = d2l.describe_mode(d2l.quick_mode(d2l.num_gpus()), len(
        sampler.dataset), len(test_iter.dataset.dataset))  # all processes'
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every process
        d2l.set_learning_rate(optimizer, d2l.cosine_lr(lr, epoch, num_epochs))
        timer.start()
        loss_sum, n = d2l.train_epoch_concise(model, shard_iter, loss,
                                              optimizer, [device])
        record['epoch_s'].append(timer.stop())
        m = len(test_iter.dataset)  # this process's test images
        _share_rank0_statistics(model._layers, world)  # one BN state
        acc = d2l.evaluate_accuracy_gpus(model._layers, test_iter,
                                         devices=[device])
        sums = _sum_over_ranks([loss_sum, n, acc * m, m], device, world)
        record['train_loss'].append(sums[0] / sums[1])
        record['test_acc'].append(sums[2] / sums[3])
    if rank == 0:
        paddle.save(model._layers.state_dict(),
                    os.path.join(folder, 'trained.pdparams'))
    return record

def train_concise_spawn(net_fn, devices, batch_size, lr, num_epochs, seed=0):
    """Train net_fn() with a process per device; return (model, record).

    Defined in :numref:`sec_multi_gpu_concise`"""
    d2l.check_spawn_args(net_fn, devices, batch_size, lr, num_epochs, seed)
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
    d2l.check_lr(lr, epoch, num_epochs)
    return lr * (1 + math.cos(math.pi * epoch / num_epochs)) / 2

def set_learning_rate(optimizer, lr):
    """Give a PaddlePaddle optimizer the learning rate `lr`.

    Defined in :numref:`sec_multi_gpu_concise`"""
    d2l.check_number(lr, 'lr')
    optimizer.set_lr(lr)

import contextlib
import socket
import subprocess
import tempfile
import threading

import json
import paddle.distributed as dist

def ddp_device(local_rank, local_world_size):
    """The launcher's GPU, else GPU `local_rank` if each gets one, else CPU.

    Defined in :numref:`sec_process_groups`"""
    check_rank(local_rank, local_world_size, 'local_rank')
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
    check_rank(rank, world_size)
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
    check_rank(0, world_size)
    _check_worker(worker, world_size, args)  # and worker.check, if any
    _check_timeout(silence_s, 'silence_s')
    backend = backend or ddp_backend(ddp_device(0, world_size))
    check(backend in ('gloo', 'nccl'), "backend must be 'gloo', 'nccl' or "
          f'None, got {backend!r}')
    with tempfile.TemporaryDirectory(prefix='d2l-ranks-') as out_dir, \
            _quiet_spawn(), _quiet_logger('root'):
        context = dist.spawn(  # a notebook's code goes by value
            _run_rank, args=(_sendable(worker), _sendable(args), out_dir,
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
            f'{", ".join(missing)} not set: start this script with its '
            f'launcher, for example python -m paddle.distributed.launch '
            f'--nproc_per_node 2 {sys.argv[0]}')
    rank = _int_from_env('PADDLE_TRAINER_ID', 0)
    world_size = _int_from_env('PADDLE_TRAINERS_NUM', 1)
    # spawn describes one machine and leaves the local numbers out
    local_rank = _int_from_env('PADDLE_LOCAL_RANK', 0, rank)
    local_world_size = _int_from_env('PADDLE_LOCAL_SIZE', 1, world_size)
    check_rank(rank, world_size)
    check_rank(local_rank, local_world_size, 'local_rank')
    return rank, world_size, local_rank, local_world_size

@contextlib.contextmanager
def launcher_deadline(rank, world_size, timeout_s):
    """Give the body's groups `timeout_s`; end the process if none forms.

    Defined in :numref:`sec_process_groups`"""
    # it also says what this rank waits for
    check_rank(rank, world_size)
    _check_timeout(timeout_s)
    if timeout_s is None:
        raise ValueError('timeout_s must be a number of seconds, not None')
    fix = (f'start all {world_size} ranks with this address, check that its '
           'port is reachable, or give a larger timeout')
    _PROCESS['group_timeout_s'] = timeout_s  # for the groups it forms
    try:
        with _deadline_watchdog(
                f'rank {rank}', timeout_s, _rendezvous_address(),
                f'all {world_size} ranks', 'group', fix,
                lambda: world_size == 1 or dist.is_initialized()):
            yield
    finally:
        _PROCESS['group_timeout_s'] = None

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
    d2l.check_number(lr, 'lr')
    d2l.check_number(momentum, 'momentum', below=1)
    if momentum:
        return paddle.optimizer.Momentum(learning_rate=lr, momentum=momentum,
                                         parameters=net.parameters())
    return paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())

def shard_of_batch(X, y, step, rank, world_size, batch_size):
    """Rank `rank`'s `batch_size` examples of minibatch `step`, wrapping.

    Defined in :numref:`sec_ddp`"""
    d2l.check_count(step, 'step')
    d2l.check_count(batch_size, 'batch_size', 1)
    d2l.check_rank(rank, world_size)
    start = (step * world_size + rank) * batch_size
    idx = np.arange(start, start + batch_size) % len(y)
    return X[idx], y[idx]

def sgd_on_shards(net, optimizer, rank, world_size, num_steps, batch_size,
                  device):
    """Take `num_steps` steps, rank `rank` training on its minibatch shard.

    Defined in :numref:`sec_ddp`"""
    d2l.check_count(num_steps, 'num_steps')
    X, y = fashion_mnist_tensors('train')
    for step in range(num_steps):
        X_shard, y_shard = shard_of_batch(X, y, step, rank, world_size,
                                          batch_size)
        y_hat = net(X_shard.to(device))
        loss = F.cross_entropy(y_hat, y_shard.to(y_hat.device))
        optimizer.zero_grad()
        loss.backward()  # a wrapped model averages gradients over ranks
        optimizer.step()
    if num_steps:  # the last step's loss; the parameters after it
        return d2l.check_finite(loss, 'sgd_on_shards', net)

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
    d2l.check_global_batch(batch_size, world_size)  # a multiple of it
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

def _ddp_epoch(net, optimizer, train_iter, device, world_size, epoch,
               lr_at=None):
    """Defined in :numref:`sec_ddp_resnet`"""
    """One epoch on this rank's shards, at rate lr_at(epochs done) per step;
    return the mean loss over all ranks."""
    net.train()
    loss_sum, n = 0.0, 0
    for i, (X, y) in enumerate(train_iter):
        if lr_at is not None:
            set_learning_rate(optimizer, lr_at(epoch + i / len(train_iter)))
        loss = F.cross_entropy(net(X.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += float(loss.detach()) * len(y)
        n += len(y)
    loss_sum, n = _sum_over_ranks([loss_sum, n], device, world_size)
    return d2l.check_finite(loss_sum / n, f'_ddp_epoch in epoch {epoch + 1}',
                            net)

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
    """Defined in :numref:`sec_ddp_resnet`"""
    """Rate after `epoch` epochs (a fraction during one): from `start` to
    `lr` in `warmup` epochs, then down along half a cosine."""
    d2l.check_lr(lr, epoch, num_epochs, warmup, start)
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
    def lr_at(epochs_done):  # warm-up from the one-process rate
        return warmup_cosine_lr(lr, epochs_done, num_epochs, warmup,
                                lr / world_size)
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        timer.start()
        summary['train_loss'].append(_ddp_epoch(
            net, optimizer, train_iter, device, world_size, epoch, lr_at))
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
    d2l.check_train_ddp(world_size, init_method, num_epochs, batch_size, lr,
                        warmup=warmup)
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

train_ddp.check = d2l.check_train_ddp  # spawn_ranks runs it first

def describe_ddp_run(summary):
    """A few lines about a distributed training run, from a rank's summary.

    Defined in :numref:`sec_ddp_resnet`"""
    d2l.check_summary(summary)
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
    d2l.check_count(global_batch, 'global_batch', 1)
    return shard_of_batch(*fashion_mnist_tensors('train'), 0, 0, 1,
                          global_batch)

_set_threads = paddle.base.core.set_num_threads

def time_steps(net, optimizer, X, y, num_steps, warmup, device):
    """Average seconds per SGD step on (X, y) after `warmup` untimed steps.

    Defined in :numref:`sec_ddp_resnet`"""
    d2l.check_timing(num_steps, warmup)
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
    d2l.check_count(global_batch, 'global_batch', 1)
    d2l.check_timing(num_steps, warmup, threads)
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
            _use_threads(threads, _set_threads)
        net, optimizer = _timing_model(model_fn, device)
        X, y = shard_of_batch(*fashion_mnist_tensors('train'), 0, rank,
                              world_size, global_batch // world_size)
        seconds = [0.0] * world_size
        X, y = _to(X, device), _to(y, device)
        seconds[rank] = time_steps(net, optimizer, X, y, num_steps, warmup,
                                   device)
        return max(_sum_over_ranks(seconds, device, world_size))

def _thread_environment(threads):
    """Defined in :numref:`sec_ddp_resnet`"""
    return {}  # set in the process: _use_threads

def _timing_rendezvous():
    """Defined in :numref:`sec_ddp_resnet`"""
    return 'env://'

class TransformerBlock(nn.Layer):
    """Pre-norm block: X + attention(LN(X)), then X + MLP(LN(X)).

    Defined in :numref:`sec_memory`"""
    def __init__(self, h, num_heads):
        super().__init__()
        d2l.check_heads(h, num_heads)
        self.num_heads = num_heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, X):  # X: (b, s, h)
        QKV = self.qkv(self.ln1(X))
        b, s = QKV.shape[:2]  # every token, even when X holds some of them
        QKV = QKV.reshape([b, s, self.num_heads, 3, -1])  # per head: Q, K, V
        Q, K, V = QKV.transpose([3, 0, 2, 1, 4]).unbind(0)  # (b, heads, s, .)
        A = F.softmax(Q @ K.transpose([0, 1, 3, 2]) / Q.shape[-1] ** 0.5, -1)
        X = X + self.proj((A @ V).transpose([0, 2, 1, 3]).reshape([b, s, -1]))
        return X + self.fc2(F.gelu(self.fc1(self.ln2(X))))

@contextlib.contextmanager
def saved_tensors(net):
    """Bytes of each activation autograd keeps meanwhile, by address.

    Defined in :numref:`sec_memory`"""
    weights = {p.data_ptr() for p in net.parameters()}
    found = {}
    def keep(t):
        if t.data_ptr() not in weights:
            found[t.data_ptr()] = max(_nbytes(t), found.get(t.data_ptr(), 0))
        return t
    with paddle.autograd.saved_tensors_hooks(keep, lambda t: t):
        yield found

def block_activation_bytes(s, b, h, a, e=4):
    """Bytes a TransformerBlock keeps for backward, e bytes per number.

    Defined in :numref:`sec_memory`"""
    for name, v in zip('sbhae', (s, b, h, a, e)):
        d2l.check_count(v, name, 1)
    return e * (16 * s * b * h + a * s * s * b) + 16 * s * b

import math

def _flat(x):
    """`x` as a 1-D tensor outside any autograd graph.

    Defined in :numref:`sec_sharded_data_parallel`"""
    return x.detach().reshape([-1])

def _tensors_on(device):
    """A context in which new tensors are made on `device`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    return paddle.device.device_guard(device)

_concat, _zeros_like = paddle.concat, paddle.zeros_like

def reduce_scatter(data):
    """Sum same-shaped tensors on k devices; device i gets shard i of it.

    Defined in :numref:`sec_sharded_data_parallel`"""
    d2l.check_per_device(data, 'data')
    bounds = [0, *itertools.accumulate(
        shard_sizes(math.prod(data[0].shape), len(data)))]
    shards = []
    for i, x in enumerate(data):
        lo, hi, device = bounds[i], bounds[i + 1], _device_of(x)
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
    d2l.check_flat_shards(shards)
    gathered = []
    for x in shards:
        with _tensors_on(_device_of(x)):
            gathered.append(
                _concat([d2l.copy_to(s, _device_of(x)) for s in shards]))
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
    d2l.check(d2l.is_count(stage) and stage <= 3, f'stage must be 0 (plain '
              f'data parallelism), 1, 2 or 3, got {stage!r}')

def zero_init(params, devices, stage):
    """Each device's flat parameters, gradients, momentum for ZeRO `stage`.

    Defined in :numref:`sec_sharded_data_parallel`"""
    d2l.check_zero_init(params, devices, stage)
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
    d2l.check_zero_step(states, devices, stage, lr, momentum)
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
    d2l.check_finite(0.0, 'zero_step', [s['params'] for s in states])

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
    d2l.check_count(num_stages, 'num_stages', 1)
    layers = list(layers)
    if num_stages > len(layers):
        raise ValueError(f'num_stages={num_stages} exceeds the {len(layers)} '
                         f'layers; every stage needs at least one layer')
    bounds = [0, *itertools.accumulate(shard_sizes(len(layers), num_stages))]
    return [layers[lo:hi] for lo, hi in zip(bounds, bounds[1:])]

def pipeline_mlp(depth, width, seed=0):
    """An MLP on flat images as a list of `depth` blocks, 10 scores out.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_count(depth, 'depth', 1)
    d2l.check_count(width, 'width', 1)
    d2l.check_count(seed, 'seed')
    _manual_seed(seed)
    sizes = [784] + [int(width)] * (int(depth) - 1) + [10]
    return [nn.Sequential(nn.Linear(a, b), nn.ReLU()) if j < depth - 1
            else nn.Linear(a, b)
            for j, (a, b) in enumerate(zip(sizes, sizes[1:]))]

def bubble_fraction(num_stages, num_microbatches):
    """Idle share (p-1)/(m+p-1) of a pipeline of equal steps.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_count(num_stages, 'num_stages', 1)
    d2l.check_count(num_microbatches, 'num_microbatches', 1)
    return (num_stages - 1) / (num_microbatches + num_stages - 1)

def pipeline_schedule(kind, num_stages, num_microbatches):
    """Steps (stage, 'F' or 'B', micro-batch) of GPipe or 1F1B.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_count(num_stages, 'num_stages', 1)
    d2l.check_count(num_microbatches, 'num_microbatches', 1)
    if kind not in ('gpipe', '1f1b'):
        raise ValueError(f"kind must be 'gpipe' or '1f1b', got {kind!r}")
    p, m = num_stages, num_microbatches
    orders = []
    for s in range(p):
        ahead = m if kind == 'gpipe' else min(p - 1 - s, m)
        order = [(s, 'F', i) for i in range(ahead)]
        for i in range(m - ahead):  # one forward, one backward
            order += [(s, 'F', ahead + i), (s, 'B', i)]
        orders.append(order + [(s, 'B', i) for i in range(m - ahead, m)])
    return _interleave(orders)

def _weight_grad(layer, out, grad):
    """W for one block: add its weights' gradients from its output's.

    Defined in :numref:`sec_pipeline`"""
    grads = _one_at_a_time(paddle.grad, out, layer.parameters(), grad)
    for p, g in zip(layer.parameters(), grads):
        p.grad = g if p.grad is None else p.grad + g

_input_grad = lambda out, x, grad: _one_at_a_time(  # W needs the graph
    paddle.grad, out, x, grad, retain_graph=True)[0]

def _forward(layers, x, y, num_examples):
    """Forward pass, each block on a copy of its input: (input, output)s.

    Defined in :numref:`sec_pipeline`"""
    loss = lambda scores: cross_entropy_sum(scores, y) / num_examples
    pairs = []
    for f in list(layers) + ([loss] if y is not None else []):
        x_in = _leaf(x)
        with _record():
            x = f(x_in)
        pairs.append((x_in, x))
    _sync(x)
    return pairs

def _backward(layers, pairs, grad):
    """B: the stage input's gradient; and W, a function for the weights'.

    Defined in :numref:`sec_pipeline`"""
    grads = []
    for x_in, out in reversed(pairs):
        grads.insert(0, grad)
        grad = _input_grad(out, x_in, grad)
    _sync(grad)
    def weights():  # W: each block's weights from its output's gradient
        for layer, (_, out), g in zip(layers, pairs, grads):
            _weight_grad(layer, out, g)
        _sync(pairs[0][0])
    return grad, weights

def run_device(stages, num_stages, steps, Xs, ys, device, send, recv):
    """Run a device's steps on its stages {s: layers}: times, bytes, loss.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_device_steps(stages, num_stages, steps)
    n, split = sum(x.shape[0] for x in Xs), any(t[1] == 'W' for t in steps)
    size = lambda pairs: 4 * sum(math.prod(t.shape) for t in [  # fp32
        pairs[0][0], *(out for _, out in pairs)])
    held, weights, now, peak, loss, times = {}, {}, 0, 0, 0.0, []
    for s, op, i in steps:
        last = s == num_stages - 1
        x = recv(s + 1, 'B', i) if op == 'B' and not last else None
        if op == 'F':  # x: what the step receives
            x = Xs[i] if s == 0 else recv(s - 1, 'F', i)
        start = time.perf_counter()
        x = None if x is None else d2l.copy_to(x, device)
        if op == 'F':
            y = d2l.copy_to(ys[i], device) if last else None
            held[s, i] = _forward(stages[s], x, y, n)
            now, out = now + size(held[s, i]), held[s, i][-1][1]
            peak = max(peak, now)
            loss += float(out.detach()) if last else 0.0
        elif op == 'B':  # out: the gradient of the stage's input
            out, weights[s, i] = _backward(stages[s], held[s, i], x)
        if op == 'W' or op == 'B' and not split:
            weights.pop((s, i))()
            now -= size(held.pop((s, i)))
        times.append((s, op, i, start, time.perf_counter()))
        if op == 'F' and not last or op == 'B' and s > 0:
            send(s + 1 if op == 'F' else s - 1, op, i, out)
    return {'times': times, 'peak_bytes': peak, 'loss': loss}

def split_microbatches(X, y, num_microbatches):
    """Cut a minibatch into `num_microbatches` nearly equal parts.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_microbatches(X, y, num_microbatches)
    sizes = shard_sizes(X.shape[0], num_microbatches)
    parts = [(sum(sizes[:j]), sum(sizes[:j + 1])) for j in range(len(sizes))]
    return [X[lo:hi] for lo, hi in parts], [y[lo:hi] for lo, hi in parts]

def run_pipeline(stages, schedule, X, y, num_microbatches, timeout_s=60.0,
                 num_devices=None):
    """Run `schedule` with a thread per device; times, bytes, loss, grads.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_stages(stages, timeout_s)
    S, p = len(stages), (len(stages) if num_devices is None else num_devices)
    d2l.check_count(p, 'num_devices', 1)
    d2l.check_schedule(schedule, S, num_microbatches)
    Xs, ys = split_microbatches(X, y, num_microbatches)
    devices, failed = try_gpus(p), threading.Event()
    send, recv = _queue_link(S, num_microbatches, timeout_s, failed)
    def device(d):  # device d holds stages d, d + p, ...
        _thread_setup()
        where = devices[d % len(devices)]
        mine = _place({s: stages[s] for s in range(d, S, p)}, where)
        return run_device(mine, S, [t for t in schedule if t[0] % p == d],
                          Xs, ys, where, send, recv)
    records = _in_threads(device, p, failed, timeout_s * (len(schedule) + 1))
    record = _merge(records, _live_grads(stages))
    record['grads'] = [g for layers in stages for g in _grads(layers)]
    return record

def _pipeline_worker(rank, world_size, init_method, runs, X, y, depth, width,
                     timeout_s):
    """Worker: run each (schedule, m) of `runs` as device `rank`.

    Defined in :numref:`sec_pipeline`"""
    with process_group(rank, world_size, init_method) as device:
        X, y, records = tensor(X), tensor(y), []
        for schedule, m in runs:  # the same model, cut into S stages
            S = 1 + max(s for s, _, _ in schedule)
            stages = split_stages(pipeline_mlp(depth, width), S)
            Xs, ys = split_microbatches(X, y, m)
            mine = _place({s: stages[s] for s in range(rank, S, world_size)},
                          device)
            send, recv, finish = _p2p_link(schedule, [
                _stage_shapes(stages, x) for x in Xs], timeout_s, device)
            dist.barrier()  # the devices start each run together
            records.append(run_device(mine, S, [
                t for t in schedule if t[0] % world_size == rank], Xs, ys,
                device, send, recv))
            finish()
        records[-1]['grads'] = {s: _grads(l) for s, l in mine.items()}
        return records

def time_pipeline(runs, num_devices, X, y, depth, width, timeout_s=60.0):
    """Run each (schedule, m) of `runs` with a process per device.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_number(timeout_s, 'timeout_s', positive=True)
    d2l.check_pipeline_runs(runs, num_devices, X, y, depth, width)
    return _merge_runs(spawn_ranks(
        _pipeline_worker, num_devices, _rendezvous(), runs, X.cpu().numpy(),
        y.cpu().numpy(), depth, width, timeout_s))

def idle_fraction(times, num_devices=None):
    """Share of the devices' time in a run that no step used.

    Defined in :numref:`sec_pipeline`"""
    d2l.check_run_times(times, num_devices)
    p = num_devices or len({t[0] for t in times})  # default: one per stage
    span = max(t[4] for t in times) - min(t[3] for t in times)
    busy = sum(end - start for *_, start, end in times)
    return 1 - busy / (p * span)

def interleaved_schedule(num_devices, num_chunks, num_microbatches):
    """Steps of interleaved 1F1B: device d holds stages d, d + p, ...

    Defined in :numref:`sec_pipeline`"""
    d2l.check_count(num_devices, 'num_devices', 1)
    d2l.check_count(num_chunks, 'num_chunks', 1)
    d2l.check_count(num_microbatches, 'num_microbatches', 1)
    p, v, m = num_devices, num_chunks, num_microbatches
    if m % p:
        raise ValueError(f'num_microbatches={m} must be a multiple of '
                         f'num_devices={p}: they go round in groups of {p}')
    def step(d, k, op):  # device d's k-th forward or backward step
        chunk = k % (p * v) // p
        chunk = v - 1 - chunk if op == 'B' else chunk
        return (chunk * p + d, op, k // (p * v) * p + k % p)
    orders = []
    for d in range(p):
        n, ahead = m * v, min(2 * (p - 1 - d) + (v - 1) * p, m * v)
        order = [step(d, k, 'F') for k in range(ahead)]
        for k in range(n - ahead):
            order += [step(d, ahead + k, 'F'), step(d, k, 'B')]
        orders.append(order + [step(d, k, 'B') for k in range(n - ahead, n)])
    return _interleave(orders)

def zero_bubble_schedule(num_stages, num_microbatches):
    """1F1B with W steps of their own; stage s runs each s B steps late.

    Defined in :numref:`sec_pipeline`"""
    one = pipeline_schedule('1f1b', num_stages, num_microbatches)
    orders = []
    for s in range(num_stages):
        order, waiting = [], []
        for step in [t for t in one if t[0] == s]:
            order.append(step)
            if step[1] == 'B':  # its W waits for s more B steps
                waiting.append((s, 'W', step[2]))
                if len(waiting) > s:
                    order.append(waiting.pop(0))
        orders.append(order + waiting)
    return _interleave(orders)

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
    d2l.check_mlp_sizes(d, hidden, seed)
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
    d2l.check_count(batch_size, 'batch_size', 1)
    d2l.check_count(d, 'd', 1)
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
    d2l.check_shards(results, key)
    return [results[0][key][i] if axis is None else
            numpy.concatenate([r[key][i] for r in results], axis)
            for i, axis in enumerate(results[0]['axes'])]

def mesh_allreduces(dp, tp):
    """This rank's (data, tensor) CountingAllreduce in a dp x tp mesh.

    Defined in :numref:`sec_tensor_parallelism`"""
    d2l.check_count(dp, 'dp', 1)
    d2l.check_count(tp, 'tp', 1)
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
    d2l.check_mesh_args(world_size, d, hidden, batch_size)
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

def tp_block(blk, allreduce, sequence=False):
    """This rank's part of TransformerBlock `blk`: heads, MLP units, tokens.

    Defined in :numref:`sec_tp_transformer`"""
    d2l.check_head_split(blk.num_heads, allreduce.size)
    column, row = ((SequenceColumnParallel, SequenceRowParallel) if sequence
                   else (ColumnParallelLinear, RowParallelLinear))
    layers = {'qkv': column(blk.qkv, allreduce),
              'proj': row(blk.proj, allreduce),
              'fc1': column(blk.fc1, allreduce),
              'fc2': row(blk.fc2, allreduce)}
    for name, layer in layers.items():  # in the order the block made them
        delattr(blk, name)  # Gluon refuses a new type under an old name
        setattr(blk, name, layer)
    blk.num_heads //= allreduce.size
    return blk

def seeded_block(h, num_heads, seed=0):
    """A TransformerBlock of width h with num_heads heads, from `seed`.

    Defined in :numref:`sec_tp_transformer`"""
    _manual_seed(seed)
    return TransformerBlock(h, num_heads)

def tp_block_worker(rank, world_size, init_method, h, num_heads, b, s,
                    sequence=False):
    """Worker: a pass of the split block; results, bytes, activation bytes.

    Defined in :numref:`sec_tp_transformer`"""
    with _group(rank, world_size, init_method):
        comm = TokenExchange()
        net = tp_block(seeded_block(h, num_heads), comm, sequence)
        layers = [net.qkv, net.proj, net.fc1, net.fc2]
        axes = [None] * 4 + [a for layer in layers for a in layer.shard_axes]
        X, Y = [x.reshape((b, s, h)) for x in mlp_data(b * s, h)]
        if sequence:  # this rank's tokens
            X, Y = [x[:, rank * s // world_size:(rank + 1) * s // world_size]
                    for x in (X, Y)]
        result = dict(mlp_pass(net, X, Y), axes=axes)
        if sequence:  # whole parameters saw only this rank's tokens
            result['grads'] = [g if a is not None else
                               _to_numpy(comm(_from_numpy(g), 'whole'))
                               for g, a in zip(result['grads'], axes)]
        result['sent'] = dict(comm.sent)
        with saved_tensors(net) as kept:  # a forward pass of its own
            net(X)
        return dict(result, kept=sum(kept.values()))

tp_block_worker.check = d2l.check_tp_block_worker  # before any process

class TokenExchange(d2l.CountingAllreduce):
    """A CountingAllreduce that also gathers and scatters tokens (axis 1).

    Defined in :numref:`sec_tp_transformer`"""
    def all_gather(self, x, name):
        parts = []
        dist.all_gather(parts, x, group=self.group)
        self.sent[name] = self.sent.get(name, 0) + self.size * _nbytes(x)
        return paddle.concat(parts, 1)

    def reduce_scatter(self, x, name):
        total = x.clone()
        dist.all_reduce(total, group=self.group)
        self.sent[name] = self.sent.get(name, 0) + _nbytes(x)
        return total.chunk(self.size, 1)[self.rank]

class _TokenExchange(paddle.autograd.PyLayer):
    """Gather tokens forward and scatter gradients back, or the reverse.

    Defined in :numref:`sec_tp_transformer`"""
    @staticmethod
    def forward(ctx, x, comm, gather):
        ctx.comm, ctx.gather = comm, gather
        step = comm.all_gather if gather else comm.reduce_scatter
        return step(x, 'forward')

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        step = comm.reduce_scatter if ctx.gather else comm.all_gather
        return step(grad, 'backward')

class SequenceColumnParallel(d2l.ColumnParallelLinear):
    """A ColumnParallelLinear fed this rank's tokens; it gathers all first.

    Defined in :numref:`sec_tp_transformer`"""
    def forward(self, X):
        X = _TokenExchange.apply(X, self.allreduce, True)
        return X @ self.weight + self.bias

class SequenceRowParallel(d2l.RowParallelLinear):
    """A RowParallelLinear that returns the sums for this rank's tokens.

    Defined in :numref:`sec_tp_transformer`"""
    def forward(self, H):
        partial = H @ self.weight
        return _TokenExchange.apply(partial, self.allreduce, False) + self.bias

import contextlib
import math
import numbers
import statistics
import time

def ring_allreduce_time(num_bytes, k, alpha, beta):
    """Alpha-beta seconds of a ring allreduce of `num_bytes` over `k` ranks.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_cost_args(num_bytes, k, alpha, beta)
    return 2 * (k - 1) * (alpha + beta * num_bytes / k)

def naive_allreduce_time(num_bytes, k, alpha, beta):
    """Alpha-beta seconds of a naive allreduce (all through device 0).

    Defined in :numref:`sec_cost_model`"""
    d2l.check_cost_args(num_bytes, k, alpha, beta)
    return 2 * (k - 1) * (alpha + beta * num_bytes)

def ps_pushpull_time(num_bytes, k, alpha, beta, servers=1):
    """Seconds of a push and a pull through `servers` parameter servers.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_ps_args(num_bytes, k, alpha, beta, servers)
    return 2 * (alpha + beta * num_bytes * max(1, k / servers))

def fit_alpha_beta(num_bytes, seconds, k):
    """Ring-model alpha (s/message) and beta (s/byte) fitted to timings.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_timings(num_bytes, seconds, k)
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
    d2l.check_ps_fit(k, servers)
    # The same line t = a + b n: fit it as a ring of two, then convert.
    a2, b2 = fit_alpha_beta(num_bytes, seconds, 2)  # a = 2 a2, b = b2
    return a2, b2 / (2 * max(1, k / servers))

def ddp_buckets(num_bytes, bucket_cap_mb=25, first_bucket_mb=1):
    """Byte sizes of DDP's gradient buckets for `num_bytes` of gradients.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_buckets(num_bytes, bucket_cap_mb, first_bucket_mb)
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
    d2l.check_step_prediction(t_compute, num_bytes, k, alpha, beta, cores,
                              threads, accumulate, overlap)
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
    d2l.check_pipeline_prediction(t_stage, num_stages, num_microbatches,
                                  message_bytes, alpha, beta)
    p, m = num_stages, num_microbatches
    return (m + p - 1) / m * t_stage + 2 * (p - 1) * (
        alpha + beta * message_bytes)

def predict_tensor_time(t_compute, k, activation_bytes, alpha, beta,
                        blocks=1, collective=None):
    """Seconds per tensor-parallel pass: compute/k plus 2 allreduces/block.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_tensor_prediction(t_compute, k, activation_bytes, alpha, beta,
                                blocks, collective)
    exchange = collective or ring_allreduce_time  # or ps_pushpull_time
    return t_compute / k + 2 * blocks * exchange(activation_bytes, k,
                                                 alpha, beta)

def pipeline_work_and_span(times):
    """The busiest stage's step seconds and the run's span, from its times.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_run_times(times)
    busy = {}
    for s, _, _, start, end in times:
        busy[s] = busy.get(s, 0.0) + end - start
    return max(busy.values()), max(t[4] for t in times) - min(
        t[3] for t in times)

def time_tensor_parallel(k, d, hidden, batch_size, num_steps=2, reps=3,
                         num_heads=0, seq_len=1):
    """Median seconds per pass of the whole block and of its k parts.

    Defined in :numref:`sec_cost_model`"""
    d2l.check_tensor_timing(k, d, hidden, batch_size, num_steps, reps,
                            num_heads, seq_len)
    return _slowest_medians(spawn_ranks(
        _tp_timing_worker, k, _rendezvous(), d, hidden, batch_size,
        num_steps, reps, num_heads, seq_len))