"""The claims of chapter_multi_gpu/memory-model.md, checked in every framework.

The page's prediction and measurements are plain cells, not d2l helpers; the
tests run all cells of the framework's tab in a namespace of their own and
then call its functions on other sizes.
"""
import contextlib
import io

import numpy as np
import pytest

from conftest import ROOT, tab_cells

PAGE = ROOT / 'chapter_multi_gpu' / 'memory-model.md'



_PAGES = {}


@pytest.fixture
def page(framework, paddle_default_device_is_the_cpu):
    """The namespace after running every cell of the tab once, quietly."""
    if framework not in _PAGES:
        namespace = {}
        with contextlib.redirect_stdout(io.StringIO()):
            for code in tab_cells(PAGE, framework):
                exec(code, namespace)
        _PAGES[framework] = namespace
    return _PAGES[framework]


@pytest.mark.parametrize('k', [2, 4])
@pytest.mark.parametrize('bits', [32, 16])
def test_predicted_model_state_bytes_equal_the_measured_ones(page, k, bits):
    n, L = page['n'], page['L']
    assert n % k == 0 and n % L == 0
    arrays = page['arrays'] if bits == 32 else page['arrays16']
    per_param = (4, 4, 8) if bits == 32 else (2, 2, 12)
    for scheme in page['SHARDED']:
        for rank in range(k):
            measured = page['measured_state_bytes'](arrays, k, scheme, rank)
            assert measured == page['predict_state_bytes'](
                n, k, scheme, per_param, L)
    assert page['predict_state_bytes'](n, k, 'zero3', per_param) * k == 16 * n


def test_peak_is_state_plus_activations_and_names_its_schemes(page):
    n, L, A, x = page['n'], page['L'], page['A'], page['x_bytes']
    predict = page['predict_peak_bytes']
    assert predict(n, (L, A, x), 2, 'ddp') == 16 * n + L * A
    assert predict(n, (L, A, x), 2, 'zero3', True) == 8 * n + L * x + A
    assert predict(n, (L, A, x), 2, 'fsdp') == 8 * n + 4 * n / L + L * A
    with pytest.raises(ValueError, match='scheme must be one of'):
        predict(n, (L, A, x), 2, 'zero4')


@pytest.mark.parametrize('p, m', [(2, 4), (4, 2), (4, 8), (1, 2)])
def test_a_pipeline_stage_keeps_the_micro_batches_its_schedule_has_in_flight(
        framework, d2l, page, p, m):
    if framework == 'mxnet':
        pytest.skip("MXNet's autograd cannot be watched")
    net, X, L = page['net'], page['X'], page['L']
    s, b, h, a = page['s'], page['b'], page['h'], page['a']
    stage_bytes = L // p * d2l.block_activation_bytes(s, b // m, h, a)
    stages = [net[i * L // p:(i + 1) * L // p] for i in range(p)]
    Xs = [X[j * b // m:(j + 1) * b // m] for j in range(m)]
    for kind in ('gpipe', '1f1b'):
        measured = page['schedule_peaks'](
            stages, Xs, d2l.pipeline_schedule(kind, p, m))
        predicted = page['predict_pipeline_bytes'](kind, p, m, stage_bytes)
        assert measured == predicted, kind
    assert predicted[0] == min(p, m) * stage_bytes  # 1F1B's first stage


@pytest.mark.parametrize('b, s', [(8, 64), (2, 16), (4, 32)])
def test_predicted_activation_bytes_equal_the_measured_ones(
        framework, d2l, page, b, s):
    if framework == 'mxnet':
        pytest.skip("MXNet's autograd cannot be watched")
    h, a, L = page['h'], page['a'], page['L']
    X = page['tensor'](np.random.default_rng(2).standard_normal((b, s, h)))
    A = d2l.block_activation_bytes(s, b, h, a)
    x = page['nbytes'](X)
    kept, predict = page['kept_bytes'], page['predict_activation_bytes']
    assert kept(page['net'], X, False) == predict(L, A, x)
    inputs = kept(page['net'], page['track'](X), True)
    assert inputs == L * x
    assert inputs + kept(page['net'][:1], X, False) == predict(L, A, x, True)


def test_the_bench_peak_line_measures_what_it_predicts():
    pytest.importorskip('torch')
    from bench import memory
    rows = memory.peak_rows(2)
    assert {(r['method'], r['recompute']) for r in rows} == {
        (m, r) for m in ('DDP', 'ZeRO-3') for r in (False, True)}
    for r in rows:
        assert r['measured'] == r['predicted'], r
    line = memory.peak_line(rows)
    assert 'DDP + recompute' in line and 'ZeRO-3' in line


@pytest.mark.parametrize('t', [1, 2, 4])
@pytest.mark.parametrize('b, s', [(8, 64), (2, 16)])
def test_a_tensor_parallel_rank_holds_the_predicted_bytes(framework, page, t,
                                                          b, s):
    h, a, blk = page['h'], page['a'], page['net'][0]
    W, whole = page['tp_rank_weights'](blk, t)
    params = sum(page['nbytes'](w) if framework != 'mxnet' else w.nbytes
                 for w in [*W.values(), *whole])
    predicted_params, predicted_acts = page['predict_tp_bytes'](s, b, h, a, t)
    assert params == predicted_params
    if framework == 'mxnet':
        return  # MXNet's autograd cannot be watched
    X = page['tensor'](np.random.default_rng(3).standard_normal((b, s, h)))
    with page['saved_tensors']([*blk.parameters(), *W.values()]) as found:
        page['tp_rank_forward'](blk, W, X, t)
    assert sum(found.values()) == predicted_acts


def test_one_rank_of_one_computes_the_whole_block(framework, page):
    if framework == 'mxnet':
        pytest.skip('MXNet runs no tensor-parallel forward pass')
    blk, X = page['net'][0], page['X']
    W, _ = page['tp_rank_weights'](blk, 1)
    one_rank = page['tp_rank_forward'](blk, W, X, 1).detach().numpy()
    np.testing.assert_allclose(one_rank, blk(X).detach().numpy(), rtol=1e-5,
                               atol=1e-5)  # the same sums in another order
