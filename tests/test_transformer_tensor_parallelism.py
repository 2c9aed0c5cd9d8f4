"""The claims of chapter_multi_gpu/transformer-tensor-parallelism.md, checked in every framework.

The ranks start with the book's spawn_ranks in a child Python under a hard
deadline (the harness of test_process_groups.py), so a hang fails the test.
"""
import sys
import textwrap

import numpy as np
import pytest

from test_process_groups import RESULT, finish, result_of, scenario_env, start
from test_tensor_parallelism import MODULES, RENDEZVOUS

TOL = 1e-5
H, HEADS, B, S = 32, 4, 2, 8  # width, heads, sequences, tokens
_results = {}


def two_ranks(framework, deadline=240):
    """The results by rank of tp_block_worker on two ranks, from a child Python."""
    if framework in _results:
        return _results[framework]
    script = textwrap.dedent(f'''
        import json
        from d2l import {MODULES[framework]} as d2l

        def plain(x):
            if hasattr(x, 'tolist'):
                return x.tolist()
            if isinstance(x, dict):
                return {{k: plain(v) for k, v in x.items()}}
            if isinstance(x, (list, tuple)):
                return [plain(v) for v in x]
            return x

        ranks = d2l.spawn_ranks(d2l.tp_block_worker, 2, {RENDEZVOUS[framework]},
                                {H}, {HEADS}, {B}, {S})
        print({RESULT!r} + json.dumps(plain(ranks)), flush=True)
    ''')
    proc = start([sys.executable, '-c', script], env=scenario_env())
    out, err = finish(proc, deadline)
    _results[framework] = result_of(out, err, proc)
    return _results[framework]


def one_device(d2l):
    """Output, loss and gradients of the unsplit block, in this process."""
    X, Y = [x.reshape((B, S, H)) for x in d2l.mlp_data(B * S, H)]
    return d2l.mlp_pass(d2l.seeded_block(H, HEADS), X, Y)


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_two_way_head_parallel_block_equals_one_device(d2l, framework):
    ranks = two_ranks(framework)
    reference = one_device(d2l)
    for r in ranks:  # every rank ends with the whole output and input grad
        np.testing.assert_allclose(r['Z'], reference['Z'], atol=TOL)
        assert abs(r['loss'] - reference['loss']) < TOL
        np.testing.assert_allclose(r['dX'], reference['dX'], atol=TOL)
    axes = ranks[0]['axes']
    assert axes[:4] == [None] * 4  # the layer norms stay whole
    grads = d2l.gather_shards([dict(r, grads=[np.asarray(g) for g in
                                              r['grads']]) for r in ranks])
    order = d2l.head_order(H, HEADS, 2)
    for i, (g, e) in enumerate(zip(grads, reference['grads'])):
        if i in (4, 5):  # the fused projection's columns, in head_order
            e = np.take(e, order, axis=axes[i])
        np.testing.assert_allclose(g, e, atol=TOL)


@pytest.mark.slow
def test_each_direction_moves_two_block_activations(framework):
    sent = two_ranks(framework)[0]['sent']
    assert sent['forward'] == sent['backward'] == 2 * 4 * B * S * H


def test_head_order_gives_each_rank_its_heads_queries_keys_values(d2l):
    order = d2l.head_order(8, 4, 2)
    assert order.tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19,
                              4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]
    assert d2l.head_order(8, 4, 1).tolist() == list(range(24))


def test_a_head_count_that_k_does_not_divide_is_refused(d2l):
    with pytest.raises(ValueError, match='num_heads=4 heads cannot be split '
                       'over k=3 ranks'):
        d2l.head_order(64, 4, 3)
    with pytest.raises(ValueError, match='num_heads=3 must divide h=64'):
        d2l.head_order(64, 3, 1)
