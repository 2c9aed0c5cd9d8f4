"""The claims of chapter_multi_gpu/overlap.md, checked in every framework.

The page's buckets, workers and accumulation are plain cells, not d2l
helpers. The tests define them as a notebook does, in a module `__main__`
without a file, so that d2l.spawn_ranks sends the workers to its two
processes by value. Each scenario that starts processes runs once per
framework and arguments; its tests check what the ranks returned.
"""
import contextlib
import sys
import types

import numpy as np
import pytest

from conftest import ROOT, page_definitions

PAGE = ROOT / 'chapter_multi_gpu' / 'overlap.md'
CAPS = (0, 2**16, 2**18, 2**20, 2**30)
MS, MICRO_SIZE = (1, 2, 4), 8
# the cells that define names; none of them starts processes
DEFINITIONS = ('def ', 'class ', 'ready = []', 'param_shards = ')

_PAGES, _RUNS = {}, {}


@pytest.fixture
def page(framework, quick, paddle_default_device_is_the_cpu):
    """The page's module in `framework`: its imports and defining cells,
    run once, in quick mode."""
    if framework not in _PAGES:
        main = types.ModuleType('__main__')  # a notebook's has no file
        page_definitions(PAGE, framework, DEFINITIONS, vars(main))
        _PAGES[framework] = main
    return _PAGES[framework]


@contextlib.contextmanager
def main_module(module):
    """Make `module` the main module, as a notebook's is, for a block."""
    saved = sys.modules['__main__']
    sys.modules['__main__'] = module
    try:
        yield
    finally:
        sys.modules['__main__'] = saved


def ranks(page, worker, *args):
    """What the two ranks of the page's `worker` returned for `args`."""
    key = (id(page), worker, args)
    if key not in _RUNS:
        with main_module(page):
            _RUNS[key] = page.d2l.spawn_ranks(
                getattr(page, worker), 2, page.rendezvous(), *args)
    return _RUNS[key]


@pytest.mark.parametrize('cap', [0, 1, 2**16, 2**18, 2**20, 2**30])
def test_buckets_take_every_parameter_once_from_the_last_within_the_cap(
        page, cap):
    sizes = page.sizes
    buckets = page.make_buckets(sizes, cap)
    assert [i for bucket in buckets for i in bucket] == \
        list(reversed(range(len(sizes))))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) * 4 <= cap
    for first, second in zip(buckets, buckets[1:]):  # no room was left
        assert sum(sizes[i] for i in first + second[:1]) * 4 > cap


def test_make_buckets_refuses_a_negative_cap(page):
    with pytest.raises(ValueError, match='cap_bytes'):
        page.make_buckets([3, 4], -1)


def test_gradients_are_finished_from_the_last_layer_to_the_first(
        framework, page):
    if framework == 'mxnet':
        pytest.skip('MXNet has no gradient hooks')
    names = [name for name, _ in page.mlp(seed=0).named_parameters()]
    assert page.ready == names[::-1]


@pytest.mark.slow
@pytest.mark.parametrize('cap', CAPS)
def test_bucketed_allreduce_equals_plain_allreduce_after_backward(page, cap):
    by_rank = ranks(page, 'compare_exchanges', CAPS, 16)
    num_buckets = len(page.make_buckets(page.sizes, cap))
    whole = page.large_batch_gradient(32)  # both ranks' shards
    first = by_rank[0][CAPS.index(cap)][0]
    for results in by_rank:
        bucketed, plain, calls = results[CAPS.index(cap)]
        assert calls == num_buckets
        np.testing.assert_array_equal(bucketed, plain)  # the same sums
        np.testing.assert_array_equal(bucketed, first)
        # the mean of two shards' gradients is the whole batch's, rounded
        np.testing.assert_allclose(bucketed, whole, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_timed_pass_makes_one_allreduce_per_bucket(page):
    caps = (None, 0, 2**20)  # None: no exchange
    for timed in ranks(page, 'time_caps', caps, 2, 1, 16):
        for cap in caps:
            seconds, calls = timed[cap]
            assert seconds > 0
            assert calls == (0 if cap is None else
                             len(page.make_buckets(page.sizes, cap)))


@pytest.mark.slow
@pytest.mark.parametrize('m', MS)
def test_m_micro_batches_with_one_exchange_equal_the_large_batch(page, m):
    by_rank = ranks(page, 'accumulated_gradients', MS, MICRO_SIZE)
    whole = page.large_batch_gradient(2 * m * MICRO_SIZE)
    num_buckets = len(page.make_buckets(page.sizes, 2**20))
    for results in by_rank:
        grad, calls = results[MS.index(m)]
        assert calls == num_buckets  # one exchange, not m
        # float32 sums of the same terms in another order
        np.testing.assert_allclose(grad, whole, rtol=0, atol=1e-6)
    assert np.abs(whole).max() > 1e-2  # a gradient worth comparing


def test_summed_loss_over_all_examples_normalises_unequal_micro_batches(
        page):
    sizes, accumulate = (40, 24), page.accumulate
    whole = page.large_batch_gradient(64)
    total = accumulate(page.mlp(seed=0), sizes, lambda j: 1 / sum(sizes))
    means = accumulate(page.mlp(seed=0), sizes,
                       lambda j: 1 / sizes[j] / len(sizes))
    np.testing.assert_allclose(total, whole, rtol=0, atol=1e-6)
    assert np.abs(means - whole).max() > 1e-3


def test_batch_norm_makes_micro_batches_differ_from_the_large_batch(page):
    grads = [page.accumulate(page.mlp(seed=0, norm=page.batch_norm),
                             micro_sizes, lambda j: 1 / 64)
             for micro_sizes in ((64,), (16,) * 4)]
    assert np.abs(grads[1] - grads[0]).max() > 1e-3


@pytest.mark.parametrize('fsdp', [False, True])
@pytest.mark.parametrize('every', [True, False])
def test_sharded_accumulation_moves_and_holds_the_bytes_of_its_choice(
        page, fsdp, every):
    grads, shards_of = page.grads, page.param_shards
    m, k = len(grads), len(grads[0])
    n = sum(page.sizes)
    shard = [n // k + (i < n % k) for i in range(k)]
    page.received.clear()
    shards, held = page.sharded_step(grads, shards_of, every, fsdp)
    gathers = 2 * m if fsdp else 1  # FSDP: forward and backward
    exchanges = m if every else 1
    for i in range(k):
        expected = 4 * ((k - 1) * shard[i] * exchanges
                        + (n - shard[i]) * gathers)
        assert page.received[i] == expected
    assert held == 4 * (shard[0] if every else n)
    whole = page.large_batch_gradient(k * m * MICRO_SIZE)
    gathered = page.d2l.all_gather(shards)[0]  # the summed gradient
    whole = page.d2l.tensor(whole, page.devices[0])
    assert float(abs(gathered - whole).max()) < 1e-6
