#!/usr/bin/env python3
"""Evaluate one section of the book in one tab, outside d2lbook's build tree.

usage: scripts/eval_section.py chapter_multi_gpu/multiple-gpus.md pytorch [--timeout S]

Writes _build/sections/<tab>/<name>.ipynb and prints every cell's text output,
so an author can check a page without re-evaluating the whole book. Exits 1 if
a cell raises.
"""
import argparse
import os
import pathlib
import sys
import time

import nbformat
from d2lbook import notebook
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABS = ('pytorch', 'mxnet', 'paddle')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('section')
    parser.add_argument('tab', choices=TABS)
    parser.add_argument('--timeout', type=int, default=1200)
    args = parser.parse_args()
    src = (ROOT / args.section).resolve()
    nb = notebook.read_markdown(src.read_text())
    nb = notebook.get_tab_notebook(nb, args.tab, TABS[0])
    if nb is None:
        sys.exit(f'{args.section} has no cells for the {args.tab} tab')
    out_dir = ROOT / '_build' / 'sections' / args.tab / src.parent.name
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ['PYTHONPATH'] = str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', '')
    client = NotebookClient(nb, timeout=args.timeout, kernel_name='python3',
                            resources={'metadata': {'path': str(out_dir)}})
    began, failed = time.time(), None
    try:
        client.execute()
    except CellExecutionError as err:
        failed = err
    out = out_dir / (src.stem + '.ipynb')
    nbformat.write(nb, out)
    for cell in nb.cells:
        if cell.cell_type != 'code':
            continue
        for o in cell.get('outputs', []):
            text = o.get('text') or o.get('data', {}).get('text/plain') or ''
            if o.get('output_type') == 'error':
                text = f"{o['ename']}: {o['evalue']}"
            if text and 'ccache' not in text:
                print(text.rstrip()[:2000])
    print(f'== {args.section} [{args.tab}] in {time.time() - began:.0f} s -> {out}')
    if failed:
        print(failed, file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
