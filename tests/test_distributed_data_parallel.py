"""Tests of the claims of chapter_multi_gpu/distributed-data-parallel.md (sec_ddp).

Every multi-process scenario runs in a fresh Python process that is the
leader of its own process group, under a hard deadline: if a scenario hangs,
the whole group (the scenario and every worker it spawned) is killed and the
test fails, so no test can block the suite or leave processes behind.
MXNet has no multi-process wrapper; its tab is prose only.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULT = 'RESULT '  # prefix of the line on which a scenario reports


@pytest.fixture
def ddp(d2l, framework):
    """The d2l module of a framework that has a multi-process wrapper."""
    if framework == 'mxnet':
        pytest.skip('MXNet has no multi-process data-parallel wrapper '
                    '(the section describes KVStore and Horovod in prose)')
    return d2l


def scenario_env():
    """Environment for scenario processes: the book's d2l, quick data, quiet C++ logs."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), D2L_QUICK='1',
               GLOG_minloglevel='2')
    return env


def start(args, **kwargs):
    """Start a command as the leader of a new process group."""
    return subprocess.Popen(args, cwd=kwargs.pop('cwd', ROOT),
                            env=kwargs.pop('env', scenario_env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kwargs)


def finish(proc, deadline_s):
    """Wait for `proc` at most `deadline_s`; kill its whole process group in any case."""
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f'scenario still running after {deadline_s} s and was '
                    f'killed; its stderr ended with:\n{err[-3000:]}')
    finally:
        try:  # workers that outlived their parent go too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return out, err


def result_of(out, err, proc):
    """The JSON a scenario printed after RESULT; fail with its stderr if there is none."""
    lines = [l for l in out.splitlines() if l.startswith(RESULT)]
    assert proc.returncode == 0 and lines, (
        f'scenario failed with exit code {proc.returncode}:\n{err[-4000:]}')
    return json.loads(lines[-1][len(RESULT):])


def run_scenario(framework, body, deadline_s=240):
    """Run `body` (Python using `d2l`, ending with report(value)) in its own process group."""
    module = {'pytorch': 'torch', 'paddle': 'paddle'}[framework]
    code = (f'import json, os, sys, tempfile, time\n'
            f'import numpy as np\n'
            f'from d2l import {module} as d2l\n'
            f'def report(value):\n'
            f'    print({RESULT!r} + json.dumps(value), flush=True)\n'
            + textwrap.dedent(body))
    proc = start([sys.executable, '-c', code])
    out, err = finish(proc, deadline_s)
    return result_of(out, err, proc)


# ---- Fast checks of the helpers: no processes are started. ----

def test_free_port_gives_a_bindable_port(ddp, framework):
    if framework == 'paddle':
        pytest.skip('paddle.distributed.spawn picks its own ports')
    import socket
    port = ddp.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(('127.0.0.1', port))  # nothing holds it
    assert ddp.local_init_method().startswith('tcp://127.0.0.1:')


def test_backend_is_gloo_without_gpus_and_nccl_only_for_cuda(ddp, framework):
    if framework == 'pytorch':
        import torch
        import torch.distributed as dist
        assert ddp.ddp_backend(torch.device('cpu')) == 'gloo'
        assert ddp.ddp_backend(torch.device('cuda', 0)) == (
            'nccl' if dist.is_nccl_available() else 'gloo')
        expected = 'cuda' if ddp.num_gpus() >= 2 else 'cpu'
        assert ddp.ddp_device(1, 2).type == expected
    else:
        import paddle
        expected = 'nccl' if paddle.device.is_compiled_with_cuda() and \
            ddp.num_gpus() >= 2 else 'gloo'
        assert ddp.ddp_backend(2) == expected
        with pytest.raises(ValueError, match='world_size'):
            ddp.ddp_backend(0)


def test_uneven_global_batch_is_rejected_with_a_suggestion(ddp):
    assert ddp.local_batch_size(512, 2) == 256
    assert ddp.local_batch_size(6, 6) == 1
    with pytest.raises(ValueError, match='multiple of 3, such as 99 or 102'):
        ddp.local_batch_size(100, 3)
    with pytest.raises(ValueError, match='multiple of 4, such as 4 or 8'):
        ddp.local_batch_size(2, 4)


def test_bad_ranks_and_missing_launcher_are_named(ddp, framework, monkeypatch):
    if framework == 'pytorch':
        with pytest.raises(ValueError, match='rank must lie in 0..1'):
            ddp.check_rank(2, 2)
        with pytest.raises(ValueError, match='world_size must be at least 1'):
            ddp.check_rank(0, 0)
        with pytest.raises(TypeError, match='local_rank must be an int'):
            ddp.ddp_device('0', 2)
        for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE'):
            monkeypatch.delenv(name, raising=False)
        with pytest.raises(RuntimeError, match='start this script with torchrun'):
            ddp.launcher_ranks()
    else:
        monkeypatch.delenv('PADDLE_TRAINER_ID', raising=False)
        with pytest.raises(RuntimeError, match='paddle.distributed.spawn'):
            with ddp.process_group():
                pass


def test_launcher_scripts_exist_where_the_book_says(ddp, framework):
    path = pathlib.Path(ddp.ddp_script_path())
    assert path.parent == ROOT / 'chapter_multi_gpu'
    assert path.name == ('ddp_train.py' if framework == 'pytorch'
                         else 'ddp_train_paddle.py')
    assert 'train_ddp' in path.read_text()


# ---- Two real processes talking through Gloo on the CPU. ----

@pytest.mark.slow
def test_two_process_parameters_equal_one_process_on_concatenated_batches(
        ddp, framework):
    num_steps, batch_size, lr = 4, 16, 0.1
    if framework == 'pytorch':
        call = ('d2l.spawn_ranks(d2l.ddp_sgd_steps, 2, d2l.local_init_method(),'
                f' {num_steps}, {batch_size}, {lr})')
    else:
        call = (f'd2l.spawn_ranks(d2l.ddp_sgd_steps, 2, {num_steps}, '
                f'{batch_size}, {lr}, backend="gloo")')
    ranks = run_scenario(framework, f"""
        ranks = {call}
        report([r.tolist() for r in ranks])
        """)
    ranks = [np.array(r) for r in ranks]
    alone = ddp.sgd_steps_one_process(num_steps, 2 * batch_size, lr)
    start = ddp.flat_parameters(ddp.small_mlp(seed=0))
    assert np.abs(alone - start).max() > 1e-3  # the steps really moved
    assert np.array_equal(ranks[0], ranks[1])  # identical copies
    assert np.abs(ranks[0] - alone).max() < 1e-5  # same as one big batch


@pytest.mark.slow
def test_model_split_over_two_devices_trains_like_one_process(ddp, framework):
    num_steps, batch_size, lr = 3, 16, 0.1
    if framework == 'pytorch':
        call = ('d2l.spawn_ranks(d2l.model_parallel_ddp_steps, 2, '
                f'd2l.local_init_method(), {num_steps}, {batch_size}, {lr})')
    else:
        call = ('d2l.spawn_ranks(d2l.model_parallel_ddp_steps, 2, '
                f'{num_steps}, {batch_size}, {lr}, backend="gloo")')
    ranks = run_scenario(framework, f"""
        ranks = {call}
        report([[r['devices'], r['parameters'].tolist()] for r in ranks])
        """)
    alone = ddp.sgd_steps_one_process(num_steps, 2 * batch_size, lr)
    for devices, params in ranks:
        assert len(devices) == 2
        assert np.abs(np.array(params) - alone).max() < 1e-5


@pytest.mark.slow
def test_checkpoint_saved_on_rank_0_loads_identically_on_every_rank(
        ddp, framework):
    if framework == 'pytorch':
        call = ("d2l.spawn_ranks(d2l.checkpoint_demo, 2, "
                "'file://' + os.path.join(folder, 'rendezvous'), "
                "os.path.join(folder, 'checkpoint.pt'))")
    else:
        call = ("d2l.spawn_ranks(d2l.checkpoint_demo, 2, "
                "os.path.join(folder, 'checkpoint.pdparams'), backend='gloo')")
    ranks = run_scenario(framework, f"""
        with tempfile.TemporaryDirectory() as folder:
            ranks = {call}
        report([{{k: v.tolist() for k, v in r.items()}} for r in ranks])
        """)
    trained = np.array(ranks[0]['trained'])
    for seen in ranks:
        assert np.array_equal(np.array(seen['trained']), trained)
        assert np.abs(np.array(seen['before']) - trained).max() > 1e-2
        assert np.array_equal(np.array(seen['after']), trained)


@pytest.mark.slow
def test_late_rank_makes_the_other_wait_and_a_rank_that_left_makes_it_fail(
        ddp, framework):
    delay_s, timeout_s = 0.8, 10.0
    if framework == 'pytorch':
        ranks = run_scenario(framework, f"""
            report(d2l.spawn_ranks(d2l.skew_demo, 2, d2l.local_init_method(),
                                   {delay_s}, {timeout_s}))
            """, deadline_s=180)
        rank0 = ranks[0]
        assert 'Connection closed by peer' in rank0['error'] or \
            'Timed out' in rank0['error']
        assert rank0['rank 1 gone'] < timeout_s + 1  # bounded, not a hang
    else:
        result = run_scenario(framework, f"""
            with tempfile.TemporaryDirectory() as folder:
                try:
                    d2l.spawn_ranks(d2l.skew_demo, 2, {delay_s}, folder,
                                    backend='gloo')
                    failure = None
                except Exception as err:
                    failure = str(err)
                ended = time.time()
                ranks = [json.load(open(os.path.join(folder, f'rank{{r}}.json')))
                         for r in range(2)]
            report({{'failure': failure, 'ended': ended, 'ranks': ranks}})
            """, deadline_s=180)
        rank0 = result['ranks'][0]
        assert result['failure'] and 'Process 0 terminated' in result['failure']
        assert result['ended'] - rank0['last step began at'] < 30
    assert rank0['rank 1 late'] >= delay_s - 0.05  # rank 0 waited for rank 1
    assert rank0['all on time'] < delay_s / 2


@pytest.mark.slow
def test_rank_stuck_longer_than_the_timeout_makes_the_other_raise(ddp,
                                                                  framework):
    if framework == 'paddle':
        pytest.skip("paddle's Gloo group has no timeout setting")
    message, seconds = run_scenario(framework, """
        began = time.perf_counter()
        try:
            d2l.spawn_ranks(d2l.skew_demo, 2, d2l.local_init_method(), 100.0, 2.0)
            report(['no error', time.perf_counter() - began])
        except Exception as err:
            report([str(err), time.perf_counter() - began])
        """, deadline_s=150)
    assert 'Timed out waiting 2000ms' in message
    # Rank 1 sleeps for 100 s; the group gave up long before that.
    assert seconds < 60


@pytest.mark.slow
def test_two_groups_started_back_to_back_do_not_collide(ddp, framework):
    if framework == 'pytorch':
        body = """
            init_method = d2l.local_init_method()
            d2l.spawn_ranks(d2l.ddp_sgd_steps, 2, init_method, 1, 8, 0.1)
            report(init_method)
            """
    else:
        body = """
            d2l.spawn_ranks(d2l.ddp_sgd_steps, 2, 1, 8, 0.1, backend='gloo')
            report('ok')
            """
    module = {'pytorch': 'torch', 'paddle': 'paddle'}[framework]
    code = (f'import json\nfrom d2l import {module} as d2l\n'
            f'def report(value):\n'
            f'    print({RESULT!r} + json.dumps(value), flush=True)\n'
            + textwrap.dedent(body))
    # The second group starts while the first is still forming.
    first = start([sys.executable, '-c', code])
    second = start([sys.executable, '-c', code])
    results = [result_of(*finish(p, 240), p) for p in (first, second)]
    if framework == 'pytorch':
        assert results[0] != results[1]  # two groups, two ports


@pytest.mark.slow
def test_ddp_timing_functions_return_seconds_per_step(ddp, framework):
    if framework == 'paddle':
        pytest.skip('the DataParallel-vs-DDP measurement is PyTorch only')
    result = run_scenario(framework, """
        import functools
        small = functools.partial(d2l.small_mlp, 0)
        report([d2l.time_data_parallel(2, 32, 2, model_fn=small),
                d2l.time_ddp(2, 32, 2, model_fn=small)])
        """)
    dp_s, ddp_s = result
    assert 0 < dp_s < 5 and 0 < ddp_s < 5
    with pytest.raises(ValueError, match='multiple of 2'):
        ddp.time_ddp(2, 33, 1)
    with pytest.raises(ValueError, match='num_devices'):
        ddp.time_data_parallel(0, 32, 1)


@pytest.mark.slow
def test_script_trains_unchanged_under_the_framework_launcher(ddp, framework,
                                                              tmp_path):
    script = ddp.ddp_script_path()
    if framework == 'pytorch':
        args = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                '--nproc_per_node=2', script]
    else:
        args = [sys.executable, '-m', 'paddle.distributed.launch',
                '--nproc_per_node', '2', '--log_dir', str(tmp_path), script]
    proc = start(args + ['--epochs', '1', '--batch-size', '512', '--lr', '0.2'],
                 cwd=tmp_path)
    out, err = finish(proc, 420)
    logs = ''.join(p.read_text() for p in tmp_path.glob('workerlog.*'))
    assert proc.returncode == 0, (err + logs)[-4000:]
    text = out + logs
    assert '2 processes, backend gloo' in text or \
        '2 processes, backend nccl' in text
    assert 'test accuracy' in text


def test_mxnet_local_kvstore_sums_what_the_contexts_push(framework):
    if framework != 'mxnet':
        pytest.skip('the KVStore example is the MXNet tab')
    import mxnet as mx
    kv = mx.kv.create('local')
    kv.init('w', mx.nd.zeros(3))
    kv.push('w', [mx.nd.ones(3, ctx=mx.cpu(0)),
                  2 * mx.nd.ones(3, ctx=mx.cpu(1))])
    sums = [mx.nd.zeros(3, ctx=mx.cpu(0)), mx.nd.zeros(3, ctx=mx.cpu(1))]
    kv.pull('w', out=sums)
    for s in sums:
        assert s.asnumpy().tolist() == [3.0, 3.0, 3.0]
    assert (kv.rank, kv.num_workers) == (0, 1)
