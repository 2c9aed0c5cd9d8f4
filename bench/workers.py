"""Bodies of the processes that multi-process benchmarks start.

`paddle.distributed.spawn` and `torch.multiprocessing.spawn` start fresh
interpreters that import their target by module name, so the targets live
here rather than in the driver. They only time the book's saved step
functions; they contain no training code of their own.
"""
import time


def paddle_concise_steps(batch_size, steps, warmup, reps, seed=0):
    """Time `reps` rounds of `steps` calls of d2l.train_step_concise in this
    process of a paddle.DataParallel group sharing a global batch of
    `batch_size`; return the seconds per round (the slowest process decides)."""
    import numpy as np
    import paddle
    from paddle import nn
    from d2l import paddle as d2l
    dist = paddle.distributed
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    paddle.seed(seed)  # DataParallel copies rank 0's values to all anyway
    net = d2l.resnet18(10)
    net.to(paddle.get_device())
    model = paddle.DataParallel(net)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1,
                                     parameters=model.parameters())
    loss = nn.CrossEntropyLoss()
    images, labels = d2l.fashion_mnist_arrays(
        'train', d2l.quick_mode(d2l.num_gpus()))
    share = batch_size // world  # this process's part of the global batch
    X = paddle.to_tensor(images[rank * share:(rank + 1) * share])
    y = paddle.to_tensor(labels[rank * share:(rank + 1) * share])
    model.train()
    # This process's own device, as the concise section's workers use it.
    place = paddle.CUDAPlace(dist.ParallelEnv().device_id) \
        if d2l.num_gpus() else paddle.CPUPlace()

    def wait():
        if d2l.num_gpus():
            paddle.device.cuda.synchronize()
        if world > 1:
            dist.barrier()

    for _ in range(warmup):
        d2l.train_step_concise(model, X, y, loss, optimizer, [place])
    seconds = []
    for _ in range(reps):
        wait()
        began = time.perf_counter()
        for _ in range(steps):
            d2l.train_step_concise(model, X, y, loss, optimizer, [place])
        wait()
        seconds.append(time.perf_counter() - began)
    return dict(rank=rank, world=world, device=paddle.get_device(),
                seconds=seconds)
