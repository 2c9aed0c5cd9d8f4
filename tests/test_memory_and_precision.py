"""The claims of chapter_multi_gpu/memory-and-precision.md, checked in every framework.

The page's demonstrations (the saved-tensor counter, the loss scaler, the
recomputing forward and backward passes, the MLP and its training) are
plain cells, not d2l helpers; the tests run those cells of the framework's
tab, after its imports cell, in a namespace of their own.
"""
import numpy as np
import pytest

from conftest import ROOT, tab_cells

PAGE = ROOT / 'chapter_multi_gpu' / 'memory-and-precision.md'
DEFINITIONS = ('def saved_tensors(', 'def round_bf16(', 'def mlp_params(',
               'class LossScaler', 'def scaled_step(', 'def train_mlp(',
               'def forward_keeping(')


@pytest.fixture(autouse=True)
def paddle_default_device_is_the_cpu(framework):
    if framework != 'paddle':
        yield
        return
    import paddle
    with paddle.device.device_guard(paddle.CPUPlace()):
        yield


@pytest.fixture
def page(framework):
    """The tab's imports cell and its cells that define the demonstrations."""
    cells = tab_cells(PAGE, framework)
    namespace = {}
    exec(cells[0], namespace)
    for code in cells[1:]:
        if '#@save' not in code and any(d in code for d in DEFINITIONS):
            exec(code, namespace)
    return namespace


def blocks_and_input(framework, d2l, page, num_blocks, b=2, s=8, h=16, a=2):
    blocks = [d2l.TransformerBlock(h, a) for _ in range(num_blocks)]
    if framework == 'mxnet':
        for blk in blocks:
            blk.initialize()
    X = page['tensor'](np.random.default_rng(0).standard_normal((b, s, h)))
    return blocks, X


def parameters(framework, blocks):
    if framework == 'mxnet':
        return [p.data() for blk in blocks
                for p in blk.collect_params().values()]
    return [p for blk in blocks for p in blk.parameters()]


@pytest.mark.parametrize('recompute', [(0, 1, 2), (1,), (0, 2)])
def test_recomputed_gradients_equal_the_stored_activation_gradients(
        framework, d2l, page, recompute):
    blocks, X = blocks_and_input(framework, d2l, page, 3)
    params = parameters(framework, blocks)
    runs = []
    for plan in [(), recompute]:
        page['zero_grads'](params)
        inputs, outputs = page['forward_keeping'](blocks, X, plan)
        dX = page['backward_recomputing'](blocks, inputs, outputs, plan)
        runs.append([page['to_numpy'](g).copy()
                     for g in [dX] + [p.grad for p in params]])
    assert len(runs[0]) == len(params) + 1
    for stored, recomputed in zip(*runs):
        assert np.abs(stored).max() > 0
        np.testing.assert_array_equal(recomputed, stored)


def test_the_scaler_skips_a_step_on_inf_and_lowers_its_scale(page):
    tensor, to_numpy = page['tensor'], page['to_numpy']
    params = [page['track'](tensor(p)) for p in page['mlp_params']()]
    rng = np.random.default_rng(0)
    X = tensor(rng.random((16, 1, 28, 28)))
    y = _labels(page, rng.integers(0, 10, 16))
    scaler = page['LossScaler'](2.0**40, growth_interval=2)
    before = [to_numpy(p).copy() for p in params]
    assert not page['scaled_step'](params, X, y, 0.1, scaler)
    assert scaler.scale == 2.0**39
    for p, b in zip(params, before):
        np.testing.assert_array_equal(to_numpy(p), b)
    scaler.scale = 2.0**4
    assert page['scaled_step'](params, X, y, 0.1, scaler)
    assert any((to_numpy(p) != b).any() for p, b in zip(params, before))
    assert page['scaled_step'](params, X, y, 0.1, scaler)
    assert scaler.scale == 2.0**5  # two good steps in a row: doubled


def _labels(page, labels):
    """Integer labels as the framework's loss takes them."""
    mod = page['d2l']
    return mod.tensor(labels.astype(np.int64))


def test_the_scaler_sees_nan_as_not_finite(page):
    scaler = page['LossScaler'](8.0)
    assert not scaler.finite([page['tensor']([1.0, float('nan')])])
    assert scaler.scale == 4.0


@pytest.mark.parametrize('b, s, h, a', [(2, 8, 16, 2), (3, 5, 12, 4),
                                        (1, 16, 8, 1)])
def test_measured_activation_bytes_equal_the_formula(framework, d2l, page,
                                                     b, s, h, a):
    if framework == 'mxnet':
        pytest.skip('MXNet has no hook on what its autograd keeps')
    (blk,), X = blocks_and_input(framework, d2l, page, 1, b, s, h, a)
    with page['saved_tensors'](blk) as found:
        Y = blk(X)
    assert tuple(Y.shape) == (b, s, h)
    assert sum(found.values()) == d2l.block_activation_bytes(s, b, h, a)


def test_recomputing_every_other_block_keeps_what_the_formula_says(
        framework, d2l, page):
    if framework == 'mxnet':
        pytest.skip('MXNet has no hook on what its autograd keeps')
    b, s, h, a = 2, 8, 16, 2
    blocks, X = blocks_and_input(framework, d2l, page, 4, b, s, h, a)
    net = page['nn'].Sequential(*blocks)
    with page['saved_tensors'](net) as found:
        inputs, _ = page['forward_keeping'](blocks, X, (1, 3))
    kept = sum(found.values()) + sum(page['nbytes'](inputs[i])
                                     for i in (1, 3))
    assert kept == 2 * d2l.block_activation_bytes(s, b, h, a) \
        + 2 * 4 * s * b * h


def test_the_block_has_12h2_plus_13h_parameters_and_refuses_odd_heads(
        framework, d2l, page):
    (blk,), X = blocks_and_input(framework, d2l, page, 1, h=16, a=4)
    blk(X)
    assert d2l.count_trainable_params(blk) == 12 * 16**2 + 13 * 16
    with pytest.raises(ValueError, match='num_heads=3 must divide h=16'):
        d2l.TransformerBlock(16, 3)


def test_bf16_rounding_keeps_8_significant_bits(page):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    r = page['to_numpy'](page['round_bf16'](page['tensor'](x)))
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0**-8)
    bits = r.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # the low 16 bits are gone


def test_bf16_training_is_within_one_point_of_float32(page, monkeypatch):
    monkeypatch.setenv('D2L_QUICK', '0')
    monkeypatch.setenv('D2L_SUBSET', '100,100')
    train_iter, test_iter = page['d2l'].load_data_fashion_mnist(100)
    # both runs see the same minibatches in the same order
    page['train_iter'], page['test_iter'] = list(train_iter), test_iter
    fp32 = page['train_mlp'](lambda x: x, 3)
    bf16 = page['train_mlp'](page['round_bf16'], 3)
    assert fp32[-1] > 0.6
    assert abs(fp32[-1] - bf16[-1]) <= 0.01
