"""Tests of the benchmark machinery (bench/): its accounting and a tiny run.

No test here asserts a speed: timings on a shared machine are the benchmark's
output, not something a test can promise.
"""
import json
import math
import pathlib
import subprocess
import sys

import pytest

from bench import harness
from bench.run import MEASUREMENTS, parse_args, run_logged

# Which measurements each framework's sections make possible on a machine
# without two GPUs (only PyTorch has both a single-process DataParallel and
# DDP, and their comparison needs two GPUs).
EXPECTED = {
    'pytorch': ('scratch_2dev_over_1dev', 'concise_2dev_over_1dev',
                'ring_over_naive_time', 'loader_over_copy',
                'cost_model_max_error', 'scaling_efficiency'),
    'mxnet': ('scratch_2dev_over_1dev', 'concise_2dev_over_1dev',
              'ring_over_naive_time', 'loader_over_copy',
              'cost_model_max_error', 'scaling_efficiency'),
    'paddle': ('scratch_2dev_over_1dev', 'concise_2dev_over_1dev',
               'ring_over_naive_time', 'loader_over_copy',
               'cost_model_max_error', 'scaling_efficiency'),
}


def test_ring_moves_no_fewer_bytes_than_naive_on_two_devices():
    n = 100 * harness.MB
    assert harness.bytes_per_device('ring', 2, n) == \
        harness.bytes_per_device('naive', 2, n) == dict(sent=n, received=n)


@pytest.mark.parametrize('k', [3, 4, 8])
def test_ring_moves_fewer_bytes_than_naive_beyond_two_devices(k):
    n = harness.MB
    ring = harness.bytes_per_device('ring', k, n)['sent']
    naive = harness.bytes_per_device('naive', k, n)['sent']
    assert ring == pytest.approx(2 * (k - 1) / k * n)
    assert naive == (k - 1) * n
    assert ring < naive


def test_unknown_allreduce_algorithm_is_named_in_the_error():
    with pytest.raises(ValueError, match="'tree'"):
        harness.bytes_per_device('tree', 2, 1)


def test_resnet18_flop_count_matches_a_count_over_the_real_network():
    torch = pytest.importorskip('torch')
    from d2l import torch as d2l
    net = d2l.resnet18(10, 1)
    macs = []

    def count(layer, inputs, output):
        if isinstance(layer, torch.nn.Conv2d):
            k = layer.kernel_size[0] * layer.kernel_size[1]
            macs.append(output.numel() * layer.in_channels * k)
        elif isinstance(layer, torch.nn.Linear):
            macs.append(output.numel() * layer.in_features)
    for layer in net.modules():
        layer.register_forward_hook(count)
    net.eval()
    net(torch.zeros(1, 1, 28, 28))
    assert harness.resnet18_conv_flops() == 2 * sum(macs)


@pytest.mark.parametrize('name, key', [
    ('NVIDIA H100 80GB HBM3', 'H100'), ('NVIDIA H100 PCIe', 'H100 PCIe'),
    ('NVIDIA H200', 'H200'), ('NVIDIA A100-SXM4-80GB', 'A100')])
def test_peak_table_recognises_device_names(name, key):
    assert harness.peak_for(name)['key'] == key


def test_no_peak_fraction_is_claimed_for_an_unknown_device():
    out = harness.fraction_of_peak(1e9, 1000, 'Some CPU')
    assert out['peak'] is None and 'fraction_of_fp32_peak' not in out


def test_interleaved_timing_alternates_the_order_of_cases():
    calls = []
    harness.time_interleaved({'a': lambda: calls.append('a'),
                              'b': lambda: calls.append('b')},
                             reps=2, warmup=1)
    assert calls == ['a', 'b', 'a', 'b', 'b', 'a']


@pytest.mark.parametrize('argv, message', [
    (['--settings', 'huge'], 'huge'), (['--frameworks', 'jax'], 'jax'),
    (['--only', 'speed'], 'speed'), (['--threads', '-1'], '-1')])
def test_bad_arguments_are_rejected_naming_the_choices(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_run_writes_json_with_every_ratio(framework, d2l, tmp_path):
    """The whole pipeline in one framework: worker process, JSON, table, plot."""
    proc = subprocess.run(
        [sys.executable, 'bench/run.py', '--settings', 'tiny',
         '--frameworks', framework, '--out', str(tmp_path)],
        cwd=harness_root(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / 'results.json').read_text())
    ratios = results['ratios'][framework]
    for name in EXPECTED[framework]:
        assert ratios[name] is not None, (
            f'{name} missing; skipped: '
            f'{results["frameworks"][framework].get("skipped")}')
        assert math.isfinite(ratios[name]) and ratios[name] > 0, name
    assert (tmp_path / 'bench.svg').read_text().lstrip().startswith('<?xml')
    if 'cost_model_max_error' in EXPECTED[framework]:
        assert (tmp_path / 'cost-model.svg').read_text().lstrip().startswith(
            '<?xml')
        assert 'predicted' in proc.stdout
        # The cost model's pipeline and tensor rows: predicted and measured
        # step times, one row per micro-batch count and per block size.
        model = results['frameworks'][framework]['cost_model']
        for kind, label in (('pipeline', 'pipeline, 2 stages'),
                            ('tensor', 'tensor MLP')):
            assert model[kind], f'no {kind} rows'
            for row in model[kind]:
                for key in ('predicted_s', 'measured_s'):
                    assert math.isfinite(row[key]) and row[key] > 0, (kind,
                                                                      key)
            assert label in proc.stdout
    assert 'ratio' in proc.stdout and framework in proc.stdout
    # The scaling line: one process against two, strong and weak, at k = 2.
    line = next(l for l in proc.stdout.splitlines()
                if l.startswith(f'scaling {framework}:'))
    assert 'strong' in line and 'weak' in line and 'efficiency' in line
    assert 'per process' in line
    if framework == 'pytorch' and ratios.get('ddp_over_dp') is None:
        assert 'needs two GPUs' in json.dumps(results)  # skipped, with why
    if framework == 'pytorch':  # the sharded section's memory line
        assert 'memory per device, ResNet-18, k = 2' in proc.stdout
        assert 'FSDP' in proc.stdout and 'ZeRO-3' in proc.stdout
        assert 'peak memory per process, 4 transformer blocks' in proc.stdout


def harness_root():
    import pathlib
    return pathlib.Path(harness.__file__).resolve().parent.parent


@pytest.mark.parametrize('settings', ['quick', 'full'])
def test_scaling_is_measured_at_the_resnet18_page_s_batch(settings):
    """The scaling line times what the ResNet-18 DDP section's table times:
    its global batch in full mode, at least 32 images per process."""
    import pathlib
    import re
    page = (harness_root() / 'chapter_multi_gpu' / 'ddp-resnet18.md')
    batch = int(re.search(r'batch, steps = \(\d+, \d+\) if quick else '
                          r'\((\d+),', page.read_text()).group(1))
    assert harness.SETTINGS[settings]['scaling_batch'] == batch
    assert batch // 2 >= 32


def test_every_measurement_has_a_benchmark():
    from bench import measure
    assert all(callable(getattr(measure, name, None))
               for name in MEASUREMENTS)


@pytest.mark.parametrize('flag, settings', [('0', 'full'), ('1', 'quick')])
def test_d2l_quick_chooses_the_settings(flag, settings, monkeypatch):
    monkeypatch.setenv('D2L_QUICK', flag)
    assert harness.default_settings_name() == settings


def test_a_bad_d2l_quick_value_is_named(monkeypatch):
    monkeypatch.setenv('D2L_QUICK', 'yes')
    with pytest.raises(ValueError, match="'yes'"):
        harness.default_settings_name()


@pytest.mark.parametrize('settings', ['quick', 'full'])
def test_step_benchmarks_get_their_global_batch_in_quick_mode(
        settings, framework, d2l, quick):
    """Quick mode's loader serves 100 images; the step benchmarks' batches are
    larger, and must still be real training images in the loader's format."""
    import numpy as np
    from bench.ops import OPS
    ops = OPS[framework]()
    s = harness.settings_for(settings)
    batch = max(s['lenet_batch'], s['resnet_batch'])
    X, y = ops.first_batch(batch)
    train_iter, _ = d2l.load_data_fashion_mnist(10)
    X_loader, y_loader = next(iter(train_iter))
    assert type(X) is type(X_loader) and type(y) is type(y_loader)
    assert ops.to_numpy(X).dtype == ops.to_numpy(X_loader).dtype
    assert ops.to_numpy(y).dtype == ops.to_numpy(y_loader).dtype
    images, labels = d2l.fashion_mnist_arrays('train', quick=False)
    np.testing.assert_array_equal(ops.to_numpy(X), images[:batch])
    np.testing.assert_array_equal(ops.to_numpy(y), labels[:batch])


@pytest.mark.parametrize('batch', [0, -3, 2.5, True, 60001])
def test_an_impossible_global_batch_is_refused_naming_it(batch, framework,
                                                        quick):
    from bench.ops import OPS
    with pytest.raises(ValueError, match='batch'):
        OPS[framework]().first_batch(batch)


def test_serial_shards_cost_the_same_as_one_step_without_fixed_costs():
    # t(b) = c b: two half steps cost one full step, so only the allreduce
    # and the split make the ratio fall below 1.
    assert harness.serial_shards_ratio(0.2, 0.1, 0.0, 0.0) == pytest.approx(1)
    assert harness.serial_shards_ratio(0.2, 0.1, 0.02, 0.0) == \
        pytest.approx(0.2 / 0.22)


def test_a_fixed_cost_per_step_is_paid_twice_by_serial_shards():
    t0, c, batch = 0.005, 1e-4, 128   # MXNet-like: 5 ms fixed per step
    ratio = harness.serial_shards_ratio(t0 + c * batch, t0 + c * batch / 2,
                                        0.004, 0.0)
    assert ratio == pytest.approx((t0 + c * batch) /
                                  (2 * t0 + c * batch + 0.004))
    assert ratio < 0.91


@pytest.mark.parametrize('bad', [-1.0, float('nan'), '0.1', None])
def test_serial_shards_ratio_rejects_times_that_are_not_seconds(bad):
    with pytest.raises(ValueError, match='half_step_1'):
        harness.serial_shards_ratio(0.1, bad, 0.0, 0.0)


def test_cost_model_rows_are_printed_and_plotted(tmp_path):
    row = dict(model='resnet18', k=2, accumulate=1, predicted_s=0.3,
               measured_s=0.25, error=0.2, error_from_alone=-0.3)
    results = dict(frameworks=dict(pytorch=dict(cost_model=dict(
        alpha_beta={'2': [5e-5, 1e-9]}, rows=[row, dict(row, k=4,
                                                         accumulate=2)]))))
    table = harness.format_table(results)
    assert 'predicted 0.3000 / measured 0.2500' in table and '+20%' in table
    assert 'from one process alone -30%' in table
    assert harness.plot_cost_model(results, tmp_path / 'cm.svg')
    assert (tmp_path / 'cm.svg').read_text().lstrip().startswith('<?xml')
    assert not harness.plot_cost_model(dict(frameworks={}), tmp_path / 'x.svg')


class _ClosedStdout:
    """A stdout whose reader has gone, as with `make bench | head -1`."""
    def write(self, text):
        raise BrokenPipeError(32, 'Broken pipe')

    def flush(self):
        pass


def test_a_reader_that_goes_away_stops_the_worker_at_once(tmp_path,
                                                          monkeypatch):
    """No worker left running and no timer keeping the run alive."""
    import threading
    import time
    pid_file = tmp_path / 'worker.pid'
    worker = ('import os, sys, time\n'
              f'open({str(pid_file)!r}, "w").write(str(os.getpid()))\n'
              'for i in range(600):\n'
              '    print(f"bench: step {i}", file=sys.stderr, flush=True)\n'
              '    time.sleep(0.1)\n')
    monkeypatch.setattr(sys, 'stdout', _ClosedStdout())
    began = time.monotonic()
    with pytest.raises(BrokenPipeError):
        run_logged([sys.executable, '-c', worker], None, 900,
                   tmp_path / 'worker.log')
    assert time.monotonic() - began < 10
    pid = int(pid_file.read_text())
    assert not pathlib.Path(f'/proc/{pid}').exists(), 'the worker still runs'
    timers = [t for t in threading.enumerate()
              if isinstance(t, threading.Timer) and t.is_alive()]
    assert all(t.daemon for t in timers), timers


def test_timers_that_start_processes_take_turns_in_alternating_order():
    """Each round calls every case once; odd rounds run them in reverse."""
    order = []
    cases = {name: (lambda name=name: order.append(name) or len(order))
             for name in ('one', 'strong', 'weak')}
    seconds = harness.alternate_rounds(cases, 2)
    assert order == ['one', 'strong', 'weak', 'weak', 'strong', 'one']
    assert seconds == {'one': [1, 6], 'strong': [2, 5], 'weak': [3, 4]}
