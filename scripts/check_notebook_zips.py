#!/usr/bin/env python3
"""Do with each framework's notebook zip what a new reader does, and run nbval there.

    python scripts/check_notebook_zips.py BOOK_ROOT [--tabs pytorch ...]

For every tab, BOOK_ROOT/_build/zips/<name>-<tab>.zip (made by
scripts/package_notebooks.py from BOOK_ROOT's evaluated notebooks) is
unzipped into an empty folder outside the repository, the `d2l` package it
ships is installed from it (`pip install --no-deps --target`, into a folder of
its own: the shared environment's editable `d2l` is never on the path), and
every notebook is run there in quick mode under nbval, from the folder the
reader would open it in.

This is also the book's nbval run, so that no notebook is evaluated twice:
before running, each unzipped notebook gets the outputs of the book's own
evaluated copy (stored full-mode outputs where the store is current, else the
build's quick run) for reference. Its code is checked to be the zip's, cell by
cell. nbval runs in lax mode: every cell must run without error, and the cells
tagged `nbval-check-output` by `make publish` (outputs that agree between full
and quick mode: shapes, sizes, sums, messages) must print what was stored.

With --skip-evaluated, a notebook whose reference copy this build evaluated
itself in quick mode (its page's stored outputs are stale) is not run again:
the build's evaluation ran the same code in the same environment. Use it only
where the environment is the build's (scripts/test-notebooks.sh); a check in
another environment (NumPy 2) runs every notebook.
"""
import argparse
import configparser
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import nbformat

SCRIPTS = pathlib.Path(__file__).resolve().parent


def book_config(root):
    config = configparser.ConfigParser()
    config.read(root / 'config.ini')
    tabs = [t.strip() for t in config['build']['tabs'].split(',') if t.strip()]
    return config['project']['name'], tabs


def eval_dir(root, tabs, tab):
    return root / '_build' / ('eval' if tab == tabs[0] else f'eval_{tab}')


def add_reference_outputs(notebook, evaluated):
    """Give NOTEBOOK (from the zip) the outputs and nbval tags of the book's evaluated copy;
    return how long that copy's run took (0 if not recorded)."""
    nb = nbformat.read(str(notebook), as_version=4)
    ref = nbformat.read(str(evaluated), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == 'code']
    ref_cells = [c for c in ref.cells if c.cell_type == 'code']
    if [c.source for c in cells] != [c.source for c in ref_cells]:
        raise SystemExit(f'{notebook}: its code differs from the book\'s {evaluated}')
    for count, (cell, old) in enumerate(zip(cells, ref_cells), 1):
        cell.outputs = old.outputs
        # nbval treats a cell without an execution count as never run.
        cell.execution_count = count if old.outputs else None
        tags = old.metadata.get('tags')
        if tags:
            cell.metadata['tags'] = tags
    notebook.write_text(nbformat.writes(nb))
    return (ref.metadata.get('d2l_outputs') or {}).get('seconds') or 0


LONG_DECIMAL = r'(?<![\w.])(\d+\.\d{3})\d{2,}'
ROUNDING = r'(?<![\w.])(?:\d(?:\.\d+)?e-(?:0[5-9]|[1-9]\d+)|0(?:\.0+)?e[+-]0+)(?!\d)'


def sanitize_config(path, roots):
    """nbval's regex replacements: paths and addresses cleaned as in stored notebooks, and rounding-level numbers."""
    entries = [(re.escape(str(r)), '<book>') for r in roots]
    entries += [(r'\bat 0x[0-9a-fA-F]+', 'at 0x...'),
                (r'/tmp/[\w.-]*?(?:tmp|pymp-|torchelastic_)[\w.-]*', '/tmp/...'),
                # Rounding-level numbers (0, or below 1e-4 in e-notation) depend
                # on the build's kernels: 7.5e-09 here is 1.5e-08 elsewhere.
                (ROUNDING, '<rounding>'),
                # A float printed in full differs in its last digits between
                # CPUs (22.641289 on one, 22.64129 on another): compared to
                # three decimals. Numbers the book formats shorter are whole.
                (LONG_DECIMAL, r'\1')]
    path.write_text(''.join(f'[path{i}]\nregex: {regex}\nreplace: {replace}\n\n'
                            for i, (regex, replace) in enumerate(entries)))


def parallel_notebooks():
    """pytest-xdist options that run NBVAL_WORKERS notebooks at once (default 2), each whole in one worker."""
    workers = os.environ.get('NBVAL_WORKERS', '2')
    if not workers.isdigit() or int(workers) < 1:
        raise SystemExit(f'NBVAL_WORKERS must be a positive integer, got {workers!r}')
    if int(workers) == 1:
        return []
    # loadfile: a notebook's cells share one kernel, so they must stay in one worker.
    return ['-n', workers, '--dist', 'loadfile']


def evaluated_here(evaluated):
    """Whether the book's copy at EVALUATED was run in quick mode by this build."""
    record = nbformat.read(str(evaluated), as_version=4).metadata.get('d2l_outputs') or {}
    return record.get('source') == 'evaluated' and record.get('mode') == 'quick'


def check_tab(root, name, tabs, tab, zip_dir, python, xdist, skip_evaluated=False):
    archive = zip_dir / f'{name}-{tab}.zip'
    if not archive.exists():
        raise SystemExit(f'{archive} is missing: scripts/package_notebooks.py {root} {zip_dir}')
    work = pathlib.Path(tempfile.mkdtemp(prefix=f'd2l-zip-{tab}-'))
    try:
        with zipfile.ZipFile(archive) as z:
            z.extractall(work)
        folder = work / f'{name}-{tab}'
        site = work / 'site-packages'
        print(f'== {archive.name}: unzipped into {folder}; installing its d2l', flush=True)
        subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation',
                        '--no-input', '--target', str(site), str(folder)], check=True)
        # PYTHONWARNINGS as `d2lbook build eval` sets it, which made the reference outputs.
        env = dict(os.environ, PYTHONPATH=str(site), D2L_QUICK='1', PYTHONWARNINGS='ignore')
        env.pop('PYTHONSTARTUP', None)
        # What the kernels and their processes leave in the temporary folder
        # (a killed rank's, a fork server's) goes with this folder at the end.
        (work / 'tmp').mkdir()
        env['TMPDIR'] = str(work / 'tmp')
        where = subprocess.run([python, '-c', 'import d2l; print(d2l.__file__)'], cwd=work,
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        if not where.startswith(str(site)):
            raise SystemExit(f'{tab}: `import d2l` found {where}, not the zip\'s installed copy')
        notebooks = sorted(p for p in folder.glob('chapter_*/*.ipynb'))
        skipped, seconds = [], {}
        for nb in notebooks:
            evaluated = eval_dir(root, tabs, tab) / nb.relative_to(folder)
            if evaluated.exists() and evaluated.stat().st_size:
                if skip_evaluated and evaluated_here(evaluated):
                    skipped.append(nb)
                    continue
                seconds[nb] = add_reference_outputs(nb, evaluated)
        if skipped:
            print(f'== not run again ({len(skipped)}; this build evaluated them in quick mode '
                  f'in this environment): {" ".join(p.stem for p in skipped)}', flush=True)
            notebooks = [p for p in notebooks if p not in skipped]
        # The longest first, so that no long notebook runs alone at the end.
        notebooks.sort(key=lambda nb: -seconds.get(nb, 0))
        sanitize = work / 'sanitize.cfg'
        sanitize_config(sanitize, [folder, site, root])
        print(f'== nbval over the {len(notebooks)} {tab} notebooks in quick mode', flush=True)
        result = subprocess.run(
            [python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--rootdir', str(work),
             '--nbval-lax', '--nbval-current-env', '--nbval-cell-timeout=1200',
             '--nbval-sanitize-with', str(sanitize), '--durations=12'] + xdist +
            [str(p.relative_to(folder)) for p in notebooks],
            cwd=folder, env=env)
        if result.returncode == 5 and skipped:  # pytest found no code cell to check:
            print(f'== {tab}: the notebooks left hold no code cells; the build ran all others',
                  flush=True)  # every notebook with code was evaluated by this build
            return 0
        return result.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('root')
    parser.add_argument('--tabs', nargs='+')
    parser.add_argument('--zips', help='folder of the zips (default: BOOK_ROOT/_build/zips)')
    parser.add_argument('--skip-evaluated', action='store_true',
                        help='do not run again the notebooks this build evaluated in quick mode')
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root).resolve()
    name, tabs = book_config(root)
    zip_dir = pathlib.Path(args.zips).resolve() if args.zips else root / '_build' / 'zips'
    xdist = parallel_notebooks()
    failed = [tab for tab in (args.tabs or tabs)
              if check_tab(root, name, tabs, tab, zip_dir, sys.executable, xdist,
                           args.skip_evaluated) != 0]
    if failed:
        print(f'check_notebook_zips: notebooks failed in {", ".join(failed)}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
