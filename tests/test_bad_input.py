"""Bad input to the public `d2l` API: every call works or raises an error that names what to fix.

The book promises (issue #11) that a public function, called with a wrong
type, a wrong shape, an empty input or a value out of range, never returns a
wrong number, hangs or leaves files behind: it either works or raises an
error naming the argument. BAD_CALLS lists such calls, one row each:

    Bad(section, function, label, call, error, fragment)

`call(d2l, fw)` makes the bad call through the `d2l` module of framework
`fw` ('pytorch', 'mxnet' or 'paddle'); the test expects `error` with
`fragment` in its message, in every framework. To sweep another section, add
its rows to BAD_CALLS (or extend it from a list built elsewhere). Calls that
of a helper that exists in one flavour only go into a list of their own
(PADDLE_ONLY here). Calls that
must keep working at the edge of their range go into EDGE_CALLS, as
(section, function, label, call, check) rows, where `check(result, d2l, fw)`
asserts the result is right.
"""
import collections
import contextlib
import os
import re

import numpy as np
import pytest

from d2l import runtime
from hypothesis import given, settings, strategies as st

from conftest import MODULES, tensor

Bad = collections.namedtuple(
    'Bad', 'section function label call error fragment')
Edge = collections.namedtuple('Edge', 'section function label call check')


def labels(fw, values):
    """Integer labels in the dtype the framework's loader yields."""
    return tensor(fw, np.asarray(values, 'int32' if fw == 'mxnet' else 'int64'))


def floats(fw, values):
    return tensor(fw, np.asarray(values, 'float32'))


def no_grad_param(fw):
    """A parameter that never took part in a backward pass."""
    return floats(fw, [1.0, 2.0])


def linear_net(d2l, fw):
    """A tiny framework model, for evaluate_accuracy_gpu."""
    if fw == 'pytorch':
        import torch
        return torch.nn.Linear(2, 3)
    if fw == 'mxnet':
        import mxnet as mx
        net = mx.gluon.nn.Dense(3, in_units=2)
        net.initialize()
        return net
    import paddle
    return paddle.nn.Linear(2, 3)


BAD_CALLS = [
    # ------------------------------------------------ helpers: devices
    Bad('helpers', 'try_gpu', 'negative', lambda d2l, fw: d2l.try_gpu(-1),
        ValueError, 'GPU index i must be a non-negative integer'),
    Bad('helpers', 'try_gpu', 'string', lambda d2l, fw: d2l.try_gpu('0'),
        ValueError, "got '0'"),
    Bad('helpers', 'try_gpus', 'zero', lambda d2l, fw: d2l.try_gpus(0),
        ValueError, 'num_devices must be a positive integer'),
    Bad('helpers', 'try_gpus', 'float', lambda d2l, fw: d2l.try_gpus(2.0),
        ValueError, 'num_devices'),
    Bad('helpers', 'try_gpus', 'none', lambda d2l, fw: d2l.try_gpus(None),
        ValueError, 'num_devices'),
    Bad('helpers', 'describe_devices', 'empty',
        lambda d2l, fw: d2l.describe_devices([]), ValueError,
        'devices must be a non-empty list'),
    Bad('helpers', 'describe_devices', 'string',
        lambda d2l, fw: d2l.describe_devices('cuda:0'), ValueError,
        'devices must be a non-empty list'),
    Bad('helpers', 'describe_devices', 'not a device',
        lambda d2l, fw: d2l.describe_devices([0, 1]), TypeError,
        'devices[0] is not a device of this framework'),
    Bad('helpers', 'describe_devices', 'num_asked',
        lambda d2l, fw: d2l.describe_devices(d2l.try_gpus(1), -2),
        ValueError, 'num_asked must be a positive integer'),
    # ------------------------------------------------ helpers: counting
    Bad('helpers', 'Accumulator', 'zero', lambda d2l, fw: d2l.Accumulator(0),
        ValueError, 'n (the number of sums) must be a positive integer'),
    Bad('helpers', 'Accumulator', 'string',
        lambda d2l, fw: d2l.Accumulator('2'), ValueError, 'n (the number'),
    Bad('helpers', 'Accumulator.add', 'too many',
        lambda d2l, fw: d2l.Accumulator(2).add(1, 2, 3), ValueError,
        'expected 2 values, got 3'),
    Bad('helpers', 'accuracy', 'lists',
        lambda d2l, fw: d2l.accuracy([[0.1, 0.9]], [1]), TypeError,
        'y_hat must be a tensor'),
    Bad('helpers', 'accuracy', 'unpaired lengths',
        lambda d2l, fw: d2l.accuracy(floats(fw, np.zeros((5, 3))),
                                     labels(fw, [0, 1, 2, 0])),
        ValueError, 'y_hat (5, 3) and y (4,)'),
    Bad('helpers', 'accuracy', 'labels as a table',
        lambda d2l, fw: d2l.accuracy(floats(fw, np.zeros((4, 3))),
                                     labels(fw, np.zeros((4, 2)))),
        ValueError, 'y of shape (N,)'),
    Bad('helpers', 'accuracy', 'three-dimensional scores',
        lambda d2l, fw: d2l.accuracy(floats(fw, np.zeros((4, 3, 2))),
                                     labels(fw, [0, 1, 2, 0])),
        ValueError, 'y_hat of shape (N, num_classes)'),
    Bad('helpers', 'evaluate_accuracy_gpu', 'empty iterator',
        lambda d2l, fw: d2l.evaluate_accuracy_gpu(linear_net(d2l, fw), []),
        ValueError, 'data_iter yielded no examples'),
    Bad('helpers', 'evaluate_accuracy_gpu', 'not iterable',
        lambda d2l, fw: d2l.evaluate_accuracy_gpu(linear_net(d2l, fw), 7),
        TypeError, 'data_iter must be an iterable'),
    Bad('helpers', 'sgd', 'batch size zero',
        lambda d2l, fw: d2l.sgd([no_grad_param(fw)], 0.1, 0), ValueError,
        'batch_size must be a positive number'),
    Bad('helpers', 'sgd', 'negative lr',
        lambda d2l, fw: d2l.sgd([no_grad_param(fw)], -0.1, 8), ValueError,
        'lr must be a finite non-negative number'),
    Bad('helpers', 'sgd', 'nan lr',
        lambda d2l, fw: d2l.sgd([no_grad_param(fw)], float('nan'), 8),
        ValueError, 'lr must be'),
    Bad('helpers', 'sgd', 'no gradient',
        lambda d2l, fw: d2l.sgd([no_grad_param(fw)], 0.1, 8), ValueError,
        'params[0] has no gradient'),
    # ------------------------------------------------ helpers: plots
    Bad('helpers', 'Animator', 'no rows',
        lambda d2l, fw: d2l.Animator(nrows=0), ValueError,
        'nrows must be a positive integer'),
    Bad('helpers', 'Animator.add', 'x and y differ in length',
        lambda d2l, fw: d2l.Animator().add([1, 2, 3], [0.5, 0.6]),
        ValueError, 'x has 3 values but y has 2'),
    # ------------------------------------------------ helpers: data
    Bad('helpers', 'load_data_fashion_mnist', 'batch size zero',
        lambda d2l, fw: d2l.load_data_fashion_mnist(0), ValueError,
        'batch_size must be a positive integer'),
    Bad('helpers', 'load_data_fashion_mnist', 'batch size float',
        lambda d2l, fw: d2l.load_data_fashion_mnist(32.0), ValueError,
        'batch_size must be a positive integer'),
    Bad('helpers', 'load_data_fashion_mnist', 'negative resize',
        lambda d2l, fw: d2l.load_data_fashion_mnist(32, resize=-4),
        ValueError, 'resize must be a positive integer'),
    Bad('helpers', 'load_data_fashion_mnist', 'resize triple',
        lambda d2l, fw: d2l.load_data_fashion_mnist(32, resize=(28, 28, 1)),
        ValueError, 'resize must be a positive integer'),
    Bad('helpers', 'fashion_mnist_arrays', 'unknown split',
        lambda d2l, fw: d2l.fashion_mnist_arrays('valid', True), ValueError,
        "split must be 'train' or 'test'"),
    Bad('helpers', 'read_idx_file', 'unknown file',
        lambda d2l, fw: d2l.read_idx_file('train-images'), ValueError,
        'name must be one of'),
    Bad('helpers', 'balanced_subset', 'zero per class',
        lambda d2l, fw: d2l.balanced_subset(np.arange(10) % 2, 0),
        ValueError, 'per_class must be a positive integer'),
    Bad('helpers', 'balanced_subset', 'negative per class',
        lambda d2l, fw: d2l.balanced_subset(np.arange(10) % 2, -1),
        ValueError, 'per_class must be a positive integer'),
    Bad('helpers', 'train_epochs', 'zero', lambda d2l, fw: d2l.train_epochs(0),
        ValueError, 'num_epochs must be a positive integer'),
    Bad('helpers', 'train_epochs', 'float',
        lambda d2l, fw: d2l.train_epochs(2.5), ValueError, 'num_epochs'),
]

PADDLE_ONLY = [
    Bad('helpers', 'ArrayDataset', 'unequal lengths',
        lambda d2l, fw: d2l.ArrayDataset(np.zeros(3), np.zeros(4)),
        ValueError, 'equal length, got lengths [3, 4]'),
    Bad('helpers', 'ArrayDataset', 'no arrays',
        lambda d2l, fw: d2l.ArrayDataset(), ValueError, 'one or more arrays'),
]

EDGE_CALLS = [
    Edge('helpers', 'accuracy', 'no examples',
         lambda d2l, fw: d2l.accuracy(floats(fw, np.zeros((0, 3))),
                                      labels(fw, np.zeros(0))),
         lambda result, d2l, fw: result == 0),
    Edge('helpers', 'accuracy', 'one class column',
         lambda d2l, fw: d2l.accuracy(floats(fw, [[0.0], [1.0]]),
                                      labels(fw, [[0], [0]])),
         lambda result, d2l, fw: result == 1),
    Edge('helpers', 'Timer.avg', 'no interval yet',
         lambda d2l, fw: d2l.Timer().avg(),
         lambda result, d2l, fw: result == 0.0),
    Edge('helpers', 'Animator.add', 'missing values',
         lambda d2l, fw: d2l.Animator().add(1, (None, 0.5)),
         lambda result, d2l, fw: result is None),
    Edge('helpers', 'try_gpus', 'many copies',
         lambda d2l, fw: d2l.try_gpus(64),
         lambda result, d2l, fw: 1 <= len(result) <= 64),
    Edge('helpers', 'balanced_subset', 'more per class than exist',
         lambda d2l, fw: d2l.balanced_subset(np.array([0, 1, 1, 0, 1]), 10),
         lambda result, d2l, fw: list(result) == [0, 1, 2, 3, 4]),
]


def _id(row):
    return f'{row.section}:{row.function}:{row.label}'


@pytest.mark.parametrize('row', BAD_CALLS, ids=[_id(r) for r in BAD_CALLS])
def test_a_bad_call_raises_an_error_that_names_the_fix(framework, d2l, row,
                                                       quick):
    with pytest.raises(row.error) as info:
        row.call(d2l, framework)
    assert row.fragment in str(info.value)


@pytest.mark.parametrize('row', PADDLE_ONLY, ids=[_id(r) for r in PADDLE_ONLY])
def test_a_bad_call_to_a_paddle_only_helper_names_the_fix(row):
    import importlib
    d2l = importlib.import_module('d2l.paddle')
    with pytest.raises(row.error) as info:
        row.call(d2l, 'paddle')
    assert row.fragment in str(info.value)


@pytest.mark.parametrize('row', EDGE_CALLS, ids=[_id(r) for r in EDGE_CALLS])
def test_a_call_at_the_edge_of_its_range_works(framework, d2l, row):
    assert row.check(row.call(d2l, framework), d2l, framework)


def test_sgd_rejects_before_writing_anything(framework, d2l):
    """A bad second parameter leaves the first one untouched."""
    from conftest import numpy
    if framework == 'pytorch':
        import torch
        good = torch.tensor([1.0, 2.0], requires_grad=True)
        (good * good).sum().backward()
    elif framework == 'mxnet':
        import mxnet as mx
        good = mx.np.array([1.0, 2.0])
        good.attach_grad()
        with mx.autograd.record():
            loss = (good * good).sum()
        loss.backward()
    else:
        import paddle
        good = paddle.to_tensor([1.0, 2.0], stop_gradient=False)
        (good * good).sum().backward()
    with pytest.raises(ValueError, match=r'params\[1\] has no gradient'):
        d2l.sgd([good, no_grad_param(framework)], 0.1, 4)
    np.testing.assert_array_equal(numpy(framework, good), [1.0, 2.0])


# ---------------------------------------------------------------- property-based sweeps

NOT_POSITIVE_INTS = st.one_of(
    st.integers(max_value=0), st.floats(allow_nan=True), st.booleans(),
    st.text(max_size=3), st.none(), st.lists(st.integers(1, 3), max_size=2))


def test_try_gpus_accepts_only_positive_ints(d2l):
    @settings(max_examples=60, deadline=None)
    @given(bad=NOT_POSITIVE_INTS)
    def check(bad):
        with pytest.raises(ValueError, match='num_devices'):
            d2l.try_gpus(bad)
    check()


def test_try_gpus_never_mixes_gpus_and_the_cpu(framework, d2l, monkeypatch):
    """For any g and k: at most k devices, all GPUs or all the CPU."""
    from test_helpers import gpu_index, pretend_gpus

    @settings(max_examples=40, deadline=None)
    @given(g=st.integers(0, 16), k=st.integers(1, 16))
    def check(g, k):
        with monkeypatch.context() as m:
            pretend_gpus(framework, d2l, m, g)
            devices = d2l.try_gpus(k)
            kinds = {gpu_index(framework, d) is None for d in devices}
        assert len(kinds) == 1
        assert len(devices) == (k if g == 0 else min(g, k))
    check()


def test_load_data_rejects_every_batch_size_that_is_not_a_positive_int(d2l):
    @settings(max_examples=40, deadline=None)
    @given(bad=NOT_POSITIVE_INTS)
    def check(bad):
        with pytest.raises(ValueError, match='batch_size'):
            d2l.load_data_fashion_mnist(bad)
    check()


def test_accuracy_rejects_every_length_mismatch(framework, d2l):
    @settings(max_examples=25, deadline=None)
    @given(n=st.integers(0, 8), m=st.integers(0, 8), c=st.integers(2, 4))
    def check(n, m, c):
        scores = floats(framework, np.zeros((n, c)))
        y = labels(framework, np.zeros(m))
        if n == m:
            assert d2l.accuracy(scores, y) == n  # argmax of zeros is class 0
        else:
            with pytest.raises(ValueError, match='y_hat'):
                d2l.accuracy(scores, y)
    check()


def test_accumulator_rejects_every_wrong_count(d2l):
    @settings(max_examples=30, deadline=None)
    @given(n=st.integers(1, 5), values=st.lists(st.floats(-1e6, 1e6),
                                                max_size=7))
    def check(n, values):
        acc = d2l.Accumulator(n)
        if len(values) == n:
            acc.add(*values)
            assert acc.data == pytest.approx(values)
        else:
            with pytest.raises(ValueError, match=f'expected {n} values'):
                acc.add(*values)
    check()


# ---------------------------------------------------------------- the number sweep
#
# Every public function that takes a number is fed, one parameter at a time,
# values that no caller means: nan and infinities, negative rates, zero and
# negative counts, fractions where a count is expected, bools, strings and
# None. Each must raise a ValueError that names the parameter, before any
# work: never a silent nan, nor a ZeroDivisionError, TypeError or
# AttributeError from inside the package or a framework. The same functions
# must accept NumPy's integer and float scalars wherever a number is expected.

NAN, INF = float('nan'), float('inf')
BAD = {
    'count': [0, -3, 2.5, True, NAN, '4', None],      # at least 1
    'count or None': [0, -3, 2.5, True, NAN, '4'],    # None: the default
    'count0': [-1, 2.5, True, NAN, '4', None],        # at least 0
    'rate': [NAN, INF, -INF, -0.5, True, '0.1', None],  # finite, at least 0
    'momentum': [NAN, INF, -0.5, 1.0, 1.5, True],     # in [0, 1)
    'fraction': [NAN, INF, -0.5, 1.5, True],          # in [0, 1]
    'real': [NAN, INF, -1.0, True, '1'],              # finite, at least 0
}

Sweep = collections.namedtuple('Sweep', 'function frameworks build kinds cheap')
ALL = ('pytorch', 'mxnet', 'paddle')
MULTI = ('pytorch', 'paddle')  # the flavours with process groups


def param_with_grad(fw):
    """A parameter of this framework after one backward pass."""
    if fw == 'pytorch':
        import torch
        p = torch.tensor([1.0, 2.0], requires_grad=True)
        (p * p).sum().backward()
        return p
    if fw == 'mxnet':
        import mxnet as mx
        p = mx.np.array([1.0, 2.0])
        p.attach_grad()
        with mx.autograd.record():
            loss = (p * p).sum()
        loss.backward()
        return p
    import paddle
    p = paddle.to_tensor([1.0, 2.0], stop_gradient=False)
    (p * p).sum().backward()
    return p


def an_optimizer(fw):
    """A plain SGD optimizer of this framework over a small layer."""
    if fw == 'pytorch':
        import torch
        return torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    if fw == 'mxnet':
        import mxnet as mx
        net = mx.gluon.nn.Dense(2, in_units=2)
        net.initialize()
        return mx.gluon.Trainer(net.collect_params(), 'sgd',
                                {'learning_rate': 0.1})
    import paddle
    return paddle.optimizer.SGD(learning_rate=0.1,
                                parameters=paddle.nn.Linear(2, 2).parameters())


def images(fw, n=4):
    return floats(fw, np.random.default_rng(0).random((n, 1, 28, 28)))


def lenet_step_args(d2l, fw):
    devices = d2l.try_gpus(1)
    return dict(X=images(fw), y=labels(fw, [0, 1, 2, 3]),
                device_params=[d2l.get_params(d2l.lenet_params(), devices[0])],
                devices=devices, lr=0.1)


def zero_step_args(d2l, fw):
    devices = d2l.try_gpus(1)
    return dict(X=images(fw), y=labels(fw, [0, 1, 2, 3]),
                states=d2l.zero_init(d2l.lenet_params(), devices, 0),
                devices=devices, stage=0, lr=0.1, momentum=0.9)


def cost_args():
    return dict(num_bytes=4e6, k=2, alpha=1e-5, beta=1e-9)


def small_net_args(d2l):
    net = d2l._small_mlp(seed=0)
    return dict(net=net, optimizer=d2l._sgd(net, 0.1), rank=0, world_size=1,
                num_steps=1, batch_size=4, device='cpu')


def pipeline_args(d2l, fw, **more):
    """Four flat images and labels with a 2-stage MLP and a GPipe schedule."""
    return dict(X=floats(fw, np.random.default_rng(0).random((4, 784))),
                y=labels(fw, [0, 1, 2, 3]), **more)


SWEEP = [
    Sweep('try_gpu', ALL, lambda d2l, fw: (d2l.try_gpu, dict(i=0)),
          {'i': 'count0'}, True),
    Sweep('try_gpus', ALL, lambda d2l, fw: (d2l.try_gpus, dict(num_devices=1)),
          {'num_devices': 'count'}, True),
    Sweep('describe_devices', ALL, lambda d2l, fw: (
        d2l.describe_devices, dict(devices=d2l.try_gpus(1), num_asked=1)),
        {'num_asked': 'count or None'}, True),
    Sweep('Accumulator', ALL, lambda d2l, fw: (d2l.Accumulator, dict(n=2)),
          {'n': 'count'}, True),
    Sweep('sgd', ALL, lambda d2l, fw: (d2l.sgd, dict(
        params=[param_with_grad(fw)], lr=0.1, batch_size=2)),
        {'lr': 'rate', 'batch_size': 'real'}, True),
    Sweep('Animator', ALL, lambda d2l, fw: (d2l.Animator, dict(nrows=1, ncols=1)),
          {'nrows': 'count', 'ncols': 'count'}, True),
    Sweep('train_epochs', ALL, lambda d2l, fw: (
        d2l.train_epochs, dict(num_epochs=2)), {'num_epochs': 'count'}, True),
    Sweep('load_data_fashion_mnist', ALL, lambda d2l, fw: (
        d2l.load_data_fashion_mnist, dict(batch_size=32, resize=28)),
        {'batch_size': 'count', 'resize': 'count or None'}, True),
    Sweep('lenet_params', ALL, lambda d2l, fw: (d2l.lenet_params, dict(seed=0)),
          {'seed': 'count0'}, True),
    Sweep('shard_sizes', ALL, lambda d2l, fw: (d2l.shard_sizes, dict(n=10, k=3)),
          {'n': 'count0', 'k': 'count'}, True),
    Sweep('train_batch', ALL, lambda d2l, fw: (
        d2l.train_batch, lenet_step_args(d2l, fw)), {'lr': 'rate'}, True),
    Sweep('resnet18', ALL, lambda d2l, fw: (d2l.resnet18, dict(
        num_classes=10, in_channels=1)),
        {'num_classes': 'count', 'in_channels': 'count'}, True),
    Sweep('cosine_lr', ALL, lambda d2l, fw: (d2l.cosine_lr, dict(
        lr=0.1, epoch=1, num_epochs=3)),
        {'lr': 'rate', 'epoch': 'real', 'num_epochs': 'count'}, True),
    Sweep('set_learning_rate', ALL, lambda d2l, fw: (
        d2l.set_learning_rate, dict(optimizer=an_optimizer(fw), lr=0.1)),
        {'lr': 'rate'}, True),
    Sweep('balanced_subset', ALL, lambda d2l, fw: (d2l.balanced_subset, dict(
        labels=np.arange(10) % 2, per_class=2)), {'per_class': 'count'}, True),
    Sweep('check_stage', ALL, lambda d2l, fw: (d2l.check_stage, dict(stage=1)),
          {'stage': 'count0'}, True),
    Sweep('zero_step', ALL, lambda d2l, fw: (
        d2l.zero_step, zero_step_args(d2l, fw)),
        {'stage': 'count0', 'lr': 'rate', 'momentum': 'momentum'}, True),
    Sweep('ring_allreduce_time', ALL, lambda d2l, fw: (
        d2l.ring_allreduce_time, cost_args()),
        {'num_bytes': 'real', 'k': 'count', 'alpha': 'real', 'beta': 'real'},
        True),
    Sweep('ps_pushpull_time', ALL, lambda d2l, fw: (
        d2l.ps_pushpull_time, dict(cost_args(), servers=1)),
        {'num_bytes': 'real', 'k': 'count', 'alpha': 'real', 'beta': 'real',
         'servers': 'count'}, True),
    Sweep('naive_allreduce_time', ALL, lambda d2l, fw: (
        d2l.naive_allreduce_time, cost_args()),
        {'num_bytes': 'real', 'k': 'count', 'alpha': 'real', 'beta': 'real'},
        True),
    Sweep('ddp_buckets', ALL, lambda d2l, fw: (d2l.ddp_buckets, dict(
        num_bytes=4e7, bucket_cap_mb=25, first_bucket_mb=1)),
        {'num_bytes': 'real', 'bucket_cap_mb': 'real',
         'first_bucket_mb': 'real'}, True),
    Sweep('predict_step_time', ALL, lambda d2l, fw: (
        d2l.predict_step_time, dict(cost_args(), t_compute=0.1, cores=2,
                                    threads=1, accumulate=1, overlap=0.5)),
        {'t_compute': 'real', 'num_bytes': 'real', 'k': 'count',
         'alpha': 'real', 'beta': 'real', 'cores': 'count or None',
         'threads': 'count', 'accumulate': 'count', 'overlap': 'fraction'},
        True),
    Sweep('local_batch_size', MULTI, lambda d2l, fw: (
        d2l.local_batch_size, dict(batch_size=32, world_size=2)),
        {'batch_size': 'count', 'world_size': 'count'}, True),
    Sweep('shard_of_batch', ALL, lambda d2l, fw: (d2l.shard_of_batch, dict(
        X=images(fw, 8), y=labels(fw, range(8)), step=1, rank=1, world_size=2,
        batch_size=2)),
        {'step': 'count0', 'rank': 'count0', 'world_size': 'count',
         'batch_size': 'count'}, True),
    Sweep('sgd_on_shards', MULTI, lambda d2l, fw: (
        d2l.sgd_on_shards, small_net_args(d2l)),
        {'num_steps': 'count0', 'batch_size': 'count', 'rank': 'count0',
         'world_size': 'count'}, True),
    Sweep('sgd_steps_one_process', ALL, lambda d2l, fw: (
        d2l.sgd_steps_one_process, dict(num_steps=1, batch_size=4, lr=0.1)),
        {'num_steps': 'count0', 'batch_size': 'count', 'lr': 'rate'}, True),
    Sweep('warmup_cosine_lr', ALL, lambda d2l, fw: (d2l.warmup_cosine_lr,
        dict(lr=0.1, epoch=0, num_epochs=3, warmup=1, start=0.05)),
        {'warmup': 'count0', 'start': 'rate', 'lr': 'rate', 'epoch': 'real',
         'num_epochs': 'count'}, True),
    Sweep('train_ddp', ALL, lambda d2l, fw: (d2l.train_ddp, dict(
        rank=0, world_size=1, init_method='env://', num_epochs=1,
        batch_size=32, lr=0.1)),
        {'num_epochs': 'count', 'batch_size': 'count', 'lr': 'rate',
         'world_size': 'count', 'rank': 'count0'}, False),
    Sweep('process_group', MULTI, lambda d2l, fw: (d2l.process_group, dict(
        rank=0, world_size=1, timeout_s=60)),
        {'rank': 'count0', 'world_size': 'count', 'timeout_s': 'real'}, False),
    Sweep('spawn_ranks', MULTI, lambda d2l, fw: (
        d2l.spawn_ranks, dict(worker=d2l.local_batch_size, world_size=1)),
        {'world_size': 'count'}, False),
    Sweep('timing_batch', ALL, lambda d2l, fw: (
        d2l.timing_batch, dict(global_batch=4)), {'global_batch': 'count'},
        True),
    Sweep('time_data_parallel', ('pytorch',), lambda d2l, fw: (
        d2l.time_data_parallel, dict(num_devices=1, global_batch=2,
                                     num_steps=1, warmup=0)),
        {'num_devices': 'count', 'global_batch': 'count', 'num_steps': 'count',
         'warmup': 'count0'}, True),
    Sweep('time_ddp', ALL, lambda d2l, fw: (d2l.time_ddp, dict(
        world_size=1, global_batch=2, num_steps=1, warmup=0, threads=1)),
        {'world_size': 'count', 'global_batch': 'count', 'num_steps': 'count',
         'warmup': 'count0', 'threads': 'count'}, False),
    Sweep('time_all_reduce', ALL, lambda d2l, fw: (d2l.time_all_reduce, dict(
        world_size=2, sizes=[4096], reps=1, calls=1)),
        {'world_size': 'count', 'reps': 'count', 'calls': 'count'}, False),
    Sweep('block_mlp', ALL, lambda d2l, fw: (d2l.block_mlp, dict(
        d=3, hidden=4, seed=0)),
        {'d': 'count', 'hidden': 'count', 'seed': 'count0'}, True),
    Sweep('mlp_data', ALL, lambda d2l, fw: (d2l.mlp_data, dict(
        batch_size=2, d=3)), {'batch_size': 'count', 'd': 'count'}, True),
    Sweep('mesh_allreduces', ALL, lambda d2l, fw: (d2l.mesh_allreduces, dict(
        dp=1, tp=1)), {'dp': 'count', 'tp': 'count'}, False),
    Sweep('train_concise_spawn', ('paddle',), lambda d2l, fw: (
        d2l.train_concise_spawn, dict(
            net_fn=d2l.count_trainable_params, devices=d2l.try_gpus(1),
            batch_size=8, lr=0.1, num_epochs=1)),
        {'batch_size': 'count', 'lr': 'rate', 'num_epochs': 'count'}, False),
    Sweep('split_stages', ALL, lambda d2l, fw: (d2l.split_stages, dict(
        layers=list(range(4)), num_stages=2)), {'num_stages': 'count'}, True),
    Sweep('pipeline_mlp', ALL, lambda d2l, fw: (d2l.pipeline_mlp, dict(
        depth=2, width=4, seed=0)),
        {'depth': 'count', 'width': 'count', 'seed': 'count0'}, True),
    Sweep('bubble_fraction', ALL, lambda d2l, fw: (d2l.bubble_fraction, dict(
        num_stages=2, num_microbatches=4)),
        {'num_stages': 'count', 'num_microbatches': 'count'}, True),
    Sweep('pipeline_schedule', ALL, lambda d2l, fw: (d2l.pipeline_schedule,
        dict(kind='1f1b', num_stages=2, num_microbatches=2)),
        {'num_stages': 'count', 'num_microbatches': 'count'}, True),
    Sweep('check_schedule', ALL, lambda d2l, fw: (d2l.check_schedule, dict(
        schedule=d2l.pipeline_schedule('gpipe', 2, 2), num_stages=2,
        num_microbatches=2)),
        {'num_stages': 'count', 'num_microbatches': 'count'}, True),
    Sweep('split_microbatches', ALL, lambda d2l, fw: (
        d2l.split_microbatches, pipeline_args(d2l, fw, num_microbatches=2)),
        {'num_microbatches': 'count'}, True),
    Sweep('run_device', ALL, lambda d2l, fw: (d2l.run_device, dict(
        stages={0: d2l.pipeline_mlp(1, 4)}, num_stages=1,
        steps=[(0, 'F', 0), (0, 'B', 0)], Xs=[pipeline_args(d2l, fw)['X']],
        ys=[pipeline_args(d2l, fw)['y']], device=d2l.try_gpu(), send=None,
        recv=None)), {'num_stages': 'count'}, True),
    Sweep('run_pipeline', ALL, lambda d2l, fw: (d2l.run_pipeline,
        pipeline_args(d2l, fw, stages=d2l.split_stages(d2l.pipeline_mlp(
            2, 4), 2), schedule=d2l.pipeline_schedule('gpipe', 2, 2),
            num_microbatches=2, timeout_s=30, num_devices=2)),
        {'num_microbatches': 'count', 'timeout_s': 'real',
         'num_devices': 'count or None'}, True),
    Sweep('idle_fraction', ALL, lambda d2l, fw: (d2l.idle_fraction, dict(
        times=[(0, 'F', 0, 0.0, 1.0)], num_devices=1)),
        {'num_devices': 'count or None'}, True),
    Sweep('time_pipeline', ALL, lambda d2l, fw: (d2l.time_pipeline,
        pipeline_args(d2l, fw, runs=[(d2l.pipeline_schedule('gpipe', 2, 2),
                                      2)], num_devices=2, depth=2, width=4,
                      timeout_s=30)),
        {'num_devices': 'count', 'depth': 'count', 'width': 'count',
         'timeout_s': 'real'}, False),
    Sweep('time_steps', ALL, lambda d2l, fw: (d2l.time_steps, dict(
        net=None, optimizer=None, X=None, y=None, num_steps=1, warmup=0,
        device='cpu')), {'num_steps': 'count', 'warmup': 'count0'}, False),
    Sweep('time_compute', ALL, lambda d2l, fw: (d2l.time_compute, dict(
        model='lenet', batch_size=2, threads=1, num_steps=1, warmup=0,
        reps=1)), {'num_steps': 'count', 'warmup': 'count0',
                   'threads': 'count or None', 'reps': 'count'}, False),
    Sweep('time_ddp_configs', MULTI, lambda d2l, fw: (d2l.time_ddp_configs,
        dict(world_size=1, configs=[{'model': 'lenet'}], global_batch=2,
             num_steps=1, warmup=0, reps=1)),
        {'num_steps': 'count', 'warmup': 'count0', 'reps': 'count'}, False),
    Sweep('time_tensor_parallel', ALL, lambda d2l, fw: (
        d2l.time_tensor_parallel, dict(k=2, d=2, hidden=4, batch_size=2,
                                       num_steps=1, reps=1)),
        {'num_steps': 'count', 'reps': 'count', 'num_heads': 'count0',
         'seq_len': 'count'}, False),
]

SWEEP_CASES = [(row, param, bad) for row in SWEEP for param, kind in
               row.kinds.items() for bad in BAD[kind]]


def _sweep_id(case):
    row, param, bad = case
    return f'{row.function}:{param}={bad!r}'


def _sweep_module(framework, row):
    if framework not in row.frameworks:
        pytest.skip(f'{row.function} exists in {", ".join(row.frameworks)}')
    import importlib
    return importlib.import_module(f'd2l.{MODULES[framework]}')


@pytest.mark.parametrize('case', SWEEP_CASES,
                         ids=[_sweep_id(c) for c in SWEEP_CASES])
def test_a_number_no_caller_means_is_refused_by_name(framework, case, quick):
    row, param, bad = case
    d2l = _sweep_module(framework, row)
    function, kwargs = row.build(d2l, framework)
    kwargs[param] = bad
    with pytest.raises(ValueError) as info:
        result = function(**kwargs)
        if hasattr(result, '__enter__'):  # process_group: checks on entry
            with result:
                pass
    assert re.search(rf'\b{param}\b', str(info.value)), str(info.value)


NUMPY_CASES = [(row, param) for row in SWEEP if row.cheap
               for param in row.kinds]


@pytest.mark.parametrize('case', NUMPY_CASES,
                         ids=[f'{r.function}:{p}' for r, p in NUMPY_CASES])
def test_numpy_scalars_count_as_numbers(framework, case, quick):
    row, param = case
    d2l = _sweep_module(framework, row)
    function, kwargs = row.build(d2l, framework)
    value = kwargs[param]
    kwargs[param] = (np.int64(value) if isinstance(value, int)
                     else np.float64(value))
    function(**kwargs)  # no error


# ---------------------------------------------------------------- diverged training stops

def set_to_inf(fw, tensor):
    """Overwrite `tensor` in place with infinities."""
    if fw == 'pytorch':
        import torch
        with torch.no_grad():
            tensor.fill_(float('inf'))
    elif fw == 'mxnet':
        tensor[:] = float('inf')
    else:
        tensor.set_value(np.full(tensor.shape, np.inf, 'float32'))


def poisoned(fw, net):
    """`net` with the bias of its output layer set to infinity: its loss is nan.

    (Infinite scores give a nan cross-entropy in every framework; a nan
    weight would not do: PaddlePaddle's ReLU turns nan into 0.)"""
    params = (list(net.collect_params().values()) if fw == 'mxnet'
              else list(net.parameters()))
    set_to_inf(fw, params[-1].data() if fw == 'mxnet' else params[-1])
    return net


def a_concise_model(fw, devices):
    """A linear classifier of 28x28 images, its loss and its optimizer."""
    if fw == 'pytorch':
        import torch
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
        return (net, torch.nn.CrossEntropyLoss(),
                torch.optim.SGD(net.parameters(), lr=0.1))
    if fw == 'mxnet':
        import mxnet as mx
        net = mx.gluon.nn.Dense(10, in_units=784)
        net.initialize(ctx=devices)
        return (net, mx.gluon.loss.SoftmaxCrossEntropyLoss(),
                mx.gluon.Trainer(net.collect_params(), 'sgd',
                                 {'learning_rate': 0.1}))
    import paddle
    net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 10))
    return (net, paddle.nn.CrossEntropyLoss(),
            paddle.optimizer.SGD(learning_rate=0.1,
                                 parameters=net.parameters()))


def test_a_from_scratch_step_whose_loss_is_nan_stops_the_run(framework, d2l):
    args = lenet_step_args(d2l, framework)
    set_to_inf(framework, args['device_params'][0][-1])  # the output bias
    with pytest.raises(FloatingPointError, match='became nan at the end of train_batch'):
        d2l.train_batch(**args)


def test_a_concise_epoch_whose_loss_is_nan_stops_at_its_end(framework, d2l):
    devices = d2l.try_gpus(1)
    net, loss, optimizer = a_concise_model(framework, devices)
    batch = (images(framework), labels(framework, [0, 1, 2, 3]))
    d2l.train_epoch_concise(net, [batch], loss, optimizer, devices)
    poisoned(framework, net)
    with pytest.raises(FloatingPointError, match='at the end of train_epoch_concise') as e:
        d2l.train_epoch_concise(net, [batch], loss, optimizer, devices)
    assert 'smaller learning rate' in str(e.value)


@contextlib.contextmanager
def one_process_group(framework, d2l):
    """A Gloo group of this process alone, in PyTorch (PaddlePaddle needs none)."""
    if framework != 'pytorch':
        yield
        return
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=d2l.local_init_method(),
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_summary_of_no_epochs_is_refused(framework, d2l):
    summary = {'rank': 0, 'world_size': 1, 'device': 'cpu', 'data': '',
               'backend': 'gloo', 'train_loss': [], 'epoch_s': [],
               'test_acc': 0.1}
    with pytest.raises(ValueError, match='num_epochs of at least 1'):
        d2l.describe_ddp_run(summary)


# ---------------------------------------------------------------- the loader's folders

@pytest.fixture
def no_data_anywhere(d2l, tmp_path, monkeypatch):
    """No Fashion-MNIST file in any folder the loader searches, and no mirror."""
    monkeypatch.setattr(runtime, 'FASHION_MNIST_SYSTEM_DIR', str(tmp_path / 'sys'))
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    monkeypatch.setenv('D2L_FASHION_MNIST_MIRROR', 'http://127.0.0.1:9/')
    monkeypatch.delenv('D2L_DATA_DIR', raising=False)
    return tmp_path


def test_a_data_folder_that_cannot_be_made_gets_the_data_error(
        d2l, no_data_anywhere, monkeypatch):
    blocker = no_data_anywhere / 'a-file'
    blocker.write_text('not a folder')
    monkeypatch.setenv('D2L_DATA_DIR', str(blocker / 'fashion-mnist'))
    with pytest.raises(d2l.DatasetError) as info:
        d2l.read_idx_file('t10k-labels-idx1-ubyte')
    message = str(info.value)
    assert str(blocker / 'fashion-mnist') in message
    assert 'D2L_DATA_DIR' in message and 'dataset-fashion-mnist' in message


def test_a_read_only_data_folder_gets_the_data_error(tmp_path):
    """D2L_DATA_DIR on a read-only file system (a mount namespace of its own)."""
    import shutil
    import subprocess
    import sys
    if not shutil.which('unshare'):
        pytest.skip('needs unshare(1) to mount a read-only file system')
    folder = tmp_path / 'read-only'
    folder.mkdir()
    script = (
        'from d2l import torch as d2l, runtime\n'
        f'runtime.FASHION_MNIST_SYSTEM_DIR = {str(tmp_path / "sys")!r}\n'
        'try:\n'
        "    d2l.read_idx_file('t10k-labels-idx1-ubyte')\n"
        'except d2l.DatasetError as err:\n'
        "    print('DatasetError:', err)\n")
    env = dict(os.environ, D2L_DATA_DIR=str(folder),
               XDG_CACHE_HOME=str(tmp_path / 'cache'),
               D2L_FASHION_MNIST_MIRROR='http://127.0.0.1:9/')
    probe = subprocess.run(['unshare', '-m', 'sh', '-c',
                            f'mount -t tmpfs -o ro tmpfs {folder}'],
                           capture_output=True)
    if probe.returncode:
        pytest.skip(f'cannot mount here: {probe.stderr.decode().strip()}')
    run = subprocess.run(
        ['unshare', '-m', 'sh', '-c', f'mount -t tmpfs -o ro tmpfs {folder} '
         f'&& exec "$0" -c "$1"', sys.executable, script],
        capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'DatasetError:' in run.stdout, run.stdout + run.stderr[-2000:]
    assert str(folder) in run.stdout and 'Read-only file system' in run.stdout


def test_a_stalled_download_elsewhere_is_given_up_after_the_stated_time(
        d2l, no_data_anywhere, monkeypatch, capfd):
    import fcntl
    import threading
    name = 't10k-labels-idx1-ubyte'
    target = no_data_anywhere / 'cache' / 'd2l' / 'fashion-mnist'
    target.mkdir(parents=True)
    monkeypatch.setattr(runtime, 'DOWNLOAD_WAIT_S', 1)
    outcome = []

    def load():
        try:
            d2l.read_idx_file(name)
        except Exception as err:
            outcome.append(err)

    with open(target / f'{name}.gz.lock', 'a') as held:  # the stalled download
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=load, daemon=True)
        waiter.start()
        waiter.join(30)
        stalled = waiter.is_alive()
    waiter.join(30)  # released: without the deadline it would go on now
    assert not stalled, 'the loader waited without a deadline'
    assert isinstance(outcome[0], d2l.DatasetError), outcome
    assert 'for 1 s' in str(outcome[0]) and 'D2L_DATA_DIR' in str(outcome[0])
    assert 'Waiting for another process to download' in capfd.readouterr().err


def test_a_subset_larger_than_the_data_is_refused(d2l, monkeypatch):
    monkeypatch.setenv('D2L_SUBSET', '999999,1')
    with pytest.raises(ValueError, match='has 6000; ask for at most'):
        d2l.fashion_mnist_arrays('train', False)


# ---------------------------------------------------------------- launcher scripts

@pytest.mark.parametrize('framework', MULTI, indirect=True)
@pytest.mark.parametrize('argv, fragment', [
    (['--lr', 'nan'], '--lr must be a finite non-negative number, got nan'),
    (['--epochs', '0'], '--epochs must be a positive integer, got 0')])
def test_a_launcher_script_refuses_a_bad_argument_in_one_line(
        framework, d2l, argv, fragment):
    import subprocess
    import sys
    script = d2l.ddp_script_path(MODULES[framework])
    run = subprocess.run([sys.executable, script,
                          *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]  # argparse's usage error
    assert fragment in run.stderr and 'Traceback' not in run.stderr


# ---------------------------------------------------------------- round three: numbers and arguments

def nan_images(fw, n=4):
    return floats(fw, np.full((n, 1, 28, 28), np.nan))


def generator_of(values):
    return (v for v in values)


def a_step(t, start, end, stage=0):
    return (stage, 'F', 0, start, end)


ROUND_THREE = [
    Bad('pipeline', 'check_schedule', 'a number, not a list',
        lambda d2l, fw: d2l.check_schedule(5, 2, 2), ValueError,
        'schedule must be a list of steps (stage'),
    Bad('pipeline', 'check_schedule', 'a step that is not a triple',
        lambda d2l, fw: d2l.check_schedule([{'F': 0}], 1, 1), ValueError,
        'schedule must be a list of steps (stage'),
    Bad('pipeline', 'run_device', 'a list of stages, not a dict',
        lambda d2l, fw: d2l.run_device(
            [d2l.pipeline_mlp(1, 4)], 1, [(0, 'F', 0)], [], [], 'cpu', None,
            None), ValueError, 'stages must map stage numbers'),
    Bad('pipeline', 'run_device', 'a step of a stage it does not hold',
        lambda d2l, fw: d2l.run_device(
            {0: d2l.pipeline_mlp(1, 4)}, 2, [(1, 'F', 0)], [], [], 'cpu',
            None, None), ValueError, 'steps of the stages this device holds'),
    Bad('pipeline', 'interleaved_schedule', 'micro-batches not in groups',
        lambda d2l, fw: d2l.interleaved_schedule(2, 2, 3), ValueError,
        'num_microbatches=3 must be a multiple of num_devices=2'),
    Bad('pipeline', 'idle_fraction', 'a run of no length',
        lambda d2l, fw: d2l.idle_fraction([(0, 'F', 0, 1.0, 1.0)]),
        ValueError, 'times span no time'),
    Bad('pipeline', 'idle_fraction', 'a generator',
        lambda d2l, fw: d2l.idle_fraction(generator_of(
            [(0, 'F', 0, 0.0, 1.0)])), ValueError, "times must hold a run's"),
    Bad('pipeline', 'idle_fraction', 'a step of three fields',
        lambda d2l, fw: d2l.idle_fraction([(0, 'F', 0)]), ValueError,
        '(stage, op, micro-batch, start, end)'),
    Bad('cost-model', 'pipeline_work_and_span', 'a run of no length',
        lambda d2l, fw: d2l.pipeline_work_and_span([(0, 'F', 0, 2.0, 2.0)]),
        ValueError, 'times span no time'),
    Bad('pipeline', 'split_microbatches', 'float64 examples',
        lambda d2l, fw: d2l.split_microbatches(
            tensor(fw, np.zeros((4, 784))), labels(fw, [0, 1, 2, 3]), 2),
        ValueError, 'X holds float64 numbers'),
    Bad('pipeline', 'split_microbatches', 'fewer labels than examples',
        lambda d2l, fw: d2l.split_microbatches(
            floats(fw, np.zeros((4, 784))), labels(fw, [0, 1, 2]), 2),
        ValueError, 'X holds 4 examples but y holds 3 labels'),
    Bad('pipeline', 'run_pipeline', 'float64 examples',
        lambda d2l, fw: d2l.run_pipeline(
            d2l.split_stages(d2l.pipeline_mlp(2, 4), 2),
            d2l.pipeline_schedule('gpipe', 2, 2),
            tensor(fw, np.zeros((4, 784))), labels(fw, [0, 1, 2, 3]), 2,
            timeout_s=30), ValueError, 'X holds float64 numbers'),
    Bad('tensor', 'gather_shards', 'no results',
        lambda d2l, fw: d2l.gather_shards([]), ValueError,
        'results must be a non-empty list'),
    Bad('tensor', 'gather_shards', 'an unknown key',
        lambda d2l, fw: d2l.gather_shards([{'grads': [], 'axes': []}], 'Z'),
        ValueError, "key 'Z' is not among"),
    Bad('tensor', 'mesh_worker', 'an odd batch',
        lambda d2l, fw: d2l.mesh_worker(0, 4, None, 4, 8, 5), ValueError,
        'batch_size=5'),
    Bad('tensor', 'mesh_worker', 'a batch of one',
        lambda d2l, fw: d2l.mesh_worker(0, 4, None, 4, 8, 1), ValueError,
        'batch_size=1'),
    Bad('tensor', 'mesh_worker', 'fewer hidden units than a pair',
        lambda d2l, fw: d2l.mesh_worker(0, 4, None, 4, 1, 4), ValueError,
        'hidden=1'),
    Bad('tensor', 'mesh_worker', 'a world of three',
        lambda d2l, fw: d2l.mesh_worker(0, 3, None, 4, 8, 4), ValueError,
        'world_size=3'),
    Bad('ddp-resnet18', 'warmup_cosine_lr', "the caller's epoch",
        lambda d2l, fw: d2l.warmup_cosine_lr(0.1, 7, 5, warmup=2), ValueError,
        'epoch=7, num_epochs=5'),
    Bad('ddp-resnet18', 'time_steps', 'no timed step',
        lambda d2l, fw: d2l.time_steps(None, None, None, None, 0, 1, 'cpu'),
        ValueError, 'num_steps must be a positive integer'),
    Bad('ddp-resnet18', 'time_steps', 'a negative warm-up',
        lambda d2l, fw: d2l.time_steps(None, None, None, None, 1, -1, 'cpu'),
        ValueError, 'warmup must be a non-negative integer'),
    Bad('cost-model', 'predict_tensor_time', 'a name, not a collective',
        lambda d2l, fw: d2l.predict_tensor_time(0.1, 2, 4096, 1e-5, 1e-9,
                                                collective='ring'),
        ValueError, "collective must be a function such as"),
    Bad('multiple-gpus', 'train_batch', 'a name, not an allreduce',
        lambda d2l, fw: d2l.train_batch(**lenet_step_args(d2l, fw),
                                        allreduce_fn='allreduce'),
        ValueError, 'allreduce_fn must be a function'),
    Bad('cost-model', 'fit_alpha_beta', 'generators',
        lambda d2l, fw: d2l.fit_alpha_beta(generator_of([4, 8]),
                                           generator_of([1e-3, 2e-3]), 2),
        ValueError, 'num_bytes and seconds must be lists'),
    Bad('pipeline', 'run_pipeline', 'stages as a generator',
        lambda d2l, fw: d2l.run_pipeline(
            generator_of(d2l.split_stages(d2l.pipeline_mlp(2, 4), 2)),
            d2l.pipeline_schedule('gpipe', 2, 2),
            floats(fw, np.zeros((4, 784))), labels(fw, [0, 1, 2, 3]), 2),
        ValueError, 'stages must be a non-empty list of stages'),
    Bad('pipeline', 'run_pipeline', 'the schedule as a generator',
        lambda d2l, fw: d2l.run_pipeline(
            d2l.split_stages(d2l.pipeline_mlp(2, 4), 2),
            generator_of(d2l.pipeline_schedule('gpipe', 2, 2)),
            floats(fw, np.zeros((4, 784))), labels(fw, [0, 1, 2, 3]), 2),
        ValueError, 'schedule must be a list of steps (stage'),
    Bad('pipeline', 'time_pipeline', 'a run of three fields',
        lambda d2l, fw: d2l.time_pipeline(
            [(1, 2, 3)], 2, floats(fw, np.zeros((4, 784))),
            labels(fw, [0, 1, 2, 3]), 2, 4), ValueError,
        'runs must list (schedule, num_microbatches) pairs'),
    Bad('sharded', 'all_gather', 'a generator',
        lambda d2l, fw: d2l.all_gather(generator_of([floats(fw, [1.0])])),
        ValueError, 'shards must be a non-empty list of 1-D tensors'),
    Bad('ddp-resnet18', 'describe_ddp_run', 'not a summary',
        lambda d2l, fw: d2l.describe_ddp_run('rank 0'), ValueError,
        'summary must be the dictionary that train_ddp returns'),
    Bad('ddp-resnet18', 'describe_ddp_run', 'a summary without losses',
        lambda d2l, fw: d2l.describe_ddp_run({'epoch_s': [1.0]}), ValueError,
        'summary must be the dictionary that train_ddp returns'),
    Bad('cost-model', 'fit_ps_alpha_beta', 'generators',
        lambda d2l, fw: d2l.fit_ps_alpha_beta(generator_of([4, 8]),
                                              generator_of([1e-3, 2e-3]), 2),
        ValueError, 'num_bytes and seconds must be lists'),
    Bad('cost-model', 'ddp_buckets', 'a bucket smaller than a number',
        lambda d2l, fw: d2l.ddp_buckets(45e6, bucket_cap_mb=1e-6), ValueError,
        'bucket_cap_mb=1e-06'),
    Bad('cost-model', 'predict_step_time', 'forty million buckets',
        lambda d2l, fw: d2l.predict_step_time(0.1, 45e6, 2, 1e-5, 1e-9,
                                              bucket_cap_mb=1e-6),
        ValueError, 'bucket_cap_mb=1e-06'),
    Bad('cost-model', 'predict_step_time', 'a million buckets',
        lambda d2l, fw: d2l.predict_step_time(0.1, 45e6, 2, 1e-5, 1e-9,
                                              bucket_cap_mb=4e-5),
        ValueError, 'buckets'),
]


@pytest.mark.parametrize('row', ROUND_THREE, ids=[_id(r) for r in ROUND_THREE])
def test_a_bad_argument_is_refused_at_once_in_the_callers_words(
        framework, d2l, row, quick):
    import time
    began = time.monotonic()
    with pytest.raises(row.error) as info:
        row.call(d2l, framework)
    assert row.fragment in str(info.value), str(info.value)
    assert time.monotonic() - began < 10, 'refused, but not at once'


def test_a_timing_loop_refuses_a_negative_number_of_rounds():
    for reps in (-1, 0, 1.5):
        with pytest.raises(ValueError, match='reps must be a positive'):
            runtime._alternating_rounds([lambda: None], reps)


@pytest.mark.parametrize('framework', ['mxnet'], indirect=True)
def test_an_allreduce_outside_a_job_says_where_to_run_it(framework, d2l,
                                                          monkeypatch):
    for name in ('DMLC_ROLE', 'DMLC_NUM_WORKER', 'DMLC_PS_ROOT_URI'):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError) as info:
        d2l.CountingAllreduce()
    message = str(info.value)
    assert 'spawn_ranks' in message and 'Traceback' not in message
    assert 'ps-lite' not in message and '.cc' not in message


# A training path that meets nan or inf stops with an error that names it,
# whether the loss shows it or not: PaddlePaddle's ReLU turns a nan activation
# into 0, so its loss stays finite while the gradients, and after the update
# the weights, are nan (MXNet's pipeline loss stayed finite too).

def test_a_step_on_nan_images_stops_the_run(framework, d2l):
    args = dict(lenet_step_args(d2l, framework), X=nan_images(framework))
    with pytest.raises(FloatingPointError,
                       match='at the end of train_batch'):
        d2l.train_batch(**args)


def a_relu_model(fw, devices):
    """A ReLU layer between two linear ones, its loss and its optimizer."""
    if fw == 'pytorch':
        import torch
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 16),
                                  torch.nn.ReLU(), torch.nn.Linear(16, 10))
        return (net, torch.nn.CrossEntropyLoss(),
                torch.optim.SGD(net.parameters(), lr=0.1))
    if fw == 'mxnet':
        import mxnet as mx
        net = mx.gluon.nn.Sequential()
        net.add(mx.gluon.nn.Dense(16, 'relu', in_units=784),
                mx.gluon.nn.Dense(10, in_units=16))
        net.initialize(ctx=devices)
        return (net, mx.gluon.loss.SoftmaxCrossEntropyLoss(),
                mx.gluon.Trainer(net.collect_params(), 'sgd',
                                 {'learning_rate': 0.1}))
    import paddle
    net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 16),
                               paddle.nn.ReLU(), paddle.nn.Linear(16, 10))
    return (net, paddle.nn.CrossEntropyLoss(),
            paddle.optimizer.SGD(learning_rate=0.1,
                                 parameters=net.parameters()))


def test_a_concise_epoch_on_nan_images_stops_at_its_end(framework, d2l):
    devices = d2l.try_gpus(1)
    net, loss, optimizer = a_relu_model(framework, devices)
    batch = (nan_images(framework), labels(framework, [0, 1, 2, 3]))
    with pytest.raises(FloatingPointError,
                       match='at the end of train_epoch_concise'):
        d2l.train_epoch_concise(net, [batch], loss, optimizer, devices)


@pytest.mark.parametrize('change', ['nan images', 'lr=1e30'])
def test_a_sharded_step_that_diverges_stops_the_run(framework, d2l, change):
    args = zero_step_args(d2l, framework)
    if change == 'nan images':
        args['X'] = nan_images(framework)
    else:
        args['lr'] = 1e30
    with pytest.raises(FloatingPointError, match='at the end of zero_step'):
        for _ in range(3):
            d2l.zero_step(**args)


def test_a_pipeline_run_on_a_nan_batch_stops_the_run(framework, d2l):
    args = pipeline_args(d2l, framework)
    args['X'] = floats(framework, np.full((4, 784), np.nan))
    with pytest.raises(FloatingPointError, match='at the end of run_pipeline'):
        d2l.run_pipeline(d2l.split_stages(d2l.pipeline_mlp(2, 4), 2),
                         d2l.pipeline_schedule('gpipe', 2, 2),
                         num_microbatches=2, timeout_s=30, **args)


def nan_first_layer(fw, net):
    """`net` with a nan in its first weight: hidden by ReLU in some frameworks."""
    params = (list(net.collect_params().values()) if fw == 'mxnet'
              else list(net.parameters()))
    first = params[0].data() if fw == 'mxnet' else params[0]
    if fw == 'pytorch':
        import torch
        with torch.no_grad():
            first.fill_(float('nan'))
    elif fw == 'mxnet':
        first[:] = float('nan')
    else:
        first.set_value(np.full(first.shape, np.nan, 'float32'))
    return net


NAN_IN = {'loss': poisoned, 'weights': nan_first_layer}  # a nan where


@pytest.mark.parametrize('framework', MULTI, indirect=True)
@pytest.mark.parametrize('where', NAN_IN)
def test_ddp_steps_with_a_nan_end_in_an_error(framework, d2l, quick, where):
    net = NAN_IN[where](framework, d2l._small_mlp(seed=0))
    with pytest.raises(FloatingPointError, match='end of sgd_on_shards'):
        d2l.sgd_on_shards(net, d2l._sgd(net, 0.1), 0, 1, 3, 4, 'cpu')


@pytest.mark.parametrize('framework', MULTI, indirect=True)
@pytest.mark.parametrize('where', NAN_IN)
def test_a_ddp_epoch_with_a_nan_names_its_epoch(framework, d2l, quick, where):
    net = NAN_IN[where](framework, d2l.resnet18(10))
    batch = (images(framework, 2), labels(framework, [0, 1]))
    with one_process_group(framework, d2l):  # the epoch sums over the ranks
        with pytest.raises(FloatingPointError, match='_ddp_epoch in epoch 3'):
            d2l._ddp_epoch(net, d2l._sgd(net, 0.1), [batch], 'cpu', 1, 2)
