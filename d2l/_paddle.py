"""The PaddlePaddle side of the d2l machinery (see d2l/runtime.py).

What the machinery must do with PaddlePaddle itself: join and leave process groups,
move tensors between processes, time steps. The book's helpers reach it
through `from d2l import paddle as d2l`."""
import contextlib
import logging
import numpy
import numpy as np
import os
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
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


def check_model_kind(net):
    """Reject `net` unless it is a paddle.nn.Layer."""
    d2l._check_model(net, nn.Layer, 'paddle.nn.Layer')


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
    if device == 'cpu':  # a device is a core: one thread, on core `rank`
        d2l.use_one_core(rank)
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


def _rendezvous_address():
    """host:port of the rendezvous that PaddlePaddle will use, from the environment."""
    if os.environ.get('MASTER_ADDR') and os.environ.get('MASTER_PORT'):
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return (os.environ.get('PADDLE_MASTER') or os.environ.get(
        'PADDLE_TRAINER_ENDPOINTS', '(unset)').split(',')[0])


def _new_group(ranks):
    """A process group of `ranks`, formed before the next one starts."""
    group = dist.new_group(ranks)
    dist.barrier()  # Gloo groups formed at once could fail to connect
    return group


_nbytes = lambda x: x.size * x.element_size()


_to_numpy = lambda x: x.numpy()


_from_numpy = paddle.to_tensor


def _parameter(layer, value):
    """A parameter of `layer` holding a copy of the NumPy array `value`."""
    return layer.create_parameter(
        list(value.shape), default_initializer=nn.initializer.Assign(value))


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One process of time_all_reduce: its seconds per call for each size."""
    with d2l.process_group(rank, world_size, init_method):
        sync = paddle.device.cuda.synchronize if d2l.num_gpus() else lambda: None
        return _all_reduce_rounds([paddle.zeros([n // 4]) for n in sizes],
                                  reps, calls, sync)


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


_lenet_net = lambda: _cost_model_lenet(nn, nn.Conv2D, nn.MaxPool2D)


def _step_loss(net, X, y, bf16):
    """The cross-entropy loss of net(X), under bfloat16 autocast if `bf16`."""
    with paddle.amp.auto_cast(enable=bf16, dtype='bfloat16'):
        return F.cross_entropy(net(X), y)


_clear_grads = lambda optimizer: optimizer.clear_grad()


def _synchronize(X):
    """Wait for the GPU, if any, to finish its queued work."""
    if d2l.num_gpus():
        paddle.device.cuda.synchronize()


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


def ddp_script_path(framework=None):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'."""
    return _script_path('paddle' if framework is None else framework)


# The pipeline page's per-framework parts (run_device, run_pipeline)
def _grads(layers):
    """The parameters' gradients as NumPy arrays, then cleared."""
    params = [p for layer in layers for p in layer.parameters()]
    grads = [p.grad.numpy() for p in params]
    for p in params:
        p.clear_gradient()
    return grads


def _leaf(x):
    """A copy of x that collects its own gradient: a block's input."""
    x = x.detach()
    x.stop_gradient = False
    return x


_thread_setup = lambda: None  # nothing to prepare in a new thread
_sync = lambda x: x.place.is_gpu_place() and paddle.device.synchronize()
_rendezvous = lambda: 'env://'  # spawn_ranks describes the group


def _place(stages, device):
    """Move the layers of `stages`, a dict stage -> layers, to `device`."""
    for layers in stages.values():
        for layer in layers:
            layer.to(device=device)
    return stages


# Last: the generated module imports this one at its top. Imported first
# (as unpickling a worker of this module does), this one is star-imported
# while incomplete, and _adopt completes the generated module.
__all__ = _exports(globals())
from d2l import paddle as d2l  # noqa: E402
_adopt(globals(), _shared_helpers(d2l) + _group_helpers(d2l, dist), d2l)
__all__ = _exports(globals())
