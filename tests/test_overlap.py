"""The claims of chapter_multi_gpu/overlap.md, checked in every framework.

The page's buckets, exchanges and accumulation are plain cells, not d2l
helpers (its ranks are threads of one process, or in MXNet model copies on
two contexts); the tests run every cell of the framework's tab once, in
quick mode, in a namespace of their own, and then call its functions.
"""
import contextlib
import io
import os

import numpy as np
import pytest

from conftest import ROOT, tab_cells

PAGE = ROOT / 'chapter_multi_gpu' / 'overlap.md'
CAPS = (0, 2**16, 2**18, 2**20, 2**30)

pytestmark = pytest.mark.slow  # each tab runs whole, threads and all

_PAGES = {}


@pytest.fixture
def page(framework):
    """The namespace after running every cell of the tab once, quietly."""
    if framework not in _PAGES:
        namespace, quick = {}, os.environ.get('D2L_QUICK')
        os.environ['D2L_QUICK'] = '1'
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for code in tab_cells(PAGE, framework):
                    exec(code, namespace)
        finally:
            if quick is None:
                del os.environ['D2L_QUICK']
            else:
                os.environ['D2L_QUICK'] = quick
        _PAGES[framework] = namespace
    return _PAGES[framework]


@pytest.mark.parametrize('cap', [0, 1, 2**16, 2**18, 2**20, 2**30])
def test_buckets_take_every_parameter_once_from_the_last_within_the_cap(
        page, cap):
    sizes = page['sizes']
    buckets = page['make_buckets'](sizes, cap)
    assert [i for bucket in buckets for i in bucket] == \
        list(reversed(range(len(sizes))))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) * 4 <= cap
    for first, second in zip(buckets, buckets[1:]):  # no room was left
        assert sum(sizes[i] for i in first + second[:1]) * 4 > cap


def test_make_buckets_refuses_a_negative_cap(page):
    with pytest.raises(ValueError, match='cap_bytes'):
        page['make_buckets']([3, 4], -1)


def test_gradients_are_finished_from_the_last_layer_to_the_first(
        framework, page):
    if framework == 'mxnet':
        pytest.skip('MXNet has no gradient hooks')
    names = [name for name, _ in page['mlp'](seed=0).named_parameters()]
    assert page['ready'] == names[::-1]


@pytest.mark.parametrize('cap', CAPS)
def test_bucketed_allreduce_equals_plain_allreduce_after_backward(page, cap):
    ranks = page['run_ranks'](page['both_exchanges'], 2, cap, 16)
    buckets = page['make_buckets'](page['sizes'], cap)
    whole = page['large_batch_gradient'](32)
    for bucketed, plain, calls in ranks:
        assert calls == len(buckets)
        np.testing.assert_array_equal(bucketed, plain)  # the same sums
        np.testing.assert_array_equal(bucketed, ranks[0][0])
        # the mean of two shards' gradients is the whole batch's, rounded
        np.testing.assert_allclose(bucketed, whole, rtol=0, atol=1e-6)


def test_a_training_step_makes_one_allreduce_per_bucket(page):
    for cap in (0, 2**20):
        ranks = page['run_ranks'](page['time_steps'], 2, cap, 2, 16)
        for seconds, calls in ranks:
            assert seconds > 0
            assert calls == len(page['make_buckets'](page['sizes'], cap))


@pytest.mark.parametrize('m', [1, 2, 4])
def test_m_micro_batches_with_one_exchange_equal_the_large_batch(page, m):
    micro_size = 8
    ranks = page['run_ranks'](page['accumulated_gradient'], 2, m,
                              micro_size)
    whole = page['large_batch_gradient'](2 * m * micro_size)
    num_buckets = len(page['make_buckets'](page['sizes'], 2**20))
    for grad, calls in ranks:
        assert calls == num_buckets  # one exchange, not m
        # float32 sums of the same terms in another order
        np.testing.assert_allclose(grad, whole, rtol=0, atol=1e-6)
    assert np.abs(whole).max() > 1e-2  # a gradient worth comparing


def test_summed_loss_over_all_examples_normalises_unequal_micro_batches(
        page):
    sizes, accumulate = (40, 24), page['accumulate']
    net, whole = page['mlp'](seed=0), page['large_batch_gradient'](64)
    total = accumulate(net, sizes, lambda j: 1 / sum(sizes))
    means = accumulate(net, sizes, lambda j: 1 / sizes[j] / len(sizes))
    np.testing.assert_allclose(total, whole, rtol=0, atol=1e-6)
    assert np.abs(means - whole).max() > 1e-3


def test_batch_norm_makes_micro_batches_differ_from_the_large_batch(page):
    accumulate = page['accumulate']
    bn_mlp = lambda: page['mlp'](seed=0, norm=page['batch_norm'])
    whole = accumulate(bn_mlp(), (64,), lambda j: 1 / 64)
    micro = accumulate(bn_mlp(), (16,) * 4, lambda j: 1 / 64)
    assert np.abs(micro - whole).max() > 1e-3


@pytest.mark.parametrize('fsdp', [False, True])
@pytest.mark.parametrize('every', [True, False])
def test_sharded_accumulation_moves_and_holds_the_bytes_of_its_choice(
        page, fsdp, every):
    grads, shards_of = page['grads'], page['param_shards']
    m, k = len(grads), len(grads[0])
    n = sum(page['sizes'])
    shard = [n // k + (i < n % k) for i in range(k)]
    page['received'].clear()
    shards, held = page['sharded_step'](grads, shards_of, every, fsdp)
    gathers = 2 * m if fsdp else 1  # FSDP: forward and backward
    exchanges = m if every else 1
    for i in range(k):
        expected = 4 * ((k - 1) * shard[i] * exchanges
                        + (n - shard[i]) * gathers)
        assert page['received'][i] == expected
    assert held == 4 * (shard[0] if every else n)
    whole = page['large_batch_gradient'](k * m * 8)
    gradient = np.concatenate([page['to_numpy'](s) for s in shards])
    np.testing.assert_allclose(gradient, whole, rtol=0, atol=1e-6)
