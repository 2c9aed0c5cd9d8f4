"""Stored outputs (scripts/stored_outputs.py): the book shows full-mode runs kept in
outputs/, reuses them exactly while their code is unchanged, evaluates only
what changed, and says on every page where its outputs come from.

The mechanism is exercised on a small book of two pages built in a temporary
folder (real d2lbook evaluation, real kernels); the committed store is checked
as it is.
"""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location('stored_outputs', ROOT / 'scripts' / 'stored_outputs.py')
so = importlib.util.module_from_spec(spec)
spec.loader.exec_module(so)

TABS = ('pytorch', 'mxnet', 'paddle')
CONFIG = """\
[project]
name = tiny
title = Tiny
release = 0.0.1

[build]
index = index
notebooks = *.md */*.md
exclusions = _build/*
resources = d2l/
dependencies = d2l/__init__.py
eval_notebook = True
tabs = pytorch, mxnet, paddle

[library]
version_file = d2l/__init__.py

[library-pytorch]
lib_file = d2l/torch.py
lib_name = torch

[library-mxnet]
lib_file = d2l/mxnet.py
lib_name = mx

[library-paddle]
lib_file = d2l/paddle.py
lib_name = paddle
"""


def page(title, label, value):
    fence = '```{.python .input}'
    return textwrap.dedent(f"""\
        # {title}
        :label:`{label}`

        Some prose.

        {fence}
        #@tab all
        print('shared', {value})
        ```

        {fence}
        print('pytorch only', {value} + 1)
        ```

        {fence}
        #@tab mxnet
        print('mxnet only', {value} + 2)
        ```

        {fence}
        #@tab paddle
        import random
        print('paddle, varies:', random.random())
        ```
        """)


def make_book(folder):
    (folder / 'chapter').mkdir(parents=True)
    (folder / 'd2l').mkdir()
    (folder / 'config.ini').write_text(CONFIG)
    (folder / 'index.md').write_text('# Tiny\n\n```toc\n:maxdepth: 2\n\nchapter/index\n```\n')
    (folder / 'chapter' / 'index.md').write_text(
        '# Chapter\n\n```toc\n:maxdepth: 2\n\none\ntwo\n```\n')
    # Page one's PyTorch cell uses a d2l helper and names a script beside the page.
    (folder / 'chapter' / 'one.md').write_text(page('One', 'sec_one', 1).replace(
        "print('pytorch only', 1 + 1)",
        "from d2l import torch as d2l\nprint('pytorch only', 1 + 1, d2l.greet(), 'launch.py')"))
    (folder / 'chapter' / 'two.md').write_text(page('Two', 'sec_two', 2))
    (folder / 'chapter' / 'launch.py').write_text("print('a script a launcher runs')\n")
    (folder / 'd2l' / '__init__.py').write_text('__version__ = "0.0.1"\n')
    for module in ('torch', 'mxnet', 'paddle'):
        (folder / 'd2l' / f'{module}.py').write_text(f'# the {module} helpers\n')
    (folder / 'd2l' / 'torch.py').write_text(TINY_TORCH_HELPERS)
    return so.Book(folder)


TINY_TORCH_HELPERS = '''import os

def greet():
    return _word()

def _word():
    return 'hello'

def unused():
    return 'nobody calls me'
'''


def d2lbook_eval(root):
    env = dict(os.environ, PYTHONPATH=str(root))
    for tab in TABS:
        out = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'd2lbook'), 'build', 'eval',
                              '--tab', tab], cwd=root, env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        yield out.stderr


@pytest.fixture(scope='module')
def published(tmp_path_factory):
    """The small book with both pages published in all tabs (full mode, real kernels)."""
    folder = tmp_path_factory.mktemp('book')
    book = make_book(folder)
    so.publish(book, ['chapter/one.md'], list(TABS), timeout=120)
    # The second page skips the quick run that finds the cells nbval compares.
    so.publish(book, ['chapter/two.md'], list(TABS), timeout=120, classify=False)
    return folder


@pytest.fixture
def book(published, tmp_path):
    """A fresh copy of the published book, as a fresh clone would have it."""
    shutil.copytree(published, tmp_path / 'clone', ignore=shutil.ignore_patterns('_build'))
    return so.Book(tmp_path / 'clone')


def stale(report):
    return sorted(report['stale'] + report['missing'])


@pytest.mark.slow
def test_a_published_book_is_reused_entirely(book):
    report = so.restore(book, verbose=False)
    assert stale(report) == []
    assert sorted(report['stored']) == sorted((p, t) for p in ('chapter/one.md', 'chapter/two.md')
                                              for t in TABS)


@pytest.mark.slow
def test_changing_one_code_cell_makes_exactly_that_page_and_tab_stale(book):
    source = book.root / 'chapter' / 'two.md'
    source.write_text(source.read_text().replace("print('mxnet only', 2 + 2)",
                                                 "print('mxnet only', 2 + 3)"))
    assert stale(so.restore(book, verbose=False)) == [('chapter/two.md', 'mxnet')]


@pytest.mark.slow
def test_prose_edits_keep_the_stored_outputs(book):
    source = book.root / 'chapter' / 'one.md'
    source.write_text(source.read_text().replace('Some prose.', 'Other prose, longer.'))
    assert stale(so.restore(book, verbose=False)) == []


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.slow
def test_a_d2l_helper_reached_through_another_makes_stale_only_the_page_using_it(book):
    stored = nbformat.read(str(book.stored_path('chapter/one.md', 'pytorch')), as_version=4)
    assert 'pytorch only 2 hello launch.py' in ''.join(so.output_texts(stored))
    edit(book.root / 'd2l' / 'torch.py', "return 'hello'", "return 'hi'")
    assert stale(so.restore(book, verbose=False)) == [('chapter/one.md', 'pytorch')]


@pytest.mark.slow
def test_new_or_changed_d2l_helpers_that_no_page_uses_keep_every_page(book):
    edit(book.root / 'd2l' / 'torch.py', "'nobody calls me'", "'still nobody'")
    with open(book.root / 'd2l' / 'paddle.py', 'a') as f:
        f.write('def helper():\n    """A new helper."""\n')
    assert stale(so.restore(book, verbose=False)) == []


@pytest.mark.slow
def test_code_that_runs_on_import_of_d2l_makes_that_tab_stale_on_every_page(book):
    with open(book.root / 'd2l' / 'paddle.py', 'a') as f:
        f.write('import json\n')
    assert stale(so.restore(book, verbose=False)) == [
        ('chapter/one.md', 'paddle'), ('chapter/two.md', 'paddle')]


@pytest.mark.slow
def test_a_changed_script_that_a_page_runs_makes_that_page_stale(book):
    edit(book.root / 'chapter' / 'launch.py', 'a script', 'the script')
    assert stale(so.restore(book, verbose=False)) == [('chapter/one.md', 'pytorch')]


def reached(source, *names):
    return '\n'.join(so.reachable_source(textwrap.dedent(source), set(names)))


def test_d2l_definitions_count_only_when_named_directly_or_through_others():
    source = '''
        import os
        LIMIT, OTHER = 3, 4
        def a():
            return d2l.b() + LIMIT
        def b():
            return 1
        class C:
            def m(self):
                return 2
        '''
    assert reached(source, 'a') == 'import os\nLIMIT, OTHER = 3, 4\ndef a():\n' \
        '    return d2l.b() + LIMIT\ndef b():\n    return 1'
    assert reached(source, 'C').splitlines() == ['import os', 'class C:', '    def m(self):',
                                                 '        return 2']


def test_statements_with_effects_on_import_always_count():
    source = '''
        def register(f):
            return f
        @register
        def plugged():
            return 1
        @contextlib.contextmanager
        def quiet():
            yield
        os.environ.setdefault('X', '1')
        Thing.size = 3
        '''
    text = reached(source)
    assert 'def plugged' in text and 'def register' in text
    assert "os.environ.setdefault('X', '1')" in text and 'Thing.size = 3' in text
    assert 'def quiet' not in text


@pytest.mark.slow
def test_other_framework_versions_make_the_tab_stale(book, monkeypatch):
    real = so.framework_versions
    monkeypatch.setattr(so, 'framework_versions', lambda tab: dict(
        real(tab), **({'torch': '99.0'} if tab == 'pytorch' else {})))
    assert stale(so.restore(book, verbose=False)) == [
        ('chapter/one.md', 'pytorch'), ('chapter/two.md', 'pytorch')]


@pytest.mark.slow
def test_a_stored_page_is_reused_byte_for_byte_and_not_evaluated(book):
    so.restore(book, verbose=False)
    from d2lbook.utils import get_updated_files
    for tab in TABS:
        target = book.eval_path('chapter/one.md', tab)
        stored = nbformat.read(str(book.stored_path('chapter/one.md', tab)), as_version=4)
        shown = nbformat.read(str(target), as_version=4)
        assert [json.dumps(c.outputs, sort_keys=True) for c in so.code_cells(shown)] == [
            json.dumps(c.outputs, sort_keys=True) for c in so.code_cells(stored)]
        # d2lbook evaluates a target older than its source or the dependencies.
        src = str(book.root / 'chapter' / 'one.md')
        assert get_updated_files([src], str(book.root), str(target.parents[1]), 'md', 'ipynb',
                                 max(book.dependencies())) == []
    first = {t: book.eval_path('chapter/one.md', t).read_bytes() for t in TABS}
    so.restore(book, verbose=False)
    assert {t: book.eval_path('chapter/one.md', t).read_bytes() for t in TABS} == first


@pytest.mark.slow
def test_the_build_evaluates_only_the_stale_page_and_labels_it(book, capsys):
    source = book.root / 'chapter' / 'two.md'
    source.write_text(source.read_text().replace("print('mxnet only', 2 + 2)",
                                                 "print('mxnet only', 2 + 3)"))
    so.restore(book, verbose=False)
    logs = '\n'.join(d2lbook_eval(book.root))
    assert '1 notebooks are outdated' in logs and 'two.md' in logs
    capsys.readouterr()
    reused, evaluated, earlier = so.annotate(book)
    assert evaluated == [('chapter/two.md', 'mxnet')]
    assert len(reused) == 5 and earlier == []
    printed = capsys.readouterr().out
    assert 'reused stored outputs: 5' in printed and 'chapter/two.md [mxnet]' in printed
    for name, quick in (('one', False), ('two', True)):
        notes = set()
        for tab in TABS:
            nb = nbformat.read(str(book.eval_path(f'chapter/{name}.md', tab)), as_version=4)
            text = '\n'.join(c.source for c in nb.cells if c.cell_type == 'markdown')
            assert text.count('Where these outputs come from') + text.count(
                'Outputs of this page come from a quick run') == 1
            assert ('quick run' in text) == quick
            assert 'Full-mode run on' in text and 'numpy' in text
            assert ('Quick run by the book build' in text) == quick
            notes.add(nb.metadata[so.RECORD]['note'])
        assert len(notes) == 1, 'every tab of a page carries the same note, so the merge keeps one'
    # A second build changes nothing and keeps one note per page.
    before = {p: p.read_bytes() for p in (book.root / '_build').rglob('*.ipynb')}
    so.restore(book, verbose=False)
    so.annotate(book, verbose=False)
    assert {p: p.read_bytes() for p in (book.root / '_build').rglob('*.ipynb')} == before


@pytest.mark.slow
def test_publish_tags_only_cells_that_agree_between_full_and_quick_runs(published):
    book = so.Book(published)
    nb = nbformat.read(str(book.stored_path('chapter/one.md', 'paddle')), as_version=4)
    tags = {c.source.splitlines()[-1]: c.metadata.get('tags', []) for c in so.code_cells(nb)}
    assert tags["print('shared', 1)"] == [so.CHECK_TAG]
    assert tags["print('paddle, varies:', random.random())"] == []


def test_the_note_says_when_a_full_run_used_a_subset_and_how_large():
    record = {'mode': 'full', 'devices': '2 CPU cores, no GPU', 'date': '2026-11-25',
              'key_parts': {'versions': {'torch': '2.13.0', 'numpy': '1.23.5'}},
              'data': ['Fashion-MNIST, full mode on a subset (D2L_SUBSET=400,1000): '
                       '4000 training and 10000 test images']}
    note = so.note_text([('pytorch', dict(record, source='stored'))])
    assert ('Full-mode run on 2 CPU cores, no GPU, 2026-11-25: PyTorch (torch 2.13.0, numpy '
            '1.23.5); a class-balanced subset, 4000 training and 10000 test images') in note
    whole = dict(record, data=['Fashion-MNIST, full mode: 60000 training and 10000 test images'])
    assert '; 60000 training and 10000 test images' in so.note_text([('pytorch', whole)])


def volatile_notebook(salt):
    """A notebook as a kernel leaves it: counts, split streams, stderr, random SVG ids."""
    svg = (f'<svg><defs><path id="m{salt}a" d="M0 0"/><clipPath id="p{salt}b"><rect/></clipPath>'
           f'</defs><use xlink:href="#m{salt}a" clip-path="url(#p{salt}b)"/>'
           f'<dc:date>2026-01-0{salt}T00:00:00</dc:date></svg>')
    cell = nbformat.v4.new_code_cell('plot()', execution_count=7 + salt)
    cell.outputs = [
        nbformat.v4.new_output('stream', name='stdout', text='epoch 1\n'),
        nbformat.v4.new_output('stream', name='stderr', text=f'at 0x7f{salt}ab in /tmp/tmpx{salt}q\n'),
        nbformat.v4.new_output('display_data', data={'image/svg+xml': svg, 'text/plain': 'Fig'}),
        nbformat.v4.new_output('execute_result', data={'text/plain': str(ROOT / 'x')},
                               execution_count=7 + salt),
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell('# T'), cell])
    nb.metadata['widgets'] = {'state': salt}
    return nb


def test_normalised_runs_that_differ_only_in_volatile_details_are_identical():
    a = so.dumps(so.normalise(volatile_notebook(1), roots=(ROOT,)))
    b = so.dumps(so.normalise(volatile_notebook(2), roots=(ROOT,)))
    assert a == b
    for volatile in ('"execution_count": 8', 'm1a', 'dc:date', '0x7f1', str(ROOT), 'widgets'):
        assert volatile not in a


def test_the_normaliser_is_idempotent():
    once = so.normalise(volatile_notebook(3), roots=(ROOT,))
    assert so.dumps(so.normalise(once, roots=(ROOT,))) == so.dumps(once)


def nbval_sanitised(text, tmp_path):
    """`text` after the regex replacements that scripts/check_notebook_zips.py gives nbval."""
    spec = importlib.util.spec_from_file_location(
        'check_notebook_zips', ROOT / 'scripts' / 'check_notebook_zips.py')
    czip = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(czip)
    czip.sanitize_config(tmp_path / 'sanitize.cfg', [ROOT])
    import configparser
    config = configparser.ConfigParser(interpolation=None)
    config.read(tmp_path / 'sanitize.cfg')
    for section in config.sections():
        text = re.sub(config[section]['regex'], config[section]['replace'], text)
    return text


def test_nbval_compares_rounding_level_numbers_as_equal_and_real_differences_not(tmp_path):
    # PyTorch builds round differently: 7.5e-09 on one is 1.5e-08 on another.
    same = [nbval_sanitised(f'rank 0 differs from one process by {d}\n', tmp_path)
            for d in ('7.5e-09', '1.5e-08', '0.0e+00')]
    assert same[0] == same[1] == same[2]
    for real in ('3.2e-01', '1.0e-04', '0.500'):
        assert real in nbval_sanitised(f'differs by {real}', tmp_path)


def stored_notebooks():
    return sorted((ROOT / so.STORE).rglob('*.ipynb'))


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_stored_notebooks_are_normalised_and_recorded(path):
    assert so.dumps(so.normalise(nbformat.read(str(path), as_version=4))) == path.read_text(), (
        f'{path} is not normalised: python scripts/stored_outputs.py normalise {path}')
    record = json.loads(path.with_suffix('.json').read_text())
    tab, *page = path.relative_to(ROOT / so.STORE).parts
    assert record['tab'] == tab
    assert record['page'] == pathlib.Path(*page).with_suffix('.md').as_posix()
    assert (ROOT / record['page']).exists(), f'{path} stores a page that no longer exists'
    assert record['mode'] == 'full' and record['devices'] and record['date']


def test_committed_stored_outputs_stay_small():
    size = sum(p.stat().st_size for p in (ROOT / so.STORE).rglob('*') if p.is_file())
    assert size < 10 * 2**20, f'outputs/ holds {size / 2**20:.1f} MB; keep it under 10 MB'


@pytest.mark.parametrize('text', [
    'Modified FLAGS detected',
    'I1122 10:15:42.123456 31337 init.cc:233] ENV [CUSTOM_DEVICE_ROOT]=',
    'W0101 00:00:00.000 12 dynamic_loader.cc:3] cannot find',
    'FatalError: `Process abort signal` is detected by the operating system.',
    '*** Aborted at 1763800000 (unix time) try "date -d @1763800000" if you are using GNU date ***',
    '[2026-11-22 09:21:21,752] [    INFO] font_manager.py:1639 - generated new fontManager',
])
def test_framework_banners_and_cpp_log_lines_are_recognised(text):
    assert so.dirty_lines('epoch 1, loss 0.25\n' + text + '\ntest accuracy 0.91') == [text]


def test_ordinary_outputs_are_not_flagged():
    text = ('Fashion-MNIST, full mode: 60000 training and 10000 test images\n'
            'I have 2 devices: [cpu, cpu]\nepoch 10, test accuracy 0.901, 12.3 sec/epoch\n'
            'ValueError: num_devices must be a positive int, got 0')
    assert so.dirty_lines(text) == []


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_stored_outputs_show_no_banners_or_cpp_logs(path):
    nb = nbformat.read(str(path), as_version=4)
    dirty = [line for text in so.output_texts(nb) for line in so.dirty_lines(text)]
    assert dirty == [], f'{path} shows framework banners, C++ log lines or abort dumps'


@pytest.mark.parametrize('source', ['# T\n:label:`sec_t`\n\nText.\nMore.', '# T\n\nText.', '# T'])
def test_the_note_sits_under_the_title_and_comes_off_exactly(source):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(source)])
    nb.metadata[so.RECORD] = {}
    so.add_note(nb, 'Where these outputs come from. Here.')
    noted = nb.cells[0].source
    assert noted.count('Where these outputs come from') == 1
    assert noted.index('Here.') > noted.index('# T') and noted.index('Here.') < len(noted) - len(
        source.split('\n\n', 1)[-1]) + 1
    assert so.strip_note(nb).cells[0].source == source


ACCURACY = re.compile(r'test accuracy (\d+\.\d+)')


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_stored_training_run_learns_and_shows_its_curve(path):
    """A full-mode run that prints a test accuracy reached at least 0.80 and left its figure."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in so.code_cells(nb):
        texts = [o.get('text', '') for o in cell.outputs if o.get('output_type') == 'stream']
        accuracies = [float(a) for t in texts for a in ACCURACY.findall(t)]
        if not accuracies:
            continue
        assert min(accuracies) >= 0.80, (
            f'{path}: a training cell printed test accuracy {min(accuracies)}')
        if any(word in cell.source for word in ('Animator', 'train(', 'train_ddp')):
            assert any(m.startswith('image/') for o in cell.outputs
                       for m in o.get('data', {})), (
                f'{path}: the training cell {cell.source[:60]!r} shows no figure')
