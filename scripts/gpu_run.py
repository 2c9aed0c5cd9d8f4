#!/usr/bin/env python3
"""Run the PyTorch tab of every page in full mode on a GPU machine, without Jupyter.

usage: python3 scripts/gpu_run.py [--pages PAGE ...] [--out DIR] [--quick]
                                  [--timeout S]

Needs only PyTorch, NumPy, matplotlib and cloudpickle (and this repository's
d2l, which it puts on the path). Each page runs in a process of its own, through
scripts/page_runner.py: its PyTorch cells, in order, in one namespace, as a
notebook kernel would, with the devices chosen by the book's
one-process-per-GPU rule. For each page it writes DIR/pytorch/<page>.ipynb in
the format of outputs/: the cells with their outputs, and in the notebook's
metadata the run's record (its key, the GPU and CPU, versions, mode, date,
seconds, and the error if a cell failed); at the end DIR/summary.md, a table
of every training run's test accuracy and seconds per epoch as the pages print
them. `scripts/stored_outputs.py store-gpu` stores the run in outputs/gpu/.
--quick runs quick mode instead (D2L_QUICK=1), for testing this script on a CPU.
"""
import argparse
import configparser
import json
import os
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import page_runner as runner  # noqa: E402

TAB = 'pytorch'
TOC = re.compile(r'^```toc\n(.*?)^```', re.M | re.S)
# What the pages print about a finished training run.
RUN = re.compile(r'test accuracy (\d\.\d+), ([\d.]+) s/epoch')


def toc_entries(index):
    """The entries of the ```toc blocks of the markdown file `index`."""
    return [line.strip() for block in TOC.findall(index.read_text())
            for line in block.splitlines()
            if line.strip() and not line.strip().startswith(':')]


def book_pages(root):
    """Every page of the book with code, in the order of its tables of contents."""
    pages = []
    for entry in toc_entries(root / 'index.md'):
        chapter_index = root / f'{entry}.md'
        for name in toc_entries(chapter_index):
            page = chapter_index.parent / f'{name}.md'
            if runner.CELL.search(page.read_text()):
                pages.append(page.relative_to(root).as_posix())
    return pages


def run_page(root, page, out_dir):
    """Run the PyTorch cells of `page` in this process; write its notebook with its record."""
    config = configparser.ConfigParser()
    config.read(root / 'config.ini')
    cells = runner.page_cells(root, page, TAB, config['build']['tabs'].split(',')[0].strip())
    began = time.time()
    nb, failed = runner.run(runner.new_notebook(cells), root, (root / page).parent,
                            in_process=True)
    import torch
    key, parts = runner.key_parts(root, root / config[f'library-{TAB}']['lib_file'], page,
                                  cells, runner.framework_versions(TAB))
    nb['metadata'][runner.RECORD] = dict(
        runner.run_record(page, TAB, key, parts, nb, os.environ.get('D2L_QUICK') == '1'),
        seconds=round(time.time() - began, 1), failed=failed, torch_build=torch.__version__,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        gpus=torch.cuda.device_count(), cuda=torch.version.cuda)
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + '\n'
    runner.write_file(out_dir / TAB / pathlib.Path(page).with_suffix('.ipynb'),
                      text.replace(json.dumps(str(root))[1:-1], '<book>'))
    return 1 if failed else 0


def runs_of(notebook):
    """(test accuracy, seconds per epoch, rest of the line) of every run a page reports."""
    found = []
    for cell in runner.code_cells(notebook):
        for output in cell['outputs']:
            for line in output.get('text', '').splitlines():
                match = RUN.search(line)
                if match:
                    found.append((float(match[1]), float(match[2]),
                                  line[match.end():].strip(' ;,')))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--pages', nargs='+', help='default: every page')
    parser.add_argument('--out', default=str(runner.ROOT / '_build' / 'gpu-run'))
    parser.add_argument('--quick', action='store_true',
                        help='quick mode, to test this script on a CPU')
    parser.add_argument('--timeout', type=float, default=4 * 3600,
                        help='seconds one page may take (default: %(default)g)')
    parser.add_argument('--root', default=str(runner.ROOT), help=argparse.SUPPRESS)
    parser.add_argument('--one', help=argparse.SUPPRESS)  # a page's process
    args = parser.parse_args()
    out_dir, root = pathlib.Path(args.out).resolve(), pathlib.Path(args.root).resolve()
    if args.one:
        return run_page(root, args.one, out_dir)
    pages = args.pages or book_pages(root)
    for page in pages:
        if not (root / page).is_file():
            parser.error(f'no page {page}: give paths such as chapter_multi_gpu/helpers.md')
    if not args.timeout > 0:
        parser.error(f'--timeout must be a positive number of seconds, got {args.timeout}')
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, D2L_QUICK='1' if args.quick else '0')
    rows, failures, records = [], [], []
    for page in pages:
        print(f'== {page}', flush=True)
        try:
            code = subprocess.run([sys.executable, __file__, '--one', page, '--out', str(out_dir),
                                   '--root', str(root)], env=env, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = f'timed out after {args.timeout:g} s'
        if code:
            failures.append(f'{page}: {code if isinstance(code, str) else "a cell failed"}')
        notebook = out_dir / TAB / pathlib.Path(page).with_suffix('.ipynb')
        if notebook.exists():
            notebook = json.loads(notebook.read_text())
            records.append(notebook['metadata'][runner.RECORD])
            rows += [(page, i, *run) for i, run in enumerate(runs_of(notebook), 1)]
    lines = [f'{"quick" if args.quick else "full"}-mode run of {len(pages)} pages on '
             + '; '.join(sorted({f'{r["devices"]}, PyTorch {r["torch_build"]}' for r in records})),
             '', '| page | run | test accuracy | seconds per epoch | as printed |',
             '|:--|--:|--:|--:|:--|']
    lines += [f'| {page} | {i} | {acc:.3f} | {s:.1f} | {rest} |' for page, i, acc, s, rest in rows]
    lines += ['', 'failed:'] + [f'* {f}' for f in failures] if failures else []
    (out_dir / 'summary.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))
    print(f'outputs in {out_dir}')
    if failures:
        print('failed:\n  ' + '\n  '.join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
