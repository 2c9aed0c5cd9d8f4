"""Framework-independent parts of the benchmarks: settings, timing, byte and
FLOP accounting, the report table and the plot.

Nothing here imports a deep-learning framework, so the tests and the driver
can use it without paying for three framework imports.
"""
import math
import os
import statistics
import time

# Quick settings keep `make bench` under ten minutes on two shared CPU cores;
# full settings are meant for a GPU machine. The step benchmarks feed the same
# real minibatch again and again, so they time the training code, not the data
# loader (which has its own benchmark).
SETTINGS = {
    'quick': dict(
        warmup=2,
        lenet_batch=256, lenet_steps=4, lenet_reps=11,
        resnet_batch=16, resnet_steps=1, resnet_reps=5, resnet_warmup=1,
        allreduce_mb=[1, 10, 100], allreduce_devices=[2, 4],
        allreduce_calls=1, allreduce_reps=5,
        ddp_batch=16, ddp_steps=1, ddp_reps=3, ddp_warmup=1,
        # the ResNet-18 DDP section's timing table: 32 images per process
        scaling_batch=64, scaling_steps=1, scaling_reps=3,
        loader_batch=256, loader_epochs=20, loader_reps=7,
        cm_sizes=[4_000, 40_000, 400_000, 4_000_000, 40_000_000, 100_000_000],
        cm_ks=[1, 2, 4], cm_batch=16, cm_steps=1, cm_reps=3,
        cm_models=['lenet', 'resnet18'], cm_models_paddle=['lenet'],
        cm_pipeline=dict(depth=4, width=256, batch=64, ms=[1, 4]),
        cm_tensor=[(256, 1024, 64)]),
    'full': dict(
        warmup=3,
        lenet_batch=256, lenet_steps=50, lenet_reps=9,
        resnet_batch=256, resnet_steps=10, resnet_reps=7, resnet_warmup=3,
        allreduce_mb=[1, 4, 16, 64, 100], allreduce_devices=[2, 4],
        allreduce_calls=5, allreduce_reps=7,
        ddp_batch=256, ddp_steps=20, ddp_reps=5, ddp_warmup=3,
        scaling_batch=64, scaling_steps=5, scaling_reps=5,
        loader_batch=256, loader_epochs=1, loader_reps=5,
        cm_sizes=[4_000, 40_000, 400_000, 4_000_000, 40_000_000, 100_000_000],
        cm_ks=[1, 2, 4], cm_batch=64, cm_steps=4, cm_reps=5,
        cm_models=['lenet', 'resnet18'],
        cm_models_paddle=['lenet', 'resnet18'],
        cm_pipeline=dict(depth=8, width=1024, batch=256, ms=[1, 2, 4, 8]),
        cm_tensor=[(256, 1024, 256), (512, 2048, 256)]),
    # For the smoke test: every code path once or twice, in seconds.
    'tiny': dict(
        warmup=1,
        lenet_batch=16, lenet_steps=1, lenet_reps=2,
        resnet_batch=4, resnet_steps=1, resnet_reps=2, resnet_warmup=1,
        allreduce_mb=[1], allreduce_devices=[2], allreduce_calls=1,
        allreduce_reps=2,
        ddp_batch=8, ddp_steps=1, ddp_reps=1, ddp_warmup=1,
        scaling_batch=8, scaling_steps=1, scaling_reps=1,
        loader_batch=64, loader_epochs=1, loader_reps=2,
        # sizes far apart and three rounds, so that the fit's slope stays
        # positive on a busy machine
        cm_sizes=[4_000, 40_000_000], cm_ks=[1, 2], cm_batch=8, cm_steps=1,
        cm_reps=3, cm_models=['lenet'], cm_models_paddle=['lenet'],
        cm_pipeline=dict(depth=2, width=32, batch=16, ms=[2]),
        cm_tensor=[(16, 64, 8)]),
}
FRAMEWORKS = ('pytorch', 'mxnet', 'paddle')
MODULES = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
MB = 10 ** 6  # sizes are decimal megabytes of float32 parameters


def settings_for(name):
    """The settings dictionary called `name`, or a ValueError listing the choices."""
    if name not in SETTINGS:
        raise ValueError(f'unknown settings {name!r}; choose one of '
                         f'{", ".join(SETTINGS)}')
    return dict(SETTINGS[name], name=name)


def default_settings_name():
    """Follow the data loader's rule: D2L_QUICK=0 means full and 1 quick;
    unset, full where a GPU is found and quick where none is."""
    flag = os.environ.get('D2L_QUICK', '').strip()
    if flag not in ('', '0', '1'):
        raise ValueError(f'D2L_QUICK must be 0 (full data) or 1 (quick '
                         f'subset), got {flag!r}')
    if flag == '':
        return 'full' if gpu_name() else 'quick'
    return 'full' if flag == '0' else 'quick'


def time_interleaved(cases, reps, warmup, sync=lambda: None):
    """Run each callable in `cases` (name -> fn) `warmup` times untimed, then
    `reps` timed rounds; every round runs every case once, alternating the
    order so that slow drift on a shared machine hits all cases alike.
    Returns name -> list of seconds."""
    if reps < 1 or warmup < 0:
        raise ValueError(f'need reps >= 1 and warmup >= 0, got reps={reps}, '
                         f'warmup={warmup}')
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
        sync()

    def timed(fn):
        def run():
            sync()
            began = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - began
        return run
    return alternate_rounds({name: timed(cases[name]) for name in names}, reps)


def alternate_rounds(cases, reps):
    """Call each callable in `cases` (name -> fn returning its own seconds,
    e.g. a timer that starts processes) once per round for `reps` rounds,
    reversing the order every other round. Returns name -> list."""
    names = list(cases)
    seconds = {name: [] for name in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds[name].append(cases[name]())
    return seconds


def summarise(seconds, work=1):
    """Median, min and max of a list of timings, and `work` units per second."""
    med = statistics.median(seconds)
    return dict(median_s=med, min_s=min(seconds), max_s=max(seconds),
                reps=len(seconds), per_s=work / med)


def speed_ratio(base, other, paired=True):
    """How much faster `other` ran than `base` (lists of seconds for the same
    work), three ways: the ratio of medians (the headline figure), the
    median of round-by-round ratios (each round ran both within moments, so
    drift cancels; only when the runs were interleaved), and the ratio of
    the fastest repetitions (least disturbed by other processes)."""
    out = dict(ratio=statistics.median(base) / statistics.median(other),
               ratio_of_fastest=min(base) / min(other))
    if paired:
        out['ratio_paired'] = statistics.median(
            b / o for b, o in zip(base, other))
    return out


def bytes_per_device(algorithm, k, n_bytes):
    """Bytes the busiest device sends and receives in one allreduce of
    `n_bytes` over `k` devices.

    naive: device 0 receives the other k-1 copies and sends the sum back to
    each of them, (k-1)*n each way. ring: reduce-scatter then all-gather,
    each k-1 steps of one n/k chunk, 2(k-1)/k*n each way on every device."""
    if k < 1:
        raise ValueError(f'k (number of devices) must be at least 1, got {k}')
    if algorithm == 'naive':
        moved = (k - 1) * n_bytes
    elif algorithm == 'ring':
        moved = 2 * (k - 1) * n_bytes / k
    else:
        raise ValueError(f"algorithm must be 'naive' or 'ring', got "
                         f"{algorithm!r}")
    return dict(sent=moved, received=moved)


def serial_shards_ratio(step_1, half_step_1, allreduce_2, split_2):
    """The cost model's 2-device / 1-device examples-per-second ratio of the
    from-scratch step when both "devices" share the same cores: the shards
    run one after the other, so a 2-device step costs two 1-device steps on
    half the batch plus the allreduce and the split (all seconds per step)."""
    for name, value in (('step_1', step_1), ('half_step_1', half_step_1),
                        ('allreduce_2', allreduce_2), ('split_2', split_2)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)
                and value >= 0):
            raise ValueError(f'{name} must be a finite number of seconds '
                             f'>= 0, got {value!r}')
    return step_1 / (2 * half_step_1 + allreduce_2 + split_2)


# Vendor data-sheet peaks in TFLOP/s, dense (no structured sparsity).
# fp32: plain CUDA cores. tf32: tensor cores on fp32 inputs, which cuDNN uses
# for fp32 convolutions by default on Ampere and later. Keys are matched
# against the device name in this order, so the more specific names come first.
PEAK_TFLOPS = [
    ('H200', dict(fp32=67.0, tf32=494.7, source='NVIDIA H200 SXM data sheet')),
    ('H100 PCIe', dict(fp32=51.2, tf32=378.0,
                       source='NVIDIA H100 PCIe data sheet')),
    ('H100', dict(fp32=67.0, tf32=494.7, source='NVIDIA H100 SXM data sheet')),
    ('A100', dict(fp32=19.5, tf32=156.0, source='NVIDIA A100 data sheet')),
    ('L40S', dict(fp32=91.6, tf32=183.0, source='NVIDIA L40S data sheet')),
    ('A10G', dict(fp32=31.2, tf32=62.5, source='NVIDIA A10G data sheet')),
    ('V100', dict(fp32=15.7, tf32=None, source='NVIDIA V100 SXM2 data sheet')),
    ('T4', dict(fp32=8.1, tf32=None, source='NVIDIA T4 data sheet')),
]


def peak_for(device_name):
    """The peak-throughput row whose key occurs in `device_name`, or None."""
    if not device_name:
        return None
    for key, row in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return dict(row, key=key)
    return None


def fraction_of_peak(flops_per_example, examples_per_s, device_name):
    """Achieved FLOP/s divided by the device's fp32 and tf32 peaks (None on CPU)."""
    peak = peak_for(device_name)
    achieved = flops_per_example * examples_per_s
    out = dict(achieved_tflops=achieved / 1e12, device=device_name,
               peak=peak)
    if peak:
        for kind in ('fp32', 'tf32'):
            if peak[kind]:
                out[f'fraction_of_{kind}_peak'] = achieved / (peak[kind] * 1e12)
    return out


def gpu_name():
    """The first GPU's name from nvidia-smi, or None when there is none."""
    import shutil
    import subprocess
    if not shutil.which('nvidia-smi'):
        return None
    try:
        out = subprocess.run(
            ['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def resnet18_conv_flops(height=28, width=28, in_channels=1, num_classes=10):
    """Forward FLOPs (2 per multiply-add) of the book's ResNet-18 on one image,
    counting convolutions and the final dense layer (batch-norm, ReLU, the
    additions and the pooling add well under 1%)."""
    macs = 0
    def conv(c_in, c_out, k, stride, h, w):
        nonlocal macs
        h, w = math.ceil(h / stride), math.ceil(w / stride)
        macs += c_in * c_out * k * k * h * w
        return h, w
    h, w = conv(in_channels, 64, 3, 1, height, width)  # 3x3 stem, no pooling
    c = 64
    for c_out, downsample in [(64, False), (128, True), (256, True),
                              (512, True)]:
        stride = 2 if downsample else 1
        h2, w2 = conv(c, c_out, 3, stride, h, w)       # block 1, conv 1
        conv(c_out, c_out, 3, 1, h2, w2)               # block 1, conv 2
        if downsample:
            conv(c, c_out, 1, stride, h, w)            # 1x1 shortcut
        conv(c_out, c_out, 3, 1, h2, w2)               # block 2, conv 1
        conv(c_out, c_out, 3, 1, h2, w2)               # block 2, conv 2
        h, w, c = h2, w2, c_out
    macs += c * num_classes
    return 2 * macs


# A training step costs about three forward passes: the forward itself, the
# gradient with respect to the activations and the one with respect to the
# weights (the stem's input gradient, which is not needed, is counted anyway).
TRAIN_FLOPS_PER_FORWARD = 3


def format_table(results):
    """The results as a fixed-width text table, one line per measurement."""
    rows = [('framework', 'measurement', 'value', 'ratio')]
    for fw, res in results['frameworks'].items():
        if 'error' in res:
            rows.append((fw, 'ERROR', res['error'][:60], ''))
            continue
        for key, label in (('scratch_lenet', 'from-scratch LeNet'),
                           ('concise_resnet18', 'concise ResNet-18')):
            if key in res:
                m = res[key]
                rows.append((fw, f'{label}, 1 device ({m["global_batch"]}/batch)',
                             f'{m["one"]["per_s"]:.0f} ex/s', ''))
                rows.append((fw, f'{label}, 2 devices',
                             f'{m["two"]["per_s"]:.0f} ex/s',
                             f'2dev/1dev {m["ratio"]:.2f} (fastest '
                             f'{m["ratio_of_fastest"]:.2f})'))
                if 'breakdown_s_per_step' in m:
                    b = {n: v * 1e3 for n, v in
                         m['breakdown_s_per_step'].items()}
                    rows.append((fw, f'{label}, 2-device step vs 1-device',
                                 f'+{b["extra_2"]:.1f} ms on '
                                 f'{b["step_1"]:.1f} ms',
                                 f'allreduce {b["allreduce_2"]:.1f}, split '
                                 f'{b["split_2"]:.1f}, 2 half steps '
                                 f'{b["two_half_batch_steps_1"]:.1f} ms'))
                if 'peak' in m:
                    p = m['peak']
                    rows.append((fw, f'{label}, achieved',
                                 f'{p["achieved_tflops"]:.2f} TFLOP/s',
                                 ' '.join(f'{k[12:-5]} {v:.1%}' for k, v in
                                          p.items() if k.startswith('fraction'))))
        for m in res.get('allreduce', []):
            rows.append((fw, f'allreduce {m["mb"]:g} MB, k={m["k"]}: naive / ring',
                         f'{m["naive"]["median_s"] * 1e3:.1f} / '
                         f'{m["ring"]["median_s"] * 1e3:.1f} ms',
                         f'ring/naive time {m["time_ratio"]:.2f}, '
                         f'bytes {m["bytes_ratio"]:.2f}'))
        if 'dp_vs_ddp' in res:
            m = res['dp_vs_ddp']
            rows.append((fw, f'{m["dp_name"]} vs {m["ddp_name"]} '
                             f'({m["global_batch"]}/batch, k={m["k"]})',
                         f'{m["dp"]["per_s"]:.0f} / {m["ddp"]["per_s"]:.0f} ex/s',
                         f'ddp/dp {m["ratio"]:.2f}'))
            if 'dp_one_thread' in m:
                rows.append((fw, 'DataParallel on one thread vs DDP',
                             f'{m["dp_one_thread"]["per_s"]:.0f} / '
                             f'{m["ddp"]["per_s"]:.0f} ex/s',
                             f'ddp/dp {m["ddp_over_dp_one_thread"]:.2f}'))
        if 'cost_model' in res:
            m = res['cost_model']
            for k, (alpha, beta) in sorted(m['alpha_beta'].items()):
                rows.append((fw, f'all_reduce fit, k={k}',
                             f'alpha {alpha * 1e6:.0f} us, '
                             f'beta {beta * 1e9:.3f} ns/B',
                             f'{1 / beta / 1e9:.2f} GB/s'))
            for r in m['rows']:
                rows.append((fw, f'DDP {r["model"]}, k={r["k"]}, accumulate '
                                 f'{r["accumulate"]} (s/micro-batch)',
                             f'predicted {r["predicted_s"]:.4f} / measured '
                             f'{r["measured_s"]:.4f}',
                             f'error {r["error"]:+.0%} (from one process '
                             f'alone {r["error_from_alone"]:+.0%})'))
            for key, label in (
                    ('pipeline', 'pipeline, 2 stages, m={m} (s/step)'),
                    ('tensor', 'tensor MLP d={d} h={hidden} b={batch}, k=2 '
                               '(s/pass)')):
                for r in m.get(key, []):
                    rows.append((fw, label.format(**r),
                                 f'predicted {r["predicted_s"]:.4f} / '
                                 f'measured {r["measured_s"]:.4f}',
                                 f'ratio {r["predicted_s"] / r["measured_s"]:.2f}'))
        if 'scratch_lenet' in res and 'model_ratio' in res['scratch_lenet']:
            m = res['scratch_lenet']
            rows.append((fw, 'from-scratch LeNet 2dev/1dev, cost model',
                         f'predicted {m["model_ratio"]:.2f}',
                         f'measured {m["ratio"]:.2f}'))
        if 'loader' in res:
            m = res['loader']
            rows.append((fw, f'data loader vs memory copy ({m["examples"]} ex)',
                         f'{m["loader"]["per_s"]:.0f} / '
                         f'{m["copy"]["per_s"]:.0f} ex/s',
                         f'loader/copy {m["ratio"]:.3f}'))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
             for r in rows]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def headline_ratios(results):
    """The four ratios the issue asks for, per framework (None where not measured)."""
    out = {}
    for fw, res in results['frameworks'].items():
        ar = res.get('allreduce') or []
        largest = max(ar, key=lambda m: (m['k'], m['mb'])) if ar else None
        out[fw] = {
            'scratch_2dev_over_1dev': res.get('scratch_lenet', {}).get('ratio'),
            'concise_2dev_over_1dev':
                res.get('concise_resnet18', {}).get('ratio'),
            'ring_over_naive_time': largest and largest['time_ratio'],
            'ddp_over_dp': res.get('dp_vs_ddp', {}).get('ratio'),
            'loader_over_copy': res.get('loader', {}).get('ratio'),
            'cost_model_max_error':
                res.get('cost_model', {}).get('max_abs_error'),
            'scaling_efficiency':
                res.get('scaling', {}).get('strong_efficiency'),
        }
    return out


def scaling_line(framework, m):
    """One line on the measured scaling of ResNet-18 at k = 2."""
    b, k = m["global_batch"], m["k"]
    return (f'scaling {framework}: ResNet-18, k = {k}, one core per '
            f'process without GPUs: strong (global batch {b}, {b // k} per '
            f'process) speedup {m["strong_speedup"]:.2f}, efficiency '
            f'{m["strong_efficiency"]:.2f}; weak ({b} per process) '
            f'efficiency {m["weak_efficiency"]:.2f}')


def plot(results, path):
    """Write an SVG with three panels: 2-device speed-up, allreduce time by
    size, and loader vs memory-copy throughput."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 3.4))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    fws = [fw for fw, r in results['frameworks'].items() if 'error' not in r]
    # Panel 1: ratio of 2-device to 1-device throughput.
    labels, values = [], []
    for fw in fws:
        for key, short in (('scratch_lenet', 'LeNet'),
                           ('concise_resnet18', 'ResNet')):
            if key in results['frameworks'][fw]:
                labels.append(f'{fw}\n{short}')
                values.append(results['frameworks'][fw][key]['ratio'])
        if 'dp_vs_ddp' in results['frameworks'][fw]:
            labels.append(f'{fw}\nDDP/DP')
            values.append(results['frameworks'][fw]['dp_vs_ddp']['ratio'])
    ax1.bar(range(len(values)), values, color='tab:blue')
    ax1.axhline(1.0, color='k', lw=0.8)
    ax1.axhline(1 / 1.1, color='r', lw=0.8, ls='--')
    ax1.set_xticks(range(len(values)), labels, fontsize=6)
    ax1.set_ylabel('throughput ratio')
    ax1.set_title('2 devices / 1 device; DDP / DataParallel\n'
                  '(red: 10% more time per example)', fontsize=9)
    # Panel 2: ring time over naive time against size, per device count.
    for fw in fws:
        ar = results['frameworks'][fw].get('allreduce', [])
        for k in sorted({m['k'] for m in ar}):
            rows = [m for m in ar if m['k'] == k]
            ax2.plot([m['mb'] for m in rows], [m['time_ratio'] for m in rows],
                     'o-' if k == 2 else 's--', label=f'{fw}, k={k}')
    ax2.axhline(1.0, color='k', lw=0.8)
    ax2.set(xscale='log', xlabel='parameters (MB)',
            ylabel='ring time / naive time')
    ax2.set_title('allreduce: ring vs naive (below 1: ring faster)',
                  fontsize=9)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=6)
    # Panel 3: loader against the memory-copy upper limit.
    loader = [(fw, results['frameworks'][fw]['loader']) for fw in fws
              if 'loader' in results['frameworks'][fw]]
    x = range(len(loader))
    ax3.bar([i - 0.2 for i in x], [m['loader']['per_s'] for _, m in loader],
            0.4, label='data loader')
    ax3.bar([i + 0.2 for i in x], [m['copy']['per_s'] for _, m in loader],
            0.4, label='memory copy')
    ax3.set_yscale('log')
    ax3.set_xticks(list(x), [fw for fw, _ in loader], fontsize=7)
    ax3.set_ylabel('examples per second')
    ax3.set_title('input pipeline', fontsize=9)
    if loader:
        ax3.legend(fontsize=6)
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def plot_cost_model(results, path):
    """Write an SVG of predicted against measured seconds per micro-batch of
    DDP, one panel per framework that measured it; nothing if none did."""
    parts = [(fw, r['cost_model']) for fw, r in results['frameworks'].items()
             if 'cost_model' in r]
    if not parts:
        return False
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib.figure import Figure
    fig = Figure(figsize=(4.2 * len(parts), 3.6))
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    markers = {'lenet': 'o', 'resnet18': 's'}
    for ax, (fw, m) in zip(axes, parts):
        for r in m['rows']:
            ax.plot(r['measured_s'], r['predicted_s'],
                    markers.get(r['model'], 'x'),
                    color=f'C{r["k"]}', fillstyle=(
                        'full' if r['accumulate'] == 1 else 'none'))
            ax.annotate(f'k={r["k"]}', (r['measured_s'], r['predicted_s']),
                        fontsize=6)
        lo = min(min(r['measured_s'], r['predicted_s']) for r in m['rows'])
        hi = max(max(r['measured_s'], r['predicted_s']) for r in m['rows'])
        line = [lo / 1.3, hi * 1.3]
        ax.plot(line, line, 'k-', lw=0.8)
        ax.fill_between(line, [v * 0.75 for v in line],
                        [v * 1.25 for v in line], color='0.9')
        ax.set(xscale='log', yscale='log', xlabel='measured s/micro-batch',
               ylabel='predicted s/micro-batch')
        ax.set_title(f'{fw}: DDP cost model (grey: within 25%)\n'
                     'circles LeNet, squares ResNet-18, hollow: accumulate',
                     fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True
