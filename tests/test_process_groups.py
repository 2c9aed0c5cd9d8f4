"""Tests of the claims of chapter_multi_gpu/process-groups.md (sec_process_groups).

Every multi-process scenario runs in a fresh Python process that is the
leader of its own process group, under a hard deadline: if a scenario hangs,
the whole group (the scenario and every worker it spawned) is killed and the
test fails, so no test can block the suite or leave processes behind.
MXNet has no process groups: its spawn_ranks (a parameter server) is tested
in tests/test_parameter_server.py, its launcher helpers at the end of this file.
The harness here (`ddp`, `run_scenario`, ...) also serves
tests/test_distributed_data_parallel.py.
"""
import json
import os
import pathlib
import signal
import subprocess
import shutil
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

from conftest import (FRAMEWORKS, exposed, listening_addresses,
                      needs_mxnet, process_tree, watch_listeners)

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULT = 'RESULT '  # prefix of the line on which a scenario reports


@pytest.fixture
def ddp(d2l, framework):
    """The d2l module of a framework that has a multi-process wrapper."""
    if framework == 'mxnet':
        pytest.skip('MXNet has no process groups; its parameter server is '
                    'tested in test_parameter_server.py')
    return d2l


def scenario_env():
    """Environment for scenario processes: the book's d2l, quick data, quiet C++ logs."""
    # PaddlePaddle's launcher takes random ports from 35100 to 64000 after
    # a bind test; under -n the kernel can hand one of them to another
    # test's connection meanwhile (Linux's ephemeral range is 32768 to
    # 60999). Below that range only launchers pick ports.
    env = dict(os.environ, PYTHONPATH=str(ROOT), D2L_QUICK='1',
               GLOG_minloglevel='2', PORT_RANGE='20000:32000')
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
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
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


def test_backend_is_gloo_without_gpus_and_nccl_only_for_gpus(ddp, framework):
    if framework == 'pytorch':
        import torch
        import torch.distributed as dist
        assert ddp.ddp_backend(torch.device('cpu')) == 'gloo'
        assert ddp.ddp_backend(torch.device('cuda', 0)) == (
            'nccl' if dist.is_nccl_available() else 'gloo')
        expected = 'cuda' if ddp.num_gpus() >= 2 else 'cpu'
        assert ddp.ddp_device(1, 2).type == expected
    else:
        assert ddp.ddp_backend('cpu') == 'gloo'
        assert ddp.ddp_backend('gpu:1') == 'nccl'
        if ddp.num_gpus() < 2:
            assert ddp.ddp_device(1, 2) == 'cpu'


@pytest.mark.parametrize('env, gpus, cuda_build, expected', [
    # paddle.distributed.launch on GPUs: FLAGS_selected_gpus, no backend variable
    ({'FLAGS_selected_gpus': '3'}, 8, True, 'gpu:3'),
    ({'FLAGS_selected_gpus': '1'}, 2, True, 'gpu:1'),
    # no launcher variable: the local rank picks a GPU if every rank gets one
    ({}, 2, True, 'gpu:1'),
    ({}, 1, True, 'cpu'),
    # the launcher on a CPU build, or spawn with backend='gloo'
    ({'PADDLE_DISTRI_BACKEND': 'gloo'}, 2, True, 'cpu'),
    ({'FLAGS_selected_gpus': '1'}, 0, False, 'cpu'),
])
def test_paddle_rank_uses_the_gpu_its_launcher_gave_it(framework, monkeypatch,
                                                       env, gpus, cuda_build,
                                                       expected):
    if framework != 'paddle':
        pytest.skip('the launcher variables are PaddlePaddle\'s')
    import paddle
    from d2l import paddle as d2l
    for name in ('FLAGS_selected_gpus', 'PADDLE_DISTRI_BACKEND'):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(d2l, 'num_gpus', lambda: gpus)
    monkeypatch.setattr(paddle.device, 'is_compiled_with_cuda',
                        lambda: cuda_build)
    device = d2l.ddp_device(1, 2)
    assert device == expected
    assert d2l.ddp_backend(device) == ('nccl' if expected != 'cpu' else 'gloo')


def test_bad_ranks_and_missing_launcher_are_named(ddp, framework, monkeypatch):
    with pytest.raises(ValueError, match='local_rank must lie in 0..1'):
        ddp.ddp_device(2, 2)
    with pytest.raises(ValueError, match='world_size must be at least 1'):
        ddp.ddp_device(0, 0)
    with pytest.raises(ValueError, match='local_rank must be an integer'):
        ddp.ddp_device('0', 2)
    with pytest.raises(ValueError, match='local_world_size must be at least'):
        ddp.ddp_device(0, 0)
    with pytest.raises(ValueError, match='world_size must be an integer'):
        with ddp.process_group(0, True):
            pass
    with pytest.raises(ValueError, match='rank must lie in 0..1'):
        with ddp.process_group(2, 2):
            pass
    with pytest.raises(ValueError, match='timeout_s must be a positive'):
        with ddp.process_group(0, 1, timeout_s=-1):
            pass
    with pytest.raises(ValueError, match='timeout_s'):
        with ddp.process_group(0, 1, timeout_s='10'):
            pass
    names = {'pytorch': ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE'),
             'paddle': ('PADDLE_TRAINER_ID', 'PADDLE_TRAINERS_NUM')}[framework]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match='start this script with'):
        ddp.launcher_ranks()
    if framework == 'paddle':
        with pytest.raises(RuntimeError, match='paddle.distributed.spawn'):
            with ddp.process_group(0, 1):
                pass


def test_ranks_given_as_numpy_integers_are_accepted(ddp):
    ddp.check_rank(np.int64(1), np.int32(2))
    ddp.check_rank(1, 2, 'local_rank')
    with pytest.raises(ValueError, match='rank must be an integer'):
        ddp.check_rank(np.float64(1), 2)


LAUNCHER_ENV = {
    'pytorch': {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1',
                'LOCAL_WORLD_SIZE': '2'},
    'paddle': {'PADDLE_TRAINER_ID': '1', 'PADDLE_TRAINERS_NUM': '2',
               'PADDLE_LOCAL_RANK': '1', 'PADDLE_LOCAL_SIZE': '2'},
}


@pytest.mark.parametrize('which, value, expected', [
    (0, 'abc', "{name}='abc' must be an integer of at least 0"),
    (1, '0', "{name}='0' must be an integer of at least 1"),
    (1, '2.5', "{name}='2.5' must be an integer"),
    (2, '-1', "{name}='-1' must be an integer of at least 0"),
    (3, '0', "{name}='0' must be an integer of at least 1"),
    (0, '2', 'rank must lie in 0..1 for a world_size of 2, got 2'),
    (2, '2', 'local_rank must lie in 0..1 for a local_world_size of 2'),
], ids=['rank abc', 'world size 0', 'world size 2.5', 'local rank -1',
        'local world size 0', 'rank too large', 'local rank too large'])
def test_a_bad_launcher_variable_is_named_with_its_value_and_the_fix(
        ddp, framework, monkeypatch, which, value, expected):
    env = dict(LAUNCHER_ENV[framework])
    name = list(env)[which]
    env[name] = value
    for key, setting in env.items():
        monkeypatch.setenv(key, setting)
    with pytest.raises(ValueError) as raised:
        ddp.launcher_ranks()
    assert expected.format(name=name) in str(raised.value)
    if expected.startswith('{name}'):
        assert "framework's launcher, which sets it" in str(raised.value)


@pytest.mark.parametrize('name, value', [
    ('PADDLE_TRAINERS_NUM', '0'), ('PADDLE_TRAINER_ID', 'abc'),
    ('PADDLE_LOCAL_SIZE', '0'), ('PADDLE_LOCAL_RANK', 'x')])
def test_paddle_group_names_a_bad_variable_before_joining(
        framework, monkeypatch, name, value):
    if framework != 'paddle':
        pytest.skip("PaddlePaddle's group reads its ranks from the environment")
    from d2l import paddle as d2l
    env = {'PADDLE_TRAINER_ID': '0', 'PADDLE_TRAINERS_NUM': '1', name: value}
    for key, setting in env.items():
        monkeypatch.setenv(key, setting)
    with pytest.raises(ValueError, match=f"{name}='{value}' must be an integer"):
        with d2l.process_group(0, 1):
            pass


def test_spawn_ranks_rejects_bad_input_before_starting_anything(
        ddp, monkeypatch, tmp_path):
    # as in a script, whose main module has a file (pytest-xdist's has none,
    # and code without a file travels by value, lambdas included)
    import types
    main = types.ModuleType('__main__')
    main.__file__ = str(tmp_path / 'script.py')
    (tmp_path / 'script.py').write_text('import d2l\n')
    monkeypatch.setitem(sys.modules, '__main__', main)
    with pytest.raises(ValueError, match='world_size must be at least 1'):
        ddp.spawn_ranks(ddp.all_reduce_demo, 0)
    with pytest.raises(ValueError, match='world_size must be an integer'):
        ddp.spawn_ranks(ddp.all_reduce_demo, 2.0)
    with pytest.raises(ValueError, match='silence_s must be a positive'):
        ddp.spawn_ranks(ddp.all_reduce_demo, 2, silence_s=0)
    with pytest.raises(TypeError, match='worker must be a function'):
        ddp.spawn_ranks('all_reduce_demo', 2)
    # A script's lambda cannot be found by name in a new process.
    with pytest.raises(ValueError, match='worker cannot be sent'):
        ddp.spawn_ranks(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match='args cannot be sent'):
        ddp.spawn_ranks(ddp.all_reduce_demo, 2, lambda: 0)
    with pytest.raises(ValueError, match='framework must be'):
        ddp.ddp_script_path('jax')


def test_a_notebook_s_worker_without_cloudpickle_is_refused_with_the_fix(
        ddp, monkeypatch):
    import types
    main = types.ModuleType('__main__')  # an interactive session has no file
    monkeypatch.setitem(sys.modules, '__main__', main)
    monkeypatch.setitem(sys.modules, 'cloudpickle', None)  # not installed

    def worker(rank, world_size):
        return rank
    worker.__module__ = '__main__'
    with pytest.raises(ValueError, match=r'pip install cloudpickle'):
        ddp.spawn_ranks(worker, 2)


def test_both_flavours_share_one_api():
    import inspect
    from d2l import paddle as d2l_paddle
    from d2l import torch as d2l_torch
    flavours = [d2l_torch, d2l_paddle]
    if 'mxnet' in FRAMEWORKS:
        from d2l import mxnet as d2l_mxnet
        flavours.append(d2l_mxnet)
    for name in ('ddp_device', 'ddp_backend', 'process_group', 'launcher_ranks',
                 'launcher_deadline', 'ddp_script_path'):
        sigs = [inspect.signature(getattr(m, name)) for m in flavours]
        assert len(set(map(str, sigs))) == 1, (name, sigs)
    # Paddle's spawn_ranks adds only the backend, which there the parent picks.
    torch_params = list(inspect.signature(d2l_torch.spawn_ranks).parameters)
    paddle_params = list(inspect.signature(d2l_paddle.spawn_ranks).parameters)
    assert paddle_params == torch_params + ['backend']


def test_checks_are_written_once_and_the_first_worker_is_public(ddp):
    for name in ('check_rank', '_check_timeout', '_check_worker'):
        assert getattr(ddp, name).__module__ == 'd2l.runtime', name
    assert callable(ddp.all_reduce_demo)  # what the page's processes run


def test_launcher_scripts_exist_where_the_book_says(ddp, framework):
    path = pathlib.Path(ddp.ddp_script_path())
    assert path.parent == ROOT / 'chapter_multi_gpu'
    assert path.name == ('ddp_train.py' if framework == 'pytorch'
                         else 'ddp_train_paddle.py')
    assert 'train_ddp' in path.read_text()


def test_launcher_script_is_found_in_an_unzipped_notebook_folder(ddp,
                                                                 framework,
                                                                 tmp_path):
    """Notebooks unzipped elsewhere, with d2l/ and each chapter's scripts beside them."""
    import shutil
    name = 'ddp_train.py' if framework == 'pytorch' else 'ddp_train_paddle.py'
    shutil.copytree(ROOT / 'd2l', tmp_path / 'd2l')
    (tmp_path / 'chapter_multi_gpu').mkdir()
    shutil.copy(ROOT / 'chapter_multi_gpu' / name, tmp_path / 'chapter_multi_gpu')
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
    code = f'from d2l import {module} as d2l; print(d2l.ddp_script_path())'
    for cwd in (tmp_path, tmp_path / 'chapter_multi_gpu'):
        found = subprocess.run(
            [sys.executable, '-c', code], cwd=cwd, capture_output=True,
            text=True, timeout=120,
            env=dict(scenario_env(), PYTHONPATH=str(tmp_path)))
        assert found.returncode == 0, found.stderr[-2000:]
        assert found.stdout.strip() == str(tmp_path / 'chapter_multi_gpu' / name)


# ---- Two real processes talking through Gloo on the CPU. ----


@pytest.mark.slow
def test_first_group_sums_over_two_separate_processes(ddp, framework):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    ranks = run_scenario(framework, f"""
        ranks = d2l.spawn_ranks(d2l.all_reduce_demo, 2, {init})
        report([ranks, os.getpid()])
        """)
    ranks, parent = ranks
    assert [r['rank'] for r in ranks] == [0, 1]
    assert [r['sum'] for r in ranks] == [3.0, 3.0]  # 1 + 2 on every rank
    assert len({r['pid'] for r in ranks} | {parent}) == 3
    assert {r['backend'] for r in ranks} <= {'gloo', 'nccl'}


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
            d2l.spawn_ranks(d2l.ddp_sgd_steps, 2, 'env://', 1, 8, 0.1,
                            backend='gloo')
            report('ok')
            """
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
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


# ---- Faults: a failing rank, an interrupted parent (issue #11). ----


WORKERS = '''
import time


def fail_on_rank_0(rank, world_size, init_method, framework):
    """Rank 0 raises inside the group while rank 1 keeps exchanging gradients."""
    if framework == 'pytorch':
        import torch
        from d2l import torch as d2l
        dist = d2l.dist
        ones = torch.ones
    else:
        import paddle
        from d2l import paddle as d2l
        dist = d2l.dist
        ones = lambda n: paddle.ones([n])
    with d2l.process_group(rank, world_size, init_method):
        dist.barrier()
        if rank == 0:
            raise ValueError('rank 0 broke on purpose')
        x = ones(1)
        for _ in range(200):
            dist.all_reduce(x)
            time.sleep(0.01)
    return 'finished'


def cpu_threads_in_group(rank, world_size, init_method, framework):
    """Threads this rank computes with inside a CPU group: PyTorch's setting, or the pool threads a Paddle convolution starts plus one."""
    import os
    if framework == 'pytorch':
        import torch
        from d2l import torch as d2l
        with d2l.process_group(rank, world_size, init_method):
            return torch.get_num_threads()
    import paddle
    from d2l import paddle as d2l
    with d2l.process_group(rank, world_size, init_method):
        before = len(os.listdir('/proc/self/task'))
        x, w = paddle.rand([8, 16, 28, 28]), paddle.rand([16, 16, 3, 3])
        paddle.nn.functional.conv2d(x, w, padding=1).numpy()
        return len(os.listdir('/proc/self/task')) - before + 1


def sleep_and_write(rank, world_size, seconds, marker_dir):
    """Leave a file with this process's id, then sleep."""
    import os
    with open(os.path.join(marker_dir, f'pid{rank}'), 'w') as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return rank


def wait_for(condition, what, seconds=120):
    """Poll `condition` until it holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f'no {what} after {seconds} s')
        time.sleep(0.02)


def write(path, text):
    """Write `text` to `path` in one step, so that readers never see half."""
    import os
    with open(path + '.part', 'w') as f:
        f.write(text)
    os.replace(path + '.part', path)


def stop_rank_1(rank, world_size, marker_dir):
    """Rank 1 stops itself with SIGSTOP; rank 0 waits long for it."""
    import os
    import signal
    write(os.path.join(marker_dir, f'pid{rank}'), str(os.getpid()))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(300)
    return rank


def killed_after_peer_reported(rank, world_size, marker_dir, framework):
    """Rank 0 writes down a lost connection; rank 1 then dies by SIGKILL before rank 0 ends."""
    import os
    import signal
    d2l = __import__(f"d2l.{'torch' if framework == 'pytorch' else 'paddle'}",
                     fromlist=['d2l'])
    reported = os.path.join(marker_dir, 'reported')
    write(os.path.join(marker_dir, f'pid{rank}'), str(os.getpid()))
    if rank == 1:
        wait_for(lambda: os.path.exists(reported), 'report of rank 0')
        os.kill(os.getpid(), signal.SIGKILL)
    try:  # what rank 0 would see once rank 1 is gone, written down first
        raise ConnectionResetError(104, 'Connection reset by peer')
    except ConnectionResetError:
        d2l._record_rank_failure(rank)
        write(reported, 'yes')
        pid1 = os.path.join(marker_dir, 'pid1')
        wait_for(lambda: os.path.exists(pid1), 'rank 1')
        wait_for(lambda: not alive(int(open(pid1).read())), 'death of rank 1')
        raise


def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[-1][0] != 'Z'
    except FileNotFoundError:
        return False


def hold_group(rank, world_size, init_method, framework, marker_dir):
    """Join a group, report this process's id, and stay until told to leave."""
    import os
    d2l = __import__(f"d2l.{'torch' if framework == 'pytorch' else 'paddle'}",
                     fromlist=['d2l'])
    with d2l.process_group(rank, world_size, init_method):
        d2l.dist.barrier()
        seen = {'pid': os.getpid(),
                'gloo': os.environ.get('GLOO_SOCKET_IFNAME'),
                'endpoints': os.environ.get('PADDLE_TRAINER_ENDPOINTS')}
        write(os.path.join(marker_dir, f'ready{rank}'), str(os.getpid()))
        wait_for(lambda: os.path.exists(os.path.join(marker_dir, 'leave')),
                 'word to leave')
        d2l.dist.barrier()
    return seen


def flavour(framework):
    """The d2l module of `framework`, imported in this process."""
    import importlib
    return importlib.import_module('d2l.' + {
        'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework])


def error_then_hang(rank, world_size, framework, marker_dir):
    """Rank 1 writes down its error and then hangs on its way out (as MXNet's
    store does when freed); rank 0 waits long for it."""
    import os
    if rank == 1:
        try:
            raise OSError('rank 1 cannot read its data')
        except OSError:
            flavour(framework)._record_rank_failure(rank)
        write(os.path.join(marker_dir, 'reported'), repr(time.time()))
    time.sleep(300)


def exit_in_group(rank, world_size, init_method, framework):
    """Rank 1 ends its process without a Python error, inside the group,
    while rank 0 keeps exchanging."""
    import os
    d2l = flavour(framework)
    with d2l.process_group(rank, world_size, init_method):
        d2l.dist.barrier()
        if rank == 1:
            os._exit(3)
        for _ in range(200):
            d2l.dist.all_reduce(d2l.tensor([1.0]))
            time.sleep(0.01)
    return 'finished'


def stuck_before_collective(rank, world_size, init_method, framework,
                            timeout_s, marker_dir):
    """Rank 1 sleeps, alive, before an all-reduce that rank 0 enters."""
    import os
    d2l = flavour(framework)
    with d2l.process_group(rank, world_size, init_method, timeout_s):
        d2l.dist.barrier()
        if rank == 1:
            time.sleep(300)
        write(os.path.join(marker_dir, 'waits'), repr(time.time()))
        d2l.dist.all_reduce(d2l.tensor([1.0]))
    return 'finished'


def group_timeout(rank, world_size, init_method, framework):
    """The timeout this rank's group got without one from process_group."""
    d2l = flavour(framework)
    with d2l.process_group(rank, world_size, init_method):
        seen = {'default': d2l._PROCESS['group_timeout_s']}
        if framework == 'pytorch':
            backend = d2l.dist.group.WORLD._get_backend(d2l.torch.device('cpu'))
            seen['gloo'] = backend.options._timeout.total_seconds()
        return seen
'''


def workers_env(tmp_path):
    """Scenario environment in which `import ddp_test_workers` finds WORKERS."""
    (tmp_path / 'ddp_test_workers.py').write_text(WORKERS)
    return dict(scenario_env(), PYTHONPATH=f'{ROOT}{os.pathsep}{tmp_path}')


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason='needs two cores')
@pytest.mark.skipif(not pathlib.Path('/proc/self/task').is_dir(), reason='Linux only')
def test_ranks_on_the_cpu_share_its_cores_instead_of_each_taking_all(
        ddp, framework, tmp_path):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
    code = textwrap.dedent(f'''
        import json
        import ddp_test_workers
        from d2l import {module} as d2l
        if __name__ == '__main__':
            threads = d2l.spawn_ranks(ddp_test_workers.cpu_threads_in_group, 2,
                                      {init}, {framework!r})
            print({RESULT!r} + json.dumps(threads), flush=True)
    ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    out, err = finish(proc, 240)
    assert result_of(out, err, proc) == [os.cpu_count() // 2] * 2


@pytest.mark.slow
def test_the_failing_rank_s_own_error_reaches_the_parent(ddp, framework,
                                                         tmp_path):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
    code = textwrap.dedent(f'''
        import json
        import ddp_test_workers
        from d2l import {module} as d2l
        if __name__ == '__main__':
            messages = []
            for attempt in range(3):  # the echo used to win about half the time
                try:
                    d2l.spawn_ranks(ddp_test_workers.fail_on_rank_0, 2, {init},
                                    {framework!r})
                    messages.append('no error')
                except RuntimeError as err:
                    messages.append(str(err))
            print({RESULT!r} + json.dumps(messages), flush=True)
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    messages = result_of(*finish(proc, 300), proc)
    for message in messages:
        assert message.startswith('rank 0 of 2 failed'), message[:2000]
        assert 'ValueError: rank 0 broke on purpose' in message


def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[-1][0] != 'Z'
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM],
                         ids=['SIGINT', 'SIGTERM'])
def test_interrupting_the_parent_stops_every_rank_and_removes_the_folder(
        machinery_framework, tmp_path, signum):
    module = {'pytorch': 'torch', 'paddle': 'paddle',
              'mxnet': 'mxnet'}[machinery_framework]
    markers = tmp_path / 'markers'
    markers.mkdir()
    # spawn_ranks's temporary folder goes here; a short path, as the fork
    # server's socket, also here, must be under 108 bytes
    scratch = pathlib.Path(tempfile.mkdtemp(prefix='d2l-test-'))
    code = textwrap.dedent(f'''
        import signal
        import ddp_test_workers
        from d2l import {module} as d2l
        if __name__ == '__main__':
            # As in a terminal or Jupyter, where SIGINT raises KeyboardInterrupt.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            d2l.spawn_ranks(ddp_test_workers.sleep_and_write, 2, 300,
                            {str(markers)!r})
        ''')
    env = dict(workers_env(tmp_path), TMPDIR=str(scratch))
    proc = subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(list(markers.glob('pid*'))) < 2:  # both ranks are running
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, 'the ranks never started'
            time.sleep(0.5)
        pids = [int(p.read_text()) for p in markers.glob('pid*')]
        assert list(scratch.iterdir()), 'spawn_ranks made no temporary folder'
        proc.send_signal(signum)  # to the parent only, not to its group
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail('the parent was still running 10 s after the signal')
        assert proc.returncode != 0
        time.sleep(1)
        assert not [pid for pid in pids if alive(pid)], 'orphaned ranks'
        assert not list(scratch.iterdir()), 'the results folder was left behind'
        if signum == signal.SIGINT:
            assert 'KeyboardInterrupt' in err
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in markers.glob('pid*'):
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(scratch, ignore_errors=True)


def workers_code(framework, body):
    """A program that imports WORKERS and d2l, defines report(value), and runs `body` as its main part."""
    module = {'pytorch': 'torch', 'paddle': 'paddle', 'mxnet': 'mxnet'}[framework]
    head = textwrap.dedent(f'''
        import json, os, time
        import ddp_test_workers
        from d2l import {module} as d2l
        def report(value):
            print({RESULT!r} + json.dumps(value), flush=True)
        if __name__ == '__main__':
        ''')
    return head + textwrap.indent(textwrap.dedent(body), '    ')


# ---- Faults, round two (issue #32): deadlines, blame, listeners. ----


@pytest.mark.skipif(not pathlib.Path('/proc/self/stat').exists(),
                    reason='Linux only')
def test_a_rank_killed_by_a_signal_is_blamed_not_the_peer_that_reported_a_lost_connection(
        ddp, framework, tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    code = workers_code(framework, f'''
        try:
            d2l.spawn_ranks(ddp_test_workers.killed_after_peer_reported, 2,
                            {str(markers)!r}, {framework!r})
            report('no error')
        except RuntimeError as err:
            report(str(err))
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    message = result_of(*finish(proc, 180), proc)
    # Rank 0's error was written first, but rank 1's death caused it.
    assert message.startswith('rank 1 of 2 died (signal SIGKILL)'), \
        message[:2000]


@pytest.mark.skipif(not pathlib.Path('/proc/self/stat').exists(),
                    reason='Linux only')
def test_a_stopped_rank_is_named_and_its_peers_are_not_kept_waiting(
        ddp, framework, tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    code = workers_code(framework, f'''
        try:
            d2l.spawn_ranks(ddp_test_workers.stop_rank_1, 2, {str(markers)!r},
                            silence_s=5)
            message = 'no error'
        except RuntimeError as err:
            message = str(err)
        pids = [int(open(os.path.join({str(markers)!r}, name)).read())
                for name in ('pid0', 'pid1')]
        report([message, [pid for pid in pids
                          if ddp_test_workers.alive(pid)]])
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    message, left = result_of(*finish(proc, 180), proc)
    assert message.startswith('rank 1 of 2 showed no sign of life for 5 s'), \
        message[:2000]
    assert 'silence_s' in message  # the fix
    assert left == [], 'ranks outlived spawn_ranks'


def launcher_env(framework, port):
    """Environment of rank 1 of 2 whose rank 0 should listen on 127.0.0.1:port."""
    if framework == 'pytorch':
        names = {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0',
                 'LOCAL_WORLD_SIZE': '1', 'MASTER_ADDR': '127.0.0.1',
                 'MASTER_PORT': str(port)}
    else:
        ends = f'127.0.0.1:{port},127.0.0.1:{port + 1}'
        names = {'PADDLE_TRAINER_ID': '1', 'PADDLE_TRAINERS_NUM': '2',
                 'PADDLE_TRAINER_ENDPOINTS': ends,
                 'PADDLE_CURRENT_ENDPOINT': f'127.0.0.1:{port + 1}',
                 'PADDLE_DISTRI_BACKEND': 'gloo'}
    return dict(scenario_env(), **names)


def test_launcher_script_says_what_it_waits_for_and_gives_up_at_its_timeout(
        ddp, framework, tmp_path):
    import socket
    with socket.socket() as deaf:  # accepts connections, never answers
        deaf.bind(('127.0.0.1', 0))
        deaf.listen(8)
        port = deaf.getsockname()[1]
        proc = start([sys.executable, ddp.ddp_script_path(), '--epochs', '1',
                      '--timeout', '3'], env=launcher_env(framework, port),
                     cwd=tmp_path)
        out, err = finish(proc, 150)
    address = f'127.0.0.1:{port}'
    assert proc.returncode != 0
    assert f'rank 1 waits for all 2 ranks at {address} until' in out, out
    last = err.strip().splitlines()[-1]
    assert last.startswith(f'rank 1: no group formed at {address} within 3 s'), \
        err[-3000:]
    assert 'larger timeout' in last
    assert 'Traceback' not in err and 'frame #' not in err, err[-3000:]


def test_launcher_script_states_its_timeout_in_help(ddp):
    shown = subprocess.run([sys.executable, ddp.ddp_script_path(), '--help'],
                           capture_output=True, text=True, timeout=120,
                           env=scenario_env())
    assert shown.returncode == 0, shown.stderr[-2000:]
    text = ' '.join(shown.stdout.split())
    assert '--timeout' in text and '(default: 300)' in text


def test_torchrun_gives_up_on_a_missing_machine_after_its_rendezvous_timeout(
        ddp, framework, tmp_path):
    if framework != 'pytorch':
        pytest.skip("PaddlePaddle's launcher has no such timeout (the page "
                    'says so)')
    port = ddp.free_port()
    proc = start([sys.executable, '-m', 'torch.distributed.run', '--nnodes=2',
                  '--node_rank=0', '--nproc_per_node=1', '--rdzv-conf',
                  'timeout=3', '--master_addr=127.0.0.1',
                  f'--master_port={port}', ddp.ddp_script_path()],
                 cwd=tmp_path)
    _, err = finish(proc, 150)
    assert proc.returncode != 0
    assert '1/2 clients joined' in err, err[-3000:]


@pytest.mark.skipif(not pathlib.Path('/proc/self/net/tcp').exists(),
                    reason='reads /proc/net/tcp (Linux)')
def test_a_run_on_one_machine_listens_on_loopback_only(ddp, framework,
                                                      tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    code = workers_code(framework, f'''
        report(d2l.spawn_ranks(ddp_test_workers.hold_group, 2, {init},
                               {framework!r}, {str(markers)!r}))
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    try:
        deadline = time.monotonic() + 180
        while not all((markers / f'ready{r}').exists() for r in (0, 1)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, 'the group never formed'
            time.sleep(0.1)
        listeners = listening_addresses(process_tree(proc.pid))
    finally:
        (markers / 'leave').write_text('')
    seen = result_of(*finish(proc, 120), proc)
    assert listeners, 'found no listening socket of the run'
    beyond = exposed(listeners)
    if framework == 'paddle':  # its store cannot be confined; the page says so
        store = int(seen[0]['endpoints'].split(',')[0].rsplit(':', 1)[1])
        beyond = [entry for entry in beyond if entry[1] != store]
    assert beyond == [], f'listening beyond loopback: {beyond}'
    assert [rank['gloo'] for rank in seen] == ['lo', 'lo']


def test_launcher_paragraph_shows_the_timeouts_and_says_what_is_exposed():
    page = (ROOT / 'chapter_multi_gpu' / 'process-groups.md').read_text()
    launchers = page[page.index('## Launchers and Several Machines'):
                     page.index('## Summary')]
    text = ' '.join(launchers.split())
    assert '--rdzv-conf timeout=900' in text  # torchrun's own wait
    assert text.count('--timeout 600') == 3  # each script's, in every tab
    assert 'no option to give up' in text  # PaddlePaddle's launcher
    assert 'private network' in text


def test_a_launcher_s_timeout_also_bounds_each_exchange(ddp, framework):
    if framework != 'pytorch':
        pytest.skip("PaddlePaddle's Gloo group has a fixed timeout (the script's "
                    'help says so)')
    port = ddp.free_port()
    code = textwrap.dedent(f'''
        import json, os, signal, time
        from d2l import torch as d2l
        rank = int(os.environ['RANK'])
        def watchdog_running():  # launcher_deadline's, a child process
            for entry in os.listdir('/proc'):
                try:
                    with open(f'/proc/{{entry}}/stat') as f:
                        fields = f.read().rsplit(')', 1)[1].split()
                except (OSError, IndexError):
                    continue
                if fields[1] == str(os.getpid()) and fields[0] != 'Z':
                    return True  # running, not merely waiting to be reaped
            return False
        with d2l.launcher_deadline(rank, 2, 3):
            with d2l.process_group(rank, 2) as device:
                d2l.dist.barrier()
                # The group formed, so the watchdog stands down; wait for
                # that, or it would end this rank at 3 s by itself.
                stood_down = time.monotonic() + 60
                while watchdog_running() and time.monotonic() < stood_down:
                    time.sleep(0.05)
                d2l.dist.barrier()  # both ranks past their watchdogs
                if rank == 1:  # frozen, as by a debugger or Ctrl-Z
                    os.kill(os.getpid(), signal.SIGSTOP)
                began = time.monotonic()
                try:
                    d2l.dist.all_reduce(d2l.torch.ones(1))
                    said = 'no error'
                except RuntimeError as err:
                    said = str(err)
                print({RESULT!r} + json.dumps([said, time.monotonic() - began]),
                      flush=True)
                os._exit(0)  # leave a broken group without a barrier
        ''')
    ranks = [start([sys.executable, '-c', code], env=dict(
        scenario_env(), RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port))) for rank in (0, 1)]
    try:
        said, seconds = result_of(*finish(ranks[0], 150), ranks[0])
    finally:
        os.killpg(ranks[1].pid, signal.SIGKILL)
        finish(ranks[1], 30)
    assert 'Timed out' in said or 'timed out' in said, said
    assert seconds < 60


# ---- Faults, round three (issue 43): no wait without end, the right rank. ----


def spawn_and_report(framework, call, tmp_path, deadline_s=180):
    """Run `call` (spawn_ranks over ddp_test_workers) in a scenario; return its error message (or 'no error') and when it ended."""
    code = workers_code(framework, f'''
        try:
            {call}
            message = 'no error'
        except RuntimeError as err:
            message = str(err)
        report([message, time.time()])
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    return result_of(*finish(proc, deadline_s), proc)


def test_a_rank_whose_error_is_written_fails_the_run_even_if_its_process_hangs(
        d2l, framework, tmp_path):
    markers = tmp_path / 'markers'
    markers.mkdir()
    message, ended = spawn_and_report(
        framework, f'd2l.spawn_ranks(ddp_test_workers.error_then_hang, 2, '
        f'{framework!r}, {str(markers)!r})', tmp_path)
    assert message.startswith('rank 1 of 2 failed'), message[:2000]
    assert 'OSError: rank 1 cannot read its data' in message
    reported = float((markers / 'reported').read_text())
    assert ended - reported < 10 + d2l.FAILED_GRACE_S


def test_a_rank_that_exits_without_a_python_error_is_named_not_the_peer_that_lost_it(
        ddp, framework, tmp_path):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    message, _ = spawn_and_report(
        framework, f'd2l.spawn_ranks(ddp_test_workers.exit_in_group, 2, '
        f'{init}, {framework!r})', tmp_path)
    # rank 0 wrote down 'Connection reset by peer' first: an echo
    assert message.startswith('rank 1 of 2 died (exit code 3) without a '
                              'Python error'), message[:2000]


@pytest.mark.slow
def test_a_rank_stuck_before_a_collective_is_named_when_its_peer_times_out(
        ddp, framework, tmp_path):
    # PaddlePaddle's Gloo group has a fixed timeout of 30 s
    timeout_s, given, init = ((3, 3, 'd2l.local_init_method()')
                              if framework == 'pytorch'
                              else (30, None, "'env://'"))
    markers = tmp_path / 'markers'
    markers.mkdir()
    message, ended = spawn_and_report(
        framework, f'd2l.spawn_ranks(ddp_test_workers.stuck_before_collective'
        f', 2, {init}, {framework!r}, {given}, {str(markers)!r})', tmp_path)
    assert message.startswith('rank 1 of 2 did not arrive: still running, '
                              'without an error, when rank 0 gave up waiting '
                              'for it'), message[:2000]
    # what rank 0 said, as context: Gloo's own words
    assert 'rank 0 of 2 failed' in message
    assert 'Timed out' in message or 'TIMEOUT' in message, message[-500:]
    waited = ended - float((markers / 'waits').read_text())
    assert waited < timeout_s + 10


def test_spawn_ranks_gives_its_groups_a_timeout_a_reader_can_wait_for(
        ddp, framework, tmp_path):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    code = workers_code(framework, f'''
        report(d2l.spawn_ranks(ddp_test_workers.group_timeout, 2, {init},
                               {framework!r}))
        ''')
    proc = start([sys.executable, '-c', code], env=workers_env(tmp_path))
    seen = result_of(*finish(proc, 180), proc)
    assert ddp.GROUP_TIMEOUT_S <= 300  # minutes, not PyTorch's half hour
    for rank in seen:
        assert rank['default'] == ddp.GROUP_TIMEOUT_S
        if framework == 'pytorch':  # what Gloo itself waits
            assert rank['gloo'] == ddp.GROUP_TIMEOUT_S


@pytest.mark.parametrize('how', ['at top level', 'in a function'])
def test_a_script_whose_top_level_starts_ranks_unguarded_gets_the_one_line_fix(
        machinery_framework, tmp_path, how):
    from conftest import MODULES
    framework = machinery_framework
    script = tmp_path / 'unguarded.py'
    call = 'd2l.spawn_ranks(d2l.try_gpu, 2)'
    body = (f'{call}\n' if how == 'at top level' else
            f'def main():\n    {call}\n\n\nmain()\n')
    script.write_text(f'from d2l import {MODULES[framework]} as d2l\n{body}')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(script)], env=env, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f'RuntimeError: {script} starts processes at its top '
                    f'level, and every new process imports that script '
                    f"again: put the code that starts them under "
                    f"`if __name__ == '__main__':`")


def test_a_script_that_starts_ranks_from_a_function_under_the_guard_passes(
        ddp, tmp_path, monkeypatch):
    import types
    script = tmp_path / 'guarded.py'
    guarded = ('def start():\n    check()\n\n\n'
               'def main():\n    start()\n\n\n'
               "if __name__ == '__main__':\n    main()\n")
    unguarded = guarded.replace("if __name__ == '__main__':\n    ", '')
    main = types.ModuleType('__main__')  # the script, run as __main__
    main.__file__ = str(script)
    # spawn_ranks's own check, two calls below the script's top level
    main.check = lambda: ddp._check_worker(ddp.try_gpu, 2, ())
    monkeypatch.setitem(sys.modules, '__main__', main)
    for code in (guarded, unguarded):
        script.write_text(code)
        if code is guarded:
            exec(compile(code, str(script), 'exec'), vars(main))
            continue
        with pytest.raises(RuntimeError, match='starts processes at its top'):
            exec(compile(code, str(script), 'exec'), vars(main))


STDIN_CALLS = {
    'pytorch': 'd2l.spawn_ranks(d2l.all_reduce_demo, 2, '
               'd2l.local_init_method())',
    'paddle': "d2l.spawn_ranks(d2l.all_reduce_demo, 2, 'env://')",
    'mxnet': 'd2l.spawn_ranks(d2l.push_pull_demo, 2)'}


def test_code_read_from_standard_input_starts_ranks_of_a_saved_worker(
        framework, tmp_path):
    from conftest import MODULES
    code = (f'import json\nfrom d2l import {MODULES[framework]} as d2l\n'
            f'ranks = {STDIN_CALLS[framework]}\n'
            f'print({RESULT!r} + json.dumps([r["sum"] for r in ranks]))\n')
    (tmp_path / 'program').write_text(code)
    with open(tmp_path / 'program') as program:  # python reads it as <stdin>
        proc = start([sys.executable], stdin=program, cwd=tmp_path)
        out, err = finish(proc, 180)
    assert result_of(out, err, proc) == [3.0, 3.0]


NOTEBOOK_WORKER = {  # each sums over its group, as the pages' workers do
    'pytorch': """
def worker(rank, world_size, init_method, shift):
    with d2l.process_group(rank, world_size, init_method):
        x = torch.tensor([double(shift(rank))])
        dist.all_reduce(x)
        return float(x)
import torch, torch.distributed as dist
args = (d2l.local_init_method(), lambda r: r + 1)""",
    'paddle': """
def worker(rank, world_size, init_method, shift):
    with d2l.process_group(rank, world_size, init_method):
        x = paddle.to_tensor([double(shift(rank))])
        dist.all_reduce(x)
        return float(x)
import paddle, paddle.distributed as dist
args = ('env://', lambda r: r + 1)""",
    'mxnet': """
def worker(rank, world_size, shift):
    with d2l.process_group(rank, world_size) as device:
        kv = d2l._STORES[-1]
        x = mx.np.array([double(shift(rank))], ctx=device)
        kv.init(0, mx.np.zeros(1))
        kv.pushpull(0, x, out=x)
        return float(x)
import mxnet as mx
args = (lambda r: r + 1,)"""}


def test_a_worker_defined_in_a_notebook_runs_in_new_processes(
        d2l, framework, tmp_path):
    """The worker, a function it calls and a lambda argument are defined in
    code without a file, as in a notebook; they travel by value."""
    from conftest import MODULES
    code = (f'import json\nfrom d2l import {MODULES[framework]} as d2l\n'
            f'def double(x):\n    return 2 * x\n'
            f'{NOTEBOOK_WORKER[framework]}\n'
            f'ranks = d2l.spawn_ranks(worker, 2, *args)\n'
            f'print({RESULT!r} + json.dumps(ranks))\n')
    proc = start([sys.executable, '-c', code], cwd=tmp_path)
    out, err = finish(proc, 180)
    assert result_of(out, err, proc) == [6.0, 6.0]  # 2 * 1 + 2 * 2


def refused_calls(d2l, framework):
    """Calls of helpers that start processes, each with one bad argument, and words of the refusal."""
    init = d2l.local_init_method() if framework == 'pytorch' else 'env://'
    calls = [  # spawn_ranks runs train_ddp.check: a warm-up past the run
        (lambda: d2l.spawn_ranks(d2l.train_ddp, 2, init, 2, 64, 0.1, None,
                                 None, 5), 'warmup must be below num_epochs'),
        (lambda: d2l.spawn_ranks(d2l.train_ddp, 2, init, 2, 65, 0.1),
         'cannot be shared equally by 2 processes'),
        (lambda: d2l.spawn_ranks(d2l.train_ddp, 2, init, 0, 64, 0.1),
         'num_epochs must be a positive integer'),
        (lambda: d2l.time_all_reduce(2, [4096], calls=0), 'calls must be'),
        (lambda: d2l.time_tensor_parallel(2, 8, 32, 4, num_steps=0),
         'num_steps must be'),
        (lambda: d2l.time_ddp(2, 4, 0), 'num_steps must be')]
    if framework == 'mxnet':  # its pipeline stages are threads
        return calls + [(lambda: d2l.time_compute('lenet', 4, num_steps=0),
                         'num_steps must be')]
    X = d2l.tensor(np.zeros((8, 4), 'float32'))
    y = d2l.tensor(np.zeros(8, 'int64'))
    return calls + [
        (lambda: d2l.time_pipeline([('gpipe', 2)], 2, X, y, 2, 4,
                                   timeout_s=0),
         'timeout_s must be a finite positive number'),
        (lambda: d2l.time_ddp_configs(2, [{'model': 'lenet'}], 4,
                                      num_steps=0), 'num_steps must be'),
        (lambda: d2l.time_ddp_configs(2, [{'model': 'lenet'}], 4, warmup=-1),
         'warmup must be')]


def test_bad_arguments_of_helpers_that_start_processes_are_refused_before_any_starts(
        d2l, framework, monkeypatch):
    import multiprocessing.process

    def no_start(process):
        raise AssertionError(f'{process} was started')
    monkeypatch.setattr(multiprocessing.process.BaseProcess, 'start',
                        no_start)
    for call, words in refused_calls(d2l, framework):
        began = time.perf_counter()
        with pytest.raises(ValueError, match=words):
            call()
        assert time.perf_counter() - began < 1


# ---- MXNet's launcher helpers: a scheduler, a server and workers by hand. ----
# The tests set the DMLC_* variables themselves, as the page's two-machine
# command does (MXNet 1.9.1's tools/launch.py fails on Python 3.9+).


def dmlc_env(port, num_workers, role):
    """The environment MXNet's launcher gives one process of a local job."""
    return dict(scenario_env(), DMLC_ROLE=role, DMLC_PS_ROOT_URI='127.0.0.1',
                DMLC_PS_ROOT_PORT=str(port), DMLC_NODE_HOST='127.0.0.1',
                DMLC_NUM_WORKER=str(num_workers), DMLC_NUM_SERVER='1',
                DMLC_JOB_CLUSTER='local', OMP_NUM_THREADS='1')


def mxnet_job(args, num_workers=2):
    """Start a scheduler, a server and `num_workers` workers running `python ARGS`; the workers' (out, err, proc), then the servers'."""
    from d2l import mxnet as d2l
    port, *worker_ports = d2l._free_ports(num_workers + 1)
    servers = [start([sys.executable, '-c', 'import mxnet'],
                     env=dmlc_env(port, num_workers, role))
               for role in ('scheduler', 'server')]
    workers = [start([sys.executable, *args], env=dict(
        dmlc_env(port, num_workers, 'worker'), PORT=str(p)))
        for p in worker_ports]  # ps-lite numbers workers by their ports
    try:
        ran = [(*finish(w, 240), w) for w in workers]
        ended = [(*finish(s, 60), s) for s in servers]
    finally:
        for proc in workers + servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return ran, ended


@needs_mxnet
def test_mxnet_launcher_ranks_are_the_store_s_and_process_group_reuses_it():
    code = textwrap.dedent(f'''
        import json
        from d2l import mxnet as d2l
        ranks = d2l.launcher_ranks()
        kv = d2l._JOB[0]
        with d2l.process_group(ranks[0], ranks[1]):
            same = d2l._STORES[-1] is kv  # a second store would never form
            kv.init(0, d2l.np.zeros(1))
            kv.push(0, d2l.np.array([ranks[0] + 1.0]))
            total = d2l.np.zeros(1)
            kv.pull(0, out=total)
        print({RESULT!r} + json.dumps([list(ranks), kv.rank, kv.num_workers,
                                       same, float(total[0])]), flush=True)
        ''')
    ran, ended = mxnet_job(['-c', code])
    seen = [result_of(*r) for r in ran]
    assert sorted(s[0][0] for s in seen) == [0, 1]
    for ranks, rank, num_workers, same, total in seen:
        assert ranks == [rank, num_workers, rank, num_workers] == [rank, 2] * 2
        assert same and total == 3.0  # 1 + 2
    # The workers freed the store at exit, which stops the scheduler and server.
    assert [proc.returncode for *_, proc in ended] == [0, 0]


@needs_mxnet
def test_a_failing_worker_of_the_mxnet_script_s_own_job_stops_the_job(
        tmp_path):
    worker = textwrap.dedent(f'''
        import os, sys, time
        from d2l import mxnet as d2l
        rank = d2l.launcher_ranks()[0]  # joins the job
        with open(os.path.join({str(tmp_path)!r}, f'pid{{rank}}'), 'w') as f:
            f.write(str(os.getpid()))
        if rank == 1:
            time.sleep(1)
            raise RuntimeError('rank 1 broke on purpose')
        time.sleep(600)  # rank 0 would wait for rank 1 for good
        ''')
    proc = start([sys.executable, '-c', 'import sys\n'
                  'from d2l import mxnet as d2l\n'
                  f'sys.exit(d2l.launch_local_job(2, ["-c", {worker!r}]))'])
    began = time.monotonic()
    _, err = finish(proc, 180)
    assert proc.returncode == 1, err[-3000:]
    assert 'rank 1 broke on purpose' in err
    assert 'worker 1 exited with code 1; stopping the job' in err
    assert time.monotonic() - began < 120
    for rank in (0, 1):
        pid = int((tmp_path / f'pid{rank}').read_text())
        assert not pathlib.Path(f'/proc/{pid}').exists() or open(
            f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z'


@needs_mxnet
def test_an_mxnet_launcher_s_timeout_also_bounds_each_exchange(tmp_path):
    waits = tmp_path / 'waits'
    worker = textwrap.dedent(f'''
        import time
        from mxnet import np
        from d2l import mxnet as d2l
        rank, world_size = d2l.launcher_ranks()[:2]
        with d2l.launcher_deadline(rank, world_size, 3):
            with d2l.process_group(rank, world_size):
                kv, x = d2l._STORES[-1], np.ones(3)
                kv.init(0, np.zeros(3))  # both ranks: the store's barrier
                if rank == 1:  # alive, as under a debugger
                    time.sleep(600)
                with open({str(waits)!r}, 'w') as f:
                    f.write(repr(time.time()))
                kv.pushpull(0, x, out=x)
                x.wait_to_read()  # rank 1 pushes nothing
        ''')
    proc = start([sys.executable, '-c', 'import sys\n'
                  'from d2l import mxnet as d2l\n'
                  f'sys.exit(d2l.launch_local_job(2, ["-c", {worker!r}]))'])
    _, err = finish(proc, 180)
    ended = time.time()
    assert proc.returncode == 1, err[-3000:]
    assert 'TimeoutError: rank 0 timed out: it waited 3 s in a dist_sync ' \
        'pushpull' in err, err[-3000:]
    assert 'worker 0 exited with code 1; stopping the job' in err
    assert ended - float(waits.read_text()) < 3 + 10


@needs_mxnet
def test_mxnet_launcher_ranks_name_a_missing_or_bad_variable(monkeypatch):
    from d2l import mxnet as d2l
    names = ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT',
             'DMLC_NUM_WORKER', 'DMLC_NUM_SERVER')
    for name in names:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match=', '.join(names) + " not set: "
                       "set them as for several machines, or start a job "
                       "here with --workers"):
        d2l.launcher_ranks()
    for name, value in dmlc_env(9, 2, 'worker').items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv('DMLC_NUM_WORKER', '0')
    with pytest.raises(ValueError, match="DMLC_NUM_WORKER='0' must be an "
                       "integer of at least 1: unset it"):
        d2l.launcher_ranks()
    assert d2l._JOB == []  # it gave up before joining anything


@needs_mxnet
@pytest.mark.parametrize('how', ['script', 'launcher_deadline'])
def test_mxnet_deadline_ends_a_worker_whose_peers_never_come(how, tmp_path):
    import socket
    from d2l import mxnet as d2l
    if how == 'script':
        args, who = [d2l.ddp_script_path(), '--epochs', '1', '--timeout',
                     '3'], 'a worker'
    else:
        args, who = ['-c', 'from d2l import mxnet as d2l\n'
                     'with d2l.launcher_deadline(0, 2, 3):\n'
                     '    with d2l.process_group(0, 2):\n'
                     '        pass\n'], 'rank 0'
    with socket.socket() as deaf:  # a scheduler that never answers
        deaf.bind(('127.0.0.1', 0))
        deaf.listen(8)
        port = deaf.getsockname()[1]
        began = time.monotonic()
        proc = start([sys.executable] + args, cwd=tmp_path,
                     env=dmlc_env(port, 2, 'worker'))
        out, err = finish(proc, 150)
        seconds = time.monotonic() - began
    address = f'127.0.0.1:{port}'
    assert proc.returncode != 0
    assert f'{who} waits for all 2 workers at {address} until' in out, out
    last = err.strip().splitlines()[-1]
    assert last.startswith(f'{who}: no job formed at {address} within 3 s'), \
        err[-3000:]
    assert 'larger timeout' in last
    assert 'Traceback' not in err, err[-3000:]
    assert seconds < 90  # 3 s of waiting after MXNet's import


@needs_mxnet
@pytest.mark.slow
def test_mxnet_script_trains_under_the_launcher_s_variables():
    from d2l import mxnet as d2l
    ran, ended = mxnet_job([d2l.ddp_script_path(), '--epochs', '1'])
    for out, err, proc in ran:
        assert proc.returncode == 0, err[-4000:]
    text = ''.join(out for out, _, _ in ran)
    assert '2 processes, backend dist_sync' in text and 'test accuracy' in text
    assert [proc.returncode for *_, proc in ended] == [0, 0]


@needs_mxnet
def test_mxnet_launcher_script_lies_where_the_book_says_and_states_its_timeout():
    from d2l import mxnet as d2l
    path = pathlib.Path(d2l.ddp_script_path())
    assert path == ROOT / 'chapter_multi_gpu' / 'ddp_train_mxnet.py'
    assert 'launcher_ranks' in path.read_text()
    shown = subprocess.run([sys.executable, str(path), '--help'],
                           capture_output=True, text=True, timeout=120,
                           env=scenario_env())
    assert shown.returncode == 0, shown.stderr[-2000:]
    text = ' '.join(shown.stdout.split())
    assert '--timeout' in text and '(default: 300)' in text


# ---- The launcher commands the book prints run as printed (issue 43). ----
# Each is read from where the book prints it: the bash blocks of the page's
# launcher section, the launcher scripts' docstrings, and the command that
# launcher_ranks suggests when a script runs without a launcher. It then runs
# briefly on this CPU machine (short_run says how it is adapted).


def _bash_blocks(text):
    """The ```bash blocks of markdown `text`, continuation lines joined."""
    import re
    return [block.replace('\\\n', ' ').strip() for block in
            re.findall(r'^```bash\n(.*?)^```', text, re.M | re.S)]


def printed_commands(framework):
    """(where, command) for every launcher command the book prints for `framework`."""
    import ast
    import re
    page = (ROOT / 'chapter_multi_gpu' / 'process-groups.md').read_text()
    section = page[page.index('## Launchers and Several Machines'):
                   page.index('## Summary')]
    found = []
    for tabs, body in re.findall(r'^:begin_tab:`([^`]*)`\n(.*?)^:end_tab:',
                                 section, re.M | re.S):
        if framework in [t.strip() for t in tabs.split(',')]:
            found += [('the page', block) for block in _bash_blocks(body)]
    module = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
    script = pathlib.Path(importlib_module(framework).ddp_script_path())
    doc = ast.get_docstring(ast.parse(script.read_text()))
    for block in re.findall(r'(?:^    .*\S.*\n?)+', doc, re.M):
        found.append(('the docstring', textwrap.dedent(block).replace(
            '\\\n', ' ').strip()))
    # run without any launcher, from the book's root as the page says
    env = {k: v for k, v in scenario_env().items()
           if not k.startswith(('RANK', 'WORLD_SIZE', 'MASTER_', 'PADDLE_',
                                'DMLC_', 'LOCAL_'))}
    bare = subprocess.run(
        [sys.executable, f'chapter_multi_gpu/{script.name}'], cwd=ROOT,
        env=env, capture_output=True, text=True, timeout=120)
    hint = re.search(r'for example (.+)$', bare.stderr, re.M)
    assert hint, f'{module[framework]} script names no command:\n' \
        + bare.stderr[-2000:]
    found.append(('the error of launcher_ranks', hint.group(1).strip()))
    return found


def importlib_module(framework):
    import importlib
    module = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
    return importlib.import_module(f'd2l.{module[framework]}')


def short_run(command, port):
    """`command` as this CPU-only machine runs it briefly: the shell text of each machine's part.

    One epoch instead of ten; 2 processes in all instead of 8 GPUs per
    machine; 127.0.0.1 and a free port for the first machine's address;
    a two-machine command runs twice here, with --node_rank=1 (torchrun) or
    without the scheduler's line (MXNet) on the second "machine".
    """
    import re
    machines = 2 if re.search(r'--nnodes[= ]2|DMLC_NUM_WORKER=2', command) \
        and '--workers' not in command else 1
    per_machine = 2 // machines
    text = re.sub(r'--epochs \d+', '--epochs 1', command)
    text = re.sub(r'(ddp_train\S*\.py(?!.*--epochs)[^&\n]*?)(\s*&)?$',
                  r'\1 --epochs 1\2', text, flags=re.M)
    text = re.sub(r'--nproc_per_node=\d+', f'--nproc_per_node={per_machine}',
                  text)
    text = re.sub(r'--nproc_per_node \d+|--devices [\d,]+',
                  f'--nproc_per_node {per_machine}', text)
    text = text.replace('10.0.0.1', '127.0.0.1')
    text = re.sub(r'(127\.0\.0\.1:|--master_port=|MASTER_PORT=|DMLC_PS_ROOT_PORT=)\d+',
                  rf'\g<1>{port}', text)
    parts = [text]
    if machines == 2:
        if '--node_rank=0' in text:
            parts.append(text.replace('--node_rank=0', '--node_rank=1'))
        elif 'DMLC_ROLE=scheduler' in text:
            parts.append('\n'.join(line for line in text.splitlines()
                                   if 'DMLC_ROLE=scheduler' not in line))
        else:
            parts.append(text)
    return parts


def free_port():
    """A port of the loopback interface that was free a moment ago."""
    import socket
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def shell_env(**extra):
    """scenario_env for a shell command: this Python's launchers first on PATH."""
    return dict(scenario_env(), PATH=os.path.dirname(sys.executable) + ':'
                + os.environ['PATH'], **extra)


# A brief run of the book's training (a printed command, a batch job, two
# ranks of train_ddp) trains on two images of each class and tests on two
# (D2L_SUBSET), not on the hundred and hundred of quick mode: what it shows
# is that the launcher, the rendezvous and the exchange work.
BRIEF_DATA = {'D2L_QUICK': '0', 'D2L_SUBSET': '2,2'}


def run_printed(command, workdir, deadline_s=400):
    """Run `command` (short_run's parts at once) in `workdir`; (outputs of all parts and logs, return codes, listeners)."""
    env = shell_env(**BRIEF_DATA)
    procs = [start(['bash', '-c', part], cwd=workdir, env=env)
             for part in short_run(command, free_port())]
    texts, codes, listeners = [], [], []
    for proc in procs:
        out, err, seen = watch_listeners(proc, deadline_s, every_s=0.05)
        texts.append(out + err)
        codes.append(proc.returncode)
        listeners += seen
    texts += [log.read_text() for log in workdir.glob('log/workerlog.*')]
    return '\n'.join(texts), codes, listeners


def exposure_beyond_the_page(command, listeners, page):
    """What a one-machine run of `command` exposes beyond loopback that `page` does not name (empty: nothing)."""
    # torchrun's agent and PaddlePaddle's store on rank 0 listen on every
    # interface, as the page says; the rest listen on loopback only.
    beyond = exposed(listeners)
    if 'torchrun' in command:
        named = '`torchrun` opens two stores of its own on every' in page
        if named and len(beyond) == 2 and all(
                'torchrun' in owner for *_, owner in beyond):
            return []
    elif 'paddle.distributed.launch' in command:
        named = ("rank 0's rendezvous store listens on every network "
                 "interface" in page)
        if named and len(beyond) == 1 and 'ddp_train_paddle' in beyond[0][2]:
            return []
    return beyond


@pytest.mark.slow
@pytest.mark.skipif(not pathlib.Path('/proc/self/net/tcp').exists(),
                    reason='reads /proc/net/tcp (Linux)')
def test_every_launcher_command_the_book_prints_runs_as_printed(framework,
                                                                 tmp_path):
    # on one machine, exposing only what the page names, warning nothing
    page = ' '.join((ROOT / 'chapter_multi_gpu' / 'process-groups.md')
                    .read_text().split())
    commands = printed_commands(framework)
    seen = {}
    for where, command in commands:  # the same run once
        key = tuple(' '.join(part.split()) for part in short_run(command, 1))
        seen.setdefault(key, (where, command))
    assert len(commands) >= 3 and len(seen) >= 2, commands
    failures = []
    for i, (key, (where, command)) in enumerate(seen.items()):
        workdir = tmp_path / str(i)  # as the book's root folder
        workdir.mkdir()
        (workdir / 'chapter_multi_gpu').symlink_to(ROOT / 'chapter_multi_gpu')
        text, codes, listeners = run_printed(command, workdir)
        warnings = [line for line in text.splitlines() if 'Warning' in line
                    and ('d2l/' in line or 'd2l' + os.sep in line)]
        if codes != [0] * len(codes) or 'test accuracy' not in text:
            failures.append(f'{where}: {command}\nexit codes {codes}\n'
                            f'{text[-2500:]}')
        elif warnings:  # such as torchrun's ranks converting a tensor
            failures.append(f'{where}: {command}\nwarns: {warnings}')
        # PaddlePaddle's gloo listens only for the ~0.2 s of its rendezvous
        # and a poll can miss that; the store listens for the whole run
        elif len(key) == 1 and not listeners:
            failures.append(f'{where}: {command}\nnot watched: {listeners}')
        elif len(key) == 1 and exposure_beyond_the_page(command, listeners,
                                                          page):
            failures.append(f'{where}: {command}\nlistening beyond '
                            f'loopback: {exposed(listeners)}')
    assert failures == [], '\n\n'.join(failures)


@pytest.mark.slow
@pytest.mark.skipif(not pathlib.Path('/proc/self/net/tcp').exists(),
                    reason='reads /proc/net/tcp (Linux)')
def test_a_pytorch_run_started_by_hand_listens_on_loopback_only(tmp_path):
    # the variables torchrun would set, as the page describes them
    if 'pytorch' not in FRAMEWORKS:
        pytest.skip('PyTorch is not in D2L_TEST_FRAMEWORKS')
    (tmp_path / 'chapter_multi_gpu').symlink_to(ROOT / 'chapter_multi_gpu')
    text, codes, listeners = run_printed(
        'export MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 '
        'LOCAL_WORLD_SIZE=2\n'
        'RANK=1 LOCAL_RANK=1 python chapter_multi_gpu/ddp_train.py &\n'
        'RANK=0 LOCAL_RANK=0 python chapter_multi_gpu/ddp_train.py\nwait',
        tmp_path)
    assert codes == [0], text[-3000:]
    assert len(listeners) >= 2, listeners  # the run was watched
    assert exposed(listeners) == [], listeners
