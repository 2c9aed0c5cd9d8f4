"""The PyTorch side of the d2l machinery (see d2l/runtime.py).

What the machinery must do with PyTorch itself: join and leave process groups,
move tensors between processes, time steps. The book's helpers reach it
through `from d2l import torch as d2l`."""
import datetime
import os
import socket
import time
import torch
import torch.distributed as dist
import torch.nn.functional as F
import urllib.error
import urllib.request
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from d2l.runtime import *  # noqa: F401,F403


def _device_name(device):
    """A short name for `device` and whether it is a GPU."""
    return str(device), device.type == 'cuda'


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


def _destroy_after_barrier():
    """Free the process group a moment after a barrier that all ranks passed."""
    # Gloo's thread frees the barrier's work after it completes and needs
    # the GIL for that; freeing the group before then can deadlock.
    time.sleep(0.1)
    dist.destroy_process_group()


def check_model_kind(net):
    """Reject `net` unless it is a torch.nn.Module."""
    d2l._check_model(net, nn.Module, 'torch.nn.Module')


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


def _rendezvous_address():
    """host:port of the rendezvous that torchrun described in the environment."""
    return (f"{os.environ.get('MASTER_ADDR', '(MASTER_ADDR unset)')}:"
            f"{os.environ.get('MASTER_PORT', '(MASTER_PORT unset)')}")


_from_numpy = torch.from_numpy


_new_group = dist.new_group


_nbytes = lambda x: x.numel() * x.element_size()


def _to_numpy(x):
    """A NumPy copy of the tensor `x`, gathered first if it is a DTensor."""
    x = x.full_tensor() if hasattr(x, 'full_tensor') else x
    return x.detach().numpy()


def _all_reduce_worker(rank, world_size, init_method, sizes, reps, calls):
    """One process of time_all_reduce: its seconds per call for each size."""
    with d2l.process_group(rank, world_size, init_method) as device:
        sync = (lambda: torch.cuda.synchronize(device)) \
            if device.type == 'cuda' else (lambda: None)
        return _all_reduce_rounds(
            [torch.zeros(n // 4, device=device) for n in sizes], reps, calls,
            sync)


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


_lenet_net = lambda: _cost_model_lenet(nn, nn.Conv2d, nn.MaxPool2d)


def _step_loss(net, X, y, bf16):
    """The cross-entropy loss of net(X), under bfloat16 autocast if `bf16`."""
    with torch.autocast(X.device.type, dtype=torch.bfloat16, enabled=bf16):
        return F.cross_entropy(net(X), y)


_clear_grads = lambda optimizer: optimizer.zero_grad()


def _synchronize(X):
    """Wait for the GPU of `X`, if any, to finish its queued work."""
    if X.device.type == 'cuda':
        torch.cuda.synchronize(X.device)


def _ddp_model(c, device):
    """A seeded DDP (plain if not c['ddp']) model for `c`, and its SGD."""
    torch.manual_seed(0)
    net = cost_model_net(c['model']).to(device)
    if c['ddp']:
        net = nn.parallel.DistributedDataParallel(
            net, bucket_cap_mb=c['bucket_cap_mb'])
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


def ddp_script_path(framework=None):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'."""
    return _script_path('torch' if framework is None else framework)


# The pipeline page's per-framework parts (run_device, run_pipeline)
def _grads(layers):
    """The parameters' gradients as NumPy arrays, then cleared."""
    params = [p for layer in layers for p in layer.parameters()]
    grads = [p.grad.cpu().numpy() for p in params]
    for p in params:
        p.grad = None
    return grads


_leaf = lambda x: x.detach().requires_grad_()  # a block's own input copy
_thread_setup = lambda: None  # nothing to prepare in a new thread
_sync = lambda x: x.is_cuda and torch.cuda.synchronize(x.device)
_rendezvous = lambda: d2l.local_init_method()  # for time_pipeline


def _place(stages, device):
    """Move the layers of `stages`, a dict stage -> layers, to `device`."""
    for layers in stages.values():
        for layer in layers:
            layer.to(device)
    return stages


# Last: the generated module imports this one at its top. Imported first
# (as unpickling a worker of this module does), this one is star-imported
# while incomplete, and _adopt completes the generated module.
__all__ = _exports(globals())
from d2l import torch as d2l  # noqa: E402
_adopt(globals(), _shared_helpers(d2l) + _group_helpers(d2l, dist), d2l)
__all__ = _exports(globals())
