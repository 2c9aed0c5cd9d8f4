#!/usr/bin/env python3
"""Execute notebooks again in the interpreter that runs this script; fail on the first error.

usage: run_notebooks.py --root BOOK_ROOT NOTEBOOK [NOTEBOOK ...]

Each notebook runs in its own folder with BOOK_ROOT on PYTHONPATH, as d2lbook
runs it, and its outputs are not written back.
"""
import argparse
import os
import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--root', required=True)
    parser.add_argument('--timeout', type=int, default=1200)
    parser.add_argument('notebooks', nargs='+')
    args = parser.parse_args()
    root = pathlib.Path(args.root).resolve()
    os.environ['PYTHONPATH'] = str(root) + os.pathsep + os.environ.get('PYTHONPATH', '')
    failed = []
    for path in map(pathlib.Path, args.notebooks):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=args.timeout, kernel_name='python3',
                                resources={'metadata': {'path': str(path.parent.resolve())}})
        began = time.time()
        try:
            client.execute()
            status = 'ok'
        except CellExecutionError as err:
            failed.append(path)
            status = 'FAILED\n' + str(err)[-3000:]
        print(f'{path}: {time.time() - began:.0f} s {status}', flush=True)
    print(f'{len(args.notebooks) - len(failed)} passed, {len(failed)} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
