"""MXNet's spawn_ranks (chapter_multi_gpu/process-groups.md): a parameter server instead of a group.

Each scenario runs in a fresh Python process that leads its own process
group under a hard deadline (the harness of test_process_groups.py), so a
hang fails the test and kills everything the scenario started. The workers
live in a small module written next to the scenario, as a reader's workers
live in d2l: spawned processes must be able to import them.
"""
import os
import pathlib
import sys
import textwrap
import time

import pytest

from conftest import (exposed, listening_addresses, needs_mxnet,
                      process_tree)
from test_process_groups import (RESULT, finish, result_of, scenario_env,
                                 start)

pytestmark = [needs_mxnet, pytest.mark.skipif(
    not pathlib.Path('/proc/self/net/tcp').exists(), reason='Linux /proc')]

WORKERS = '''
import os, signal, time
import numpy
from mxnet import np
import mxnet as mx

LENGTHS = (1, 7, 1000003)  # 1000003 is above MXNet's bound for big arrays

def push_sums(rank, world_size):
    """Push (rank + 1) * arange(n) under one key per length; pull the sums."""
    kv = mx.kv.create('dist_sync')
    pulled = []
    for key, n in enumerate(LENGTHS):
        kv.init(key, np.zeros(n))
        kv.push(key, np.arange(n, dtype='float32') * (rank + 1))
        out = np.zeros(n)
        kv.pull(key, out=out)
        expected = numpy.arange(n, dtype='float32') * sum(
            r + 1 for r in range(world_size))
        pulled.append(float(numpy.abs(out.asnumpy() - expected).max()))
    return {'rank': kv.rank, 'num_workers': kv.num_workers,
            'largest_error': pulled,
            'scheduler_port': int(os.environ['DMLC_PS_ROOT_PORT'])}

def raise_on_rank_1(rank, world_size, marker_dir):
    """Rank 1 raises after joining the store; rank 0 then waits forever."""
    kv = mx.kv.create('dist_sync')
    open(os.path.join(marker_dir, f'pid{rank}'), 'w').write(str(os.getpid()))
    if rank == 1:
        raise ValueError('rank 1 cannot go on')
    kv.init(0, np.zeros(3))
    kv.push(0, np.ones(3))
    out = np.zeros(3)
    kv.pull(0, out=out)  # never returns: rank 1 pushes nothing
    out.wait_to_read()

def raise_in_process_group(rank, world_size, marker_dir):
    """Rank 1 raises inside process_group while rank 0 waits in a pull."""
    from d2l import mxnet as d2l
    with d2l.process_group(rank, world_size) as device:
        if rank == 1:
            raise OSError('rank 1 cannot read its data')
        kv = d2l._STORES[-1]
        kv.init(0, np.zeros(3))
        kv.push(0, np.ones(3))
        out = np.zeros(3)
        open(os.path.join(marker_dir, 'waits'), 'w').write(repr(time.time()))
        kv.pull(0, out=out)  # never returns: rank 1 pushes nothing
        out.wait_to_read()

def stuck_before_exchange(rank, world_size, timeout_s, marker_dir, how):
    """Rank 1 sleeps, alive, after joining; rank 0 waits in a pushpull or
    at the store's barrier."""
    from d2l import mxnet as d2l
    with d2l.process_group(rank, world_size, timeout_s=timeout_s):
        open(os.path.join(marker_dir, f'pid{rank}'), 'w').write(
            str(os.getpid()))
        kv, x = d2l._STORES[-1], np.ones(3)
        kv.init(0, np.zeros(3))  # both ranks: the store's barrier
        if rank == 1:
            time.sleep(300)
        open(os.path.join(marker_dir, 'waits'), 'w').write(repr(time.time()))
        if how == 'barrier':
            kv._barrier()  # never returns: rank 1 never arrives
        kv.pushpull(0, x, out=x)  # returns at once; the wait is the read
        x.wait_to_read()  # never returns: rank 1 pushes nothing
    return 'finished'


def kill_rank_1(rank, world_size, marker_dir):
    """Rank 1 is killed by SIGKILL after joining the store."""
    kv = mx.kv.create('dist_sync')
    open(os.path.join(marker_dir, f'pid{rank}'), 'w').write(str(os.getpid()))
    if rank == 1:
        open(os.path.join(marker_dir, 'killed'), 'w').write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)

def hold_store(rank, world_size, marker_dir):
    """Join the store, say so, and wait until the test has looked."""
    kv = mx.kv.create('dist_sync')  # held: freeing it leaves the store
    open(os.path.join(marker_dir, f'ready{rank}'), 'w').close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(marker_dir, 'leave')):
        assert time.monotonic() < deadline, 'the test never looked'
        time.sleep(0.1)
    return kv.rank
'''


def run(tmp_path, body, deadline_s=240):
    """Run `body` (using d2l, ps_test_workers and report) in its own process group; return the process."""
    (tmp_path / 'ps_test_workers.py').write_text(WORKERS)
    code = textwrap.dedent(f'''
        import json, os, time
        import ps_test_workers
        from d2l import mxnet as d2l
        def report(value):
            print({RESULT!r} + json.dumps(value), flush=True)
        ''') + textwrap.dedent(body)
    env = dict(scenario_env(), PYTHONPATH=f'{scenario_env()["PYTHONPATH"]}'
               f'{os.pathsep}{tmp_path}')
    return start([sys.executable, '-c', code], env=env)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_one_two_and_three_workers_pull_the_exact_sum_of_their_pushes(
        tmp_path):
    proc = run(tmp_path, '''
        report([d2l.spawn_ranks(ps_test_workers.push_sums, k)
                for k in (1, 2, 3)])
        ''')
    runs = result_of(*finish(proc, 300), proc)
    for k, ranks in zip((1, 2, 3), runs):
        # ps-lite numbers workers by their ports; spawn_ranks orders those.
        assert [r['rank'] for r in ranks] == list(range(k))
        assert all(r['num_workers'] == k for r in ranks)
        assert all(r['largest_error'] == [0.0, 0.0, 0.0] for r in ranks)
    # The scheduler's port is one the system never hands out by itself, so
    # no ps-lite node (they bind port 0) can take it before the scheduler.
    highest = int(pathlib.Path('/proc/sys/net/ipv4/ip_local_port_range')
                  .read_text().split()[1])
    assert all(r['scheduler_port'] > highest for ranks in runs
               for r in ranks), runs


def test_a_worker_that_raises_reaches_the_parent_with_its_rank_and_message(
        tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    proc = run(tmp_path, f'''
        try:
            d2l.spawn_ranks(ps_test_workers.raise_on_rank_1, 2,
                            {str(markers)!r})
            report('no error')
        except RuntimeError as err:
            report(str(err))
        ''')
    message = result_of(*finish(proc, 180), proc)
    assert message.startswith('rank 1 of 2 failed'), message[:2000]
    assert 'ValueError: rank 1 cannot go on' in message
    pids = [int((markers / f'pid{r}').read_text()) for r in (0, 1)]
    assert not any(alive(pid) for pid in pids)


def test_a_worker_that_raises_inside_process_group_ends_the_run_within_seconds(
        tmp_path):
    """Its store, freed on the way out, waits for the other worker forever;
    its written error is enough to end the run."""
    from d2l import mxnet as d2l
    markers = tmp_path / 'markers'
    markers.mkdir()
    proc = run(tmp_path, f'''
        import multiprocessing
        try:
            d2l.spawn_ranks(ps_test_workers.raise_in_process_group, 2,
                            {str(markers)!r})
            message = 'no error'
        except RuntimeError as err:
            message = str(err)
        report([message, time.time(), len(multiprocessing.active_children())])
        ''')
    message, ended, children = result_of(*finish(proc, 120), proc)
    assert message.startswith('rank 1 of 2 failed'), message[:2000]
    assert 'OSError: rank 1 cannot read its data' in message
    waits = float((markers / 'waits').read_text())
    assert ended - waits < d2l.FAILED_GRACE_S + 10
    assert children == 0


def test_a_killed_worker_ends_the_run_within_seconds_leaving_no_process(
        tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    proc = run(tmp_path, f'''
        import multiprocessing
        try:
            d2l.spawn_ranks(ps_test_workers.kill_rank_1, 2, {str(markers)!r})
            message = 'no error'
        except RuntimeError as err:
            message = str(err)
        ended = time.time()
        report([message, ended, len(multiprocessing.active_children())])
        ''')
    message, ended, children = result_of(*finish(proc, 180), proc)
    assert message.startswith('rank 1 of 2 died (signal SIGKILL)'), \
        message[:2000]
    killed = float((markers / 'killed').read_text())
    assert ended - killed < 10  # seconds from the kill to the error
    assert children == 0  # no worker, scheduler or server outlived the call
    pids = [int((markers / f'pid{r}').read_text()) for r in (0, 1)]
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize('how, what', [('pushpull', 'pushpull (key 0)'),
                                       ('barrier', 'barrier')])
def test_a_worker_stuck_before_an_exchange_is_named_when_its_peer_times_out(
        tmp_path, how, what):
    """ps-lite waits for good; process_group's timeout_s bounds the wait."""
    markers = tmp_path / 'markers'
    markers.mkdir()
    timeout_s = 5
    proc = run(tmp_path, f'''
        import multiprocessing
        try:
            d2l.spawn_ranks(ps_test_workers.stuck_before_exchange, 2,
                            {timeout_s}, {str(markers)!r}, {how!r})
            message = 'no error'
        except RuntimeError as err:
            message = str(err)
        report([message, time.time(), len(multiprocessing.active_children())])
        ''')
    message, ended, children = result_of(*finish(proc, 120), proc)
    assert message.startswith('rank 1 of 2 did not arrive: still running, '
                              'without an error, when rank 0 gave up waiting '
                              'for it'), message[:2000]
    assert 'TimeoutError: rank 0 timed out: it waited 5 s in a dist_sync ' \
        f'{what} for the other workers' in message, message[-1000:]
    waited = ended - float((markers / 'waits').read_text())
    assert waited < timeout_s + 10
    assert children == 0  # no worker, scheduler or server outlived the call
    pids = [int((markers / f'pid{r}').read_text()) for r in (0, 1)]
    assert not any(alive(pid) for pid in pids)


def test_scheduler_server_and_workers_listen_on_loopback_only(tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    proc = run(tmp_path, f'''
        report(d2l.spawn_ranks(ps_test_workers.hold_store, 2,
                               {str(markers)!r}))
        ''')
    try:
        deadline = time.monotonic() + 180
        while not all((markers / f'ready{r}').exists() for r in (0, 1)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, 'the workers never met'
            time.sleep(0.1)
        tree = process_tree(proc.pid)
        listeners = listening_addresses(tree)
    finally:
        (markers / 'leave').write_text('')
    assert result_of(*finish(proc, 120), proc) == [0, 1]
    # scheduler, server and two workers each listen
    assert len(listeners) >= 4, listeners
    beyond = exposed(listeners)
    assert beyond == [], f'listening beyond loopback: {beyond}'


def test_two_workers_through_dist_sync_take_one_process_s_sgd_steps(tmp_path):
    proc = run(tmp_path, '''
        import numpy as np
        ranks = d2l.spawn_ranks(d2l.ddp_sgd_steps, 2, 'env://', 3, 16, 0.1)
        alone = d2l.sgd_steps_one_process(3, 32, 0.1)
        start = d2l.sgd_steps_one_process(0, 16, 0.1)
        report([float(np.abs(alone - start).max()),
                float(np.abs(ranks[0] - ranks[1]).max()),
                float(np.abs(ranks[0] - alone).max())])
        ''')
    moved, between, off = result_of(*finish(proc, 240), proc)
    assert moved > 1e-3  # the steps changed the weights
    assert between == 0.0  # both workers pulled the same weights
    assert off < 1e-6  # the same steps as one process, up to rounding


def test_a_checkpoint_and_a_model_in_two_parts_keep_the_one_process_result(
        tmp_path):
    proc = run(tmp_path, f'''
        import numpy as np
        path = os.path.join({str(tmp_path)!r}, 'checkpoint')
        saved = d2l.spawn_ranks(d2l.checkpoint_demo, 2, 'env://', path)
        parts = d2l.spawn_ranks(d2l.model_parallel_ddp_steps, 2, 'env://', 3,
                                16, 0.1)
        alone = d2l.sgd_steps_one_process(3, 32, 0.1)
        report([[float(np.abs(r['after'] - saved[0]['trained']).max())
                 for r in saved],
                [float(np.abs(r['before'] - saved[0]['trained']).max())
                 for r in saved],
                [float(np.abs(r['parameters'] - alone).max()) for r in parts]])
        ''')
    loaded, fresh, split = result_of(*finish(proc, 240), proc)
    assert loaded == [0.0, 0.0]  # every rank loads rank 0's weights exactly
    assert min(fresh) > 1e-3  # and they differ from a fresh model's
    assert max(split) < 1e-6  # two parts compute what one process does


def test_a_trainer_s_first_step_waits_for_the_backward_pass_and_its_broadcast(
        monkeypatch):
    """The launchers appendix: a dist_sync trainer's first step broadcasts
    rank 0's parameters; the first exchange of gradients must not overtake
    that pull. Every trainer's first step waits before and after it."""
    from d2l import mxnet as d2l
    from mxnet import autograd, gluon, np, npx
    assert gluon.Trainer._init_params.waits  # installed when d2l is imported
    events, waitall = [], npx.waitall

    def recorded_wait():
        events.append('wait')
        waitall()
    monkeypatch.setattr(npx, 'waitall', recorded_wait)
    d2l._waiting_init_params(lambda trainer: events.append('init'))(None)
    assert events == ['wait', 'init', 'wait']
    net = gluon.nn.Dense(2)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 1},
                            kvstore='local')
    for step in range(2):
        events.clear()
        with autograd.record():
            loss = net(np.ones((3, 4))).sum()
        loss.backward()
        trainer.step(3)
        assert events == (['wait', 'wait'] if step == 0 else [])
