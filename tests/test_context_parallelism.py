"""The claims of chapter_multi_gpu/context-parallelism.md, checked in every framework.

The page's own code is run: its cells define the attention functions, the
exchanges and the worker, and the ranks start with the book's spawn_ranks in
a child Python under a hard deadline (the harness of test_process_groups.py).
"""
import numpy as np
import pytest

from conftest import ROOT, numpy, page_definitions
from test_tensor_parallelism import RENDEZVOUS, child_result

PAGE = ROOT / 'chapter_multi_gpu' / 'context-parallelism.md'
DEFINITIONS = ('def attention(', 'class ContextExchange', 'class _Shift',
               'def layout', 'def ring_attention', 'def cp_worker',
               'def one_device', 'def check_cp_worker',
               'def ulysses_attention')
TOL = 2e-6


def inputs(s=32, heads=4, seed=0):
    """Queries, keys, values and output gradients, as NumPy arrays."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, heads, s, 8)).astype('float32')
            for _ in range(4)]


def test_blocks_of_keys_merged_by_the_online_softmax_equal_full_attention(
        d2l, framework):
    page = page_definitions(PAGE, framework, ('def attention(',))
    Q, K, V = [d2l.tensor(x) for x in inputs()[:3]]
    for causal in (False, True):
        blocks = [page['attention_block'](Q, K, V, causal)]  # one block
        if not causal:  # four blocks of keys, merged in turn
            blocks = [page['attention_block'](Q, K_j, V_j) for K_j, V_j in
                      zip(page['chunk'](K, 4, 2), page['chunk'](V, 4, 2))]
        result = None
        for block in blocks:
            result = page['merge'](result, block)
        O, _, l = result
        np.testing.assert_allclose(
            numpy(framework, O / l),
            numpy(framework, page['attention'](Q, K, V, causal)), atol=TOL)


def runs(framework, shared_results):
    """Every run the tests check, in one child Python once per test session:
    {name: ranks}."""
    return shared_results(f'cp-{framework}', lambda: child_result(
        framework, f'''
            from test_context_parallelism import inputs
            data = inputs()
            three_heads = [x[:, :3] for x in data]
            out = {{}}
            for causal in (False, True):
                out[causal] = page['one_device'](data, causal)
                for scheme in ('ring', 'zigzag', 'ulysses'):
                    if not (causal and scheme == 'ring'):
                        out[scheme, causal] = d2l.spawn_ranks(
                            page['cp_worker'], 2, {RENDEZVOUS[framework]},
                            data, scheme, causal)
            out['alone'] = {{repr(causal): d2l.spawn_ranks(
                page['cp_worker'], 1, {RENDEZVOUS[framework]}, data, 'ring',
                causal) for causal in (False, True)}}
            out['balance'] = {{scheme: d2l.spawn_ranks(
                page['cp_worker'], 2, {RENDEZVOUS[framework]}, data, scheme,
                True, False) for scheme in ('ring', 'zigzag')}}
            try:
                d2l.spawn_ranks(page['cp_worker'], 2, {RENDEZVOUS[framework]},
                                three_heads, 'ulysses', False)
            except RuntimeError as error:
                out['three heads'] = str(error)
            out['refused'] = []
            for k, seq in ((3, data), (2, [x[:, :, :30] for x in data])):
                try:  # checked before any process starts
                    d2l.spawn_ranks(page['cp_worker'], k,
                                    {RENDEZVOUS[framework]}, seq, 'zigzag',
                                    False)
                except ValueError as error:
                    out['refused'].append(str(error))
            out = {{repr(key): value for key, value in out.items()}}
            ''', 300, PAGE, DEFINITIONS))


@pytest.mark.slow
@pytest.mark.parametrize('scheme, causal', [
    ('ring', False), ('zigzag', False), ('zigzag', True),
    ('ulysses', False), ('ulysses', True)])
def test_two_ranks_give_one_device_s_output_and_gradients(
        framework, scheme, causal, shared_results):
    result = runs(framework, shared_results)
    reference = [np.asarray(x) for x in result[repr(causal)]]
    ranks = result[repr((scheme, causal))]
    seen = sorted(p for r in ranks for p in r['positions'])
    assert seen == list(range(32))  # every token on exactly one rank
    for r in ranks:
        for got, want in zip([r['O']] + r['grads'], reference):
            np.testing.assert_allclose(np.asarray(got),
                                       want[:, :, r['positions']], atol=TOL)


@pytest.mark.slow
@pytest.mark.parametrize('causal', [False, True])
def test_the_worker_alone_is_one_device_and_sends_nothing(
        framework, causal, shared_results):
    result = runs(framework, shared_results)
    (alone,) = result[repr('alone')][repr(causal)]
    assert alone['positions'] == list(range(32)) and alone['sent'] == {}
    for got, want in zip([alone['O']] + alone['grads'], result[repr(causal)]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                                   atol=TOL)


@pytest.mark.slow
def test_under_a_causal_mask_two_chunks_a_rank_even_out_the_work(
        framework, shared_results):
    balance = runs(framework, shared_results)[repr('balance')]
    plain = [sum(r['pairs']) for r in balance['ring']]
    zigzag = [sum(r['pairs']) for r in balance['zigzag']]
    # two ranks: chunks of 16 tokens, 1 and 2 blocks of 16 x 16 (the first
    # causal); chunks of 8, 0 and 3 (1 + 4 blocks) and 1 and 2 (2 + 3)
    assert plain == [256, 512]
    assert zigzag == [320, 320]


@pytest.mark.slow
def test_ulysses_refuses_heads_that_the_ranks_do_not_divide(
        framework, shared_results):
    message = runs(framework, shared_results)[repr('three heads')]
    assert 'num_heads=3 heads cannot be split over k=2 ranks' in message


@pytest.mark.slow
def test_the_bytes_sent_are_the_formula_s(framework, shared_results):
    sent = {key: runs(framework, shared_results)[repr(key)][0]['sent']
            for key in (('zigzag', False), ('ulysses', False))}
    array = 2 * 4 * 16 * 8 * 4  # a rank's (b, a, s/k, d) float32 array
    # forward and backward; MXNet sends every slot, PaddlePaddle's all-to-all
    # is an all-gather
    ring_factor = {'mxnet': 2}.get(framework, 1)
    a2a_factor = {'mxnet': 4, 'paddle': 2}.get(framework, 1)
    assert sent[('zigzag', False)]['ring'] == ring_factor * 2 * 2 * array
    assert sent[('ulysses', False)]['all-to-all'] == (
        a2a_factor * 2 * 4 * array // 2)


@pytest.mark.slow
def test_a_sequence_the_chunks_do_not_divide_is_refused_before_any_process(
        framework, shared_results):
    refused = runs(framework, shared_results)[repr('refused')]
    assert refused == [
        's=32 tokens cannot be cut into 6 equal chunks for 3 ranks; use an s '
        'that 6 divides',
        's=30 tokens cannot be cut into 4 equal chunks for 2 ranks; use an s '
        'that 4 divides']


@pytest.mark.slow
def test_a_ring_shift_passes_a_transposed_array_whole(framework):
    """send and recv need contiguous arrays; the shift makes them so."""
    if framework == 'mxnet':
        pytest.skip("MXNet's shift sums slotted arrays through the store")
    ranks = child_result(framework, f'''
        import numpy
        ContextExchange = page['ContextExchange']  # the page: not picklable

        def worker(rank, world_size, init_method):
            with d2l.process_group(rank, world_size, init_method):
                x = numpy.arange(6, dtype='float32').reshape(2, 3) + 10 * rank
                return ContextExchange().shift(d2l.tensor(x).T)
        out = d2l.spawn_ranks(worker, 2, {RENDEZVOUS[framework]})
        ''', 120, PAGE, DEFINITIONS)
    for rank, got in enumerate(ranks):  # the other rank's array, transposed
        want = np.arange(6).reshape(2, 3) + 10 * (1 - rank)
        np.testing.assert_array_equal(np.asarray(got), want.T)
