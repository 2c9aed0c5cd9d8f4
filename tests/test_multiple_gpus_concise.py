"""The claims of chapter_multi_gpu/multiple-gpus-concise.md, checked in every framework.

Without GPUs, k "devices" are the CPU k times in PyTorch and PaddlePaddle and
the distinct contexts cpu(0), ..., cpu(k-1) in MXNet; PaddlePaddle's
multi-process training really starts k processes (Gloo on the CPU).
"""
import importlib

import numpy as np
import pytest

from conftest import cpu_devices, numpy, tensor


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
    for framework, module in [('pytorch', 'torch'), ('mxnet', 'mxnet'),
                              ('paddle', 'paddle')]:
        d2l = importlib.import_module(f'd2l.{module}')
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


@pytest.mark.parametrize('num_gpus', [0, -1, 1.0, None])
def test_num_gpus_must_be_a_positive_integer(d2l, num_gpus):
    with pytest.raises(ValueError, match='num_gpus must be a positive'):
        d2l.check_num_gpus(num_gpus)


def choose_devices(framework, d2l, num_gpus):
    """The devices (PaddlePaddle: the places of the processes) a run would use."""
    if framework == 'paddle':
        return d2l.data_parallel_places(num_gpus)
    return d2l.data_parallel_devices(num_gpus)


def test_a_run_gets_at_most_the_gpus_present(framework, d2l, monkeypatch):
    if d2l.num_gpus() == 0 and framework == 'paddle':
        pytest.skip("a CPU build of PaddlePaddle cannot even name a GPU place")
    monkeypatch.setattr(d2l, 'num_gpus', lambda: 1)
    devices = choose_devices(framework, d2l, 2)
    assert len(devices) == 1
    assert any(name in str(devices[0]) for name in ('cuda:0', 'gpu(0)',
                                                    'gpu:0'))


def test_without_gpus_the_fallback_is_said_in_the_devices(framework, d2l,
                                                         monkeypatch):
    monkeypatch.setattr(d2l, 'num_gpus', lambda: 0)
    names = [str(d) for d in choose_devices(framework, d2l, 2)]
    expected = {'pytorch': ['cpu'],  # nn.DataParallel cannot split over CPUs
                'mxnet': ['cpu(0)', 'cpu(1)'],  # two real copies
                'paddle': ['Place(cpu)', 'Place(cpu)']}  # two processes
    assert names == expected[framework]


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


def test_mxnet_defaults_to_the_contexts_holding_the_parameters():
    import mxnet as mx
    from d2l import mxnet as d2l
    net = built_resnet('mxnet', d2l, [mx.cpu(0), mx.cpu(1)])
    images, labels = d2l.fashion_mnist_arrays('test', quick=True)
    data = [(mx.nd.array(images[:6]), mx.nd.array(labels[:6], dtype='int32'))]
    assert d2l.evaluate_accuracy_gpus(net, data) == \
        d2l.evaluate_accuracy_gpu(net, data)
    with pytest.raises(RuntimeError, match='not initialized on context cpu'):
        net[0].weight.data(mx.cpu(2))  # the pitfall the section shows


def test_pytorch_model_has_no_lazy_parameters_before_wrapping():
    import torch
    from d2l import torch as d2l
    net = d2l.resnet18(10)
    assert not any(isinstance(p, torch.nn.parameter.UninitializedParameter)
                   for p in net.parameters())
    model, devices = d2l.data_parallel_model(net, 1)
    assert isinstance(model, torch.nn.DataParallel) and model.module is net
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


def concise_steps(framework, d2l, num_steps, lr=0.02):
    """Summed losses of `num_steps` concise training steps on one fixed minibatch."""
    seed_everything(framework)
    X, y = first_batch(d2l, 32)
    if framework == 'mxnet':  # two real copies on cpu(0) and cpu(1)
        from mxnet import gluon
        devices = d2l.data_parallel_devices(2)
        net = built_resnet(framework, d2l, devices)
        trainer = gluon.Trainer(net.collect_params(), 'sgd',
                                {'learning_rate': lr})
        loss = gluon.loss.SoftmaxCrossEntropyLoss()
        return [float(d2l.train_step_concise(net, X, y, loss, trainer,
                                             devices).asscalar())
                for _ in range(num_steps)]
    if framework == 'paddle':  # this process alone: no spawn needed for a step
        import paddle
        net = d2l.resnet18(10)
        optimizer = paddle.optimizer.SGD(learning_rate=lr,
                                         parameters=net.parameters())
        loss = paddle.nn.CrossEntropyLoss()
        net.train()
        return [float(d2l.train_step_concise(net, X, y, loss, optimizer))
                for _ in range(num_steps)]
    import torch
    model, devices = d2l.data_parallel_model(d2l.resnet18(10), 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.nn.CrossEntropyLoss()
    model.train()
    return [float(d2l.train_step_concise(model, X, y, loss, optimizer,
                                         devices[0]))
            for _ in range(num_steps)]


def test_a_few_concise_training_steps_reduce_the_loss(framework, d2l, quick):
    losses = concise_steps(framework, d2l, num_steps=4)
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < 0.7 * losses[0], losses  # observed: about 0.45


def test_mxnet_two_context_step_equals_one_context_step():
    """The Trainer's sum over contexts gives the update of one big minibatch."""
    import mxnet as mx
    from mxnet import gluon, init
    from d2l import mxnet as d2l
    rng = np.random.default_rng(0)
    X = mx.nd.array(rng.random((12, 1, 28, 28), dtype=np.float32))
    y = mx.nd.array(rng.integers(0, 10, 12), dtype='int32')
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


def test_paddle_spawn_rejects_a_batch_that_does_not_divide():
    from d2l import paddle as d2l
    with pytest.raises(ValueError, match='batch_size 9 cannot be shared '
                                         'equally by 2 processes'):
        d2l.train_concise_spawn(d2l.resnet18(10), 2, 9, 0.1, 1)


def small_paddle_net():
    """A network without batch normalisation: its training does not depend on
    how a minibatch is split, so one and two processes must agree."""
    import paddle
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 32),
                                paddle.nn.ReLU(), paddle.nn.Linear(32, 10))


@pytest.mark.slow
def test_paddle_two_process_training_equals_one_process_training(quick):
    from d2l import paddle as d2l
    results = {}
    for num_gpus in (1, 2):
        net = small_paddle_net()
        record = d2l.train_concise_spawn(net, num_gpus, batch_size=64, lr=0.1,
                                         num_epochs=2)
        results[num_gpus] = record, [p.numpy() for p in net.parameters()]
    (one, one_weights), (two, two_weights) = results[1], results[2]
    if d2l.num_gpus() == 0:
        assert one['devices'] == ['cpu'] and two['devices'] == ['cpu', 'cpu']
    assert two['train_loss'][1] < two['train_loss'][0]
    np.testing.assert_allclose(two['train_loss'], one['train_loss'], rtol=1e-4)
    for w2, w1 in zip(two_weights, one_weights):
        np.testing.assert_allclose(w2, w1, rtol=1e-4, atol=1e-5)
    untrained = [p.numpy() for p in small_paddle_net().parameters()]
    # The trained weights came back to the notebook's model.
    assert not np.allclose(one_weights[0], untrained[0])
