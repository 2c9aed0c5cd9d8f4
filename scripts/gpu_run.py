#!/usr/bin/env python3
"""Run the PyTorch tab of every page in full mode on a GPU machine, without Jupyter.

usage: python3 scripts/gpu_run.py [--pages PAGE ...] [--out DIR] [--quick]
                                  [--timeout S]

Needs only PyTorch, NumPy and matplotlib (and this repository's d2l, which it
puts on the path). Each page runs in a process of its own: its PyTorch cells,
read from the markdown as d2lbook reads them, are executed in order in one
namespace, as a notebook kernel would, with the devices chosen by the book's
one-process-per-GPU rule. For each page it writes DIR/pytorch/<page>.ipynb
(every cell with its printed text, its last expression and its figures) and
DIR/pytorch/<page>.json (device, versions, mode, date, seconds); at the end,
DIR/summary.md, a table of every training run's test accuracy and seconds per
epoch as the pages print them, and DIR/provenance.json. --quick runs quick
mode instead (D2L_QUICK=1), for testing this script on a CPU.
"""
import argparse
import ast
import base64
import contextlib
import datetime
import io
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
CELL = re.compile(r'^```\{\.python \.input\}\n(.*?)^```', re.M | re.S)
TOC = re.compile(r'^```toc\n(.*?)^```', re.M | re.S)
# What the pages print about a finished training run.
RUN = re.compile(r'test accuracy (\d\.\d+), ([\d.]+) s/epoch')


def toc_entries(index):
    """The entries of the ```toc blocks of the markdown file `index`."""
    return [line.strip() for block in TOC.findall(index.read_text())
            for line in block.splitlines()
            if line.strip() and not line.strip().startswith(':')]


def book_pages():
    """Every page of the book with code, in the order of its tables of contents."""
    pages = []
    for entry in toc_entries(ROOT / 'index.md'):
        chapter_index = ROOT / f'{entry}.md'
        for name in toc_entries(chapter_index):
            page = chapter_index.parent / f'{name}.md'
            if CELL.search(page.read_text()):
                pages.append(str(page.relative_to(ROOT)))
    return pages


def tab_cells(text, tab='pytorch', default_tab='pytorch'):
    """The code cells of page `text` in `tab`, in order, as d2lbook assigns them."""
    cells = []
    for code in CELL.findall(text):
        first = code.split('\n', 1)[0].strip()
        if first.startswith('#@tab'):
            tabs = [t.strip() for t in first[len('#@tab'):].split(',')]
            if 'all' not in tabs and tab not in tabs:
                continue
        elif tab != default_tab:
            continue
        cells.append(code)
    return cells


def svg_output(figure):
    """A notebook output showing the matplotlib `figure` as SVG."""
    buffer = io.StringIO()
    figure.savefig(buffer, format='svg', bbox_inches='tight')
    return {'output_type': 'display_data', 'metadata': {},
            'data': {'image/svg+xml': buffer.getvalue(),
                     'text/plain': '<Figure>'}}


def figures(namespace, shown):
    """The new figures of a cell as outputs: pyplot's (closed after) and d2l.Animator's."""
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure
    outputs = [svg_output(plt.figure(n)) for n in plt.get_fignums()]
    plt.close('all')
    for value in list(namespace.values()):
        figure = getattr(value, 'fig', None)  # an Animator draws on its own
        if isinstance(figure, Figure) and id(figure) not in shown:
            shown.add(id(figure))
            outputs.append(svg_output(figure))
    return outputs


def run_cell(source, namespace, count, shown):
    """Execute one cell like a kernel; return its outputs and whether it failed."""
    text, outputs, failed = io.StringIO(), [], False
    try:
        tree = ast.parse(source)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and \
                not source.rstrip().endswith(';'):
            last = ast.Expression(tree.body.pop().value)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            exec(compile(tree, f'<cell {count}>', 'exec'), namespace)
            value = None if last is None else eval(
                compile(last, f'<cell {count}>', 'eval'), namespace)
    except BaseException:  # a cell's error ends the page, as in nbclient
        text.write(traceback.format_exc())
        failed, value = True, None
    if text.getvalue():
        outputs.append({'output_type': 'stream', 'name': 'stdout',
                        'text': text.getvalue()})
    outputs += figures(namespace, shown)
    if value is not None:
        outputs.append({'output_type': 'execute_result', 'metadata': {},
                        'execution_count': count,
                        'data': {'text/plain': repr(value)}})
    return outputs, failed


def run_page(page, out_dir):
    """Run the PyTorch cells of `page` in this process; write its notebook and record."""
    import matplotlib
    matplotlib.use('Agg')
    source = (ROOT / page).read_text()
    os.chdir((ROOT / page).parent)  # where a notebook of the page runs
    sys.path.insert(0, str(ROOT))
    namespace = {'__name__': '__main__'}
    cells, began, failed, shown = [], time.time(), False, set()
    for count, code in enumerate(tab_cells(source), 1):
        lines = [line for line in code.splitlines()
                 if not line.startswith(('%', '!'))]
        outputs, failed = run_cell('\n'.join(lines), namespace, count, shown)
        cells.append({'cell_type': 'code', 'execution_count': count,
                      'metadata': {}, 'outputs': outputs, 'source': code})
        if failed:
            break
    target = out_dir / 'pytorch' / page.replace('.md', '.ipynb')
    target.parent.mkdir(parents=True, exist_ok=True)
    notebook = {'nbformat': 4, 'nbformat_minor': 5, 'cells': cells,
                'metadata': {'kernelspec': {'name': 'python3',
                                            'display_name': 'Python 3'}}}
    target.write_text(json.dumps(notebook, indent=1))
    import torch
    record = {'page': page, 'seconds': round(time.time() - began, 1),
              'failed': failed, 'quick': os.environ.get('D2L_QUICK') == '1',
              'device': (torch.cuda.get_device_name(0)
                         if torch.cuda.is_available() else 'CPU only'),
              'gpus': torch.cuda.device_count(),
              'torch': torch.__version__, 'python': platform.python_version(),
              'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec='seconds')}
    target.with_suffix('.json').write_text(json.dumps(record, indent=1))
    return 1 if failed else 0


def runs_of(notebook_path):
    """(test accuracy, seconds per epoch, rest of the line) of every run a page reports."""
    found = []
    for cell in json.loads(notebook_path.read_text())['cells']:
        for output in cell['outputs']:
            for line in output.get('text', '').splitlines():
                match = RUN.search(line)
                if match:
                    rest = line[match.end():].strip(' ;,')
                    found.append((float(match[1]), float(match[2]), rest))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--pages', nargs='+', help='default: every page')
    parser.add_argument('--out', default=str(ROOT / '_build' / 'gpu-run'))
    parser.add_argument('--quick', action='store_true',
                        help='quick mode, to test this script on a CPU')
    parser.add_argument('--timeout', type=float, default=4 * 3600,
                        help='seconds one page may take (default: %(default)g)')
    parser.add_argument('--one', help=argparse.SUPPRESS)  # a page's process
    args = parser.parse_args()
    out_dir = pathlib.Path(args.out).resolve()
    if args.one:
        return run_page(args.one, out_dir)
    pages = args.pages or book_pages()
    for page in pages:
        if not (ROOT / page).is_file():
            parser.error(f'no page {page}: give paths such as '
                         f'chapter_multi_gpu/helpers.md')
    if not args.timeout > 0:
        parser.error(f'--timeout must be a positive number of seconds, '
                     f'got {args.timeout}')
    env = dict(os.environ, D2L_QUICK='1' if args.quick else '0',
               PYTHONPATH=os.pathsep.join(
                   [str(ROOT), os.environ.get('PYTHONPATH', '')]).rstrip(
                       os.pathsep))
    rows, failures = [], []
    for page in pages:
        print(f'== {page}', flush=True)
        try:
            code = subprocess.run(
                [sys.executable, __file__, '--one', page, '--out',
                 str(out_dir)], env=env, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = f'timed out after {args.timeout:g} s'
        if code:
            why = code if isinstance(code, str) else 'a cell failed'
            failures.append(f'{page}: {why}')
        notebook = out_dir / 'pytorch' / page.replace('.md', '.ipynb')
        if notebook.exists():
            rows += [(page, i, *run)
                     for i, run in enumerate(runs_of(notebook), 1)]
    import torch
    lines = ['| page | run | test accuracy | seconds per epoch | as printed |',
             '|:--|--:|--:|--:|:--|']
    lines += [f'| {page} | {i} | {acc:.3f} | {s:.1f} | {rest} |'
              for page, i, acc, s, rest in rows]
    (out_dir / 'summary.md').write_text('\n'.join(lines) + '\n')
    (out_dir / 'provenance.json').write_text(json.dumps({
        'device': (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                   else 'CPU only'), 'gpus': torch.cuda.device_count(),
        'torch': torch.__version__, 'quick': args.quick, 'pages': pages,
        'failures': failures}, indent=1))
    print('\n'.join(lines))
    print(f'outputs in {out_dir}')
    if failures:
        print('failed:\n  ' + '\n  '.join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
