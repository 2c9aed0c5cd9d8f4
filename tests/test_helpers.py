"""The claims of the toolkit section (chapter_multi_gpu/helpers.md), per framework.

Its argument checks and data machinery are tested with the appendix pages that
define them, in test_d2l_package.py.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from d2l import runtime

from conftest import FRAMEWORKS, MODULES, ROOT, saved_signatures


# ---------------------------------------------------------------- devices

def is_cpu(framework, device):
    if framework == 'pytorch':
        return device.type == 'cpu'
    if framework == 'mxnet':
        return device.device_type == 'cpu'
    return device.is_cpu_place()


def test_try_gpu_falls_back_to_the_cpu_when_that_gpu_is_missing(framework, d2l):
    assert is_cpu(framework, d2l.try_gpu(d2l.num_gpus()))
    assert is_cpu(framework, d2l.try_gpu(d2l.num_gpus() + 5))


def test_mxnet_fallback_contexts_are_distinct(framework, d2l):
    if framework != 'mxnet':
        pytest.skip('distinct CPU contexts are an MXNet feature')
    k = d2l.num_gpus()
    assert d2l.try_gpu(k) != d2l.try_gpu(k + 1)


def test_try_all_gpus_is_never_empty(framework, d2l):
    devices = d2l.try_all_gpus()
    assert len(devices) == max(1, d2l.num_gpus())
    if d2l.num_gpus() == 0:
        assert is_cpu(framework, devices[0])


class _FakeCUDAPlace:
    """Stands in for paddle.CUDAPlace, which a CPU build refuses to construct."""
    def __init__(self, i):
        self.i = i

    def get_device_id(self):
        return self.i

    def is_gpu_place(self):
        return True

    def __eq__(self, other):
        return isinstance(other, _FakeCUDAPlace) and other.i == self.i


def pretend_gpus(framework, d2l, monkeypatch, g):
    """Make d2l believe the machine has `g` GPUs."""
    monkeypatch.setattr(d2l, 'num_gpus', lambda: g)
    if framework == 'paddle':
        import paddle
        monkeypatch.setattr(paddle, 'CUDAPlace', _FakeCUDAPlace)


def gpu_index(framework, device):
    """The GPU number of `device`, or None for a CPU device."""
    if framework == 'pytorch':
        return device.index if device.type == 'cuda' else None
    if framework == 'mxnet':
        return device.device_id if device.device_type == 'gpu' else None
    return device.get_device_id() if isinstance(device, _FakeCUDAPlace) \
        else None


@pytest.mark.parametrize('g', [0, 1, 2, 8])
@pytest.mark.parametrize('k', [1, 2, 4])
def test_k_copies_on_g_gpus_follow_the_one_rule(framework, d2l, monkeypatch,
                                                g, k):
    """GPUs 0..min(g, k)-1 when there are GPUs, k CPU devices when there are none."""
    pretend_gpus(framework, d2l, monkeypatch, g)
    devices = d2l.try_gpus(k)
    if g == 0:
        assert len(devices) == k
        assert all(is_cpu(framework, d) for d in devices)
        if framework == 'mxnet':  # distinct contexts, one per copy
            assert [d.device_id for d in devices] == list(range(k))
    else:
        # Never a mix of GPUs and the CPU, even when fewer GPUs than asked.
        assert [gpu_index(framework, d) for d in devices] == \
            list(range(min(g, k)))


@pytest.mark.parametrize('g, k, expected', [
    (0, 2, '2 copies of the model on '),
    (0, 1, '1 copy of the model on '),
    (1, 2, '2 devices asked, 1 GPU found: using '),
    (2, 2, '2 GPUs (2 found): using '),
    (8, 4, '4 GPUs (8 found): using '),
])
def test_describe_devices_says_what_was_chosen(framework, d2l, monkeypatch,
                                               g, k, expected):
    pretend_gpus(framework, d2l, monkeypatch, g)
    line = d2l.describe_devices(d2l.try_gpus(k), k)
    assert line.startswith(expected)
    if g == 0:
        assert line.endswith('(no GPU found)')
    else:
        assert line.count('0') >= 1 and 'cpu' not in line


@pytest.mark.slow
def test_installed_package_imports_from_any_directory(framework, tmp_path):
    """`pip install -e .` makes `from d2l import X as d2l` work outside the repo."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    code = (f'from d2l import {MODULES[framework]} as d2l; '
            'print(len(d2l.try_all_gpus()), d2l.try_all_gpus())')
    out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    count, devices = out.stdout.strip().splitlines()[-1].split(' ', 1)
    assert int(count) >= 1
    assert 'cpu' in devices.lower() or 'gpu' in devices.lower()


# ---------------------------------------------------------------- timing and counting

def test_timer_measures_intervals(d2l):
    timer = d2l.Timer()
    time.sleep(0.02)
    first = timer.stop()
    timer.start()
    time.sleep(0.01)
    timer.stop()
    assert 0.015 < first < 1
    assert timer.sum() == pytest.approx(sum(timer.times))
    assert timer.avg() == pytest.approx(timer.sum() / 2)
    assert timer.cumsum()[-1] == pytest.approx(timer.sum())


def test_accumulator_keeps_running_sums(d2l):
    acc = d2l.Accumulator(2)
    acc.add(1, 10)
    acc.add(2.5, 5)
    assert (acc[0], acc[1]) == (3.5, 15)
    acc.reset()
    assert acc.data == [0.0, 0.0]
    with pytest.raises(ValueError, match='expected 2 values, got 3'):
        acc.add(1, 2, 3)


def tensor(framework, values, dtype='float32'):
    """A framework tensor on the CPU holding `values`."""
    values = np.asarray(values, dtype=dtype)
    if framework == 'pytorch':
        import torch
        return torch.from_numpy(values)
    if framework == 'mxnet':
        import mxnet as mx
        return mx.np.array(values, dtype=dtype)
    import paddle
    return paddle.to_tensor(values)


def test_accuracy_counts_correct_predictions(framework, d2l):
    label_dtype = 'int32' if framework == 'mxnet' else 'int64'
    scores = tensor(framework, [[0.1, 0.9, 0.0], [0.8, 0.1, 0.1],
                                [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    labels = tensor(framework, [1, 0, 1, 0], label_dtype)
    assert d2l.accuracy(scores, labels) == 3.0
    # Already-decided labels are compared directly.
    assert d2l.accuracy(tensor(framework, [1, 1, 1, 1], label_dtype),
                        labels) == 2.0


def linear_classifier(framework, weight):
    """A bias-free linear layer with the given (out, in) weight, on the CPU."""
    weight = np.asarray(weight, dtype='float32')
    n_out, n_in = weight.shape
    if framework == 'pytorch':
        import torch
        net = torch.nn.Linear(n_in, n_out, bias=False)
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(weight))
        return net
    if framework == 'mxnet':
        import mxnet as mx
        net = mx.gluon.nn.Dense(n_out, in_units=n_in, use_bias=False)
        net.initialize(ctx=mx.cpu())
        net.weight.set_data(mx.np.array(weight))
        return net
    import paddle
    net = paddle.nn.Linear(n_in, n_out, bias_attr=False)
    net.weight.set_value(weight.T)  # paddle stores (in, out)
    return net


def test_evaluate_accuracy_gpu_returns_the_fraction_correct(framework, d2l):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 4)).astype('float32')
    W = rng.normal(size=(3, 4)).astype('float32')
    y = rng.integers(0, 3, size=50)
    expected = float(np.mean((X @ W.T).argmax(axis=1) == y))
    net = linear_classifier(framework, W)
    label_dtype = 'int32' if framework == 'mxnet' else 'int64'
    batches = [(tensor(framework, X[i:i + 16]),
                tensor(framework, y[i:i + 16], label_dtype))
               for i in range(0, 50, 16)]  # the last batch is smaller
    assert d2l.evaluate_accuracy_gpu(net, batches) == pytest.approx(expected)


def test_sgd_updates_parameters_in_place(framework, d2l):
    init = np.array([1.0, -2.0, 3.0], dtype='float32')
    if framework == 'pytorch':
        import torch
        w = torch.tensor(init, requires_grad=True)
        (w * w).sum().backward()
        grad = lambda: w.grad.numpy()
    elif framework == 'mxnet':
        import mxnet as mx
        w = mx.np.array(init)
        w.attach_grad()
        with mx.autograd.record():
            loss = (w * w).sum()
        loss.backward()
        grad = lambda: w.grad.asnumpy()
    else:
        import paddle
        w = paddle.to_tensor(init, stop_gradient=False)
        (w * w).sum().backward()
        grad = lambda: w.grad.numpy()
    same_object = w
    d2l.sgd([w], lr=0.5, batch_size=2)
    updated = w.asnumpy() if framework == 'mxnet' else w.detach().numpy()
    np.testing.assert_allclose(updated, init - 0.5 * 2 * init / 2)
    assert w is same_object
    if framework != 'mxnet':  # mxnet overwrites gradients on each backward
        assert not np.any(grad() if grad() is not None else 0)


def test_animator_draws_headless_and_saves_svg(d2l, tmp_path):
    animator = d2l.Animator(xlabel='epoch', legend=['a', 'b'])
    for epoch in range(1, 4):
        animator.add(epoch, (epoch, None if epoch == 2 else 2 * epoch))
    assert animator.Y == [[1, 2, 3], [2, 6]]
    animator.savefig(tmp_path / 'curve.svg')
    assert (tmp_path / 'curve.svg').read_text().lstrip().startswith('<?xml')


# ---------------------------------------------------------------- the real data

def as_numpy(framework, t):
    return t.asnumpy() if framework == 'mxnet' else t.numpy()


def collect(framework, data_iter):
    Xs, ys = zip(*[(as_numpy(framework, X), as_numpy(framework, y))
                   for X, y in data_iter])
    return np.concatenate(Xs), np.concatenate(ys)


def test_loader_yields_float_images_and_integer_labels(framework, d2l, quick,
                                                       capsys, monkeypatch):
    # As in a fresh process: earlier tests have already heard the mode.
    monkeypatch.setattr(runtime, '_SAID', set())
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size=64)
    assert 'quick mode' in capsys.readouterr().out
    X, y = next(iter(train_iter))
    assert tuple(X.shape) == (64, 1, 28, 28) and tuple(y.shape) == (64,)
    assert 'float32' in str(X.dtype)
    assert ('int32' if framework == 'mxnet' else 'int64') in str(y.dtype)
    if framework == 'mxnet':  # NumPy-interface arrays, as npx operators need
        import mxnet as mx
        assert isinstance(X, mx.np.ndarray) and isinstance(y, mx.np.ndarray)
    X, y = collect(framework, test_iter)
    assert X.min() >= 0 and X.max() <= 1 and X.max() > 0.9
    assert set(np.unique(y)) == set(range(10))


def test_quick_subset_is_class_balanced(framework, d2l, quick):
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size=128)
    for data_iter, split in ((train_iter, 'train'), (test_iter, 'test')):
        _, y = collect(framework, data_iter)
        per_class = d2l.QUICK_PER_CLASS[split]
        assert np.bincount(y, minlength=10).tolist() == [per_class] * 10


def test_quick_subset_is_identical_across_runs_and_frameworks(quick):
    import importlib
    seen = []
    for framework in FRAMEWORKS:
        d2l = importlib.import_module(f'd2l.{MODULES[framework]}')
        for _ in range(2):
            _, test_iter = d2l.load_data_fashion_mnist(batch_size=50)
            seen.append(collect(framework, test_iter))
    for X, y in seen[1:]:
        np.testing.assert_array_equal(X, seen[0][0])
        np.testing.assert_array_equal(y, seen[0][1])


def test_training_iterator_reshuffles_every_epoch(framework, d2l, quick):
    train_iter, _ = d2l.load_data_fashion_mnist(batch_size=300)
    first = as_numpy(framework, next(iter(train_iter))[1])
    second = as_numpy(framework, next(iter(train_iter))[1])
    assert sorted(first) == sorted(second) and list(first) != list(second)


def test_full_mode_serves_all_70000_images(framework, d2l, monkeypatch,
                                            capsys):
    monkeypatch.setenv('D2L_QUICK', '0')
    monkeypatch.setattr(runtime, '_SAID', set())  # said once per process
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size=1000)
    assert 'full mode: 60000 training and 10000 test images' in \
        capsys.readouterr().out
    assert sum(1 for _ in test_iter) == 10


def test_resize_changes_height_and_width(framework, d2l, quick):
    _, test_iter = d2l.load_data_fashion_mnist(batch_size=4, resize=(32, 40))
    assert tuple(next(iter(test_iter))[0].shape) == (4, 1, 32, 40)


def test_unknown_quick_flag_is_an_error(d2l, monkeypatch):
    monkeypatch.setenv('D2L_QUICK', 'yes')
    with pytest.raises(ValueError, match="D2L_QUICK must be 0 .* got 'yes'"):
        d2l.load_data_fashion_mnist(32)


def test_quick_mode_caps_training_at_two_epochs(d2l, quick):
    assert d2l.train_epochs(10) == d2l.QUICK_MAX_EPOCHS == 1
    assert d2l.train_epochs(1) == 1


def test_full_mode_trains_the_epochs_asked_for(d2l, monkeypatch):
    monkeypatch.setenv('D2L_QUICK', '0')
    assert d2l.train_epochs(10) == 10


def test_the_loader_says_its_mode_once_per_process(d2l, quick, monkeypatch,
                                                   capsys):
    monkeypatch.setattr(runtime, '_SAID', set())
    for _ in range(3):
        d2l.load_data_fashion_mnist(batch_size=32)
    assert capsys.readouterr().out.count('quick mode') == 1


# ---------------------------------------------------------------- d2l's own calls

def test_evaluate_accuracy_gpu_takes_a_plain_function(framework, d2l):
    """d2l's from-scratch call: evaluate_accuracy_gpu(lambda X: net(X, params), it, device)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 4)).astype('float32')
    W = rng.normal(size=(4, 3)).astype('float32')
    y = rng.integers(0, 3, size=40)
    expected = float(np.mean((X @ W).argmax(axis=1) == y))
    label_dtype = 'int32' if framework == 'mxnet' else 'int64'
    batches = [(tensor(framework, X[i:i + 16]),
                tensor(framework, y[i:i + 16], label_dtype))
               for i in range(0, 40, 16)]
    params = [tensor(framework, W)]
    if framework == 'pytorch':
        import torch
        net = lambda X, params: torch.matmul(X, params[0])
    elif framework == 'mxnet':
        import mxnet as mx
        net = lambda X, params: mx.np.dot(X, params[0])
    else:
        import paddle
        net = lambda X, params: paddle.matmul(X, params[0])
    device = d2l.try_gpu()
    assert d2l.evaluate_accuracy_gpu(lambda X: net(X, params), batches,
                                     device) == pytest.approx(expected)
    assert d2l.evaluate_accuracy_gpu(lambda X: net(X, params),
                                     batches) == pytest.approx(expected)


def test_animator_takes_d2ls_arguments(d2l):
    animator = d2l.Animator(xlabel='epoch', xlim=[1, 10], ylim=[0, 1],
                            legend=['train loss', 'train acc', 'test acc'],
                            nrows=1, ncols=2, figsize=(7, 2.5))
    assert len(animator.axes) == 2
    animator.add(1, (0.9, 0.3, None))
    animator.add(2, (0.5, 0.6, 0.55))
    assert animator.Y == [[0.9, 0.5], [0.3, 0.6], [0.55]]
    assert animator.axes[0].get_xlabel() == 'epoch'


def test_residual_takes_d2ls_argument_names(framework, d2l):
    block = d2l.Residual(input_channels=3, num_channels=6, use_1x1conv=True,
                         strides=2)
    X = tensor(framework, np.random.default_rng(0).random(
        (2, 3, 6, 6)).astype('float32'))
    if framework == 'mxnet':
        block.initialize()
    assert tuple(block(X).shape) == (2, 6, 3, 3)


def test_d2l_style_metric_bookkeeping(d2l):
    """The epoch loop of d2l's train_ch6, run against our Timer and Accumulator."""
    timer, metric = d2l.Timer(), d2l.Accumulator(3)
    for loss, correct, n in ((2.0, 3, 4), (1.0, 1, 2)):
        timer.start()
        metric.add(loss * n, correct, n)
        timer.stop()
    assert metric[0] / metric[2] == pytest.approx(10 / 6)
    assert metric[1] / metric[2] == pytest.approx(4 / 6)
    assert len(timer.times) == 2 and timer.sum() >= 0


# ---------------------------------------------------------------- accuracy never overcounts

def test_accuracy_is_a_count_between_zero_and_n(framework, d2l):
    """Property: for any N, C and shapes, the count equals a NumPy reference."""
    from hypothesis import given, settings, strategies as st
    label_dtype = 'int32' if framework == 'mxnet' else 'int64'

    @settings(max_examples=40, deadline=None)
    @given(n=st.integers(0, 12), c=st.integers(1, 5), seed=st.integers(0, 99),
           column=st.booleans())
    def check(n, c, seed, column):
        rng = np.random.default_rng(seed)
        scores = rng.normal(size=(n, c)).astype('float32')
        labels = rng.integers(0, c, size=n)
        predicted = scores.argmax(axis=1) if c > 1 else scores[:, 0]
        reference = int(np.sum(predicted.astype(labels.dtype) == labels))
        count = d2l.accuracy(
            tensor(framework, scores),
            tensor(framework, labels.reshape(-1, 1) if column else labels,
                   label_dtype))
        assert count == int(count) and 0 <= count <= n
        assert count == reference
    check()


# ---------------------------------------------------------------- curves stay in the notebook

def test_a_training_cell_keeps_its_figure_above_its_summary(framework,
                                                            tmp_path):
    """Run headless as d2lbook does: the cell ends with an image, then the text."""
    import nbformat
    from nbclient import NotebookClient
    cell = (f'import sys; sys.path.insert(0, {str(ROOT)!r})\n'
            f'from d2l import {MODULES[framework]} as d2l\n'
            'animator = d2l.Animator(xlabel="epoch", legend=["loss"])\n'
            'for epoch in range(1, 5):\n'
            '    animator.add(epoch, 1 / epoch)\n'
            'print("test accuracy 0.900")\n')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    NotebookClient(nb, timeout=300, kernel_name='python3',
                   resources={'metadata': {'path': str(tmp_path)}}).execute()
    kinds = []
    for output in nb.cells[0].outputs:
        data = output.get('data', {})
        if 'image/svg+xml' in data or 'image/png' in data:
            kinds.append('image')
        elif output.get('name') == 'stdout' and 'test accuracy' in \
                output.get('text', ''):
            kinds.append('text')
    assert kinds == ['image', 'text'], nb.cells[0].outputs


# ---------------------------------------------------------------- one API

def test_helpers_have_the_same_signature_in_every_framework():
    """A helper of this section has the same parameters in all three flavours."""
    import importlib
    modules = [importlib.import_module(f'd2l.{MODULES[f]}') for f in FRAMEWORKS]
    expected = {'try_gpu', 'try_all_gpus', 'try_gpus', 'describe_devices',
                'Timer', 'Accumulator', 'accuracy', 'evaluate_accuracy_gpu',
                'sgd', 'load_data_fashion_mnist', 'Residual'}
    seen = [saved_signatures(m, 'sec_helpers', also=expected) for m in modules]
    shared = set.intersection(*(set(names) for names in seen))
    assert expected <= shared
    for name in sorted(shared):
        signatures = {s[name] for s in seen}
        if name == 'Residual':  # Gluon blocks also take a prefix and params
            signatures = {s.replace(', **kwargs', '') for s in signatures}
        assert len(signatures) == 1, (name, signatures)


@pytest.mark.skipif(not hasattr(os, 'sched_getaffinity'), reason='Linux only')
def test_a_process_that_uses_one_core_runs_only_there(framework):
    import subprocess
    module = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
    cores = sorted(os.sched_getaffinity(0))
    code = (f'import os, threading\nfrom d2l import {module[framework]} as d2l\n'
            'core = d2l.use_one_core(1)\n'
            'print(core, *sorted({c for t in os.listdir("/proc/self/task") '
            'for c in os.sched_getaffinity(int(t))}))\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    core, *used = map(int, out.stdout.split())
    assert core == cores[1 % len(cores)]  # local rank 1: the second core
    assert used == [core]  # every thread of the process, pinned there
