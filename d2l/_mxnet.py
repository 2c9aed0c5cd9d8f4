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


def _device_names(devices, num_asked):
    """(name, is_gpu) for each of `devices`, or an error saying what fails."""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, '__len__') \
            or len(devices) == 0:
        raise ValueError('devices must be a non-empty list of devices, such '
                         f'as d2l.try_gpus(2), got {devices!r}')
    if num_asked is not None:
        check_num_devices(num_asked, 'num_asked')
    named = []
    for i, device in enumerate(devices):
        try:
            named.append(_device_name(device))
        except (AttributeError, TypeError, ValueError, RuntimeError):
            raise TypeError(f'devices[{i}] is not a device of this framework '
                            f'({device!r}); build the list with '
                            f'd2l.try_gpus(k)') from None
    return named


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


def _start_servers(context, num_workers, out_dir, num_servers=1):
    """Start MXNet's scheduler and servers on loopback; return the workers' environment and the processes."""
    env = {'DMLC_PS_ROOT_URI': '127.0.0.1', 'DMLC_NODE_HOST': '127.0.0.1',
           'DMLC_PS_ROOT_PORT': str(d2l.free_port()),
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
    port, *ports = _free_ports(num_workers + 1)
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


def check_lenet_args(X, params):
    """Raise ValueError, saying what to pass, unless `X` and `params` fit LeNet."""
    shape = tuple(X.shape) if hasattr(X, 'shape') else type(X).__name__
    check(shape[1:] == (1, 28, 28), lambda: 'X must be a batch of 28 x 28 grayscale '
             f'images, shape (examples, 1, 28, 28); got {shape}')
    n = len(params) if isinstance(params, (list, tuple)) else None
    check(n == len(d2l.LENET_SHAPES), lambda: f"params must be a list of LeNet's {len(d2l.LENET_SHAPES)}"
             f' tensors, as lenet_params() returns; got {n or params!r:.60}')
    for i, (p, shape) in enumerate(zip(params, d2l.LENET_SHAPES)):
        check(tuple(p.shape) == shape, lambda: f'params[{i}] has shape '
                 f'{tuple(p.shape)} but LeNet needs {shape}; use lenet_params()')


def check_model_kind(net):
    """Reject `net` unless it is a gluon.Block."""
    d2l._check_model(net, gluon.Block, 'gluon.Block')


def check_zero_init(params, devices, stage):
    """Reject a ZeRO stage, or an empty parameter or device list."""
    d2l.check_stage(stage)
    d2l._check_zero_args(params, devices)


def check_zero_step(states, devices, stage, lr, momentum):
    """Reject a rate or momentum, a ZeRO stage, or states that do not fit
    the stage and the devices."""
    check_number(lr, 'lr')
    check_number(momentum, 'momentum', below=1)
    d2l.check_stage(stage)
    d2l._check_zero_states(states, devices, stage)


def _run_rank(rank, worker, world_size, args, out_dir, parent_pid, env):
    """Body of a worker of spawn_ranks: run the worker, store what it gives."""
    _start_rank(rank, out_dir, parent_pid, env)
    try:
        result = worker(rank, world_size, *args)
    except BaseException:
        _record_rank_failure(rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # while the worker's store is alive: see the text
    _finish_rank(rank, out_dir, result)


def _stand_down(watchdog, done):
    """Tell `watchdog` to stand down once this worker has joined a store or `done` is set."""
    while not (_JOB or d2l._STORES) and not done.wait(0.2):
        pass
    watchdog.stdin.close()  # end of its input: the watchdog exits quietly


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
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


@contextlib.contextmanager
def _join_deadline(who, world_size, timeout_s):
    """Say what `who` waits for while the body joins the job; end the process if that takes over `timeout_s`."""
    if _JOB or d2l._STORES:  # joined already: nothing to wait for
        yield
        return
    where = _rendezvous_address()
    until = time.strftime('%H:%M:%S %Z',
                          time.localtime(time.time() + timeout_s))
    print(f'{who} waits for all {world_size} workers at {where} until '
          f'{until} (timeout {timeout_s:g} s)', flush=True)
    message = (f'{who}: no job formed at {where} within {timeout_s:g} s; '
               f'start all {world_size} workers, the scheduler and the '
               f'servers with this address, check that its port is '
               f'reachable, or give a larger timeout')
    watchdog = subprocess.Popen([sys.executable, '-c', _WATCHDOG, str(
        os.getpid()), str(timeout_s), message], stdin=subprocess.PIPE)
    done = threading.Event()
    threading.Thread(target=_stand_down, args=(watchdog, done),
                     daemon=True).start()
    try:
        yield
    finally:
        done.set()
        watchdog.wait()  # it ends when told to stand down


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


def check_pipeline_runs(runs, num_stages, X, y, depth, width):
    """Refuse bad runs or sizes for time_pipeline before anything starts."""
    check_count(depth, 'depth', 1)
    check_count(width, 'width', 1)
    d2l.split_stages(range(depth), num_stages)  # enough blocks for the stages
    check_runs(runs)
    for schedule, m in runs:
        d2l.check_schedule(schedule, num_stages, m)
        d2l.split_microbatches(X, y, m)  # enough examples


def _live_grads(stages):
    """The gradients of the stages' parameters, left in place (None: none)."""
    return [p.grad() for layers in stages for layer in layers
            for p in layer.collect_params().values()]


def _stage_shapes(stages, x):
    """The shape of each stage's output for the input x."""
    shapes = []
    with d2l._no_grad():
        for layers in stages:
            for layer in layers:
                x = layer(x)
            shapes.append(tuple(x.shape))
    return shapes


def _tp_slice(n, allreduce):
    """The slice of `n` features that this rank keeps."""
    sizes = d2l.shard_sizes(n, allreduce.size)
    lo = sum(sizes[:allreduce.rank])
    return slice(lo, lo + sizes[allreduce.rank])


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


def _check_arrangement(allreduce, kind, shape, checksum):
    """Raise on every rank unless all build one layer from one model."""
    table = numpy.zeros((allreduce.size, 4), 'float32')
    table[allreduce.rank] = [kind, *shape, checksum]
    mine = _from_numpy(table)
    found = _to_numpy(allreduce(mine, 'check'))
    names = {1: 'ColumnParallelLinear', 2: 'RowParallelLinear'}
    def describe(row):
        return f'{names[int(row[0])]}({int(row[1])}, {int(row[2])})'

    for rank, row in enumerate(found):
        if not numpy.array_equal(row[:3], found[0][:3]):
            raise ValueError(
                f'rank {rank} builds {describe(row)} where rank 0 builds '
                f'{describe(found[0])}: every rank must build the same '
                f'layers in the same order')
        if not numpy.isclose(row[3], found[0][3], rtol=1e-5):
            raise ValueError(
                f'rank {rank} builds {describe(row)} from other weights than '
                f'rank 0 (weight sums {row[3]:.4f} and {found[0][3]:.4f}): '
                f'build every rank\'s layers from the same model')


def _tp_wrong_worker(rank, world_size, init_method, d, hidden):
    """Worker: three wrong arrangements of the MLP block; the errors raised."""
    with _group(rank, world_size, init_method):
        allreduce, mlp, errors = d2l.CountingAllreduce(), d2l.block_mlp(d, hidden), []
        X, _ = d2l.mlp_data(4, d)
        mistakes = [
            lambda: d2l.ColumnParallelLinear(mlp[0], allreduce) if rank == 0
            else d2l.RowParallelLinear(mlp[2], allreduce),
            lambda: d2l.RowParallelLinear(mlp[2], allreduce)(mlp[1](mlp[0](X))),
            lambda: d2l.tp_mlp(d2l.block_mlp(d, hidden, seed=rank), allreduce)]
        for mistake in mistakes:
            try:
                mistake()
            except ValueError as error:
                errors.append(str(error))
        return errors


def time_all_reduce(world_size, sizes, reps=3, calls=5):
    """Median seconds per push and pull of each byte size in `sizes`."""
    sizes = _check_sizes(sizes, reps)
    check_count(calls, 'calls', 1)
    _check_world_of_two(world_size)
    return _slowest_medians(d2l.spawn_ranks(
        _all_reduce_worker, world_size, 'env://', sizes, reps, calls))


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One worker of time_all_reduce: its seconds per call of each size."""
    with d2l.process_group(rank, world_size, init_method) as device:
        return _all_reduce_rounds(
            [np.zeros(n // 4, ctx=device) for n in sizes], reps, calls,
            npx.waitall)


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


def cost_model_net(model):
    """LeNet ('lenet') or the book's ResNet-18 ('resnet18'), uninitialised."""
    if model == 'lenet':
        net = nn.Sequential()
        net.add(nn.Conv2D(6, 5, padding=2, in_channels=1, activation='relu'),
                nn.MaxPool2D(2),
                nn.Conv2D(16, 5, in_channels=6, activation='relu'),
                nn.MaxPool2D(2), nn.Flatten(),
                nn.Dense(120, 'relu', in_units=400),
                nn.Dense(84, 'relu', in_units=120), nn.Dense(10, in_units=84))
        return net
    if model == 'resnet18':
        return d2l.resnet18(10)
    raise ValueError(f"model must be 'lenet' or 'resnet18', got {model!r}")


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


def _tp_timing_worker(rank, world_size, init_method, d, hidden, batch_size,
                      num_steps, reps):
    """Worker: seconds per pass of the whole MLP block and of its part."""
    with _group(rank, world_size, init_method):
        whole = d2l.block_mlp(d, hidden)
        part = d2l.tp_mlp(d2l.block_mlp(d, hidden), d2l.CountingAllreduce())
        X, Y = d2l.mlp_data(batch_size, d)
        jobs = [lambda net=net: [d2l.mlp_pass(net, X, Y)
                                 for _ in range(num_steps)]
                for net in (whole, part)]
        for job in jobs:  # untimed: the first pass sets up buffers
            job()
        seconds = _alternating_rounds(jobs, reps, _tp_barrier)
        return [[s / num_steps for s in row] for row in seconds]


def ddp_script_path(framework=None):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'."""
    return _script_path('mxnet' if framework is None else framework)


__all__ = [
    '_device_name', '_device_names', '_one_thread', '_batchify_resized',
    '_worker_context', '_free_ports', '_start_servers',
    'launch_local_job', '_end_with_launcher', '_serve',
    'check_lenet_args', 'check_model_kind', 'check_zero_init',
    'check_zero_step', '_run_rank', '_stand_down', '_rendezvous_address',
    '_WAITS', '_STORE_CALLS', '_store_timeout', '_bound_store_waits',
    '_flat_arrays', '_bounded_call', '_close_wait', '_await_pulls',
    '_watch_store_waits', '_end_waiting_rank',
    '_JOB', '_job_store', '_leave_failed_worker', '_join_deadline',
    '_waiting_init_params', 'check_pipeline_runs', '_live_grads', '_stage_shapes',
    '_tp_slice', '_to_numpy', '_parameter', '_from_numpy', '_stores',
    '_dist_store', '_group', '_check_arrangement', '_tp_wrong_worker',
    'time_all_reduce', '_all_reduce_worker', '_all_reduce_rounds',
    'cost_model_net', 'gradient_bytes', 'time_compute', '_compute_worker',
    '_tp_barrier', '_rendezvous', '_tp_timing_worker', 'ddp_script_path',
]

# Last: the generated module imports this one at its top.
from d2l import mxnet as d2l  # noqa: E402
