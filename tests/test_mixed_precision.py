"""The claims of chapter_multi_gpu/mixed-precision.md, checked in every framework.

The page's demonstrations (bf16 rounding, the MLP, the loss scaler and
the training loop) are plain cells, not d2l helpers; the tests run those
cells of the framework's tab, after its imports cell, in a namespace of
their own.
"""
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT, page_definitions
from test_process_groups import RESULT, finish, result_of, start

PAGE = ROOT / 'chapter_multi_gpu' / 'mixed-precision.md'
DEFINITIONS = ('def round_bf16(', 'def mlp_params(', 'class LossScaler',
               'def scaled_step(', 'def train_mlp(')


pytestmark = pytest.mark.usefixtures('paddle_default_device_is_the_cpu')



@pytest.fixture
def page(framework):
    """The tab's imports cell and its cells that define the demonstrations."""
    return page_definitions(PAGE, framework, DEFINITIONS)


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


# ---- FSDP2 with a MixedPrecisionPolicy in two Gloo processes (PyTorch) ----

MLP_PARAMETERS = 784 * 256 + 256 + 256 * 10 + 10
FSDP_SCENARIO = textwrap.dedent(f'''
    import json
    from d2l import torch as d2l
    ranks = d2l.spawn_ranks(d2l.fsdp_precisions, 2, d2l.local_init_method(),
                            2)
    print({RESULT!r} + json.dumps(ranks), flush=True)
''')


@pytest.mark.slow  # two processes; run once in the pinned environment
def test_fsdp_in_bf16_gathers_half_the_bytes_onto_float32_masters(
        framework):
    if framework != 'pytorch':
        pytest.skip('FSDP runs in the PyTorch tab only; the other tabs '
                    'compute the same bytes from the parameter count')
    proc = start([sys.executable, '-c', FSDP_SCENARIO])
    out, err = finish(proc, 300)
    n, num_steps = MLP_PARAMETERS, 2
    # bytes per number gathered and reduce-scattered under each policy
    expected = {'float32': (4, 4), 'bf16': (2, 2),
                'bf16, float32 reduce': (2, 4)}
    for rank in result_of(out, err, proc):
        assert list(rank) == list(expected)
        for name, (param_bytes, grad_bytes) in expected.items():
            moved, losses, dtype = rank[name]
            # the parameters gathered twice a step, the gradients once
            assert moved == [num_steps * 2 * param_bytes * n,
                             num_steps * grad_bytes * n]
            assert dtype == 'torch.float32'
            assert losses[1] < losses[0]
        assert abs(rank['bf16'][1][1] - rank['float32'][1][1]) < 0.01


@pytest.mark.parametrize('num_steps', [0, 2.5, '3'])
def test_the_fsdp_worker_refuses_a_step_count_before_it_joins_a_group(
        framework, d2l, num_steps):
    if framework != 'pytorch':
        pytest.skip('the FSDP worker is in the PyTorch tab only')
    with pytest.raises(ValueError,
                       match='num_steps must be a positive integer, got '):
        d2l.fsdp_precisions(0, 2, 'unused://', num_steps)
