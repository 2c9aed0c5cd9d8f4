"""The committed d2l/ package is exactly what `d2lbook build lib` makes of the book."""
import pathlib
import shutil
import subprocess
import sys

import re

import pytest

from conftest import ROOT

SOURCES = ('config.ini', 'index.md', 'references.bib', 'd2l', 'scripts')


def copy_book(dest):
    """Copy what `d2lbook build lib` reads: config, the table of contents, the pages."""
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name,
                            ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copy2(src, dest / name)
    for chapter in ROOT.glob('chapter_*'):
        shutil.copytree(chapter, dest / chapter.name,
                        ignore=shutil.ignore_patterns('*.ipynb', '__pycache__'))


@pytest.mark.slow
def test_committed_library_equals_a_fresh_build(tmp_path):
    copy_book(tmp_path)
    out = subprocess.run([sys.executable, 'scripts/d2lbook', 'build', 'lib'],
                         cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    stale = [p.name for p in sorted((ROOT / 'd2l').glob('*.py'))
             if p.read_text() != (tmp_path / 'd2l' / p.name).read_text()]
    assert not stale, (f'd2l/{", d2l/".join(stale)} differ from what the book '
                       'generates: run `make lib` and commit the result')


@pytest.mark.parametrize('module', ['torch', 'mxnet', 'paddle'])
def test_hand_written_part_sits_above_the_generated_header(module):
    text = (ROOT / 'd2l' / f'{module}.py').read_text()
    header = '#################   WARNING   ################'
    assert text.count(header) == 1
    hand_written = text.split(header)[0]
    assert 'd2l = sys.modules[__name__]' in hand_written
    assert 'def ' not in hand_written and 'class ' not in hand_written


def test_version_comes_from_config():
    import configparser
    import d2l
    config = configparser.ConfigParser()
    config.read(ROOT / 'config.ini')
    assert d2l.__version__ == config['project']['release']


def test_make_targets_hand_the_build_scripts_a_book_root():
    """`make -n` shows every script call; a root argument must hold config.ini."""
    out = subprocess.run(['make', '-n', 'book', 'pdf'], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = [line.split() for line in out.stdout.splitlines()
             if any(s in line for s in ('eval-tabs.sh', 'build-html.sh',
                                        'build-pdf.sh'))]
    assert calls, out.stdout
    for words in calls:
        script = next(w for w in words if w.endswith('.sh'))
        args = words[words.index(script) + 1:]
        root = ROOT / args[0] if args else ROOT
        assert (root / 'config.ini').is_file(), (
            f'{" ".join(words)}: {root} is not a book root')


@pytest.mark.parametrize('module', ['torch', 'mxnet', 'paddle'])
def test_each_saved_helper_is_defined_once(module):
    """Two pages saving the same name would leave one page's code calling the other's."""
    import ast
    tree = ast.parse((ROOT / 'd2l' / f'{module}.py').read_text())
    names = [node.name for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    names += [t.id for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)]
    names += [e.id for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Tuple)
              for e in t.elts if isinstance(e, ast.Name)]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert twice == [], f'd2l/{module}.py defines {twice} more than once'


@pytest.mark.parametrize('module', ['torch', 'mxnet', 'paddle'])
def test_each_generated_module_has_at_most_2000_lines(module):
    """The machinery lives in d2l/runtime.py, so a module holds the book's code."""
    lines = (ROOT / 'd2l' / f'{module}.py').read_text().count('\n')
    assert lines <= 2000, f'd2l/{module}.py has {lines} lines'


@pytest.mark.parametrize('module', ['torch', 'mxnet', 'paddle'])
def test_every_public_function_s_source_is_the_def_its_page_shows(module):
    """No wrapper stands in: getsource gives the function, checks first."""
    import importlib
    import inspect
    lib = importlib.import_module(f'd2l.{module}')
    wrapped, not_def = [], []
    for name, obj in vars(lib).items():
        if name.startswith('_') or not inspect.isfunction(obj) \
                or not obj.__module__.startswith('d2l.'):
            continue
        if obj.__code__.co_name != name and not obj.__code__.co_filename \
                .endswith('contextlib.py'):  # contextmanager's own wrapper
            wrapped.append(name)
        source = inspect.getsource(obj)
        if f'def {name}(' not in source.split('"""')[0]:
            not_def.append(name)
    assert wrapped == [] and not_def == [], (wrapped, not_def)


def test_no_page_hides_a_cell():
    """Every cell a notebook runs is on the page, in every tab."""
    hidden = [md.name for md in ROOT.glob('chapter_*/*.md')
              if re.search(r'^#@hide\s*$', md.read_text(), re.M)]
    assert hidden == []
