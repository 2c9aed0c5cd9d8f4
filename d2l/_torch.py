"""The PyTorch side of the d2l machinery (see d2l/runtime.py).

What the machinery must do with PyTorch itself: join and leave process groups,
move tensors between processes, time steps. The book's helpers reach it
through `from d2l import torch as d2l`."""
import contextlib
import datetime
import multiprocessing.connection
import numpy
import os
import queue
import socket
import sys
import threading
import time
import torch
import torch.distributed as dist
import torch.nn.functional as F
import urllib.error
import urllib.request
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from d2l.runtime import *  # noqa: F401,F403


def _device_name(device):
    """A short name for `device` and whether it is a GPU."""
    return str(device), device.type == 'cuda'


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
    """Let every operator of this process run on a single thread."""
    torch.set_num_threads(1)


def _collate_resized(batch, size):
    """Stack (image, label) pairs into a minibatch, resizing if asked."""
    X = torch.stack([x for x, _ in batch])
    y = torch.stack([t for _, t in batch])
    if size is not None:
        X = F.interpolate(X, size=size, mode='bilinear', align_corners=False)
    return X, y


_ABANDONED = []  # models of failed groups, never freed (see _run_rank)


def _exit_if_abandoned():
    """End a rank that keeps a model of a failed group without running destructors."""
    if _ABANDONED:  # freeing them can deadlock in ProcessGroupGloo's destructor
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _leave_failed_rank():
    """End a rank whose error is stored without running destructors."""
    sys.stdout.flush()  # tearing down a failed Gloo group can deadlock
    sys.stderr.flush()
    os._exit(1)


def _destroy_after_barrier():
    """Free the process group a moment after a barrier that all ranks passed."""
    # Gloo's thread frees the barrier's work after it completes and needs
    # the GIL for that; freeing the group before then can deadlock.
    time.sleep(0.1)
    dist.destroy_process_group()


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
    """Reject `net` unless it is a torch.nn.Module."""
    d2l._check_model(net, nn.Module, 'torch.nn.Module')


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


def time_data_parallel(num_devices, global_batch, num_steps, warmup=1,
                       model_fn=None):
    """Seconds per step of nn.DataParallel over GPUs 0..num_devices-1."""
    # without GPUs: a plain model on the CPU
    d2l.check_count(num_devices, 'num_devices', 1)
    d2l.check_count(global_batch, 'global_batch', 1)
    d2l.check_count(num_steps, 'num_steps', 1)
    d2l.check_count(warmup, 'warmup')
    use_gpus = d2l.num_gpus() >= num_devices
    device = torch.device('cuda', 0) if use_gpus else torch.device('cpu')
    torch.manual_seed(0)
    net = (model_fn() if model_fn else d2l.resnet18(10)).to(device)
    if use_gpus:  # without GPUs, nn.DataParallel would just call the model
        net = nn.DataParallel(net, device_ids=list(range(num_devices)))
    X, y = d2l.timing_batch(global_batch)
    return d2l.time_steps(net, d2l._sgd(net, 0.01), X.to(device), y.to(device),
                      num_steps, warmup, device)


def _join_group(backend, init_method, rank, world_size, timeout_s):
    """Join the default process group; a rendezvous on loopback listens on loopback only."""
    if timeout_s is None:
        timeout_s = _PROCESS['group_timeout_s']
    timeout = timeout_s and datetime.timedelta(seconds=timeout_s)  # or None
    url = urllib.parse.urlsplit(init_method)
    host, port = url.hostname, url.port
    if url.scheme == 'env':  # set by torchrun, or by hand
        host = os.environ.get('MASTER_ADDR')
        port = _int_from_env('MASTER_PORT', 1)
    if _is_loopback(host):
        os.environ['GLOO_SOCKET_IFNAME'] = _loopback_interface()
    # Under torchrun its agent runs the store, on every interface.
    agent = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    if url.scheme not in ('tcp', 'env') or not port or agent \
            or not _is_loopback(host):
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timeout)
        return
    listener = None
    if rank == 0:  # TCPStore itself would listen on all interfaces
        listener = socket.create_server((host, port)).detach()
    store = dist.TCPStore(host, port, world_size, rank == 0,
                          timeout or dist.default_pg_timeout,
                          master_listen_fd=listener)
    dist.init_process_group(backend, store=store, rank=rank,
                            world_size=world_size, timeout=timeout)


def _run_rank(rank, worker, world_size, args, out_dir, parent_pid, env):
    """Body of a process of spawn_ranks: run the worker, store its outcome."""
    _start_rank(rank, out_dir, parent_pid, env)
    try:
        result = worker(rank, world_size, *args)
    except BaseException:
        _record_rank_failure(rank)  # unless process_group already did
        _leave_failed_rank()
    _finish_rank(rank, out_dir, result)
    _exit_if_abandoned()


def _stand_down(watchdog, done, world_size):
    """Tell `watchdog` to stand down once a process group has formed or `done` is set."""
    while world_size > 1 and not dist.is_initialized() and not done.wait(0.2):
        pass
    watchdog.stdin.close()  # end of its input: the watchdog exits quietly


def _rendezvous_address():
    """host:port of the rendezvous that torchrun described in the environment."""
    return (f"{os.environ.get('MASTER_ADDR', '(MASTER_ADDR unset)')}:"
            f"{os.environ.get('MASTER_PORT', '(MASTER_PORT unset)')}")


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


_from_numpy = torch.from_numpy


def _group(rank, world_size, init_method):
    """The process group of a tensor-parallel worker (as process_group)."""
    return d2l.process_group(rank, world_size, init_method)


_new_group = dist.new_group


_nbytes = lambda x: x.numel() * x.element_size()


def _to_numpy(x):
    """A NumPy copy of the tensor `x`, gathered first if it is a DTensor."""
    x = x.full_tensor() if hasattr(x, 'full_tensor') else x
    return x.detach().numpy()


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
    return _slowest_medians(d2l.spawn_ranks(
        _all_reduce_worker, world_size, d2l.local_init_method(), sizes, reps,
        calls))


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One process of time_all_reduce: its seconds per call for each size."""
    with d2l.process_group(rank, world_size, init_method) as device:
        sync = (lambda: torch.cuda.synchronize(device)) \
            if device.type == 'cuda' else (lambda: None)
        return _all_reduce_rounds(
            [torch.zeros(n // 4, device=device) for n in sizes], reps, calls,
            sync)


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
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10))
    if model == 'resnet18':
        return d2l.resnet18(10)
    raise ValueError(f"model must be 'lenet' or 'resnet18', got {model!r}")


def gradient_bytes(net):
    """Bytes of float32 gradients one allreduce of `net`'s parameters moves."""
    return sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)


def time_compute(model, batch_size, threads=None, num_steps=2, warmup=1,
                 reps=3, bf16=False):
    """Median seconds per plain SGD step of `model` in this process."""
    # on `batch_size` images, with `threads` CPU threads
    cost_model_net(model)  # rejects an unknown name
    check_timing(num_steps, warmup, 1 if threads is None else threads, reps)
    device = d2l.try_gpu()
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or saved_threads)
    try:
        torch.manual_seed(0)
        net = cost_model_net(model).to(device)
        runs = [(net, torch.optim.SGD(net.parameters(), lr=0.01),
                 dict(accumulate=1, bf16=bf16))]
        X, y = (t.to(device) for t in d2l.timing_batch(batch_size))
        return _slowest_medians([_time_runs(runs, X, y, num_steps, warmup,
                                            reps)])[0]
    finally:
        torch.set_num_threads(saved_threads)


def _sgd_steps(net, optimizer, X, y, num_steps, accumulate=1, bf16=False,
               step_end=lambda: None):
    """Take `num_steps` SGD steps of `accumulate` micro-batches (X, y) each."""
    # step_end is called after each step
    for _ in range(num_steps):
        optimizer.zero_grad()
        for i in range(accumulate):
            # DDP's no_sync skips the allreduce of all but the last one.
            skip = net.no_sync() if i < accumulate - 1 and hasattr(
                net, 'no_sync') else contextlib.nullcontext()
            with skip:
                with torch.autocast(X.device.type, dtype=torch.bfloat16,
                                    enabled=bf16):
                    loss = F.cross_entropy(net(X), y)
                loss.backward()
        optimizer.step()
        step_end()
    if X.device.type == 'cuda':
        torch.cuda.synchronize(X.device)


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
    """A seeded DDP (plain if not c['ddp']) model for `c`, and its SGD."""
    torch.manual_seed(0)
    net = cost_model_net(c['model']).to(device)
    if c['ddp']:
        net = DDP(net, bucket_cap_mb=c['bucket_cap_mb'])
    if c['compress']:  # bf16 needs NCCL; fp16 sends as many bytes
        net.register_comm_hook(None, default_hooks.bf16_compress_hook
            if device.type == 'cuda' else default_hooks.fp16_compress_hook)
    return net, torch.optim.SGD(net.parameters(), lr=0.01)


def time_ddp_configs(world_size, configs, global_batch, num_steps=2,
                     warmup=1, reps=3):
    """Median seconds per micro-batch of DDP training for each config."""
    # `world_size` processes share `global_batch` examples
    configs = _check_configs(configs)
    check_timing(num_steps, warmup, 1, reps)
    d2l.local_batch_size(global_batch, world_size)  # fail here, not in a child
    return _slowest_medians(d2l.spawn_ranks(
        _ddp_configs_worker, world_size, d2l.local_init_method(), configs,
        global_batch, num_steps, warmup, reps))


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
    return _script_path('torch' if framework is None else framework)


__all__ = [
    '_device_name', '_device_names', '_one_thread', '_collate_resized',
    '_ABANDONED', '_exit_if_abandoned', '_leave_failed_rank',
    '_destroy_after_barrier', 'check_lenet_args', 'check_model_kind',
    'check_zero_init', 'check_zero_step', 'time_data_parallel', '_join_group',
    '_run_rank', '_stand_down', '_rendezvous_address', 'check_pipeline_runs',
    '_live_grads', '_stage_shapes', '_pump', '_direction_groups', '_p2p_link', '_tp_slice',
    '_from_numpy', '_group', '_new_group', '_nbytes', '_to_numpy',
    '_check_arrangement', '_tp_wrong_worker', 'time_all_reduce',
    '_all_reduce_worker', '_all_reduce_rounds', 'cost_model_net',
    'gradient_bytes', 'time_compute', '_sgd_steps', '_time_runs',
    '_check_configs', '_ddp_model', 'time_ddp_configs', '_ddp_configs_worker',
    '_time_configs', '_tp_barrier', '_tp_timing_worker', 'ddp_script_path',
]

# Last: the generated module imports this one at its top.
from d2l import torch as d2l  # noqa: E402
