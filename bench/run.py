#!/usr/bin/env python3
"""Benchmark the book's training code: `make bench`.

usage: python bench/run.py [--full | --settings quick|full|tiny]
                           [--frameworks pytorch,mxnet,paddle] [--out DIR]

Each framework is measured in its own process (the three frameworks are not
imported together), one measurement after the other; inside a measurement
the cases being compared run interleaved, so their ratio is meaningful on a
noisy machine. Writes DIR/results.json, DIR/bench.svg and DIR/cost-model.svg
(the cost model's predicted against measured step times; DIR defaults to
_build/bench) and prints a table.
"""
import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

MEASUREMENTS = ('loader', 'allreduce', 'scratch_lenet', 'concise_resnet18',
                'dp_vs_ddp', 'scaling', 'cost_model', 'memory')


def run_worker(framework, settings, measurements):
    """Measure one framework in this process; return its results dict."""
    from bench import measure
    from bench.ops import OPS
    ops = OPS[framework]()
    out = dict(threads=ops.threads())
    for name in measurements:
        fn = getattr(measure, name, None)
        began = time.time()
        try:
            if fn is None:
                raise measure.Missing(f'no benchmark for {name} yet')
            out[name] = fn(ops, settings)
        except measure.Missing as err:
            out.setdefault('skipped', {})[name] = str(err)
        except Exception as err:  # keep the other measurements going
            traceback.print_exc()
            out.setdefault('failed', {})[name] = f'{type(err).__name__}: {err}'
            print(f'bench: {framework} {name} failed: {err}', file=sys.stderr,
                  flush=True)
        print(f'bench: {framework} {name}: {time.time() - began:.1f} s',
              file=sys.stderr, flush=True)
        if name in out.get('skipped', {}):
            print(f'bench: {framework} {name} skipped: {out["skipped"][name]}',
                  file=sys.stderr, flush=True)
    return out


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--settings', default=None,
                        help='quick, full or tiny (default: as the data '
                             'loader decides, full with a GPU or D2L_QUICK=0, '
                             'else quick)')
    parser.add_argument('--full', action='store_true',
                        help='same as --settings full (for GPU machines)')
    parser.add_argument('--frameworks', default=','.join(harness.FRAMEWORKS))
    parser.add_argument('--only', default=','.join(MEASUREMENTS),
                        help='comma-separated subset of ' + ','.join(MEASUREMENTS))
    parser.add_argument('--out', default=str(ROOT / '_build' / 'bench'))
    parser.add_argument('--timeout', type=int, default=900,
                        help='seconds allowed per framework')
    parser.add_argument('--threads', default='auto',
                        help='CPU threads per framework process: a number, '
                             '"default" (the framework decides), or "auto": '
                             '1 without a GPU, else default')
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    name = 'full' if args.full else (args.settings or
                                     harness.default_settings_name())
    try:
        args.settings = harness.settings_for(name)
    except ValueError as err:
        parser.error(str(err))
    args.frameworks = [f.strip() for f in args.frameworks.split(',') if f.strip()]
    bad = [f for f in args.frameworks if f not in harness.FRAMEWORKS]
    if bad or not args.frameworks:
        parser.error(f'--frameworks takes a comma-separated subset of '
                     f'{",".join(harness.FRAMEWORKS)}; got {bad or "nothing"}')
    if args.threads not in ('auto', 'default') and not (
            args.threads.isdigit() and int(args.threads) > 0):
        parser.error(f'--threads takes a positive number, "default" or '
                     f'"auto"; got {args.threads!r}')
    args.only = [m.strip() for m in args.only.split(',') if m.strip()]
    bad = [m for m in args.only if m not in MEASUREMENTS]
    if bad or not args.only:
        parser.error(f'--only takes a comma-separated subset of '
                     f'{",".join(MEASUREMENTS)}; got {bad or "nothing"}')
    return args


def conditions():
    """What the machine was doing: cores, load, GPU, versions."""
    return dict(host=platform.node(), cpu_count=os.cpu_count(),
                load_average=os.getloadavg(), gpu=harness.gpu_name(),
                python=platform.python_version(),
                time=time.strftime('%Y-%m-%d %H:%M:%S %Z'))


def run_logged(cmd, env, timeout, log_path):
    """Run a worker, keeping its chatter (framework banners, warnings) in
    `log_path` and echoing only its progress lines and errors. Returns the
    exit status, or None if it ran past `timeout` seconds and was killed."""
    import threading
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log,
                                stderr=subprocess.PIPE, text=True)
        timer = threading.Timer(timeout, proc.kill)
        timer.daemon = True  # an interrupted run must not wait for it
        timer.start()
        tail = []
        try:
            for line in proc.stderr:
                log.write(line)
                tail = (tail + [line])[-30:]
                if line.startswith('bench:'):
                    print(line, end='', flush=True)
            proc.wait()
        finally:  # Ctrl-C or a closed stdout: stop the worker, then go on
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    if proc.returncode == -9:
        return None
    if proc.returncode:
        print(''.join(tail), end='', file=sys.stderr)
    return proc.returncode


def thread_count(choice):
    """Threads per worker, or None to leave it to the framework.

    Without a GPU the "devices" are shards that run one after another on the
    same cores, and on a shared machine a multi-threaded kernel stalls at
    every barrier while another process holds a core: one thread measures
    the book's code rather than the scheduler. With a GPU the CPU threads
    only launch kernels, so the framework's default is kept."""
    if choice == 'default':
        return None
    if choice == 'auto':
        return None if harness.gpu_name() else 1
    return int(choice)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        # Worker mode: measure one framework, write JSON to --out (a file).
        try:
            res = run_worker(args.worker, args.settings, args.only)
        except Exception as err:  # report, so the other frameworks still run
            traceback.print_exc()
            print(f'bench: {args.worker} failed: {type(err).__name__}: {err}',
                  file=sys.stderr, flush=True)
            res = dict(error=f'{type(err).__name__}: {err}')
        pathlib.Path(args.out).write_text(json.dumps(res, indent=1))
        return 0
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    threads = thread_count(args.threads)
    if threads:
        # Set before the framework is imported, which is when the OpenMP
        # and MKL thread pools are sized.
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    results = dict(settings=args.settings, conditions_before=conditions(),
                   threads=threads or 'framework default', frameworks={})
    began = time.time()
    for fw in args.frameworks:
        part = out_dir / f'{fw}.part.json'
        part.unlink(missing_ok=True)
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()),
               '--worker', fw, '--settings', args.settings['name'],
               '--only', ','.join(args.only), '--out', str(part)]
        status = run_logged(cmd, env, args.timeout, out_dir / f'{fw}.log')
        if status is None:
            res = dict(error=f'timed out after {args.timeout} s; raise '
                             f'--timeout or use smaller settings')
        elif part.exists():
            res = json.loads(part.read_text())
        else:
            res = dict(error=f'worker exited with status {status}; see '
                             f'{out_dir / f"{fw}.log"}')
        part.unlink(missing_ok=True)
        results['frameworks'][fw] = res
    results['conditions_after'] = conditions()
    results['seconds'] = time.time() - began
    results['ratios'] = harness.headline_ratios(results)
    (out_dir / 'results.json').write_text(json.dumps(results, indent=1))
    harness.plot(results, out_dir / 'bench.svg')
    wrote_cm = harness.plot_cost_model(results, out_dir / 'cost-model.svg')
    print(harness.format_table(results))
    for fw, res in results['frameworks'].items():
        if 'scaling' in res:
            print(harness.scaling_line(fw, res['scaling']))
    for fw, res in results['frameworks'].items():
        if 'memory' in res:
            print(res['memory']['line'])
            print(res['memory']['peak_line'])
    for fw, res in results['frameworks'].items():
        for name, why in res.get('skipped', {}).items():
            print(f'skipped {fw} {name}: {why}')
    print(f'\n{args.settings["name"]} settings, {results["seconds"]:.0f} s, '
          f'load average {results["conditions_before"]["load_average"][0]:.1f}'
          f' -> {results["conditions_after"]["load_average"][0]:.1f}, '
          f'{results["threads"]} thread(s) per process; wrote '
          f'{out_dir / "results.json"} and {out_dir / "bench.svg"}'
          + (f' and {out_dir / "cost-model.svg"}' if wrote_cm else ''))
    for fw, res in results['frameworks'].items():
        for name, why in res.get('failed', {}).items():
            print(f'FAILED {fw} {name}: {why}')
    failed = [fw for fw, r in results['frameworks'].items()
              if 'error' in r or r.get('failed')]
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
