"""The claims of chapter_multi_gpu/multiple-gpus.md, checked in every framework.

Without GPUs, k "devices" are the CPU k times in PyTorch and PaddlePaddle and
the distinct contexts cpu(0), ..., cpu(k-1) in MXNet, so every copy and every
sum of the data-parallel algorithm really runs.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import FRAMEWORKS, MODULES, cpu_devices, numpy, tensor

REDUCERS = ('allreduce', 'ring_allreduce')
# (examples, devices): even and uneven splits, and as many devices as examples.
SPLITS = [(5, 1), (8, 2), (7, 2), (7, 3), (9, 3), (4, 4), (10, 4), (13, 4)]
TOL = 1e-5  # float32, on averaged gradients (what SGD applies) and on sums of O(1) values


pytestmark = pytest.mark.usefixtures('paddle_default_device_is_the_cpu')


def device_of(framework, x):
    """The device a tensor lives on, as a comparable string."""
    if framework == 'mxnet':
        return str(x.context)
    if framework == 'paddle':
        return str(x.place)
    return str(x.device)


def backward_on_shards(framework, d2l, X_shards, y_shards, device_params):
    """Each device's summed loss on its shard, differentiated into its replica's .grad."""
    pairs = list(zip(X_shards, y_shards, device_params))
    if framework == 'mxnet':
        from mxnet import autograd
        with autograd.record():
            losses = [d2l.cross_entropy_sum(d2l.lenet(X, W), y)
                      for X, y, W in pairs]
    else:
        losses = [d2l.cross_entropy_sum(d2l.lenet(X, W), y)
                  for X, y, W in pairs]
    for loss in losses:
        loss.backward()


def add_in_place(framework, x, value):
    """Add `value` to every entry of `x` without recording it for autograd."""
    if framework == 'pytorch':
        import torch
        with torch.no_grad():
            x += value
    elif framework == 'paddle':
        import paddle
        with paddle.no_grad():
            x[:] += value
    else:
        x[:] += value


@pytest.fixture(scope='module')
def images():
    """The first real Fashion-MNIST training images and labels (quick subset)."""
    from d2l import torch as any_d2l  # the arrays are framework-neutral NumPy
    X, y = any_d2l.fashion_mnist_arrays('train', quick=True)
    return X[:16], y[:16]


def batch(framework, images, n):
    X, y = images
    labels = y[:n].astype(np.int32 if framework == 'mxnet' else np.int64)
    return tensor(framework, X[:n]), tensor(framework, labels)


def whole_batch_gradient(framework, d2l, X, y):
    """The gradient of the summed loss over the whole batch on one device."""
    device = cpu_devices(framework, 1)[0]
    params = d2l.get_params(d2l.lenet_params(), device)
    backward_on_shards(framework, d2l, [X], [y], [params])
    return [numpy(framework, p.grad) for p in params]


@pytest.mark.parametrize('reducer', REDUCERS)
@pytest.mark.parametrize('n,k', SPLITS)
def test_k_device_gradient_equals_one_device_gradient(framework, d2l, images,
                                                      reducer, n, k):
    X, y = batch(framework, images, n)
    expected = whole_batch_gradient(framework, d2l, X, y)
    devices = cpu_devices(framework, k)
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]
    X_shards, y_shards = d2l.split_batch(X, y, devices)
    backward_on_shards(framework, d2l, X_shards, y_shards, device_params)
    for i in range(len(expected)):
        getattr(d2l, reducer)([W[i].grad for W in device_params])
    for W in device_params:  # compare averages over the n examples
        for p, g in zip(W, expected):
            np.testing.assert_allclose(numpy(framework, p.grad) / n, g / n,
                                       rtol=0, atol=TOL)


def reduce_random_arrays(framework, d2l, reducer, shape, k, seed=0):
    """Run a reducer on k random arrays; return the arrays passed in and their true sum."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(k)]
    data = [tensor(framework, a, d)
            for a, d in zip(arrays, cpu_devices(framework, k))]
    originals = list(data)  # the objects the devices hold, whatever the list becomes
    getattr(d2l, reducer)(data)
    return originals, np.sum(arrays, axis=0)


@pytest.mark.parametrize('reducer', REDUCERS)
@pytest.mark.parametrize('k', [1, 2, 3, 4])
@pytest.mark.parametrize('shape', [(3, 5), (6, 1, 5, 5), (2,)])
def test_allreduce_leaves_identical_sums_in_place_on_every_device(
        framework, d2l, reducer, k, shape):
    # (2,) over 4 devices leaves some ring chunks empty.
    originals, total = reduce_random_arrays(framework, d2l, reducer, shape, k)
    devices = cpu_devices(framework, k)
    for x, device in zip(originals, devices):
        assert device_of(framework, x) == str(device)  # stayed where it was
        np.testing.assert_allclose(numpy(framework, x), total, rtol=0,
                                   atol=TOL)
    first = numpy(framework, originals[0])
    for x in originals[1:]:
        assert np.array_equal(numpy(framework, x), first)  # bit for bit


def test_in_place_check_rejects_a_rebinding_allreduce(framework, d2l):
    """The check above fails for the classic bug: new objects put in the list."""
    class Buggy:
        @staticmethod
        def allreduce(data):
            total = sum(numpy(framework, x) for x in data)
            for i in range(len(data)):
                data[i] = tensor(framework, total)

    originals, total = reduce_random_arrays(framework, Buggy, 'allreduce',
                                            (3, 5), 2)
    assert not np.allclose(numpy(framework, originals[0]), total, atol=TOL)


def test_ring_allreduce_equals_allreduce(framework, d2l):
    summed = [reduce_random_arrays(framework, d2l, r, (7, 11), 3, seed=1)[0]
              for r in REDUCERS]
    for simple, ring in zip(*summed):
        np.testing.assert_allclose(numpy(framework, ring),
                                   numpy(framework, simple), rtol=0, atol=TOL)


@pytest.mark.parametrize('n,k', [(7, 3), (256, 6), (4, 4), (5, 1), (10, 4)])
def test_shard_sizes_differ_by_at_most_one_and_larger_come_first(d2l, n, k):
    sizes = d2l.shard_sizes(n, k)
    assert len(sizes) == k and sum(sizes) == n
    assert sizes == sorted(sizes, reverse=True)
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize('n,k', [(7, 3), (16, 6), (4, 4), (5, 1)])
def test_split_batch_shards_are_in_order_on_their_devices(framework, d2l,
                                                          images, n, k):
    X, y = batch(framework, images, n)
    devices = cpu_devices(framework, k)
    X_shards, y_shards = d2l.split_batch(X, y, devices)
    assert [s.shape[0] for s in X_shards] == d2l.shard_sizes(n, k)
    assert [s.shape[0] for s in y_shards] == d2l.shard_sizes(n, k)
    for X_s, y_s, device in zip(X_shards, y_shards, devices):
        assert device_of(framework, X_s) == str(device)
        assert device_of(framework, y_s) == str(device)
    np.testing.assert_array_equal(
        np.concatenate([numpy(framework, s) for s in X_shards]),
        numpy(framework, X))
    np.testing.assert_array_equal(
        np.concatenate([numpy(framework, s) for s in y_shards]),
        numpy(framework, y))


def test_split_batch_names_both_lengths_when_they_differ(framework, d2l,
                                                         images):
    X, _ = batch(framework, images, 5)
    _, y = batch(framework, images, 4)
    with pytest.raises(ValueError, match=r'5 examples.*4 labels'):
        d2l.split_batch(X, y, cpu_devices(framework, 2))


def test_split_batch_names_the_numbers_when_devices_outnumber_examples(
        framework, d2l, images):
    X, y = batch(framework, images, 3)
    with pytest.raises(ValueError, match=r'3 examples over 4 devices'):
        d2l.split_batch(X, y, cpu_devices(framework, 4))


def test_split_batch_rejects_an_empty_device_list(framework, d2l, images):
    X, y = batch(framework, images, 3)
    with pytest.raises(ValueError, match='devices is empty'):
        d2l.split_batch(X, y, [])


def test_get_params_makes_independent_replicas_that_record_gradients(
        framework, d2l):
    device = cpu_devices(framework, 1)[0]
    a, b = (d2l.get_params(d2l.lenet_params(), device) for _ in range(2))
    before = numpy(framework, b[1]).copy()
    add_in_place(framework, a[1], 1.0)  # change one replica's bias
    np.testing.assert_array_equal(numpy(framework, b[1]), before)
    if framework == 'pytorch':
        assert all(p.requires_grad and p.is_leaf for p in a)
    elif framework == 'paddle':
        assert all(not p.stop_gradient for p in a)
    else:
        assert all(p.grad is not None for p in a)


@pytest.mark.parametrize('reducer', REDUCERS)
def test_train_batch_on_three_devices_equals_the_one_device_step(
        framework, d2l, images, reducer):
    X, y = batch(framework, images, 10)
    results = []
    for k in (1, 3):
        devices = cpu_devices(framework, k)
        device_params = [d2l.get_params(d2l.lenet_params(), d)
                         for d in devices]
        d2l.train_batch(X, y, device_params, devices, lr=0.1,
                        allreduce_fn=getattr(d2l, reducer))
        results.append(device_params)
    (one,), replicas = results
    for W in replicas:
        for p, q in zip(W, one):
            np.testing.assert_allclose(numpy(framework, p),
                                       numpy(framework, q), rtol=0, atol=TOL)
    start = d2l.lenet_init_arrays()
    assert not np.allclose(numpy(framework, one[0]), start[0])  # it moved


def test_training_steps_lower_the_loss(framework, d2l, images):
    X, y = batch(framework, images, 16)
    devices = cpu_devices(framework, 2)
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]

    def loss():
        return float(numpy(framework, d2l.cross_entropy_sum(
            d2l.lenet(X, device_params[0]), y)))

    before = loss()
    for _ in range(10):
        d2l.train_batch(X, y, device_params, devices, lr=0.1)
    assert loss() < 0.5 * before


def test_train_batch_returns_the_whole_minibatch_loss_before_its_step(
        framework, d2l, images):
    """The loss that train's figure plots: summed over the shards, it is the
    one-device loss of the whole minibatch."""
    X, y = batch(framework, images, 16)
    devices = cpu_devices(framework, 2)
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]
    want = float(numpy(framework, d2l.cross_entropy_sum(
        d2l.lenet(X, d2l.lenet_params()), y)))
    got = d2l.train_batch(X, y, device_params, devices, lr=0.1)
    assert isinstance(got, float) and got == pytest.approx(want, rel=1e-5)


def test_accuracy_over_all_devices_equals_accuracy_on_one(framework, d2l,
                                                          images):
    # The last minibatch has fewer examples (2) than there are devices (3).
    batches = [batch(framework, images, 16), batch(framework, images, 2)]
    params = d2l.lenet_params(seed=3)
    X_all, y_all = batches[0]
    scores = numpy(framework, d2l.lenet(X_all, params))
    correct = (scores.argmax(axis=1) == numpy(framework, y_all)).sum()
    correct += (scores[:2].argmax(axis=1) == numpy(framework, y_all)[:2]).sum()
    for k in (1, 3):
        devices = cpu_devices(framework, k)
        device_params = [d2l.get_params(params, d) for d in devices]
        acc = d2l.evaluate_accuracy_replicas(device_params, batches, devices)
        assert acc == pytest.approx(correct / 18)


# Devices reach every place that needs them (issue #10, item 4).

@pytest.mark.parametrize('reducer', REDUCERS)
def test_train_batch_hands_the_devices_to_the_allreduce(framework, d2l, images,
                                                        reducer):
    X, y = batch(framework, images, 6)
    devices = cpu_devices(framework, 3)
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]
    seen = []

    def recording(data, devices=None):
        seen.append(devices)
        getattr(d2l, reducer)(data, devices)

    d2l.train_batch(X, y, device_params, devices, lr=0.1, allreduce_fn=recording)
    assert len(seen) == len(d2l.LENET_SHAPES)
    assert all(list(s) == list(devices) for s in seen)


@pytest.fixture
def recorded_guards(monkeypatch):
    """Every device that PaddlePaddle's device_guard is entered with."""
    import paddle
    seen, real = [], paddle.device.device_guard

    def recording(device):
        seen.append(device)
        return real(device)

    monkeypatch.setattr(paddle.device, 'device_guard', recording)
    return seen


@pytest.mark.parametrize('framework', ['paddle'])
@pytest.mark.parametrize('reducer', REDUCERS)
def test_paddle_allreduce_guards_run_on_the_devices_passed_in(
        framework, d2l, recorded_guards, reducer):
    # A guard given a tensor's generic Place falls back to GPU 0 on a GPU
    # machine; it must get the very device objects the caller passed.
    import paddle
    devices = [paddle.CPUPlace() for _ in range(3)]
    data = [tensor(framework, np.full(5, i, np.float32), d)
            for i, d in enumerate(devices)]
    getattr(d2l, reducer)(data, devices)
    assert recorded_guards
    assert all(any(g is d for d in devices) for g in recorded_guards)


@pytest.mark.parametrize('framework', ['paddle'])
@pytest.mark.parametrize('reducer', REDUCERS)
def test_paddle_allreduce_without_devices_guards_with_typed_places(
        framework, d2l, recorded_guards, reducer):
    import paddle
    data = [tensor(framework, np.full(5, i, np.float32)) for i in range(3)]
    getattr(d2l, reducer)(data)
    assert recorded_guards
    assert all(isinstance(g, (paddle.CPUPlace, paddle.CUDAPlace))
               for g in recorded_guards)
    assert all(type(g) is not type(data[0].place) for g in recorded_guards)


@pytest.mark.parametrize('framework', ['paddle'])
def test_paddle_train_batch_guards_run_on_the_devices_passed_in(
        framework, d2l, images, recorded_guards):
    import paddle
    X, y = batch(framework, images, 6)
    devices = [paddle.CPUPlace() for _ in range(2)]
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]
    d2l.train_batch(X, y, device_params, devices, lr=0.1)
    assert recorded_guards
    assert all(any(g is d for d in devices) for g in recorded_guards)


# Bad input (issue #11): a clear error naming the argument, never a wrong number.

def _arrays(framework, shapes, k=None):
    return [tensor(framework, np.ones(s, np.float32), d)
            for s, d in zip(shapes, cpu_devices(framework, k or len(shapes)))]


BAD_CALLS = {
    'seed a string': (lambda fw, d2l, im: d2l.lenet_init_arrays('0'), r'seed'),
    'seed negative': (lambda fw, d2l, im: d2l.lenet_params(seed=-1), r'seed'),
    'seed a float': (lambda fw, d2l, im: d2l.lenet_init_arrays(1.5), r'seed'),
    'images without a channel axis': (
        lambda fw, d2l, im: d2l.lenet(tensor(fw, im[0][:2, 0]),
                                      d2l.lenet_params()), r'\bX\b.*28'),
    'images of the wrong size': (
        lambda fw, d2l, im: d2l.lenet(
            tensor(fw, np.zeros((2, 1, 32, 32), np.float32)),
            d2l.lenet_params()), r'\bX\b'),
    'a parameter missing': (
        lambda fw, d2l, im: d2l.lenet(tensor(fw, im[0][:2]),
                                      d2l.lenet_params()[:9]), r'params'),
    'parameters swapped': (
        lambda fw, d2l, im: d2l.lenet(tensor(fw, im[0][:2]),
                                      d2l.lenet_params()[::-1]),
        r'params\[0\]'),
    'scores not a matrix': (
        lambda fw, d2l, im: d2l.cross_entropy_sum(
            tensor(fw, np.zeros(10, np.float32)), batch(fw, im, 1)[1]),
        r'y_hat'),
    'fewer labels than scores': (
        lambda fw, d2l, im: d2l.cross_entropy_sum(
            tensor(fw, np.zeros((4, 10), np.float32)), batch(fw, im, 3)[1]),
        r'\by must'),
    'a label too large': (
        lambda fw, d2l, im: d2l.cross_entropy_sum(
            tensor(fw, np.zeros((2, 10), np.float32)),
            tensor(fw, np.array([3, 10], np.int64 if fw != 'mxnet'
                                else np.int32))), r'\by holds'),
    'a negative label': (
        lambda fw, d2l, im: d2l.cross_entropy_sum(
            tensor(fw, np.zeros((2, 10), np.float32)),
            tensor(fw, np.array([-1, 3], np.int64 if fw != 'mxnet'
                                else np.int32))), r'\by holds'),
    'params not a list': (
        lambda fw, d2l, im: d2l.get_params(None, cpu_devices(fw, 1)[0]),
        r'params'),
    'no params': (
        lambda fw, d2l, im: d2l.get_params([], cpu_devices(fw, 1)[0]),
        r'params'),
    'allreduce of nothing': (lambda fw, d2l, im: d2l.allreduce([]), r'data'),
    'ring of nothing': (lambda fw, d2l, im: d2l.ring_allreduce([]), r'data'),
    'allreduce of a gradient that is None': (
        lambda fw, d2l, im: d2l.allreduce(_arrays(fw, [(3,)]) + [None]),
        r'data\[1\]'),
    'allreduce with too few devices': (
        lambda fw, d2l, im: d2l.allreduce(_arrays(fw, [(3,), (3,)]),
                                          cpu_devices(fw, 1)), r'devices'),
    'ring with too many devices': (
        lambda fw, d2l, im: d2l.ring_allreduce(_arrays(fw, [(3,), (3,)]),
                                               cpu_devices(fw, 3)),
        r'devices'),
    'allreduce onto one device object': (
        lambda fw, d2l, im: d2l.allreduce(_arrays(fw, [(3,), (3,)]),
                                          cpu_devices(fw, 1)[0]), r'devices'),
    'shard_sizes over no parts': (lambda fw, d2l, im: d2l.shard_sizes(5, 0),
                                  r'\bk\b'),
    'shard_sizes of a negative count': (
        lambda fw, d2l, im: d2l.shard_sizes(-1, 2), r'\bn\b'),
    'shard_sizes of a fraction': (
        lambda fw, d2l, im: d2l.shard_sizes(2.5, 2), r'\bn\b'),
    'split_batch of a list': (
        lambda fw, d2l, im: d2l.split_batch([1, 2], batch(fw, im, 2)[1],
                                            cpu_devices(fw, 1)), r'\bX\b'),
    'split_batch onto one device object': (
        lambda fw, d2l, im: d2l.split_batch(*batch(fw, im, 2),
                                            cpu_devices(fw, 1)[0]),
        r'devices'),
    'train_batch with a replica missing': (
        lambda fw, d2l, im: d2l.train_batch(
            *batch(fw, im, 4),
            [d2l.get_params(d2l.lenet_params(), cpu_devices(fw, 1)[0])],
            cpu_devices(fw, 2), lr=0.1), r'device_params'),
    'evaluation of an empty iterator': (
        lambda fw, d2l, im: d2l.evaluate_accuracy_replicas(
            [d2l.lenet_params()], [], cpu_devices(fw, 1)), r'data_iter'),
    'evaluation with a replica missing': (
        lambda fw, d2l, im: d2l.evaluate_accuracy_replicas(
            [d2l.lenet_params()], [batch(fw, im, 4)], cpu_devices(fw, 2)),
        r'device_params'),
}


@pytest.mark.parametrize('case', sorted(BAD_CALLS))
def test_bad_input_raises_an_error_naming_the_argument(framework, d2l, images,
                                                       case):
    call, names = BAD_CALLS[case]
    with pytest.raises(ValueError, match=names):
        call(framework, d2l, images)


@pytest.mark.parametrize('reducer', REDUCERS)
def test_allreduce_of_different_shapes_fails_before_changing_anything(
        framework, d2l, reducer):
    # (3,) and (1, 3) would broadcast into a plausible-looking wrong sum.
    data = [tensor(framework, a, d) for a, d in zip(
        [np.ones(3, np.float32), np.full((1, 3), 2, np.float32)],
        cpu_devices(framework, 2))]
    with pytest.raises(ValueError, match='different shapes'):
        getattr(d2l, reducer)(data)
    np.testing.assert_array_equal(numpy(framework, data[0]), np.ones(3))
    np.testing.assert_array_equal(numpy(framework, data[1]),
                                  np.full((1, 3), 2))


def test_train_batch_rejects_labels_out_of_range_before_updating(
        framework, d2l, images):
    X, y = images
    labels = y[:4].astype(np.int32 if framework == 'mxnet' else np.int64)
    labels[2] = 12
    devices = cpu_devices(framework, 2)
    device_params = [d2l.get_params(d2l.lenet_params(), d) for d in devices]
    with pytest.raises(ValueError, match=r'\by holds labels'):
        d2l.train_batch(tensor(framework, X[:4]), tensor(framework, labels),
                        device_params, devices, lr=0.1)
    for W in device_params:
        np.testing.assert_array_equal(numpy(framework, W[0]),
                                      d2l.lenet_init_arrays()[0])


PUBLIC = ('lenet_init_arrays', 'lenet_params', 'lenet', 'cross_entropy_sum',
          'get_params', 'allreduce', 'ring_allreduce', 'shard_sizes',
          'split_batch', 'train_batch', 'evaluate_accuracy_replicas')


def _parameters(function):
    """Names, kinds and defaults of a function's parameters (functions by name)."""
    import inspect
    return [(p.name, p.kind, getattr(p.default, '__name__', p.default))
            for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize('name', PUBLIC)
def test_each_public_helper_has_one_signature_in_all_frameworks(name):
    import importlib
    functions = [getattr(importlib.import_module(f'd2l.{MODULES[f]}'), name)
                 for f in FRAMEWORKS]
    first = _parameters(functions[0])
    assert all(_parameters(f) == first for f in functions[1:])
    assert all(f.__doc__.strip() for f in functions)


# Property-based: any split, any number of devices, any shape.


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10_000), k=st.integers(1, 64))
def test_shard_sizes_cover_every_item_once_for_any_n_and_k(n, k):
    from d2l import torch as any_d2l  # pure Python, the same in every module
    sizes = any_d2l.shard_sizes(n, k)
    assert len(sizes) == k and sum(sizes) == n and min(sizes) >= 0
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 5),
       shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       reducer=st.sampled_from(REDUCERS))
def test_any_allreduce_leaves_the_true_sum_everywhere(framework, d2l, k,
                                                     shape, reducer):
    originals, total = reduce_random_arrays(framework, d2l, reducer,
                                            tuple(shape), k)
    for x in originals:
        np.testing.assert_allclose(numpy(framework, x), total, rtol=0,
                                   atol=TOL)
