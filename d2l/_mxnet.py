"""The MXNet side of the d2l machinery (see d2l/runtime.py).

What the machinery must do with MXNet itself: join and leave process groups,
move tensors between processes, time steps. The book's helpers reach it
through `from d2l import mxnet as d2l`."""
import atexit
import contextlib
import functools
import inspect
import math
import multiprocessing.connection
import multiprocessing.forkserver
import mxnet as mx
import numpy
import numpy as onp
import os
import queue
import sys
import subprocess
import threading
import time
import traceback
from mxnet import autograd
from mxnet import gluon
from mxnet import init
from mxnet import np, npx
from mxnet.gluon import nn
from d2l.runtime import *  # noqa: F401,F403


def _device_name(device):
    """A short name for `device` and whether it is a GPU."""
    if not isinstance(device, mx.Context):
        raise TypeError(f'not an MXNet context: {device!r}')
    return str(device), device.device_type == 'gpu'


def _one_thread():
    """Nothing to do: MXNet fixed its thread count when it was imported."""


def _batchify_resized(batch, size):
    """Stack (image, label) pairs into a minibatch, resizing if asked."""
    X = np.array(onp.stack([x for x, _ in batch]))
    y = np.array(onp.array([t for _, t in batch]), dtype='int32')
    if size is not None:
        # npx.image.resize works on channels-last images and takes
        # (width, height); interp=1 is bilinear.
        X = npx.image.resize(X.transpose(0, 2, 3, 1),
                             size=(size[1], size[0]), interp=1)
        X = X.transpose(0, 3, 1, 2)
    return X, y


def _worker_context():
    """A context for the workers, and the environment they need."""
    # On a CPU a worker is one core (sec_helpers) unless OMP_NUM_THREADS
    # says otherwise. MXNet reads it once, on import, so the fork server,
    # which imports MXNet, serves only one-thread workers.
    threads = {} if d2l.num_gpus() or 'OMP_NUM_THREADS' in os.environ \
        else {'OMP_NUM_THREADS': '1'}
    if {**os.environ, **threads}.get('OMP_NUM_THREADS') != '1':
        return multiprocessing.get_context('spawn'), threads
    with _environment({}, OMP_NUM_THREADS='1'):  # the server's own
        return multiprocessing.get_context(_fork_server()), threads


def _free_ports(n, host='127.0.0.1'):
    """`n` different free ports on `host`, in increasing order."""
    ports = set()
    while len(ports) < n:
        ports.add(d2l.free_port(host))
    return sorted(ports)


def _scheduler_port(host='127.0.0.1'):
    """A free port for MXNet's scheduler that the system never hands out itself."""
    # ps-lite's nodes bind ports the system picks (port 0); one of them
    # could take a port that free_port found free before the scheduler
    # binds it, and get the scheduler's messages (ps-lite aborts: "Check
    # failed: is_scheduler_"). Above the system's range only we pick.
    import random, socket
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            low = int(f.read().split()[1]) + 1
        for port in random.sample(range(low, 65536), min(64, 65536 - low)):
            with socket.socket() as probe:
                with contextlib.suppress(OSError):
                    probe.bind((host, port))
                    return port
    return d2l.free_port(host)


def _start_servers(context, num_workers, out_dir, num_servers=1):
    """Start MXNet's scheduler and servers on loopback; return the workers' environment and the processes."""
    env = {'DMLC_PS_ROOT_URI': '127.0.0.1', 'DMLC_NODE_HOST': '127.0.0.1',
           'DMLC_PS_ROOT_PORT': str(_scheduler_port()),
           'DMLC_NUM_SERVER': str(num_servers),
           'DMLC_NUM_WORKER': str(num_workers)}
    servers = []
    for i, role in enumerate(['scheduler'] + ['server'] * num_servers):
        log = os.path.join(out_dir, f'{role}{i}.log')
        servers.append(context.Process(target=_serve, args=(
            role, dict(os.environ, **env), log, os.getpid())))
        servers[-1].start()
    return env, servers


def launch_local_job(num_workers, argv):
    """Run `python argv` as `num_workers` workers of a dist_sync job here; 0 or the first failure's exit code."""
    # A scheduler and a server start too; everything listens on loopback.
    # (MXNet's tools/launch.py calls Thread.isAlive, gone in Python 3.9.)
    check_count(num_workers, 'num_workers', 1)
    port, ports = _scheduler_port(), _free_ports(num_workers)
    env = dict(os.environ, DMLC_PS_ROOT_URI='127.0.0.1', DMLC_NUM_SERVER='1',
               DMLC_NODE_HOST='127.0.0.1', DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_WORKER=str(num_workers), DMLC_JOB_CLUSTER='local')
    if d2l.num_gpus() == 0:  # a worker is a core, as in spawn_ranks
        env.setdefault('OMP_NUM_THREADS', '1')
    def start(role, args, **more):
        return subprocess.Popen([sys.executable, *args], env=dict(
            env, DMLC_ROLE=role, **more), preexec_fn=_end_with_launcher)
    servers = [start(role, ['-c', 'import mxnet'])
               for role in ('scheduler', 'server')]
    # ps-lite numbers the workers in the order of their ports
    workers = [start('worker', argv, PORT=str(p)) for p in ports]
    try:
        servers_ended = None  # when a server or the scheduler ended
        while None in [w.poll() for w in workers]:  # polls every one
            if any(w.returncode for w in workers):
                break  # the others would wait for it for good
            if servers_ended is None and any(s.poll() is not None
                                             for s in servers):
                servers_ended = time.monotonic()  # the job is over, or broke
            if servers_ended and time.monotonic() - servers_ended > 30:
                break
            time.sleep(0.1)
        codes = [w.poll() for w in workers]
        failed = [(r, c) for r, c in enumerate(codes) if c]
        if failed or None in codes:
            rank, code = failed[0] if failed else (None, 1)
            print('launch_local_job: ' + (
                f'worker {rank} exited with code {code}' if failed else
                'the scheduler or the server ended early') +
                '; stopping the job', file=sys.stderr, flush=True)
            return code
        for server in servers:  # they end once every worker has left
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                pass  # stopped below
        return 0
    finally:
        for proc in workers + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _end_with_launcher():
    """In a process that launch_local_job starts: die when the launcher does."""
    if sys.platform.startswith('linux'):
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def _serve(role, env, log_path, parent_pid):
    """Become MXNet's scheduler or a server (`role`) for one job, logging to `log_path`; die with the parent."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):
        os.dup2(log, stream)
    _die_with_parent(parent_pid)  # PR_SET_PDEATHSIG is kept across exec
    _take_environment(env)
    os.environ['DMLC_ROLE'] = role
    os.execv(sys.executable, [sys.executable, '-c', 'import mxnet'])


def check_model_kind(net):
    """Reject `net` unless it is a gluon.Block."""
    d2l._check_model(net, gluon.Block, 'gluon.Block')


def _rendezvous_address():
    """host:port of the scheduler that MXNet's launcher described in the environment."""
    return (f"{os.environ.get('DMLC_PS_ROOT_URI', '(DMLC_PS_ROOT_URI unset)')}:"
            f"{os.environ.get('DMLC_PS_ROOT_PORT', '(DMLC_PS_ROOT_PORT unset)')}")


# ps-lite waits for a peer for good, so the waits of a worker's dist_sync
# stores run under a deadline here: the group timeout of the process
# (process_group's timeout_s, or GROUP_TIMEOUT_S in spawn_ranks' ranks).
# A blocking call (init, _barrier) is a wait while it runs; a pull, which
# returns at once, is one until its outputs are ready, which a thread of the
# process waits for, one pull after another. A wait that sees no wait end
# for the timeout (from its start, or from the last one that ended: the
# thread may wait on work queued after the pull) ends the rank with a
# TimeoutError written down as its error.
_WAITS = {'open': {}, 'progress': 0.0, 'queue': None, 'pid': None}
_STORE_CALLS = {'init': False, '_barrier': False, 'broadcast': True,
                'pull': True, 'row_sparse_pull': True, 'pushpull': True}


@contextlib.contextmanager
def _store_timeout(timeout_s):
    """In the body, bound each wait of a dist_sync store by `timeout_s` (None: the process's group timeout)."""
    _bound_store_waits()
    before = _PROCESS['group_timeout_s']
    if timeout_s is not None:
        _PROCESS['group_timeout_s'] = timeout_s
    try:
        yield
    finally:
        _PROCESS['group_timeout_s'] = before


def _bound_store_waits():
    """Put the store's waits under the group timeout, once; start this process's watching threads."""
    kvstore = mx.kvstore.KVStore
    for name, pulls in _STORE_CALLS.items():
        if not getattr(getattr(kvstore, name), 'bounded', False):
            setattr(kvstore, name, _bounded_call(getattr(kvstore, name),
                                                 pulls))
    if _WAITS['pid'] != os.getpid():  # first here, or forked
        _WAITS.update(open={}, progress=time.monotonic(),
                      queue=queue.SimpleQueue(), pid=os.getpid())
        for target in (_await_pulls, _watch_store_waits):
            threading.Thread(target=target, daemon=True).start()


def _flat_arrays(value):
    """The arrays in an array or a (nested) list of them."""
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flat_arrays(v)]
    return [] if value is None else [value]


def _bounded_call(method, pulls):
    """KVStore's `method` (which `pulls` into outputs, or blocks), as a wait under the group timeout in a dist store."""
    signature = inspect.signature(method)

    def bounded(self, *args, **kwargs):
        timeout_s = _PROCESS['group_timeout_s']
        if timeout_s is None or _WAITS['pid'] != os.getpid() or \
                not self.type.startswith('dist'):
            return method(self, *args, **kwargs)
        given = signature.bind(self, *args, **kwargs).arguments
        key, what = given.get('key'), method.__name__.lstrip('_')
        if key is not None:
            what += f' (key {key!r})' if not isinstance(key, (list, tuple)) \
                else f' ({len(key)} keys)'
        token = object()  # this wait, open until done
        _WAITS['open'][token] = (time.monotonic(), timeout_s, self.rank, what)
        try:
            result = method(self, *args, **kwargs)
            out = given.get('out')  # pushpull's default: into the values
            outs = _flat_arrays(given.get('value') if out is None else out) \
                if pulls else []
        except BaseException:
            _close_wait(token)
            raise
        if outs:
            _WAITS['queue'].put((token, outs))
        else:
            _close_wait(token)
        return result
    bounded.bounded = True
    return functools.wraps(method)(bounded)


def _close_wait(token):
    """A wait has ended: the stores made progress."""
    _WAITS['open'].pop(token, None)
    _WAITS['progress'] = time.monotonic()


def _await_pulls():
    """Thread: wait for each pull's outputs in turn, closing its wait."""
    while True:
        token, outs = _WAITS['queue'].get()
        for out in outs:
            try:
                out.wait_to_read()
            except Exception:  # the caller sees it when it reads
                pass
        _close_wait(token)


def _watch_store_waits():
    """Thread: end the rank once a wait has seen no progress for its timeout."""
    while True:
        time.sleep(0.25)
        now = time.monotonic()
        for since, timeout_s, rank, what in list(_WAITS['open'].values()):
            if now - max(since, _WAITS['progress']) > timeout_s:
                _end_waiting_rank(rank, what, timeout_s)


def _end_waiting_rank(rank, what, timeout_s):
    """Write down a TimeoutError as the rank's error, print it, end the process."""
    try:
        raise TimeoutError(
            f'rank {rank} timed out: it waited {timeout_s:g} s in a '
            f'dist_sync {what} for the other workers, and no exchange '
            f'finished; a worker that never reached it holds them all up '
            f'(pass a larger timeout_s to process_group if they need longer)')
    except TimeoutError:
        _record_rank_failure(rank)
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # freeing the store would wait for the others too


_JOB = []  # the store that launcher_ranks joined, kept until the exit


def _job_store():
    """This worker's dist_sync store of the launcher's job, joined once and freed at a normal exit."""
    if not _JOB:
        _JOB.append(mx.kv.create('dist_sync'))  # a second one never forms
        atexit.register(_JOB.clear)  # runs before MXNet's own clean-up
        sys.excepthook = _leave_failed_worker
    return _JOB[0]


def _leave_failed_worker(kind, value, trace):
    """Print an uncaught error and end the worker without freeing its store, which would wait for every other worker."""
    sys.__excepthook__(kind, value, trace)
    _leave_failed_rank()


@contextlib.contextmanager
def _join_deadline(who, world_size, timeout_s):
    """Say what `who` waits for while the body joins the job; end the process if that takes over `timeout_s`."""
    if _JOB or d2l._STORES:  # joined already: nothing to wait for
        yield
        return
    fix = (f'start all {world_size} workers, the scheduler and the servers '
           f'with this address, check that its port is reachable, or give a '
           f'larger timeout')
    with _deadline_watchdog(who, timeout_s, _rendezvous_address(),
                            f'all {world_size} workers', 'job', fix,
                            lambda: bool(_JOB or d2l._STORES)):
        yield


def _waiting_init_params(init_params):
    """Trainer._init_params that returns once its broadcasts have landed."""
    def init_params_and_wait(self):
        npx.waitall()  # the first backward pass, finished
        init_params(self)
        npx.waitall()  # rank 0's parameters, in every rank
    init_params_and_wait.waits = True
    return init_params_and_wait


if not getattr(gluon.Trainer._init_params, 'waits', False):
    gluon.Trainer._init_params = _waiting_init_params(
        gluon.Trainer._init_params)


def _live_grads(stages):
    """The gradients of the stages' parameters, left in place (None: none)."""
    return [p.grad() for layers in stages for layer in layers
            for p in layer.collect_params().values()]


_to_numpy = lambda x: x.asnumpy()


def _parameter(block, name, value):
    """A parameter `name` of `block` holding a copy of the array `value`."""
    param = block.params.get(name, shape=value.shape)
    param.initialize(ctx=value.ctx)
    param.set_data(value.copy())
    return param


_from_numpy = np.array


_stores = []  # a process joins its dist_sync job once


def _dist_store():
    """This worker's dist_sync key-value store, created on first use."""
    if not _stores and not os.environ.get('DMLC_NUM_WORKER'):
        raise RuntimeError(
            'CountingAllreduce (and mesh_allreduces) sum over the workers of '
            'a parameter-server job, and this process is in none: call it in '
            'a worker that d2l.spawn_ranks (or MXNet\'s launcher) started')
    if not _stores:
        _bound_store_waits()  # the group timeout of spawn_ranks' ranks
        _stores.append(mx.kv.create('dist_sync'))
    return _stores[0]


def _group(rank, world_size, init_method):
    """MXNet's workers form no group: their store connects them."""
    return contextlib.nullcontext()


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One worker of time_all_reduce: its seconds per call of each size."""
    with d2l.process_group(rank, world_size, init_method) as device:
        return _all_reduce_rounds(
            [np.zeros(n // 4, ctx=device) for n in sizes], reps, calls,
            npx.waitall)


def job_store():
    """The dist_sync key-value store of the process_group this worker is in."""
    d2l.check(d2l._STORES, 'job_store() is for a worker inside '
              'd2l.process_group, which opens the job\'s store')
    return d2l._STORES[-1]


def _all_reduce_rounds(bufs, reps, calls, sync):
    """Seconds per push and pull of each buffer in alternating rounds."""
    kv = d2l._STORES[-1]
    keys = [next(d2l._SUM_KEYS) for _ in bufs]  # keys no Trainer uses
    for key, x in zip(keys, bufs):
        kv.init(key, x)
        kv.pushpull(key, x, out=x)  # untimed: the first call sets up
    def exchange(key, x):
        for _ in range(calls):
            kv.pushpull(key, x, out=x)
        x.wait_to_read()
    seconds = _alternating_rounds(
        [lambda k=key, x=x: exchange(k, x) for key, x in zip(keys, bufs)],
        reps, kv._barrier, sync)
    return [[s / calls for s in row] for row in seconds]


def _lenet_net():
    """The cost model's LeNet, uninitialised."""
    net = nn.Sequential()
    net.add(nn.Conv2D(6, 5, padding=2, in_channels=1, activation='relu'),
            nn.MaxPool2D(2),
            nn.Conv2D(16, 5, in_channels=6, activation='relu'),
            nn.MaxPool2D(2), nn.Flatten(),
            nn.Dense(120, 'relu', in_units=400),
            nn.Dense(84, 'relu', in_units=120), nn.Dense(10, in_units=84))
    return net


def gradient_bytes(net):
    """Bytes of float32 gradients of `net`'s trainable parameters."""
    return sum(4 * math.prod(p.shape) for p in net.collect_params().values()
               if p.grad_req != 'null')


def time_compute(model, batch_size, threads=None, num_steps=2, warmup=1,
                 reps=3, bf16=False):
    """Median seconds per plain SGD step of `model` on `batch_size` images."""
    cost_model_net(model)  # rejects an unknown name
    check_timing(num_steps, warmup, 1 if threads is None else threads, reps)
    check_count(batch_size, 'batch_size', 1)
    if bf16:
        raise ValueError('bf16=True: this tab times float32 only')
    with _environment({'OMP_NUM_THREADS': str(threads or 1)}):
        return _slowest_medians(d2l.spawn_ranks(
            _compute_worker, 1, model, batch_size, num_steps, warmup,
            reps))[0]


def _compute_worker(rank, world_size, model, batch_size, num_steps, warmup,
                    reps):
    """The worker of time_compute: seconds per step in rounds, no exchange."""
    mx.random.seed(0)
    net = cost_model_net(model)
    net.initialize(init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': 0.01}, kvstore=None)
    X, y = d2l.timing_batch(batch_size)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    def steps(n):
        for _ in range(n):
            with autograd.record():
                l = loss(net(X), y)
            l.backward()
            trainer.step(batch_size)
        npx.waitall()
    steps(warmup)
    seconds = _alternating_rounds([lambda: steps(num_steps)], reps)
    return [[s / num_steps for s in row] for row in seconds]


_tp_barrier = lambda: _dist_store()._barrier()  # the store's barrier


_rendezvous = lambda: None  # the store finds its scheduler by itself


def ddp_script_path(framework=None):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'."""
    return _script_path('mxnet' if framework is None else framework)


# The pipeline page's per-framework parts (run_device, run_pipeline)
def _grads(layers):
    """The parameters' gradients as NumPy arrays, then cleared."""
    params = [p for layer in layers for p in layer.collect_params().values()]
    grads = [p.grad().asnumpy() for p in params]
    for p in params:
        p.grad()[:] = 0
    return grads


def _leaf(x):
    """A copy of x that collects its own gradient: a block's input."""
    x = x.detach()
    x.attach_grad()
    return x


_thread_setup = lambda: npx.set_np()  # MXNet's NumPy interface is per thread
_sync = lambda x: x.wait_to_read()  # MXNet computes asynchronously


def _place(stages, device):
    """Move the layers of `stages`, a dict stage -> layers, to `device`."""
    for layers in stages.values():
        for layer in layers:
            layer.collect_params().reset_ctx(device)
    return stages


# Last: the generated module imports this one at its top. Imported first
# (as unpickling a worker of this module does), this one is star-imported
# while incomplete, and _adopt completes the generated module.
__all__ = _exports(globals())
from d2l import mxnet as d2l  # noqa: E402
_adopt(globals(), _shared_helpers(d2l), d2l)
__all__ = _exports(globals())
