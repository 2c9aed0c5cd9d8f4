"""The measurements, each a function of (ops, settings) returning a dict.

They call the book's own saved functions through `ops.d2l`; a function a
section has not saved (yet) makes that measurement report why it was skipped
instead of failing the whole run.
"""
import statistics
import numpy as np

from bench.harness import (MB, TRAIN_FLOPS_PER_FORWARD, alternate_rounds,
                           bytes_per_device,
                           fraction_of_peak, gpu_name, resnet18_conv_flops, serial_shards_ratio,
                           speed_ratio, summarise, time_interleaved)


class Missing(Exception):
    """A function the measurement needs is not in the d2l package."""


def need(d2l, *names):
    """The d2l functions called `names`, or Missing naming the absent ones."""
    absent = [n for n in names if not hasattr(d2l, n)]
    if absent:
        raise Missing(f'd2l.{", d2l.".join(absent)} not in {d2l.__name__}; '
                      f'run `make lib` after the section saves it')
    return [getattr(d2l, n) for n in names]


def loader(ops, s):
    """Examples per second of iterating the book's training loader, against
    np.copyto of the same arrays (images and labels) as the upper limit."""
    d2l = ops.d2l
    train_iter, _ = d2l.load_data_fashion_mnist(s['loader_batch'])
    images, labels = d2l.fashion_mnist_arrays(
        'train', d2l.quick_mode(d2l.num_gpus()))
    image_copy, label_copy = np.empty_like(images), np.empty_like(labels)
    epochs = s['loader_epochs']

    def iterate():
        for _ in range(epochs):
            for X, y in train_iter:
                pass
        # MXNet builds the batches asynchronously; wait for the last one.
        ops.sync()

    def copy():
        for _ in range(epochs):
            np.copyto(image_copy, images)
            np.copyto(label_copy, labels)

    times = time_interleaved({'loader': iterate, 'copy': copy},
                             s['loader_reps'], s['warmup'])
    n = len(labels) * epochs
    out = {name: summarise(t, n) for name, t in times.items()}
    out.update(examples=len(labels), batch_size=s['loader_batch'],
               bytes_per_example=int(images[0].nbytes + labels[0].nbytes),
               ratio=out['loader']['per_s'] / out['copy']['per_s'])
    return out


def allreduce(ops, s):
    """Time of the section's naive and ring allreduce on k devices, with the
    bytes each moves per device, for each parameter size."""
    naive, ring = need(ops.d2l, 'allreduce', 'ring_allreduce')
    rows = []
    for k in s['allreduce_devices']:
        devices = ops.devices(k)
        # Both must leave the same sum on every device; check once, small.
        for fn in (naive, ring):
            data = [ops.filled(1000, d, i + 1) for i, d in enumerate(devices)]
            fn(data)
            ops.sync()
            for x in data:
                if not np.allclose(ops.to_numpy(x), k * (k + 1) / 2):
                    raise AssertionError(f'{fn.__name__} left the wrong sum '
                                         f'on a device; check it in the section')
        for mb in s['allreduce_mb']:
            n = mb * MB // 4  # float32 entries
            # Zeros keep every repetition's sum finite, at the same cost.
            bufs = {name: [ops.filled(n, d) for d in devices]
                    for name in ('naive', 'ring')}
            calls = s['allreduce_calls']
            cases = {name: (lambda f, b: lambda: [f(b) for _ in range(calls)])(
                fn, bufs[name]) for name, fn in (('naive', naive),
                                                 ('ring', ring))}
            times = time_interleaved(cases, s['allreduce_reps'], s['warmup'],
                                     ops.sync)
            row = {name: summarise([t / calls for t in ts])
                   for name, ts in times.items()}
            for name in ('naive', 'ring'):
                row[name]['bytes_per_device'] = bytes_per_device(
                    name, k, n * 4)
            row.update(
                k=k, mb=mb, devices=[str(d) for d in devices],
                time_ratio=row['ring']['median_s'] / row['naive']['median_s'],
                bytes_ratio=(row['ring']['bytes_per_device']['sent'] /
                             row['naive']['bytes_per_device']['sent']))
            rows.append(row)
            del bufs, cases
    return rows


def scratch_lenet(ops, s):
    """The from-scratch data-parallel step (`d2l.train_batch`) on 1 and on 2
    devices at the same global batch, and where the 2-device time goes:
    splitting the batch, summing the gradients, and the rest (forward and
    backward of each shard, the update of each replica)."""
    d2l = ops.d2l
    train_batch, get_params, lenet_params, split_batch, allreduce = need(
        d2l, 'train_batch', 'get_params', 'lenet_params', 'split_batch',
        'allreduce')
    batch, steps = s['lenet_batch'], s['lenet_steps']
    X, y = ops.first_batch(batch)
    cases, setups = {}, {}
    for k in (1, 2):
        devices = ops.devices(k)
        params = [get_params(lenet_params(), d) for d in devices]
        setups[k] = devices
        cases[f'step_{k}'] = (lambda devices=devices, params=params: [
            train_batch(X, y, params, devices, 0.1) for _ in range(steps)])
    devices = setups[2]
    cases['split_2'] = lambda: [split_batch(X, y, devices)
                                for _ in range(steps)]
    # The allreduce calls of a step, one per parameter, on buffers of the
    # gradients' shapes and devices (copies of the parameters: the sums
    # double each call, which stays finite for far more calls than we make).
    bufs = [get_params(lenet_params(), d) for d in devices]
    cases['allreduce_2'] = lambda: [
        [allreduce([b[i] for b in bufs]) for i in range(len(bufs[0]))]
        for _ in range(steps)]
    # One device on half the global batch: on a CPU the two shards run one
    # after the other, so twice this is what the 2-device compute should cost.
    half = batch // 2
    params = [get_params(lenet_params(), d) for d in setups[1]]
    cases['step_1_half_batch'] = lambda: [
        train_batch(X[:half], y[:half], params, setups[1], 0.1)
        for _ in range(steps)]
    times = time_interleaved(cases, s['lenet_reps'], s['warmup'], ops.sync)
    t = {name: summarise(ts, batch * steps) for name, ts in times.items()}
    out = dict(global_batch=batch, steps_per_rep=steps,
               devices={k: [str(d) for d in v] for k, v in setups.items()},
               one=t['step_1'], two=t['step_2'],
               **speed_ratio(times['step_1'], times['step_2']))
    out['time_per_example_increase'] = 1 / out['ratio'] - 1
    med = {name: m['median_s'] / steps for name, m in t.items()}
    # The cost model of the section: on a CPU the two shards run one after
    # the other, so the 2-device step is two half-batch steps plus the
    # allreduce and the split.
    out['model_ratio'] = serial_shards_ratio(
        med['step_1'], med['step_1_half_batch'], med['allreduce_2'],
        med['split_2'])
    out['breakdown_s_per_step'] = dict(
        step_1=med['step_1'], step_2=med['step_2'],
        extra_2=med['step_2'] - med['step_1'],
        split_2=med['split_2'], allreduce_2=med['allreduce_2'],
        rest_2=med['step_2'] - med['split_2'] - med['allreduce_2'],
        two_half_batch_steps_1=2 * med['step_1_half_batch'])
    return out


def _concise_cases(ops, s, X, y):
    """Callables running `resnet_steps` concise steps on 1 and on 2 devices,
    each set up the way the concise section's training loop sets it up."""
    d2l, steps, cases, devices = ops.d2l, s['resnet_steps'], {}, {}
    if ops.name == 'pytorch':
        import torch
        from torch import nn
        for k in (1, 2):
            devs = d2l.try_gpus(k)
            # As the concise section wraps it; without GPUs the wrapper
            # just calls the model.
            model = nn.DataParallel(d2l.resnet18(10).to(devs[0]),
                                    device_ids=devs)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loss = nn.CrossEntropyLoss()
            model.train()
            cases[k] = (lambda m=model, o=optimizer, l=loss, d=devs: [
                d2l.train_step_concise(m, X, y, l, o, d) for _ in range(steps)])
            devices[k] = [str(d) for d in devs]
    elif ops.name == 'mxnet':
        from mxnet import gluon, init
        for k in (1, 2):
            devs = d2l.try_gpus(k)
            net = d2l.resnet18(10)
            net.initialize(init.Xavier(), ctx=devs)
            trainer = gluon.Trainer(net.collect_params(), 'sgd',
                                    {'learning_rate': 0.1})
            loss = gluon.loss.SoftmaxCrossEntropyLoss()
            cases[k] = (lambda n=net, t=trainer, l=loss, d=devs: [
                d2l.train_step_concise(n, X, y, l, t, d) for _ in range(steps)])
            devices[k] = [str(d) for d in devs]
    return cases, devices


def _paddle_concise(ops, s):
    """Paddle's concise training is one process per device: spawn 1, then 2."""
    import paddle
    from bench.workers import paddle_concise_steps
    d2l, out = ops.d2l, {}
    backend = 'nccl' if d2l.num_gpus() else 'gloo'
    for k in (1, 2):
        places = d2l.try_gpus(k)
        context = paddle.distributed.spawn(
            paddle_concise_steps, nprocs=len(places), backend=backend,
            args=(s['resnet_batch'], s['resnet_steps'], s['resnet_warmup'],
                  s['resnet_reps']))
        records = [q.get() for q in context.return_queues]
        # A round ends when the slowest process ends it.
        per_round = [max(r['seconds'][i] for r in records)
                     for i in range(s['resnet_reps'])]
        out[k] = dict(seconds=per_round,
                      devices=[r['device'] for r in records])
    return out


def concise_resnet18(ops, s):
    """The concise section's step (`d2l.train_step_concise`) of ResNet-18 on
    1 and 2 devices at the same global batch, and on a GPU the achieved
    fraction of the device's peak arithmetic rate."""
    d2l = ops.d2l
    need(d2l, 'resnet18', 'train_step_concise')
    batch, steps = s['resnet_batch'], s['resnet_steps']
    need(d2l, 'try_gpus')
    if ops.name == 'paddle':
        runs = _paddle_concise(ops, s)
        times = {k: runs[k]['seconds'] for k in (1, 2)}
        devices = {k: runs[k]['devices'] for k in (1, 2)}
        note = ('one process per device (paddle.DataParallel); the two '
                'configurations run one after the other, not interleaved')
    else:
        X, y = ops.first_batch(batch)
        cases, devices = _concise_cases(ops, s, X, y)
        times = time_interleaved(cases, s['resnet_reps'], s['resnet_warmup'],
                                 ops.sync)
        note = 'one process; 1- and 2-device steps interleaved'
    t = {k: summarise(times[k], batch * steps) for k in (1, 2)}
    out = dict(global_batch=batch, steps_per_rep=steps, devices=devices,
               one=t[1], two=t[2], how=note,
               **speed_ratio(times[1], times[2],
                             paired=ops.name != 'paddle'))
    out['time_per_example_increase'] = 1 / out['ratio'] - 1
    flops = TRAIN_FLOPS_PER_FORWARD * resnet18_conv_flops()
    out['train_flops_per_example'] = flops
    name = gpu_name()
    if name:
        # Per device: divide the k-device rate by k.
        out['peak'] = fraction_of_peak(flops, t[1]['per_s'], name)
        out['peak_two_per_device'] = fraction_of_peak(
            flops, t[2]['per_s'] / 2, name)
    return out


def dp_vs_ddp(ops, s):
    """Seconds per ResNet-18 step with nn.DataParallel (one process) and with
    DDP (one process per device) at the same global batch, timed by the DDP
    section's own functions; the calls alternate, one of each per round."""
    if ops.name != 'pytorch':
        raise Missing(f'{ops.name} has no single-process DataParallel to '
                      f'compare with; the DDP comparison is PyTorch only')
    import os
    import torch
    d2l = ops.d2l
    if d2l.num_gpus() < 2:
        raise Missing(f'the comparison needs two GPUs ({d2l.num_gpus()} '
                      f'found): without them nn.DataParallel just calls '
                      f'the model')
    time_dp, time_ddp = need(d2l, 'time_data_parallel', 'time_ddp')
    k, batch, steps = 2, s['ddp_batch'], s['ddp_steps']
    warmup = s['ddp_warmup']
    threads = torch.get_num_threads()
    # Same cores for both designs: on a CPU the DDP section gives each of
    # its k processes 1/k of the cores, so the one DataParallel process
    # gets all of them. With GPUs the CPU threads only launch kernels.
    dp_threads = threads if d2l.num_gpus() else (os.cpu_count() or 1)

    def dp():
        torch.set_num_threads(dp_threads)
        try:
            return time_dp(k, batch, steps, warmup)
        finally:
            torch.set_num_threads(threads)

    def dp_one_thread():
        # The same, on one core: on a machine whose cores other processes
        # also use, a multi-threaded step stalls at every barrier.
        torch.set_num_threads(1)
        try:
            return time_dp(k, batch, steps, warmup)
        finally:
            torch.set_num_threads(threads)

    def ddp():
        return time_ddp(k, batch, steps, warmup)

    cases = {'dp': dp, 'ddp': ddp}
    if not d2l.num_gpus() and dp_threads > 1:
        cases['dp_one_thread'] = dp_one_thread
    seconds = alternate_rounds(cases, s['ddp_reps'])
    out = {name: summarise(ts, batch) for name, ts in seconds.items()}
    if 'dp_one_thread' in seconds:
        out['ddp_over_dp_one_thread'] = (
            out['ddp']['per_s'] / out['dp_one_thread']['per_s'])
    out.update(global_batch=batch, k=k, steps_per_call=steps,
               warmup_steps=warmup, dp_name='DataParallel',
               ddp_name='DDP', dp_threads=dp_threads,
               ddp_threads_per_process=max(1, (os.cpu_count() or 1) // k)
               if not d2l.num_gpus() else 'default',
               on_gpus=d2l.num_gpus() >= k,
               **speed_ratio(seconds['dp'], seconds['ddp']))
    return out


def scaling(ops, s):
    """ResNet-18 steps of one process, of two sharing its global batch
    (strong scaling) and of two with a batch each (weak scaling), one core
    per process without GPUs, timed by the ResNet-18 DDP section's
    time_ddp at its table's batch (32 images per process when two share
    it); the three alternate, and each keeps its median."""
    d2l = ops.d2l
    time_ddp, = need(d2l, 'time_ddp')
    if d2l.num_gpus() == 1:
        raise Missing('scaling at k = 2 needs two devices; 1 GPU found')
    batch, steps = s['scaling_batch'], s['scaling_steps']
    warmup = s['ddp_warmup']
    runs = {'one': (1, batch), 'strong': (2, batch), 'weak': (2, 2 * batch)}
    seconds = alternate_rounds(
        {name: lambda k=k, b=b: time_ddp(k, b, steps, warmup, None, 1)
         for name, (k, b) in runs.items()}, s['scaling_reps'])
    t = {name: statistics.median(ts) for name, ts in seconds.items()}
    return dict(k=2, global_batch=batch, steps=steps, seconds=t,
                strong_speedup=t['one'] / t['strong'],
                strong_efficiency=t['one'] / (2 * t['strong']),
                weak_efficiency=t['one'] / t['weak'])


def cost_model(ops, s):
    """The cost-model section's prediction of seconds per micro-batch of DDP
    (k processes; default buckets and accumulation over two micro-batches;
    LeNet and ResNet-18) against the measured time, with alpha and beta
    fitted to all_reduce timings and t_compute timed while all k processes
    train plain copies (the prediction from one process alone, times the
    core-sharing factor, comes along for comparison)."""
    import os
    if ops.name == 'mxnet':
        return _cost_model_parameter_server(ops, s)
    d2l = ops.d2l
    (time_all_reduce, fit_alpha_beta, time_compute, time_ddp_configs,
     predict_step_time, gradient_bytes, cost_model_net) = need(
        d2l, 'time_all_reduce', 'fit_alpha_beta', 'time_compute',
        'time_ddp_configs', 'predict_step_time', 'gradient_bytes',
        'cost_model_net')
    models = s['cm_models'] if ops.name == 'pytorch' else s['cm_models_paddle']
    sizes, reps, steps, batch = (s['cm_sizes'], s['cm_reps'], s['cm_steps'],
                                 s['cm_batch'])
    cores = os.cpu_count() or 1
    # Each k fits its own constants: on a CPU, k processes share the cores,
    # and the transfers slow down with the computation.
    allreduce_s = {k: time_all_reduce(k, sizes, reps)
                   for k in s['cm_ks'] if k > 1}
    fits = {k: fit_alpha_beta(sizes, t, k) for k, t in allreduce_s.items()}
    grad = {m: gradient_bytes(cost_model_net(m)) for m in models}
    # Per model: plain copies (the computation while all k processes run),
    # then DDP without and with accumulation.
    configs = [dict(model=m, ddp=ddp, accumulate=a) for m in models
               for a in (1, 2) for ddp in (False, True)]
    rows = []
    for k in s['cm_ks']:
        threads = 1  # a core is a device: one thread per process
        alpha, beta = fits.get(k, (0.0, 0.0))
        alone = {m: time_compute(m, batch // k, threads, steps, reps=reps)
                 for m in models}
        measured = time_ddp_configs(k, configs, batch, steps, reps=reps)
        compute = {}
        for c, t in zip(configs, measured):
            m, a = c['model'], c['accumulate']
            if not c['ddp']:
                compute[m, a] = t
                continue
            p_alone = predict_step_time(alone[m], grad[m], k, alpha, beta,
                                        cores, threads, accumulate=a)
            p = predict_step_time(compute[m, a], grad[m], k, alpha, beta,
                                  accumulate=a)
            rows.append(dict(model=m, k=k, accumulate=a, threads=threads,
                             compute_alone_s=alone[m],
                             compute_at_once_s=compute[m, a],
                             predicted_from_alone_s=p_alone,
                             error_from_alone=p_alone / t - 1,
                             predicted_s=p, measured_s=t, error=p / t - 1))
    return dict(cores=cores, global_batch=batch, steps=steps, reps=reps,
                sizes=sizes, allreduce_s=allreduce_s, alpha_beta=fits,
                gradient_bytes=grad, rows=rows,
                max_abs_error=max(abs(r['error']) for r in rows),
                within_25_percent=sum(abs(r['error']) <= 0.25 for r in rows),
                **_model_parallel_rows(d2l, s, fits[2], fits[2],
                                       d2l.ring_allreduce_time))


def _cost_model_parameter_server(ops, s):
    """The MXNet tab of the cost-model section: seconds per step of k
    workers on a dist_sync store (time_ddp), against one worker's plain steps
    plus one push and pull of all the gradient bytes (ps_pushpull_time), with
    alpha and beta fitted to push-pull timings."""
    import functools
    import os
    d2l = ops.d2l
    (time_all_reduce, fit_ps, time_compute, time_ddp, ps_time,
     gradient_bytes, cost_model_net) = need(
        d2l, 'time_all_reduce', 'fit_ps_alpha_beta', 'time_compute',
        'time_ddp', 'ps_pushpull_time', 'gradient_bytes', 'cost_model_net')
    models = s['cm_models']
    sizes, reps, steps, batch = (s['cm_sizes'], s['cm_reps'], s['cm_steps'],
                                 s['cm_batch'])
    cores = os.cpu_count() or 1
    ks = [k for k in s['cm_ks']]
    allreduce_s = {k: time_all_reduce(k, sizes, reps)
                   for k in sorted({max(k, 2) for k in ks})}
    fits = {k: fit_ps(sizes, t, k) for k, t in allreduce_s.items()}
    grad = {m: gradient_bytes(cost_model_net(m)) for m in models}
    rows = []
    for k in ks:
        alpha, beta = fits[max(k, 2)]  # one worker also goes via the server
        for m in models:
            alone = time_compute(m, batch // k, 1, steps, reps=reps)
            p = alone * max(1, k / cores) + ps_time(grad[m], k, alpha, beta)
            t = time_ddp(k, batch, steps, 1,
                         functools.partial(cost_model_net, m))
            rows.append(dict(model=m, k=k, accumulate=1, threads=1,
                             compute_alone_s=alone, predicted_from_alone_s=p,
                             error_from_alone=p / t - 1, predicted_s=p,
                             measured_s=t, error=p / t - 1))
    return dict(cores=cores, global_batch=batch, steps=steps, reps=reps,
                sizes=sizes, allreduce_s=allreduce_s, alpha_beta=fits,
                gradient_bytes=grad, rows=rows,
                max_abs_error=max(abs(r['error']) for r in rows),
                within_25_percent=sum(abs(r['error']) <= 0.25 for r in rows),
                # stages are threads: their messages cost nothing
                **_model_parallel_rows(d2l, s, (0.0, 0.0), fits[2],
                                       ps_time))


def _model_parallel_rows(d2l, s, p2p_fit, tensor_fit, collective):
    """The cost-model section's pipeline and tensor rows: GPipe on two
    stages (time_pipeline) against the bubble formula plus the sends
    (predict_pipeline_time), and the MLP block on two processes
    (time_tensor_parallel) against compute/2 plus two allreduces
    (predict_tensor_time), both priced with the constants fitted at k = 2."""
    import numpy
    (time_pipeline, pipeline_schedule, work_and_span, predict_pipeline,
     time_tp, predict_tp) = need(
        d2l, 'time_pipeline', 'pipeline_schedule', 'pipeline_work_and_span',
        'predict_pipeline_time', 'time_tensor_parallel',
        'predict_tensor_time')
    pipe, reps, steps = s['cm_pipeline'], s['cm_reps'], s['cm_steps']
    rng = numpy.random.default_rng(0)
    X = d2l.tensor(rng.standard_normal(
        (pipe['batch'], 784)).astype('float32'))
    y = d2l.tensor(rng.integers(0, 10, pipe['batch']))
    ms = pipe['ms']
    runs = [(pipeline_schedule('gpipe', 2, m), m) for m in ms]
    records = time_pipeline(runs[-1:] + runs * reps, 2, X, y, pipe['depth'],
                            pipe['width'])[1:]
    pipeline = []
    for j, m in enumerate(ms):
        work, span = zip(*(work_and_span(r['times'])
                           for r in records[j::len(ms)]))
        w, t = statistics.median(work), statistics.median(span)
        n = 4 * pipe['batch'] // m * pipe['width']
        pipeline.append(dict(m=m, stages=2, stage_work_s=w, message_bytes=n,
                             predicted_s=predict_pipeline(w, 2, m, n,
                                                          *p2p_fit),
                             measured_s=t))
    tensor = []
    for d, h, b in s['cm_tensor']:
        whole, part = time_tp(2, d, h, b, steps, reps)
        tensor.append(dict(d=d, hidden=h, batch=b, k=2, whole_s=whole,
                           predicted_s=predict_tp(
                               whole, 2, 4 * b * d, *tensor_fit,
                               collective=collective),
                           measured_s=part))
    return dict(pipeline=pipeline, tensor=tensor)


def memory(ops, s):
    """Per-device bytes of DDP, ZeRO-1/2/3 and FSDP for ResNet-18 at k = 2 (bench/memory.py)."""
    if ops.name != 'pytorch':
        raise Missing(f'{ops.name}: FSDP and the memory comparison run in '
                      f'PyTorch only')
    from bench import memory as mem
    rows, peaks = mem.per_device_memory(2), mem.peak_rows(2)
    return dict(rows=rows, line=mem.line(rows), peaks=peaks,
                peak_line=mem.peak_line(peaks))
