"""The claims of chapter_multi_gpu/transformer-tensor-parallelism.md, checked in every framework.

The ranks start with the book's spawn_ranks in a child Python under a hard
deadline (the harness of test_process_groups.py), so a hang fails the test.
"""

import numpy as np
import pytest

from conftest import ROOT, page_definitions
from test_tensor_parallelism import RENDEZVOUS, child_result

TOL = 1e-5
H, HEADS, B, S = 32, 4, 2, 8  # width, heads, sequences, tokens
PAGE = ROOT / 'chapter_multi_gpu' / 'transformer-tensor-parallelism.md'


def two_ranks(framework, shared_results):
    """{split: results by rank} of tp_block_worker on two ranks, tensor and
    sequence parallel, from one child Python once per test session."""
    return shared_results(f'transformer-tp-{framework}', lambda: child_result(
        framework, f'''
            out = {{split: d2l.spawn_ranks(
                d2l.tp_block_worker, 2, {RENDEZVOUS[framework]}, {H}, {HEADS},
                {B}, {S}, split == 'sequence')
                for split in ('tensor', 'sequence')}}
            '''))


def one_device(d2l):
    """Output, loss and gradients of the unsplit block, in this process."""
    X, Y = [x.reshape((B, S, H)) for x in d2l.mlp_data(B * S, H)]
    return d2l.mlp_pass(d2l.seeded_block(H, HEADS), X, Y)


def assert_equals_one_device(d2l, ranks, sequence):
    """The ranks' pieces put together are the unsplit block's results."""
    reference, k = one_device(d2l), len(ranks) if sequence else 1
    Z, dX = [np.concatenate([np.asarray(r[key]) for r in ranks], 1)
             if sequence else np.asarray(ranks[0][key]) for key in ('Z', 'dX')]
    np.testing.assert_allclose(Z, reference['Z'], atol=TOL)
    np.testing.assert_allclose(dX / k, reference['dX'], atol=TOL)
    assert abs(np.mean([r['loss'] for r in ranks]) - reference['loss']) < TOL
    assert ranks[0]['axes'][:4] == [None] * 4  # the layer norms stay whole
    grads = d2l.gather_shards([dict(r, grads=[np.asarray(g) for g in
                                              r['grads']]) for r in ranks])
    assert len(grads) == len(reference['grads'])
    for g, e in zip(grads, reference['grads']):
        np.testing.assert_allclose(g / k, e, atol=TOL)


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_two_way_head_parallel_block_equals_one_device(d2l, framework,
                                                       shared_results):
    ranks = two_ranks(framework, shared_results)['tensor']
    assert_equals_one_device(d2l, ranks, False)


@pytest.mark.slow
def test_two_way_sequence_parallel_block_equals_one_device(d2l, framework,
                                                           shared_results):
    ranks = two_ranks(framework, shared_results)['sequence']
    assert_equals_one_device(d2l, ranks, True)


@pytest.mark.slow
def test_each_direction_moves_two_block_activations(framework, shared_results):
    sent = two_ranks(framework, shared_results)['tensor'][0]['sent']
    assert sent['forward'] == sent['backward'] == 2 * 4 * B * S * H


@pytest.mark.slow
def test_sequence_parallelism_hands_twice_the_bytes_to_half_size_exchanges(
        framework, shared_results):
    sent = two_ranks(framework, shared_results)['sequence'][0]['sent']
    # two all-gathers and two reduce-scatters each way, whole activations;
    # a ring sends (k - 1) / k of each, an allreduce twice that
    assert sent['forward'] == sent['backward'] == 4 * 4 * B * S * H
    assert sent['whole'] == 4 * 6 * H  # two norms' scales and shifts, 2 biases


@pytest.mark.slow
def test_sequence_parallelism_keeps_fewer_activation_bytes(framework,
                                                           shared_results):
    runs = two_ranks(framework, shared_results)
    kept = {split: [r['kept'] for r in ranks] for split, ranks in runs.items()}
    assert all(0 < s < t for s, t in zip(kept['sequence'], kept['tensor']))


def test_a_head_count_that_k_does_not_divide_is_refused_before_any_process(d2l):
    with pytest.raises(ValueError, match='num_heads=4 heads cannot be split '
                       'over k=3 ranks'):
        d2l.spawn_ranks(d2l.tp_block_worker, 3, None, 64, 4, 2, 6)


def test_tokens_that_k_does_not_divide_are_refused_for_sequence_parallelism(
        d2l):
    with pytest.raises(ValueError, match='s=7 tokens cannot be split evenly '
                       'over 2 ranks'):
        d2l.spawn_ranks(d2l.tp_block_worker, 2, None, 64, 4, 2, 7, True)
    d2l.check_tp_block_worker(2, None, 64, 4, 2, 7)  # fine without sequence


@pytest.mark.slow
@pytest.mark.parametrize('sequence', [False, True], ids=['tensor', 'sequence'])
def test_pytorch_parallelize_module_on_the_block_equals_one_device(sequence):
    from d2l import torch as d2l
    ranks = child_result('pytorch', f'''
        out = d2l.spawn_ranks(
            page['parallelize_block_demo'], 2, d2l.local_init_method(), {H},
            {HEADS}, {B}, {S}, {sequence})
        ''', page=PAGE, definitions=('def parallelize_block_demo',))
    assert_equals_one_device(d2l, ranks, sequence)


def test_a_shared_seed_sliced_reproduces_the_unsplit_dropout_mask(framework):
    page = page_definitions(PAGE, framework, ('def dropout_mask',))
    whole = page['dropout_mask']((B, S, H), 0.5, 1)
    for rank in range(2):
        tokens = slice(rank * S // 2, (rank + 1) * S // 2)
        sliced = page['dropout_mask']((B, S, H), 0.5, 1)[:, tokens]
        own = page['dropout_mask']((B, S // 2, H), 0.5, 2 + rank)
        assert (sliced == whole[:, tokens]).all()
        assert 0.3 < (own == whole[:, tokens]).mean() < 0.7
