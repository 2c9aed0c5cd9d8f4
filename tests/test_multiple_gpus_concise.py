"""The claims of chapter_multi_gpu/multiple-gpus-concise.md, checked in every framework.

Without GPUs, k "devices" are the CPU k times in PyTorch and PaddlePaddle and
the distinct contexts cpu(0), ..., cpu(k-1) in MXNet; PaddlePaddle's
multi-process training really starts k processes (Gloo on the CPU).
"""
import importlib
import json
import math
import pathlib
import re

import numpy as np
import pytest

from conftest import (FRAMEWORKS, MODULES, ROOT, cpu_devices, needs_mxnet,
                      numpy, tab_cells, tensor)


def built_resnet(framework, d2l, devices=None, **kwargs):
    """A ResNet-18 whose parameters exist on `devices` (MXNet needs initialize)."""
    net = d2l.resnet18(10, **kwargs)
    if framework == 'mxnet':
        from mxnet import init
        net.initialize(init.Xavier(), ctx=devices or cpu_devices(framework, 1))
    return net


def forward(framework, net, X):
    """The network's outputs as a NumPy array, in inference mode."""
    if framework == 'mxnet':
        return net(X).asnumpy()
    if framework == 'paddle':
        import paddle
        net.eval()
        with paddle.no_grad():
            return net(X).numpy()
    import torch
    net.eval()
    with torch.no_grad():
        return net(X).numpy()


def expected_resnet18_params(num_classes, in_channels):
    """Trainable values of the architecture the section describes, counted by hand."""
    def conv(c_in, c_out, k):
        return c_in * c_out * k * k + c_out  # weights and bias

    def bn(c):
        return 2 * c  # scale and shift; running statistics are not trained

    def residual(c_in, c_out, shortcut):
        return (conv(c_in, c_out, 3) + bn(c_out) + conv(c_out, c_out, 3) +
                bn(c_out) + (conv(c_in, c_out, 1) if shortcut else 0))

    total = conv(in_channels, 64, 3) + bn(64)
    for c_in, c_out in [(64, 64), (64, 128), (128, 256), (256, 512)]:
        total += residual(c_in, c_out, c_in != c_out) + residual(c_out, c_out,
                                                                 False)
    return total + 512 * num_classes + num_classes


@pytest.mark.parametrize('size', [28, 96])
def test_resnet18_maps_a_batch_of_images_to_class_scores(framework, d2l, size):
    net = built_resnet(framework, d2l)
    X = tensor(framework, np.random.rand(2, 1, size, size).astype(np.float32))
    assert forward(framework, net, X).shape == (2, 10)


def test_resnet18_accepts_other_channel_and_class_counts(framework, d2l):
    net = built_resnet(framework, d2l, in_channels=3)
    X = tensor(framework, np.random.rand(2, 3, 28, 28).astype(np.float32))
    assert forward(framework, net, X).shape == (2, 10)
    assert d2l.count_trainable_params(net) == expected_resnet18_params(10, 3)


def test_resnet18_has_the_parameter_count_of_its_architecture(framework, d2l):
    net = built_resnet(framework, d2l)
    assert d2l.count_trainable_params(net) == expected_resnet18_params(10, 1)


def test_parameter_count_is_identical_across_frameworks():
    counts = {}
    for framework in FRAMEWORKS:
        d2l = importlib.import_module(f'd2l.{MODULES[framework]}')
        counts[framework] = d2l.count_trainable_params(
            built_resnet(framework, d2l))
    assert len(set(counts.values())) == 1, counts
    assert counts['pytorch'] == 11_175_818


@pytest.mark.parametrize('bad', [0, -3, 2.5, '10', True])
def test_resnet18_rejects_a_size_that_is_not_a_positive_integer(d2l, bad):
    with pytest.raises(ValueError, match='num_classes must be a positive'):
        d2l.resnet18(bad)
    with pytest.raises(ValueError, match='in_channels must be a positive'):
        d2l.resnet18(10, in_channels=bad)


@pytest.mark.parametrize('num_devices', [1, 2, 3])
def test_split_evaluation_equals_single_device_accuracy(framework, d2l,
                                                        num_devices):
    devices = cpu_devices(framework, num_devices)
    net = built_resnet(framework, d2l, devices)
    images, _ = d2l.fashion_mnist_arrays('test', quick=True)
    images = images[:25]
    # Label 15 images with the network's own prediction and 10 with another
    # class, so the right answer is exactly 15/25 whichever way it is split.
    predicted = forward(framework, net, tensor(framework, images)).argmax(1)
    labels = np.where(np.arange(25) < 15, predicted, (predicted + 1) % 10)
    labels = labels.astype(np.int32 if framework == 'mxnet' else np.int64)
    # Batches of 8, 8, 8 and 1: the last has fewer examples than 3 devices.
    data = [(tensor(framework, images[i:i + 8]),
             tensor(framework, labels[i:i + 8])) for i in range(0, 25, 8)]
    single = d2l.evaluate_accuracy_gpu(net, data, devices[0])
    split = d2l.evaluate_accuracy_gpus(net, data, devices=devices)
    assert single == split == 15 / 25



@needs_mxnet
def test_mxnet_defaults_to_the_contexts_holding_the_parameters():
    import mxnet as mx
    from d2l import mxnet as d2l
    net = built_resnet('mxnet', d2l, [mx.cpu(0), mx.cpu(1)])
    images, labels = d2l.fashion_mnist_arrays('test', quick=True)
    data = [(tensor('mxnet', images[:6]),
             tensor('mxnet', labels[:6].astype(np.int32)))]
    assert d2l.evaluate_accuracy_gpus(net, data) == \
        d2l.evaluate_accuracy_gpu(net, data)
    with pytest.raises(RuntimeError, match='not initialized on context cpu'):
        net[0].weight.data(mx.cpu(2))  # the pitfall the section shows


@needs_mxnet
def test_mxnet_contexts_test_with_the_first_contexts_batch_norm_statistics():
    import mxnet as mx
    from d2l import mxnet as d2l
    net = built_resnet('mxnet', d2l, [mx.cpu(0), mx.cpu(1)])
    statistics = [p for p in net.collect_params().values()
                  if p.grad_req == 'null']
    for p in statistics:  # as if cpu(1) had normalised other shards
        p.data(mx.cpu(1))[:] = p.data(mx.cpu(1)) * 2 + 1
    images, labels = d2l.fashion_mnist_arrays('test', quick=True)
    data = [(tensor('mxnet', images[:6]),
             tensor('mxnet', labels[:6].astype(np.int32)))]
    first = d2l.evaluate_accuracy_gpus(net, data, devices=[mx.cpu(0)])
    assert d2l.evaluate_accuracy_gpus(net, data) == first
    for p in statistics:
        assert (p.data(mx.cpu(0)) == p.data(mx.cpu(1)).as_in_ctx(
            mx.cpu(0))).all()


@needs_mxnet
def test_mxnet_helpers_work_in_numpy_mode():
    """Issue 10 item 8: after a reader's npx.set_np() the section's helpers run."""
    from mxnet import np as mnp, npx
    npx.set_np()
    from d2l import mxnet as d2l
    devices = d2l.try_gpus(2)
    net = built_resnet('mxnet', d2l, devices)
    X = mnp.random.uniform(size=(4, 1, 28, 28))
    y = mnp.array([0, 1, 2, 3], dtype='int32')
    X_shards, _ = d2l.split_batch(X, y, devices)
    assert [x.shape[0] for x in X_shards] == [2, 2]
    assert 0 <= d2l.evaluate_accuracy_gpus(net, [(X, y)]) <= 1


def test_pytorch_model_has_no_lazy_parameters_before_wrapping():
    import torch
    from d2l import torch as d2l
    net = d2l.resnet18(10)
    assert not any(isinstance(p, torch.nn.parameter.UninitializedParameter)
                   for p in net.parameters())
    devices = d2l.try_gpus(1)
    model = torch.nn.DataParallel(net.to(devices[0]), device_ids=devices)
    assert model.module is net
    assert all(p.device == devices[0] for p in net.parameters())


def first_batch(d2l, batch_size):
    """The first minibatch of the quick-mode training set."""
    train_iter, _ = d2l.load_data_fashion_mnist(batch_size)
    return next(iter(train_iter))


def seed_everything(framework, seed=0):
    """Fix the shuffling and the initial weights, so a test sees the same run each time."""
    np.random.seed(seed)
    if framework == 'mxnet':
        import mxnet as mx
        mx.random.seed(seed)
    elif framework == 'paddle':
        import paddle
        paddle.seed(seed)
    else:
        import torch
        torch.manual_seed(seed)


def step_setup(framework, d2l, lr=0.02):
    """Model, loss, optimizer and devices as the section's training loop makes them."""
    if framework == 'mxnet':  # two real copies on cpu(0) and cpu(1)
        from mxnet import gluon
        devices = d2l.try_gpus(2)
        net = built_resnet(framework, d2l, devices)
        optimizer = gluon.Trainer(net.collect_params(), 'sgd',
                                  {'learning_rate': lr})
        return net, gluon.loss.SoftmaxCrossEntropyLoss(), optimizer, devices
    if framework == 'paddle':  # this process alone: no spawn needed for a step
        import paddle
        net = d2l.resnet18(10)
        net.train()
        optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                         parameters=net.parameters())
        return net, paddle.nn.CrossEntropyLoss(), optimizer, d2l.try_gpus(1)
    import torch
    devices = d2l.try_gpus(1)
    model = torch.nn.DataParallel(d2l.resnet18(10).to(devices[0]),
                                  device_ids=devices)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return model, torch.nn.CrossEntropyLoss(), optimizer, devices


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_a_few_concise_training_steps_reduce_the_loss(framework, d2l, quick):
    seed_everything(framework)
    X, y = first_batch(d2l, 8)
    net, loss, optimizer, devices = step_setup(framework, d2l)
    losses = [float(numpy(framework, d2l.train_step_concise(
        net, X, y, loss, optimizer, devices))) for _ in range(4)]
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < 0.7 * losses[0], losses  # observed: about 0.45


def test_learning_rate_falls_from_lr_along_half_a_cosine(d2l):
    rates = [d2l.cosine_lr(0.2, epoch, 10) for epoch in range(10)]
    assert rates[0] == pytest.approx(0.2)
    assert rates[5] == pytest.approx(0.1)  # halfway down at half the epochs
    assert rates[-1] == pytest.approx(0.2 * (1 - math.cos(math.pi / 10)) / 2)
    assert all(a > b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize('epoch, num_epochs', [(10, 10), (-1, 10), (0, 0),
                                               (9.5, 9), ('1', 10), (True, 10),
                                               (0, True), (0, 2.5)])
def test_cosine_lr_names_an_epoch_outside_the_run(d2l, epoch, num_epochs):
    with pytest.raises(ValueError, match=r'epoch must be a number in '
                       r'\[0, num_epochs\).*got epoch='):
        d2l.cosine_lr(0.1, epoch, num_epochs)


def test_a_step_s_rate_lies_between_its_epochs_rates(d2l):
    rates = [d2l.cosine_lr(0.2, e, 10) for e in (3, 3.5, 4)]
    assert rates[0] > rates[1] > rates[2]


def trainable_values(framework, net):
    """Copies of the trained parameters (not batch norm's running statistics)."""
    if framework == 'mxnet':
        return [p.data().asnumpy() for p in net.collect_params().values()
                if p.grad_req != 'null']
    if framework == 'paddle':
        return [p.numpy() for p in net.parameters() if p.trainable]
    return [p.detach().numpy().copy() for p in net.parameters()]


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_a_step_at_learning_rate_zero_leaves_the_weights_alone(framework,
                                                                d2l, quick):
    seed_everything(framework)
    X, y = first_batch(d2l, 8)
    net, loss, optimizer, devices = step_setup(framework, d2l)
    d2l.train_step_concise(net, X, y, loss, optimizer, devices)  # builds state
    before = trainable_values(framework, net)
    d2l.set_learning_rate(optimizer, 0.0)
    d2l.train_step_concise(net, X, y, loss, optimizer, devices)
    for got, want in zip(trainable_values(framework, net), before):
        np.testing.assert_array_equal(got, want)
    d2l.set_learning_rate(optimizer, 0.05)
    d2l.train_step_concise(net, X, y, loss, optimizer, devices)
    assert any((got != want).any() for got, want in
               zip(trainable_values(framework, net), before))


def test_training_helpers_have_one_signature_in_every_framework():
    """Issue 10 item 9: a helper shared by the tabs has the same parameters."""
    import inspect
    names = ['resnet18', 'count_trainable_params', 'evaluate_accuracy_gpus',
             'train_step_concise', 'train_epoch_concise', 'cosine_lr',
             'set_learning_rate']
    signatures = {}
    for framework in FRAMEWORKS:
        d2l = importlib.import_module(f'd2l.{MODULES[framework]}')
        for name in names:
            params = inspect.signature(getattr(d2l, name)).parameters
            signatures.setdefault(name, set()).add(tuple(
                (p.name, p.default is inspect.Parameter.empty)
                for p in params.values()))
    assert all(len(found) == 1 for found in signatures.values()), signatures


def test_argument_checks_come_from_the_runtime_written_once(d2l):
    """The section's argument checks are the package's, not the page's."""
    assert d2l.check_resnet_args.__module__ == 'd2l.runtime'
    for name in ('check_num_gpus', 'data_parallel_devices',
                 'data_parallel_places'):
        assert not hasattr(d2l, name), name


@needs_mxnet
def test_mxnet_two_context_step_equals_one_context_step():
    """The Trainer's sum over contexts gives the update of one big minibatch."""
    import mxnet as mx
    from mxnet import gluon, init
    from d2l import mxnet as d2l
    rng = np.random.default_rng(0)
    X = tensor('mxnet', rng.random((12, 1, 28, 28), dtype=np.float32))
    y = tensor('mxnet', rng.integers(0, 10, 12).astype(np.int32))
    weights = []
    for devices in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        mx.random.seed(1)
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(32, activation='relu', in_units=784),
                gluon.nn.Dense(10, in_units=32))
        net.initialize(init.Xavier(), ctx=devices)
        trainer = gluon.Trainer(net.collect_params(), 'sgd',
                                {'learning_rate': 0.5})
        loss = gluon.loss.SoftmaxCrossEntropyLoss()
        for _ in range(3):
            d2l.train_step_concise(net, X, y, loss, trainer, devices)
        copies = [net[0].weight.data(d).asnumpy() for d in devices]
        for copy in copies[1:]:  # every context holds the same values
            np.testing.assert_array_equal(copy, copies[0])
        weights.append(copies[0])
    np.testing.assert_allclose(weights[1], weights[0], rtol=1e-5, atol=1e-6)


# Bad input (issue 11): every public helper of the section, in every tab,
# names the argument that is wrong instead of failing somewhere inside.

def small_batches(framework, sizes):
    """Minibatches of random 28x28 images with labels, of the given sizes."""
    rng = np.random.default_rng(0)
    dtype = np.int32 if framework == 'mxnet' else np.int64
    return [(tensor(framework, rng.random((n, 1, 28, 28), dtype=np.float32)),
             tensor(framework, rng.integers(0, 10, n).astype(dtype)))
            for n in sizes]


def test_count_trainable_params_rejects_what_is_not_a_model(framework, d2l):
    images = tensor(framework, np.zeros((2, 3), dtype=np.float32))
    for bad in (images, None, [1, 2]):
        with pytest.raises(TypeError, match='net must be a model'):
            d2l.count_trainable_params(bad)


@pytest.mark.parametrize('sizes', [[], [0]])
def test_evaluate_accuracy_gpus_on_an_empty_iterator_names_data_iter(
        framework, d2l, sizes):
    net = built_resnet(framework, d2l)
    with pytest.raises(ValueError, match='data_iter yielded no examples'):
        d2l.evaluate_accuracy_gpus(net, small_batches(framework, sizes),
                                   devices=cpu_devices(framework, 2))


def test_evaluate_accuracy_gpus_rejects_bad_iterators_and_devices(framework,
                                                                  d2l):
    net = built_resnet(framework, d2l)
    data = small_batches(framework, [4])
    with pytest.raises(TypeError, match='data_iter must be an iterable'):
        d2l.evaluate_accuracy_gpus(net, 42, devices=cpu_devices(framework, 1))
    with pytest.raises(ValueError, match='devices is empty'):
        d2l.evaluate_accuracy_gpus(net, data, devices=[])


def test_training_step_names_what_is_wrong_with_its_input(framework, d2l):
    net, loss, optimizer, devices = step_setup(framework, d2l)
    (X, y), = small_batches(framework, [4])
    (_, y3), (X0, y0) = small_batches(framework, [3, 0])
    with pytest.raises(ValueError, match='X holds 4 examples but y holds 3'):
        d2l.train_step_concise(net, X, y3, loss, optimizer, devices)
    with pytest.raises(ValueError, match='X is an empty minibatch'):
        d2l.train_step_concise(net, X0, y0, loss, optimizer, devices)
    with pytest.raises(ValueError, match='devices is empty'):
        d2l.train_step_concise(net, X, y, loss, optimizer, [])
    with pytest.raises(ValueError, match='train_iter yielded no examples'):
        d2l.train_epoch_concise(net, [], loss, optimizer, devices)
    with pytest.raises(TypeError, match='train_iter must be an iterable'):
        d2l.train_epoch_concise(net, None, loss, optimizer, devices)


def test_a_paddle_step_runs_on_the_one_device_of_its_process():
    from d2l import paddle as d2l
    net, loss, optimizer, _ = step_setup('paddle', d2l)
    (X, y), = small_batches('paddle', [4])
    with pytest.raises(ValueError, match='start one process per device'):
        d2l.train_step_concise(net, X, y, loss, optimizer,
                               cpu_devices('paddle', 2))


def test_paddle_evaluation_runs_each_copy_under_its_device_guard(monkeypatch):
    """Issue 10 item 1: Paddle computes on its current device, so each shard's
    forward pass must run inside device_guard(that shard's device)."""
    import paddle
    from d2l import paddle as d2l
    current, real_guard = [], paddle.device.device_guard

    class RecordingGuard:
        def __init__(self, device):
            self.device, self.guard = device, real_guard(device)

        def __enter__(self):
            current.append(self.device)
            return self.guard.__enter__()

        def __exit__(self, *exc):
            current.pop()
            return self.guard.__exit__(*exc)

    class Probe(paddle.nn.Layer):
        """A classifier that notes the device guard each call runs under."""
        def __init__(self):
            super().__init__()
            self.linear, self.seen = paddle.nn.Linear(784, 10), []

        def forward(self, X):
            self.seen.append(current[-1] if current else None)
            return self.linear(X.reshape([X.shape[0], -1]))

    monkeypatch.setattr(paddle.device, 'device_guard', RecordingGuard)
    devices = [paddle.CPUPlace(), paddle.CPUPlace()]  # told apart by identity
    net = Probe()
    d2l.evaluate_accuracy_gpus(net, small_batches('paddle', [6]),
                               devices=devices)
    assert [id(d) for d in net.seen] == [id(d) for d in devices]


@pytest.mark.parametrize('bad, error, message', [
    ({'net_fn': 'model'}, TypeError, 'net_fn must be a function'),
    ({'devices': []}, ValueError, 'devices is empty'),
    ({'batch_size': 9}, ValueError, 'batch_size 9 cannot be shared equally '
                                    'by 2 processes'),
    ({'batch_size': 0}, ValueError, 'batch_size must be a positive integer'),
    ({'num_epochs': 0}, ValueError, 'num_epochs must be a positive integer'),
    ({'lr': -0.1}, ValueError, 'lr must be a finite non-negative number'),
    ({'seed': -1}, ValueError, 'seed must be a non-negative integer')])
def test_paddle_spawn_rejects_bad_arguments_before_starting(bad, error,
                                                            message):
    import functools
    from d2l import paddle as d2l
    args = {'net_fn': functools.partial(d2l.resnet18, 10),
            'devices': cpu_devices('paddle', 2), 'batch_size': 64, 'lr': 0.1,
            'num_epochs': 1}
    args.update(bad)
    if args['net_fn'] == 'model':  # the model itself instead of its maker
        args['net_fn'] = d2l.resnet18(10)
    with pytest.raises(error, match=message):
        d2l.train_concise_spawn(**args)


def test_paddle_processes_start_from_code_read_on_standard_input(tmp_path):
    """Python names such code's file '<stdin>'; the new processes must not
    try to run it again."""
    import sys
    from test_process_groups import RESULT, finish, result_of, start
    (tmp_path / 'program').write_text(
        'import json, tempfile, paddle\nfrom d2l import paddle as d2l\n'
        'with tempfile.TemporaryDirectory() as folder:\n'
        '    found = d2l.spawn_per_device(d2l.num_gpus, '
        '[paddle.CPUPlace()] * 2, folder)\n'
        f'print({RESULT!r} + json.dumps(found))\n')
    with open(tmp_path / 'program') as program:
        proc = start([sys.executable], stdin=program, cwd=tmp_path)
        out, err = finish(proc, 180)
    assert result_of(out, err, proc) == [0, 0]


def small_paddle_net():
    """A network without batch normalisation: its training does not depend on
    how a minibatch is split, so one and two processes must agree."""
    import paddle
    return paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 32),
                                paddle.nn.ReLU(), paddle.nn.Linear(32, 10))


def failing_paddle_net():
    """A constructor that fails in every worker once all have formed the group."""
    import paddle.distributed as dist
    dist.barrier()  # else rank 0 may still be joining when rank 1 has failed
    raise RuntimeError('this constructor fails on purpose')


def paddle_reference_training(d2l, batch_size, lr, num_epochs, seed=0):
    """The training of train_concise_spawn done in this process, without
    paddle.distributed: same seed, same sampler, same shuffles."""
    import paddle
    paddle.seed(seed)
    net = small_paddle_net()
    train_iter, _ = d2l.load_data_fashion_mnist(batch_size)
    sampler = paddle.io.DistributedBatchSampler(
        train_iter.dataset, batch_size, num_replicas=1, rank=0, shuffle=True)
    loader = paddle.io.DataLoader(train_iter.dataset, batch_sampler=sampler,
                                  collate_fn=train_iter.collate_fn)
    optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                     parameters=net.parameters())
    loss, losses = paddle.nn.CrossEntropyLoss(), []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        optimizer.set_lr(lr * (1 + math.cos(math.pi * epoch / num_epochs)) / 2)
        total, n = 0.0, 0
        for X, y in loader:
            l = loss(net(X), y)
            l.backward()
            optimizer.step()
            optimizer.clear_grad()
            total, n = total + float(l) * X.shape[0], n + X.shape[0]
        losses.append(total / n)
    return losses, [p.numpy() for p in net.parameters()]


NOISE = ('Modified FLAGS', 'ccache', 'CPUONLY', 'find free ports',
         'FatalError', 'C++ Traceback', 'tcp_utils', 'tcp_store')


@pytest.mark.slow
def test_paddle_two_process_training_equals_in_process_training(quick,
                                                                 capfd):
    """Issue 10 item 2: each worker builds its own model from a constructor
    and a seed; one and two processes both reproduce the in-process run."""
    from d2l import paddle as d2l
    expected_loss, expected_weights = paddle_reference_training(
        d2l, batch_size=64, lr=0.1, num_epochs=2)
    capfd.readouterr()  # what importing Paddle here printed is not the workers'
    for k in (1, 2):
        net, record = d2l.train_concise_spawn(
            small_paddle_net, cpu_devices('paddle', k), batch_size=64, lr=0.1,
            num_epochs=2)
        assert record['devices'] == ['cpu'] * k
        assert record['train_loss'][1] < record['train_loss'][0]
        # The processes score disjoint shares of the test set every epoch;
        # together they count every test image once.
        _, test_iter = d2l.load_data_fashion_mnist(64)
        assert len(record['test_acc']) == 2
        assert record['test_acc'][-1] == pytest.approx(
            d2l.evaluate_accuracy_gpus(net, test_iter,
                                       devices=cpu_devices('paddle', 1)))
        np.testing.assert_allclose(record['train_loss'], expected_loss,
                                   rtol=1e-4)
        for got, want in zip(net.parameters(), expected_weights):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4,
                                       atol=1e-5)
    printed = ''.join(capfd.readouterr())
    # Issue 12 item 7: the workers' start-up notices stay out of the output.
    assert not [word for word in NOISE if word in printed], printed


@pytest.mark.slow
def test_paddle_failing_worker_reports_its_error_and_leaves_nothing(
        quick, capfd, monkeypatch, tmp_path):
    import multiprocessing
    import tempfile
    from d2l import paddle as d2l
    d2l._fork_server()  # its socket folder lives as long as this process
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    capfd.readouterr()  # what importing Paddle here printed is not the workers'
    with pytest.raises(Exception, match='this constructor fails on purpose'):
        d2l.train_concise_spawn(failing_paddle_net, cpu_devices('paddle', 2),
                                batch_size=64, lr=0.1, num_epochs=1)
    assert multiprocessing.active_children() == []
    assert list(tmp_path.iterdir()) == []
    printed = ''.join(capfd.readouterr())
    assert not [word for word in NOISE if word in printed], printed


def cause_then_consequence(folder):
    """Rank 1 fails first but its process ends late; rank 0 fails after it."""
    import multiprocessing.util
    import os
    import time
    if os.environ['PADDLE_TRAINER_ID'] == '1':
        # hold back the end of this process, as a slow exit would
        multiprocessing.util.Finalize(None, time.sleep, args=(5,),
                                      exitpriority=100)
        open(os.path.join(folder, 'raising'), 'w').close()
        raise ValueError('the cause')
    while not os.path.exists(os.path.join(folder, 'raising')):
        time.sleep(0.05)
    time.sleep(0.3)
    raise RuntimeError('a consequence')


@pytest.mark.slow
def test_paddle_processes_report_the_earliest_error_not_the_first_exit(
        tmp_path):
    """As spawn_ranks does: the process that ends first may only have failed
    because another one had failed before it."""
    import multiprocessing
    from d2l import paddle as d2l
    with pytest.raises(RuntimeError, match='rank 1 of 2 failed') as failure:
        d2l.spawn_per_device(cause_then_consequence, cpu_devices('paddle', 2),
                             str(tmp_path), str(tmp_path))
    assert 'ValueError: the cause' in str(failure.value)
    assert 'a consequence' not in str(failure.value)
    assert multiprocessing.active_children() == []


def sleeping_paddle_net():
    """A constructor that notes its process id and then waits to be stopped."""
    import os
    import time
    folder = os.environ['CONCISE_TEST_PIDS']
    with open(os.path.join(folder, f'{os.getpid()}.pid'), 'w'):
        pass
    time.sleep(120)


INTERRUPTED_RUN = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
import paddle
from d2l import paddle as d2l
import test_multiple_gpus_concise as t
try:
    d2l.train_concise_spawn(t.sleeping_paddle_net, [paddle.CPUPlace()] * 2,
                            batch_size=64, lr=0.1, num_epochs=1)
except KeyboardInterrupt:
    print('interrupted')
"""


@pytest.mark.slow
def test_interrupting_paddle_training_stops_its_processes(tmp_path):
    """Ctrl-C (the notebook's interrupt button) in the parent stops every
    worker and removes the temporary folder."""
    import os
    import pathlib
    import signal
    import subprocess
    import sys
    import time
    pids, scratch = tmp_path / 'pids', tmp_path / 'tmp'
    pids.mkdir()
    scratch.mkdir()
    env = dict(os.environ, CONCISE_TEST_PIDS=str(pids), TMPDIR=str(scratch),
               PYTHONPATH=str(pathlib.Path(__file__).parent.parent))
    script = INTERRUPTED_RUN.format(tests=str(pathlib.Path(__file__).parent))
    parent = subprocess.Popen([sys.executable, '-c', script], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.time() + 120
        while len(list(pids.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.5)
        workers = [int(p.stem) for p in pids.iterdir()]
        assert len(workers) == 2, parent.communicate(timeout=60)
        parent.send_signal(signal.SIGINT)
        out, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert 'interrupted' in out, err
    time.sleep(1)
    assert not [pid for pid in workers if running(pid)]
    assert list(scratch.iterdir()) == []


def running(pid):
    """Whether process `pid` exists and has not finished (a zombie has)."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] not in 'ZX'
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------
# Issue 31 item 4: runs that a reader can compare, on both data-parallel pages

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAINING_PAGES = ['chapter_multi_gpu/multiple-gpus.md',
                  'chapter_multi_gpu/multiple-gpus-concise.md']


@pytest.mark.parametrize('page', TRAINING_PAGES)
@pytest.mark.parametrize('tab', ['pytorch', 'mxnet', 'paddle'])
def test_every_training_figure_shows_loss_beside_test_accuracy(page, tab):
    figures = [cell for cell in tab_cells(ROOT / page, tab)
               if 'Animator(' in cell]
    assert figures, f'{page} [{tab}] draws no training figure'
    for cell in figures:
        assert "legend=['train loss', 'test acc']" in cell, cell


@pytest.mark.parametrize('page', TRAINING_PAGES)
def test_one_and_two_device_runs_share_minibatch_and_rate(page):
    """The two-device run keeps the one-device run's global minibatch and
    learning rate, in every tab, so both take the same steps."""
    calls = {tab: [re.sub(r'num_(gpus|devices)=\d', '', line)
                   for cell in tab_cells(ROOT / page, tab)
                   for line in cell.splitlines()
                   if re.match(r'train\(num_(gpus|devices)=[12],', line)]
             for tab in ('pytorch', 'mxnet', 'paddle')}
    assert all(len(found) == 2 for found in calls.values()), calls
    assert len({line for found in calls.values() for line in found}) == 1, \
        calls


@pytest.mark.parametrize('tab', ['pytorch', 'mxnet', 'paddle'])
def test_two_devices_train_an_epoch_faster_than_one_in_the_stored_outputs(tab):
    """Issue 49: on the page, each tab's two-device run takes less time per
    epoch than its one-device run, says how many images it trained on, and
    names two processes (a core each) when no GPU was found."""
    notebook = json.loads((ROOT / 'outputs' / tab / 'chapter_multi_gpu' /
                           'multiple-gpus-concise.ipynb').read_text())
    runs = {}
    for cell in notebook['cells']:
        source = ''.join(cell.get('source', ''))
        found = re.match(r'train\(num_gpus=(\d)', source)
        if cell['cell_type'] == 'code' and found:
            text = ''.join(''.join(o.get('text', ''))
                           for o in cell.get('outputs', []))
            runs[int(found.group(1))] = text
    assert sorted(runs) == [1, 2], runs
    seconds = {}
    for k, text in runs.items():
        assert re.search(r'\d+ training and \d+ test images', text), text
        timed = re.search(r'test accuracy [\d.]+, ([\d.]+) s/epoch; (.*)',
                          text)
        assert timed, text
        seconds[k] = float(timed.group(1))
        if 'no GPU found' in timed.group(2):
            assert timed.group(2).startswith(
                f'{k} process{"es" if k > 1 else ""} on the CPU, one core')
    assert seconds[2] < seconds[1], seconds
