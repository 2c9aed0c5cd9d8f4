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

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import tensor

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
