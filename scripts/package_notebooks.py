#!/usr/bin/env python3
"""Zip each framework's notebooks for download from the HTML book.

    python scripts/package_notebooks.py [BOOK_ROOT] [OUT_DIR]

For every tab in config.ini this writes OUT_DIR/<name>-<tab>.zip (default
OUT_DIR: BOOK_ROOT/_build/html), holding one folder <name>-<tab>/ with the
tab's evaluated notebooks (outputs cleared, so a reader runs them on their
own hardware rather than reading this machine's quick-mode numbers), the
`d2l` package they import, the images they show, the files a page reads or
launches next to its notebook (`chapter_*/*.py`, such as the DDP launcher
scripts), and the files that install `d2l` (`pip install -e .`). The header
links in config.ini point at these zips. scripts/check_notebook_zips.py does
with each zip what a new reader does: unzip, install, run every notebook.
"""
import configparser
import pathlib
import re
import sys
import tempfile
import zipfile

import nbformat
from d2lbook.build import update_ipynb_toc

# Besides the notebooks: what a reader needs to run them, if the book has it.
EXTRA_FILES = ('pyproject.toml', 'requirements.txt', 'README.md', 'LICENSE')
EXTRA_DIRS = ('d2l', 'img')
# A fixed timestamp keeps the archive byte-identical across rebuilds.
ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def book_config(root):
    config = configparser.ConfigParser()
    config.read(root / 'config.ini')
    name = config['project']['name']
    tabs = [t.strip() for t in config['build']['tabs'].split(',') if t.strip()]
    return name, tabs


def eval_dir(root, tabs, tab):
    """d2lbook evaluates the first tab into _build/eval, the others into _build/eval_<tab>."""
    return root / '_build' / ('eval' if tab == tabs[0] else f'eval_{tab}')


# Sphinx-only markup that Jupyter would show as code: the front page's
# rubrics become headings, `only:: html` blocks go, and the lists d2lbook
# makes of toc blocks lose their tab marks.
RUBRIC = re.compile(r'```eval_rst\n\.\. rubric:: (.+?)\n(?:\s+:class: .*\n)?```')
HTML_ONLY = re.compile(r'```eval_rst\n\.\. only:: html\n.*?```\n?', re.S)
TOC_TAB = re.compile(r':begin_tab:toc\n(.*?):end_tab:\n?', re.S)


def cleared(notebook_path):
    """The notebook's text without outputs, execution counts and Sphinx-only markup."""
    nb = nbformat.read(str(notebook_path), as_version=4)
    # The note on where the book's outputs were computed is not about the reader's run.
    note = nb.metadata.get('d2l_outputs', {}).pop('note', None)
    nb.metadata.pop('d2l_outputs', None)
    for cell in nb.cells:
        if cell.cell_type == 'code':
            cell.outputs = []
            cell.execution_count = None
        else:
            if note:
                cell.source = cell.source.replace('\n' + note + '\n', '', 1)
            source = RUBRIC.sub(lambda m: '## ' + m[1].replace('``', '`'), cell.source)
            cell.source = HTML_ONLY.sub('', source)
    return nbformat.writes(nb)


def untab_toc_lists(notebook_path):
    """Drop the tab marks d2lbook puts around the toc lists it writes."""
    nb = nbformat.read(str(notebook_path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == 'markdown':
            cell.source = TOC_TAB.sub(r'\1', cell.source)
    notebook_path.write_text(nbformat.writes(nb))


def chapter_files(root):
    """Files next to the pages that are not pages: scripts a notebook runs or reads."""
    files = []
    for chapter in sorted(root.glob('chapter_*')):
        for path in sorted(chapter.rglob('*')):
            parts = set(path.relative_to(root).parts)
            if (path.is_file() and path.suffix not in ('.md', '.ipynb', '.pyc')
                    and not parts & {'__pycache__', '.ipynb_checkpoints'}):
                files.append(path)
    return files


def add(archive, arcname, data):
    info = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)


def package_tab(root, name, tabs, tab, out_dir):
    source = eval_dir(root, tabs, tab)
    if not (source / 'index.ipynb').exists():
        raise FileNotFoundError(
            f'{source}/index.ipynb is missing: evaluate the {tab} tab first '
            f'(scripts/eval-tabs.sh {root})')
    folder = f'{name}-{tab}'
    zip_path = out_dir / f'{folder}.zip'
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        notebooks = sorted(p for p in source.rglob('*.ipynb')
                           if p.stat().st_size > 0 and '.ipynb_checkpoints' not in p.parts)
        for nb in notebooks:
            target = tmp / nb.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(cleared(nb))
        # The toc blocks of index notebooks become lists of notebook links.
        update_ipynb_toc(str(tmp))
        for nb in tmp.rglob('*.ipynb'):
            untab_toc_lists(nb)
        with zipfile.ZipFile(zip_path, 'w') as archive:
            for nb in sorted(tmp.rglob('*.ipynb')):
                add(archive, f'{folder}/{nb.relative_to(tmp).as_posix()}',
                    nb.read_bytes())
            for dirname in EXTRA_DIRS:
                for path in sorted((root / dirname).rglob('*')):
                    if path.is_file() and '__pycache__' not in path.parts:
                        add(archive, f'{folder}/{path.relative_to(root).as_posix()}',
                            path.read_bytes())
            for path in chapter_files(root):
                add(archive, f'{folder}/{path.relative_to(root).as_posix()}', path.read_bytes())
            for filename in EXTRA_FILES:
                if (root / filename).is_file():
                    add(archive, f'{folder}/{filename}', (root / filename).read_bytes())
    return zip_path, len(notebooks)


def main(argv):
    root = pathlib.Path(argv[1] if len(argv) > 1 else '.').resolve()
    out_dir = pathlib.Path(argv[2]) if len(argv) > 2 else root / '_build' / 'html'
    out_dir.mkdir(parents=True, exist_ok=True)
    name, tabs = book_config(root)
    for tab in tabs:
        try:
            zip_path, count = package_tab(root, name, tabs, tab, out_dir)
        except FileNotFoundError as error:
            print(f'package_notebooks: {error}', file=sys.stderr)
            return 1
        print(f'package_notebooks: {count} {tab} notebooks -> {zip_path}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
