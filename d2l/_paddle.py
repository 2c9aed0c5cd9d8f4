"""The PaddlePaddle side of the d2l machinery (see d2l/runtime.py).

What the machinery must do with PaddlePaddle itself: join and leave process groups,
move tensors between processes, time steps. The book's helpers reach it
through `from d2l import paddle as d2l`."""
import contextlib
import logging
import multiprocessing.connection
import numpy
import numpy as np
import os
import queue
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
import threading
import warnings
from paddle import nn
from d2l.runtime import *  # noqa: F401,F403

# Notices that PaddlePaddle repeats on every training step, in this process
# and in the processes it starts.
warnings.filterwarnings('ignore', message='When training, we now always track')
warnings.filterwarnings('ignore',
                        message='Your model will be trained under CPUONLY')
os.environ.setdefault('GLOG_minloglevel', '2')
os.environ.setdefault('PYTHONWARNINGS', ','.join(
    f'ignore::UserWarning:{module}' for module in (
        'paddle.nn.layer.norm', 'paddle.utils.cpp_extension.extension_utils')))


def _device_name(device):
    """A short name for `device` and whether it is a GPU."""
    if isinstance(device, paddle.CUDAPlace) or device.is_gpu_place():
        return f'gpu:{device.get_device_id()}', True
    if not device.is_cpu_place():
        raise TypeError(f'not a CPU or GPU place: {device!r}')
    return 'cpu', False


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


if 'FLAGS_paddle_num_threads' not in os.environ:
    paddle.base.core.set_num_threads(os.cpu_count() or 1)


def _one_thread():
    """Let every operator of this process run on a single thread."""
    paddle.base.core.set_num_threads(1)


def _collate_resized(batch, size):
    """Stack (image, label) pairs into a minibatch, resizing if asked."""
    X = paddle.to_tensor(np.stack([x for x, _ in batch]))
    y = paddle.to_tensor(np.array([t for _, t in batch]))
    if size is not None:
        X = F.interpolate(X, size=size, mode='bilinear', align_corners=False)
    return X, y


class ArrayDataset(paddle.io.Dataset):
    """A map-style dataset over equally long NumPy arrays."""
    def __init__(self, *arrays):
        super().__init__()
        lengths = [len(a) for a in arrays]
        if not arrays or len(set(lengths)) != 1:
            raise ValueError(f'arrays must be one or more arrays of equal '
                             f'length, got lengths {lengths}')
        self.arrays = arrays

    def __getitem__(self, idx):
        return tuple(a[idx] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


def _spawn_variables():
    """Names of the variables that paddle.distributed.spawn set here."""
    return [name for name in os.environ
            if name.startswith(('PADDLE_', 'FLAGS_selected_'))]


def _group_from_env(rank, world_size, init_method):
    """Check a rank and world size against the group that spawn or launch described in the environment."""
    if 'PADDLE_TRAINER_ID' not in os.environ:
        raise RuntimeError(
            'no process group is described in the environment: run this code '
            'in a process started by d2l.spawn_ranks, paddle.distributed.spawn '
            'or python -m paddle.distributed.launch')
    given = (_int_from_env('PADDLE_TRAINER_ID', 0),
             _int_from_env('PADDLE_TRAINERS_NUM', 1))
    if (rank, world_size) != given:
        raise ValueError(f'rank {rank} of world_size {world_size} does not '
                         f'match the environment, which says rank {given[0]} '
                         f'of {given[1]}')
    if init_method != 'env://':
        raise ValueError(f"init_method must be 'env://' in PaddlePaddle, which "
                         f'reads the rendezvous from the environment; got '
                         f'{init_method!r}')
    hosts = os.environ.get('PADDLE_TRAINER_ENDPOINTS', '').split(',')
    if all(_is_loopback(host.rsplit(':', 1)[0]) for host in hosts):
        os.environ['GLOO_SOCKET_IFNAME'] = _loopback_interface()


def _set_group_timeout(timeout_s, device):
    """Give an NCCL group `timeout_s`, else a launcher's --timeout or spawn_ranks' GROUP_TIMEOUT_S; refuse one for Gloo, whose is fixed."""
    if timeout_s is None and d2l.ddp_backend(device) == 'nccl':
        timeout_s = _PROCESS['group_timeout_s']
    if timeout_s is not None:
        if d2l.ddp_backend(device) != 'nccl':
            raise ValueError("timeout_s must be None on the CPU: PaddlePaddle's "
                             'Gloo group has a fixed timeout of 30 s')
        os.environ['PADDLE_PG_TIMEOUT'] = str(int(timeout_s * 1000))


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
    """Reject `net` unless it is a paddle.nn.Layer."""
    d2l._check_model(net, nn.Layer, 'paddle.nn.Layer')


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


@contextlib.contextmanager
def _quiet_spawn():
    """Keep PaddlePaddle's start-up notices out of the output while processes start (also from code without a file)."""
    with _no_main_rerun():
        with _quiet_notices():
            yield


@contextlib.contextmanager
def _quiet_notices():
    """Keep PaddlePaddle's start-up notices out of the output in the body of a `with` block."""
    quiet = {'GLOG_minloglevel': '2',  # no C++ INFO or WARNING lines
             'PYTHONWARNINGS': 'ignore::UserWarning'}  # import notices
    saved = {key: os.environ.get(key) for key in quiet}  # restored at the end
    os.environ.update(quiet)
    launcher_log = logging.getLogger('root')  # Paddle logs free ports here
    level = launcher_log.level
    launcher_log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='.*CPUONLY mode')
            yield
    finally:
        launcher_log.setLevel(level)
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def check_spawn_args(net_fn, devices, batch_size, lr, num_epochs, seed=0):
    """Reject arguments of train_concise_spawn that cannot work, saying which."""
    if isinstance(net_fn, nn.Layer) or not callable(net_fn):
        raise TypeError('net_fn must be a function that builds the model, got '
                        f'{type(net_fn).__name__}; pass e.g. '
                        'functools.partial(d2l.resnet18, 10)')
    check_devices(devices)
    for name, value in (('batch_size', batch_size), ('num_epochs', num_epochs)):
        d2l.check(d2l.is_count(value, 1),
                     f'{name} must be a positive integer, got {value!r}')
    k = len(devices)
    d2l.check(batch_size % k == 0, f'batch_size {batch_size} cannot be shared '
                 f'equally by {k} processes; use a multiple of {k}')
    d2l.check_number(lr, 'lr')
    _check_seed(seed)


def spawn_per_device(worker, devices, folder, *args):
    """Run worker(*args) in a process per device; their results by rank."""
    gpus = [str(d.get_device_id()) for d in devices
            if isinstance(d, paddle.CUDAPlace)]
    options = {'backend': 'nccl', 'gpus': ','.join(gpus)} if gpus else {
        'backend': 'gloo'}
    with _quiet_spawn():  # forked with this process's environment
        context = paddle.distributed.spawn(
            _run_in_environment, nprocs=len(devices), join=False,
            args=(worker, args, dict(os.environ), folder),
            start_method=_fork_server(), **options)
    try:  # not context.join(): it can wait for good on a failed process
        codes = _wait_for_ranks(context.processes, folder, None)
    finally:  # after a failure or an interrupt, leave no process behind
        _stop_processes(context.processes)  # SIGKILL if SIGTERM fails
    if codes is not None:  # the earliest error is the cause, as in spawn_ranks
        raise _rank_failure(folder, len(devices), codes) from None
    return [queue.get() for queue in context.return_queues]


def _run_in_environment(worker, args, env, folder):
    """worker(*args) after taking `env`; an error is written to `folder`."""
    _take_environment(env, keep=_spawn_variables())  # spawn's own stay
    _PROCESS['report_dir'] = folder  # as in the processes of spawn_ranks
    try:
        return worker(*args)
    except BaseException:
        _record_rank_failure(int(os.environ.get('PADDLE_TRAINER_ID', '0')))
        raise


def start_spawned_process(folder):
    """Join the group, output to rank<r>.log; return rank, world, device."""
    rank = int(os.environ.get('PADDLE_TRAINER_ID', '0'))
    log = os.open(os.path.join(folder, f'rank{rank}.log'),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):  # start-up notices, C++ log lines, abort reports
        os.dup2(log, stream)
    dist = paddle.distributed
    dist.init_parallel_env()  # also makes this process's GPU the current one
    world = dist.get_world_size()
    device = paddle.get_device()  # 'gpu:<rank's GPU>' or 'cpu'
    if device == 'cpu':  # the processes share the cores
        threads = max(1, (os.cpu_count() or 1) // world)
        paddle.base.core.set_num_threads(threads)
    return rank, world, device


def _run_rank(worker, args, out_dir, parent_pid, env):
    """Body of a process of spawn_ranks: run the worker, store its outcome."""
    rank = _int_from_env('PADDLE_TRAINER_ID', 0)  # set by spawn
    _start_rank(rank, out_dir, parent_pid, env, keep=_spawn_variables())
    try:
        result = worker(rank, _int_from_env('PADDLE_TRAINERS_NUM', 1), *args)
    except BaseException:
        _record_rank_failure(rank)  # unless process_group already did
        raise
    _finish_rank(rank, out_dir, result)


def _stand_down(watchdog, done, world_size):
    """Tell `watchdog` to stand down once a process group has formed or `done` is set."""
    while world_size > 1 and not dist.is_initialized() and not done.wait(0.2):
        pass
    watchdog.stdin.close()  # end of its input: the watchdog exits quietly


def _rendezvous_address():
    """host:port of the rendezvous that PaddlePaddle will use, from the environment."""
    if os.environ.get('MASTER_ADDR') and os.environ.get('MASTER_PORT'):
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return (os.environ.get('PADDLE_MASTER') or os.environ.get(
        'PADDLE_TRAINER_ENDPOINTS', '(unset)').split(',')[0])


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
    return [p.grad for layers in stages for layer in layers
            for p in layer.parameters()]


def _stage_shapes(stages, x):
    """The shape of each stage's output for the input x."""
    shapes = []
    with d2l._no_grad():
        for layers in stages:
            for layer in layers:
                x = layer(x)
            shapes.append(tuple(x.shape))
    return shapes


def _pump(box, peer, group, sending, shapes, rank, device, errors):
    """Carry this rank's messages to or from `peer` through `box`, in order."""
    try:
        for i in range(len(shapes)):
            if sending:
                dist.send(box.get(), peer, group)
                continue
            x = d2l.tensor(numpy.zeros(shapes[i][min(rank, peer)],
                                    numpy.float32), device)
            dist.recv(x, peer, group)
            box.put(x)
    except BaseException as error:
        errors.append(error)
        box.put(error)  # for a waiting recv


def _direction_groups(world_size, _made={}):
    """A group for each neighbour pair and direction ('F', 'B'), made once."""
    if world_size not in _made:  # every rank makes them in the same order
        _made[world_size] = {(s, op): dist.new_group([s, s + 1])
                             for s in range(world_size - 1) for op in 'FB'}
    return _made[world_size]


def _p2p_link(shapes, timeout_s, device):
    """send and recv between neighbour ranks; finish waits for the sends."""
    rank, p = dist.get_rank(), dist.get_world_size()
    groups, boxes, threads, errors = _direction_groups(p), {}, [], []
    for op, peer, sending in (('F', rank + 1, True), ('B', rank - 1, True),
                              ('F', rank - 1, False), ('B', rank + 1, False)):
        if 0 <= peer < p:  # one thread per peer and direction
            boxes[op, peer] = queue.Queue()
            threads.append(threading.Thread(target=_pump, daemon=True, args=(
                boxes[op, peer], peer, groups[min(rank, peer), op], sending,
                shapes, rank, device, errors)))
            threads[-1].start()
    send = lambda stage, op, i, x: boxes[op, stage].put(x.detach())
    def recv(source, op, i):
        try:
            x = boxes[op, source].get(timeout=timeout_s)
        except queue.Empty:
            x = TimeoutError(f'rank {rank} waited {timeout_s:g} s for {op} '
                             f'of micro-batch {i} from rank {source}')
        if isinstance(x, BaseException):
            raise x
        return x
    def finish():
        for thread in threads:
            thread.join(timeout_s)
        if errors or any(thread.is_alive() for thread in threads):
            raise errors[0] if errors else TimeoutError(
                f'rank {rank}: messages unfinished after {timeout_s:g} s')
    return send, recv, finish


def _tp_slice(n, allreduce):
    """The slice of `n` features that this rank keeps."""
    sizes = d2l.shard_sizes(n, allreduce.size)
    lo = sum(sizes[:allreduce.rank])
    return slice(lo, lo + sizes[allreduce.rank])


def _new_group(ranks):
    """A process group of `ranks`, formed before the next one starts."""
    group = dist.new_group(ranks)
    dist.barrier()  # Gloo groups formed at once could fail to connect
    return group


_nbytes = lambda x: x.size * x.element_size()


_to_numpy = lambda x: x.numpy()


_from_numpy = paddle.to_tensor


def _group(rank, world_size, init_method):
    """The process group of a tensor-parallel worker (as process_group)."""
    return d2l.process_group(rank, world_size, init_method)


def _parameter(layer, value):
    """A parameter of `layer` holding a copy of the NumPy array `value`."""
    return layer.create_parameter(
        list(value.shape), default_initializer=nn.initializer.Assign(value))


def _check_arrangement(allreduce, kind, shape, checksum):
    """Raise on every rank unless all build one layer from one model."""
    table = numpy.zeros((allreduce.size, 4), 'float32')
    table[allreduce.rank] = [kind, *shape, checksum]
    mine = d2l._from_numpy(table)
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
    with d2l._group(rank, world_size, init_method):
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
    """Median seconds per all_reduce of each byte size in `sizes`."""
    # each over `world_size` processes, timed over `calls` calls in a row
    sizes = _check_sizes(sizes, reps)
    check_count(calls, 'calls', 1)
    _check_world_of_two(world_size)
    # PaddlePaddle's spawn passes the rendezvous in the environment.
    return _slowest_medians(d2l.spawn_ranks(
        _all_reduce_worker, world_size, 'env://', sizes, reps, calls))


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One process of time_all_reduce: its seconds per call for each size."""
    with d2l.process_group(rank, world_size, init_method):
        sync = paddle.device.cuda.synchronize if d2l.num_gpus() else lambda: None
        return _all_reduce_rounds([paddle.zeros([n // 4]) for n in sizes],
                                  reps, calls, sync)


def _all_reduce_rounds(bufs, reps, calls, sync):
    """Seconds per all_reduce of each buffer in `reps` rounds of `calls`."""
    for x in bufs:
        dist.all_reduce(x)  # untimed: the first call sets up buffers
    seconds = _alternating_rounds(
        [lambda x=x: [dist.all_reduce(x) for _ in range(calls)]
         for x in bufs], reps, dist.barrier, sync)
    return [[s / calls for s in row] for row in seconds]


def cost_model_net(model):
    """LeNet ('lenet') or the book's ResNet-18 ('resnet18') as a module."""
    if model == 'lenet':
        return nn.Sequential(
            nn.Conv2D(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2D(2),
            nn.Conv2D(6, 16, 5), nn.ReLU(), nn.MaxPool2D(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10))
    if model == 'resnet18':
        return d2l.resnet18(10)
    raise ValueError(f"model must be 'lenet' or 'resnet18', got {model!r}")


def gradient_bytes(net):
    """Bytes of float32 gradients one allreduce of `net`'s parameters moves."""
    return sum(p.numel().item() * 4 for p in net.parameters() if p.trainable)


def time_compute(model, batch_size, threads=None, num_steps=2, warmup=1,
                 reps=3, bf16=False):
    """Median seconds per plain SGD step of `model` in this process."""
    # on `batch_size` images, with `threads` CPU threads
    cost_model_net(model)  # rejects an unknown name
    check_timing(num_steps, warmup, 1 if threads is None else threads, reps)
    if threads is not None:
        paddle.base.core.set_num_threads(threads)
    try:
        paddle.seed(0)
        net = cost_model_net(model)
        runs = [(net, paddle.optimizer.SGD(learning_rate=0.01,
                                           parameters=net.parameters()),
                 dict(accumulate=1, bf16=bf16))]
        X, y = d2l.timing_batch(batch_size)
        return _slowest_medians([_time_runs(runs, X, y, num_steps, warmup,
                                            reps)])[0]
    finally:  # Paddle cannot report its setting: back to the package's
        if threads is not None:
            paddle.base.core.set_num_threads(int(os.environ.get(
                'FLAGS_paddle_num_threads', os.cpu_count() or 1)))


def _sgd_steps(net, optimizer, X, y, num_steps, accumulate=1, bf16=False,
               step_end=lambda: None):
    """Take `num_steps` SGD steps of `accumulate` micro-batches (X, y) each."""
    # step_end is called after each step
    for _ in range(num_steps):
        optimizer.clear_grad()
        for i in range(accumulate):
            # DataParallel's no_sync skips the allreduce of all but the last.
            skip = net.no_sync() if i < accumulate - 1 and hasattr(
                net, 'no_sync') else contextlib.nullcontext()
            with skip:
                with paddle.amp.auto_cast(enable=bf16, dtype='bfloat16'):
                    loss = F.cross_entropy(net(X), y)
                loss.backward()
        optimizer.step()
        step_end()
    if d2l.num_gpus():
        paddle.device.cuda.synchronize()


def _time_runs(runs, X, y, num_steps, warmup, reps, wait=lambda: None):
    """This process's seconds per micro-batch of each run in `runs`."""
    # runs: (net, optimizer, config) triples, timed in alternating rounds
    for net, optimizer, c in runs:  # untimed: DDP also settles its buckets
        _sgd_steps(net, optimizer, X, y, warmup, c['accumulate'], c['bf16'])
    # Plain copies wait for one another after each step, as DDP's processes
    # do at its allreduce: a step lasts as long as the slowest process's.
    jobs = [lambda r=r: _sgd_steps(
                r[0], r[1], X, y, num_steps, r[2]['accumulate'], r[2]['bf16'],
                wait if r[2].get('ddp') is False else lambda: None)
            for r in runs]
    seconds = _alternating_rounds(jobs, reps, wait)
    return [[s / (num_steps * c['accumulate'])
             for s, (_, _, c) in zip(row, runs)] for row in seconds]


def _check_configs(configs):
    """Each DDP configuration with its defaults; unknown keys rejected."""
    defaults = dict(model='resnet18', accumulate=1, bucket_cap_mb=25,
                    bf16=False, compress=False, ddp=True)
    out = []
    for c in configs:
        if not isinstance(c, dict) or set(c) - set(defaults):
            raise ValueError(f'each config must be a dict with keys among '
                             f'{sorted(defaults)}, got {c!r}')
        out.append(dict(defaults, **c))
        cost_model_net(out[-1]['model'])  # rejects an unknown model
        check_count(out[-1]['accumulate'], 'accumulate', 1)
        d2l.ddp_buckets(1, out[-1]['bucket_cap_mb'])  # rejects a size <= 0
        if not isinstance(out[-1]['ddp'], bool):
            raise ValueError(f"ddp must be True or False, got "
                             f"{out[-1]['ddp']!r}")
        if out[-1]['compress'] and not out[-1]['ddp']:
            raise ValueError('compress=True needs ddp=True: a plain copy '
                             'of the network sends no gradients')
    if not out:
        raise ValueError("configs is empty; give dicts such as "
                         "{'model': 'lenet'}")
    return out


def _ddp_model(c, device):
    """A seeded DataParallel (plain if not c['ddp']) model, and its SGD."""
    paddle.seed(0)
    net = cost_model_net(c['model'])
    if c['ddp']:
        net = paddle.DataParallel(net, comm_buffer_size=c['bucket_cap_mb'])
    return net, paddle.optimizer.SGD(learning_rate=0.01,
                                     parameters=net.parameters())


def time_ddp_configs(world_size, configs, global_batch, num_steps=2,
                     warmup=1, reps=3):
    """Median seconds per micro-batch of DDP training for each config."""
    # `world_size` processes share `global_batch` examples
    configs = _check_configs(configs)
    check_timing(num_steps, warmup, 1, reps)
    if any(c['compress'] for c in configs):
        raise ValueError('compress=True: DataParallel has no compression hook')
    d2l.local_batch_size(global_batch, world_size)  # fail here, not in a child
    if world_size == 1:  # Paddle forms no group of one: time it here,
        paddle.base.core.set_num_threads(1)  # on one core's thread
        try:
            return _slowest_medians([_time_configs(
                configs, global_batch, num_steps, warmup, reps, 0, 1)])
        finally:
            paddle.base.core.set_num_threads(int(os.environ.get(
                'FLAGS_paddle_num_threads', os.cpu_count() or 1)))
    return _slowest_medians(d2l.spawn_ranks(
        _ddp_configs_worker, world_size, 'env://', configs, global_batch,
        num_steps, warmup, reps))


def _ddp_configs_worker(rank, world_size, init_method, configs, global_batch,
                        num_steps, warmup, reps):
    """One process of time_ddp_configs: join the group, time the configs."""
    with d2l.process_group(rank, world_size, init_method):
        return _time_configs(configs, global_batch, num_steps, warmup, reps,
                             rank, world_size)


def _time_configs(configs, global_batch, num_steps, warmup, reps, rank,
                  world_size):
    """This process's seconds per micro-batch of each config, alternating."""
    device = d2l.ddp_device(rank, world_size)
    share = d2l.local_batch_size(global_batch, world_size)
    X, y = (t[rank * share:(rank + 1) * share].to(device)
            for t in d2l.timing_batch(global_batch))
    runs = [(*_ddp_model(c, device), c) for c in configs]
    # A single process has no group to wait for.
    wait = dist.barrier if world_size > 1 else lambda: None
    return _time_runs(runs, X, y, num_steps, warmup, reps, wait)


_tp_barrier = lambda: dist.barrier()  # all ranks start a timing together


def _tp_timing_worker(rank, world_size, init_method, d, hidden, batch_size,
                      num_steps, reps):
    """Worker: seconds per pass of the whole MLP block and of its part."""
    with d2l._group(rank, world_size, init_method):
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
    return _script_path('paddle' if framework is None else framework)


__all__ = [
    '_device_name', '_device_names', '_one_thread', '_collate_resized',
    'ArrayDataset', '_spawn_variables', '_group_from_env',
    '_set_group_timeout', 'check_lenet_args',
    'check_model_kind', 'check_zero_init', 'check_zero_step', '_quiet_spawn',
    '_quiet_notices',
    'check_spawn_args', 'spawn_per_device', '_run_in_environment',
    'start_spawned_process', '_run_rank', '_stand_down', '_rendezvous_address',
    'check_pipeline_runs', '_live_grads', '_stage_shapes', '_pump', '_direction_groups',
    '_p2p_link', '_tp_slice', '_new_group', '_nbytes', '_to_numpy',
    '_from_numpy', '_group', '_parameter', '_check_arrangement',
    '_tp_wrong_worker', 'time_all_reduce', '_all_reduce_worker',
    '_all_reduce_rounds', 'cost_model_net', 'gradient_bytes', 'time_compute',
    '_sgd_steps', '_time_runs', '_check_configs', '_ddp_model',
    'time_ddp_configs', '_ddp_configs_worker', '_time_configs', '_tp_barrier',
    '_tp_timing_worker', 'ddp_script_path',
]

# Last: the generated module imports this one at its top.
from d2l import paddle as d2l  # noqa: E402
