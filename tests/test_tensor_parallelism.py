"""The claims of chapter_multi_gpu/tensor-parallelism.md, checked in every framework.

Each check starts the ranks with the book's spawn_ranks (Gloo processes in
PyTorch and PaddlePaddle, dist_sync workers beside a parameter server in
MXNet) in a child Python under a hard deadline, so that a hang fails the
test instead of blocking the suite (the harness of test_process_groups.py).
"""
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT
from test_process_groups import RESULT, finish, result_of, scenario_env, start

TOL = 1e-5
MODULES = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
RENDEZVOUS = {'pytorch': 'd2l.local_init_method()', 'paddle': "'env://'",
              'mxnet': 'None'}


# (worker, world size, arguments) of every run the tests check, per framework
RUNS = {'k=1': ('tp_mlp_worker', 1, (8, 64, 6)),
        'k=2, uneven 32+31': ('tp_mlp_worker', 2, (8, 63, 6)),
        'wrong': ('_tp_wrong_worker', 2, (8, 16))}
# The child scripts' conversion of their results to JSON: arrays to lists.
PLAIN = textwrap.dedent('''
    def plain(x):
        if hasattr(x, 'tolist'):
            return x.tolist()
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x
    ''')


def child_result(framework, body, deadline=240, page=None, definitions=()):
    """Run `body`, which sets `out`, in a child Python with `d2l` (and the
    `definitions` of `page` in `page`) under `deadline`; `out`, via JSON."""
    if page is None:
        head = f'''
            import json, numpy
            from d2l import {MODULES[framework]} as d2l
            '''
    else:
        head = f'''
            import json, pathlib, sys
            sys.path.insert(0, {str(ROOT / 'tests')!r})
            from conftest import page_definitions
            page = page_definitions(pathlib.Path({str(page)!r}), {framework!r},
                                    {tuple(definitions)!r})
            d2l = page['d2l']
            '''
    script = (textwrap.dedent(head) + PLAIN + textwrap.dedent(body)
              + f'print({RESULT!r} + json.dumps(plain(out)), flush=True)\n')
    proc = start([sys.executable, '-c', script], env=scenario_env())
    out, err = finish(proc, deadline)
    return result_of(out, err, proc)


def runs(framework, shared_results):
    """The results by rank of every run in RUNS, started from one child Python
    once per test session."""
    return shared_results(f'tp-mlp-{framework}', lambda: child_result(
        framework, f'''
            out = {{name: d2l.spawn_ranks(getattr(d2l, worker), k,
                                          {RENDEZVOUS[framework]}, *args)
                   for name, (worker, k, args) in {RUNS!r}.items()}}
            '''))


def one_device(d2l, d, hidden, batch_size):
    """Output, loss and gradients of the unsplit block, in this process."""
    return d2l.mlp_pass(d2l.block_mlp(d, hidden), *d2l.mlp_data(batch_size, d))


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
@pytest.mark.parametrize('run', ['k=1', 'k=2, uneven 32+31'])
def test_k_way_tensor_parallel_block_equals_one_device(d2l, framework, run,
                                                       shared_results):
    _, k, (d, hidden, batch_size) = RUNS[run]
    ranks = runs(framework, shared_results)[run]
    reference = one_device(d2l, d, hidden, batch_size)
    for r in ranks:  # every rank ends with the whole output and input grad
        np.testing.assert_allclose(r['Z'], reference['Z'], atol=TOL)
        assert abs(r['loss'] - reference['loss']) < TOL
        np.testing.assert_allclose(r['dX'], reference['dX'], atol=TOL)
    columns = [np.asarray(r['grads'][0]).shape[r['axes'][0]] for r in ranks]
    assert columns == d2l.shard_sizes(hidden, k)
    grads = d2l.gather_shards([dict(r, grads=[np.asarray(g) for g in
                                              r['grads']]) for r in ranks])
    for g, e in zip(grads, reference['grads']):
        np.testing.assert_allclose(g, e, atol=TOL)
    forward = 4 * batch_size * d if k > 1 else 0
    sent = ranks[0]['sent']
    assert sent.get('forward', 0) == sent.get('backward', 0) == forward


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_a_wrong_arrangement_is_an_error_on_every_rank(framework,
                                                      shared_results):
    ranks = runs(framework, shared_results)['wrong']
    for errors in ranks:
        assert len(errors) == 3
        assert 'rank 1 builds RowParallelLinear(16, 8) where rank 0 builds ' \
            'ColumnParallelLinear(8, 16)' in errors[0]
        assert "RowParallelLinear expects this rank's 8 hidden units, got 16" \
            in errors[1]
        assert 'from other weights than rank 0' in errors[2]


def test_bad_sizes_are_named(d2l):
    with pytest.raises(ValueError, match='hidden must be a positive integer'):
        d2l.block_mlp(4, 0)
    with pytest.raises(ValueError, match='batch_size must be a positive'):
        d2l.mlp_data(0, 4)
