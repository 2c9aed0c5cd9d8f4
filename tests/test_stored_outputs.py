"""Stored outputs (scripts/stored_outputs.py): the book shows full-mode runs kept in
outputs/, reuses them exactly while their code is unchanged, evaluates only
what changed, and says on every page where its outputs come from.

The mechanism is exercised on a small book of two pages built in a temporary
folder (real d2lbook evaluation, real kernels); the committed store is checked
as it is.
"""
import errno
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
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


def gpu_run(book, out, *pages):
    """scripts/gpu_run.py on BOOK's PAGES in full mode, into OUT (no GPU needed for this book)."""
    proc = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'gpu_run.py'), '--root',
                           str(book.root), '--out', str(out), '--pages', *pages],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_a_gpu_run_is_stored_beside_the_cpu_runs_with_its_own_record(book, tmp_path, capsys):
    _, before = status_lines(book, capsys)
    cpu = {p: p.read_bytes() for p in (book.root / so.STORE).rglob('*.ipynb')}
    run = gpu_run(book, tmp_path / 'run', 'chapter/one.md', 'chapter/two.md')
    stored, refused = so.store_gpu(book, run)
    assert refused == [] and [p.relative_to(book.root).as_posix() for p in stored] == [
        'outputs/gpu/pytorch/chapter/one.ipynb', 'outputs/gpu/pytorch/chapter/two.ipynb']
    nb = nbformat.read(str(stored[0]), as_version=4)
    assert 'pytorch only 2 hello launch.py' in ''.join(so.output_texts(nb))
    assert nb.metadata[so.RECORD]['mode'] == 'full' and 'gpu' in nb.metadata[so.RECORD]
    assert {p: p.read_bytes() for p in cpu} == cpu
    damaged, lines = status_lines(book, capsys)
    assert damaged == 0 and lines == before + [
        'stored   chapter/one.md [pytorch on a GPU]', 'stored   chapter/two.md [pytorch on a GPU]']
    assert stale(so.restore(book, verbose=False)) == []
    # A helper the page uses changes: its CPU and its GPU outputs are stale.
    edit(book.root / 'd2l' / 'torch.py', "return 'hello'", "return 'hi'")
    _, lines = status_lines(book, capsys)
    assert [line for line in lines if line.startswith('stale')] == [
        'stale    chapter/one.md [pytorch]', 'stale    chapter/one.md [pytorch on a GPU]']
    # A run of other code, in quick mode, or with a failed cell is not stored.
    path = run / 'pytorch' / 'chapter' / 'two.ipynb'
    for change, why in (({'mode': 'quick'}, 'a quick-mode run'),
                        ({'failed': 'ValueError: no'}, 'a cell failed (ValueError: no)')):
        nb = json.loads(path.read_text())
        nb['metadata'][so.RECORD].update(change)
        path.write_text(json.dumps(nb))
        assert so.store_gpu(book, run)[1] == [
            'run/pytorch/chapter/one.ipynb: its code, d2l or scripts differ from the page\'s now'
            .replace('run/', f'{run}/'), f'{path}: {why}']


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


def test_an_attribute_set_on_a_function_counts_only_with_the_function():
    source = '''
        def train():
            return 1
        def check(n):
            return n
        train.check = check
        def other():
            return 2
        '''
    assert 'train.check = check' not in reached(source, 'other')
    assert reached(source, 'train').splitlines() == [
        'def train():', '    return 1', 'def check(n):', '    return n',
        'train.check = check']


def test_the_functions_a_factory_returns_count_one_by_one():
    source = '''
        def helpers(d2l):
            """Made for one side."""
            limit = 3
            def first():
                return d2l.base() + limit
            def second():
                return 2
            return [first, second]
        def base():
            return 0
        install(helpers(d2l))
        '''
    always = reached(source)
    assert 'install(helpers(d2l))' in always and 'limit = 3' in always
    assert 'def first' not in always and 'def second' not in always
    first = reached(source, 'first')
    assert 'def first' in first and 'def base' in first
    assert 'def second' not in first


# A generated module whose hand-written header imports a hand-written module
# of the package, which imports another: (header line, how the saved code calls).
IMPORTS = [('from d2l.runtime import *', 'd2l.train'), ('from .runtime import train', 'train'),
           ('from d2l import runtime', 'runtime.train'), ('import d2l.runtime', 'd2l.runtime.train')]


def split_package(folder, header, call):
    (folder / 'd2l').mkdir(parents=True)
    (folder / 'd2l' / 'torch.py').write_text(
        f'"""Generated."""\n{header}\n\n#################   WARNING   ################\n'
        f'def fit(net):\n    return {call}(net)\n')
    (folder / 'd2l' / 'runtime.py').write_text(
        'from .base import describe\n\ndef train(net):\n    return describe(net)\n\n'
        'def unused():\n    return 0\n')
    (folder / 'd2l' / 'base.py').write_text(
        'def describe(net):\n    return str(net)\n\ndef other():\n    return 1\n')


@pytest.mark.parametrize('header,call', IMPORTS, ids=[h for h, _ in IMPORTS])
def test_a_changed_function_of_an_imported_hand_written_module_stales_the_pages_reaching_it(
        tmp_path, header, call):
    split_package(tmp_path, header, call)
    pages = {'fits': ['from d2l import torch as d2l', 'd2l.fit(1)'], 'prints': ['print(1)']}

    def keys():
        return {name: so.runner.key_parts(tmp_path, tmp_path / 'd2l' / 'torch.py',
                                          f'chapter/{name}.md', code, {})[0]
                for name, code in pages.items()}

    def changed(module, old, new):
        before = keys()
        edit(tmp_path / 'd2l' / module, old, new)
        return sorted(name for name, key in keys().items() if key != before[name])

    assert changed('runtime.py', 'return describe(net)', 'return describe(net) * 2') == ['fits']
    assert changed('base.py', 'return str(net)', 'return repr(net)') == ['fits']
    assert changed('runtime.py', 'return 0', 'return 2') == []
    assert changed('base.py', 'return 1', 'return 3') == []
    # What a hand-written module runs on import reaches every page.
    assert changed('base.py', 'def other', 'print("loaded")\n\ndef other') == ['fits', 'prints']


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
            assert 'NumPy' in text and re.search(r'; \d{4}-\d\d-\d\d', text)
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


CPU = '2 CPU cores (AMD EPYC), no GPU'


def stored_record(tab, version, date='2026-11-25', data=(), epochs=None, **more):
    package = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddlepaddle'}[tab]
    return (tab, dict({'mode': 'full', 'devices': CPU, 'date': date, 'source': 'stored',
                       'key_parts': {'versions': {package: version, 'numpy': '1.23.5'}},
                       'data': list(data), 'epochs': epochs}, **more))


SUBSET = ('Fashion-MNIST, full mode on a subset (D2L_SUBSET=600,200): '
          '6000 training and 2000 test images')


def test_the_note_says_when_a_full_run_used_a_subset_and_how_large():
    note = so.note_text([stored_record('pytorch', '2.13.0', data=[SUBSET], epochs=10)])
    assert note == ('*Where these outputs come from:* 2 CPU cores (AMD EPYC), no GPU; '
                    'PyTorch 2.13.0, NumPy 1.23.5; 6,000 training images, 600 per class, '
                    '2,000 test images, 10 epochs; 2026-11-25.')
    whole = stored_record('pytorch', '2.13.0', data=[
        'Fashion-MNIST, full mode: 60000 training and 10000 test images'])
    assert '; all 60,000 training and 10,000 test images; ' in so.note_text([whole])
    # A subset of a full-mode run is no contradiction in terms.
    assert 'Full-mode run' not in note and 'subset' not in note


def test_the_note_is_one_line_that_credits_only_the_runs_that_exist():
    """Two tabs trained on a subset, MXNet ran a small demonstration a day earlier."""
    note = so.note_text([
        stored_record('pytorch', '2.13.0', '2026-11-26', [SUBSET], 10),
        stored_record('mxnet', '1.9.1', '2026-11-25'),
        stored_record('paddle', '3.3.1', '2026-11-25', [SUBSET], 10)])
    assert note == (
        '*Where these outputs come from:* 2 CPU cores (AMD EPYC), no GPU; PyTorch 2.13.0, '
        'MXNet 1.9.1, PaddlePaddle 3.3.1, NumPy 1.23.5; PyTorch and PaddlePaddle: 6,000 '
        'training images, 600 per class, 2,000 test images, 10 epochs; 2026-11-25 to '
        '2026-11-26.')
    assert note.count(CPU) == 1 and '\n' not in note


def test_a_page_that_trains_nothing_names_no_epochs():
    note = so.note_text([stored_record(tab, v) for tab, v in (
        ('pytorch', '2.13.0'), ('mxnet', '1.9.1'), ('paddle', '3.3.1'))])
    assert 'epoch' not in note
    assert note.endswith('NumPy 1.23.5; 2026-11-25.')


def test_a_quick_run_of_the_build_says_so_first():
    quick = stored_record('pytorch', '2.13.0', '2026-11-27', [
        'Fashion-MNIST, quick mode (no GPU found; set D2L_QUICK=0 for the full data): '
        '100 training and 100 test images'], 2, mode='quick', source='evaluated')
    note = so.note_text([quick, stored_record('paddle', '3.3.1', data=[SUBSET], epochs=10)])
    assert note.startswith('**Outputs of this page come from a quick run** (PyTorch)')
    assert ('PyTorch: 100 training images, 10 per class, 100 test images, 2 epochs; '
            'PaddlePaddle: 6,000 training images') in note
    assert note.count(CPU) == 1 and note.endswith('2026-11-25 to 2026-11-27.')


def code_notebook(*sources):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


@pytest.mark.parametrize('sources,full,quick', [
    (['num_epochs, lr = d2l.train_epochs(10), 0.1'], 10, 1),
    (['def train(lr, num_epochs=10):\n    num_epochs = d2l.train_epochs(num_epochs)',
      'train(lr=0.1)'], 10, 1),
    (['n = d2l.train_epochs(1)'], 1, 1),
    (['[round(cosine_lr(0.1, epoch, 10), 4) for epoch in range(10)]'], None, None),
    (['print(d2l.describe_devices(d2l.try_gpus(2)))'], None, None),
])
def test_the_epochs_come_from_the_code_as_train_epochs_gives_them(sources, full, quick):
    nb = code_notebook(*sources)
    assert so.epochs_of(nb, quick=False) == full
    assert so.epochs_of(nb, quick=True) == quick


STORED_PAGES = sorted({p.relative_to(ROOT / so.STORE).parts[1:] for tab in TABS
                       for p in (ROOT / so.STORE / tab).rglob('*.ipynb')})


@pytest.mark.parametrize('parts', STORED_PAGES, ids=lambda parts: '/'.join(parts))
def test_every_stored_page_gets_one_short_line_with_the_epochs_it_trains(parts):
    """The note each page gets from the committed records, as annotate builds it."""
    records = []
    for tab in TABS:
        path = ROOT / so.STORE / tab / pathlib.Path(*parts)
        if not path.exists():
            continue
        nb = nbformat.read(str(path), as_version=4)
        record = nb.metadata[so.RECORD]
        epochs = so.epochs_of(nb, record['mode'] == 'quick')
        records.append((tab, dict(record, source='stored', epochs=epochs)))
    note = so.note_text(records)
    assert '\n' not in note and len(note) < 400, note
    for devices in {rec['devices'] for _, rec in records}:
        assert note.count(devices) == 1, f'{devices!r} repeated in {note!r}'
    assert 'as written in the code' not in note
    trained = {rec['epochs'] for _, rec in records if rec['epochs']}
    assert ('epochs' in note) == bool(trained)
    for epochs in trained:
        assert f'{epochs} epochs' in note


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


@pytest.mark.parametrize('page', ['chapter_multi_gpu/multiple-gpus.md',
                                  'chapter_multi_gpu/multiple-gpus-concise.md'])
def test_the_stored_runs_of_every_tab_trained_the_same_images(page):
    """Outputs stored for the current code say which data the run loaded;
    every tab of a page trained on the same images (stale outputs are not
    shown: the build evaluates those tabs in quick mode)."""
    book = so.Book(ROOT)
    data, subsets = {}, {}
    for tab in book.tabs:
        state, record, _ = so.read_stored(book, page, tab)
        if state == 'stored':
            # A tab whose loader runs only in worker processes (PaddlePaddle's
            # spawn) prints no data line; its record still holds the subset.
            subsets[tab] = record.get('env', {}).get('D2L_SUBSET')
            if record['data']:
                data[tab] = tuple(record['data'])
    assert len(set(subsets.values())) <= 1, subsets
    assert len(set(data.values())) <= 1, data


def zip_check_module():
    """scripts/check_notebook_zips.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        'check_notebook_zips', ROOT / 'scripts' / 'check_notebook_zips.py')
    czip = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(czip)
    return czip


def nbval_sanitised(text, tmp_path):
    """`text` after the regex replacements that scripts/check_notebook_zips.py gives nbval."""
    czip = zip_check_module()
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


def test_nbval_compares_floats_printed_in_full_to_three_decimals(tmp_path):
    # MXNet's loss on the from-scratch page: 22.641289 on an AMD EPYC, where
    # it was stored, and 22.64129 on an Intel Xeon.
    assert nbval_sanitised('((4, 10), array(22.641289))', tmp_path) == \
        nbval_sanitised('((4, 10), array(22.64129))', tmp_path)
    for one, other in (('22.641289', '22.642289'), ('0.806', '0.807'),
                       ('18.1 s/epoch', '18.2 s/epoch'), ('version 2.13.0', 'version 2.13.1')):
        assert nbval_sanitised(one, tmp_path) != nbval_sanitised(other, tmp_path)


def test_the_zip_check_skips_only_notebooks_this_build_ran_in_quick_mode(tmp_path):
    """--skip-evaluated: no notebook runs twice in one environment, stored ones still run."""
    czip = zip_check_module()
    seen = {}
    for name, record in [('quick', {'source': 'evaluated', 'mode': 'quick'}),
                         ('stored', {'source': 'stored', 'mode': 'full'}),
                         ('full', {'source': 'evaluated', 'mode': 'full'}),
                         ('bare', None)]:
        nb = nbformat.v4.new_notebook()
        if record:
            nb.metadata[so.RECORD] = record
        path = tmp_path / f'{name}.ipynb'
        nbformat.write(nb, str(path))
        seen[name] = czip.evaluated_here(path)
    assert seen == {'quick': True, 'stored': False, 'full': False, 'bare': False}


def stored_notebooks():
    """Every committed stored notebook: outputs/<tab>/ and the GPU runs in outputs/gpu/<tab>/."""
    return sorted((ROOT / so.STORE).rglob('*.ipynb'))


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_stored_notebooks_are_normalised_and_carry_their_record(path):
    nb = nbformat.read(str(path), as_version=4)
    assert so.dumps(so.normalise(nb)) == path.read_text(), (
        f'{path} is not normalised: python scripts/stored_outputs.py normalise {path}')
    parts = path.relative_to(ROOT / so.STORE).parts
    tab, *page = parts[parts[0] == so.GPU:]
    page = pathlib.Path(*page).with_suffix('.md').as_posix()
    assert so.record_problem(nb.metadata.get(so.RECORD), page, tab) is None
    assert (ROOT / page).exists(), f'{path} stores a page that no longer exists'
    record = nb.metadata[so.RECORD]
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
    # A library's own failure text, where the book says in one line what failed.
    '[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error '
    '[127.0.0.1]:23971: Connection reset by peer.',
    'on the CPU: group_sharded_parallel only support gpu, xpu and custom_device now',
    '/usr/lib/python3/site-packages/paddle/utils/cpp_extension.py:711: UserWarning: No ccache',
    '  (at /paddle/paddle/phi/core/dense_tensor.cc:160)',
])
def test_framework_banners_and_cpp_log_lines_are_recognised(text):
    assert so.dirty_lines('epoch 1, loss 0.25\n' + text + '\ntest accuracy 0.91') == [text]


def test_ordinary_outputs_are_not_flagged():
    text = ('Fashion-MNIST, full mode: 60000 training and 10000 test images\n'
            'I have 2 devices: [cpu, cpu]\nepoch 10, test accuracy 0.901, 12.3 sec/epoch\n'
            'ValueError: num_devices must be a positive int, got 0\n'
            'rank 1 gone : rank 0 raised after 0.031 s: Gloo lost the connection to rank 1\n'
            'on the CPU: group_sharded_parallel refused (AssertionError)\n'
            'cost-model.md shows it; train.py --epochs 10')
    assert so.dirty_lines(text) == []


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_stored_outputs_show_no_banners_or_cpp_logs(path):
    nb = nbformat.read(str(path), as_version=4)
    dirty = [line for text in so.output_texts(nb) for line in so.dirty_lines(text)]
    assert dirty == [], f'{path} shows framework banners, C++ log lines or abort dumps'


# An output line longer than this is a raw log, not the book's words.
LONGEST_OUTPUT_LINE = 160


@pytest.mark.parametrize('path', stored_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_stored_outputs_hold_no_line_longer_than_a_sentence(path):
    nb = nbformat.read(str(path), as_version=4)
    long = [line[:100] + '...' for text in so.output_texts(nb) for line in text.splitlines()
            if len(line) > LONGEST_OUTPUT_LINE]
    assert long == [], f'{path} shows raw lines over {LONGEST_OUTPUT_LINE} characters'


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
    """A full-mode run that prints a test accuracy learned (at least 0.5, five
    times chance: the subsets that fit a CPU and the ResNet-18 page's
    deliberately short large-batch run end between 0.6 and 0.85), and the
    training cell or the cell after it draws the curves."""
    nb = nbformat.read(str(path), as_version=4)
    cells = so.code_cells(nb)
    for i, cell in enumerate(cells):
        texts = [o.get('text', '') for o in cell.outputs if o.get('output_type') == 'stream']
        accuracies = [float(a) for t in texts for a in ACCURACY.findall(t)]
        if not accuracies:
            continue
        assert min(accuracies) >= 0.5, (
            f'{path}: a training cell printed test accuracy {min(accuracies)}')
        if any(word in cell.source for word in ('Animator', 'train(', 'train_ddp')):
            assert any(m.startswith('image/') for c in cells[i:i + 2]
                       for o in c.outputs for m in o.get('data', {})), (
                f'{path}: the training cell {cell.source[:60]!r} shows no figure')


# ---------------------------------------------------------------------------
# Interrupted writes and damaged records, on a copy of real stored outputs

def smallest_stored_page():
    """The page whose stored outputs, all tabs together, are smallest."""
    sizes = {}
    for path in [p for p in stored_notebooks() if p.parts[len(ROOT.parts) + 1] in TABS]:
        _, *rest = path.relative_to(ROOT / so.STORE).parts
        page = pathlib.Path(*rest).with_suffix('.md').as_posix()
        if (ROOT / page).exists():
            sizes[page] = sizes.get(page, 0) + path.stat().st_size
    return min(sizes, key=sizes.get)


def git(root, *args):
    return subprocess.run(['git', '-c', 'user.name=test', '-c', 'user.email=test@localhost',
                           *args], cwd=root, capture_output=True, text=True, check=True).stdout


def committed(path):
    """PATH as committed (HEAD), so that others' edits in progress leave the
    copy's pages as current as their stored outputs; PATH itself without git."""
    try:
        return subprocess.run(['git', 'show', f'HEAD:{path.relative_to(ROOT).as_posix()}'],
                              cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return path.read_bytes()


@pytest.fixture
def real(tmp_path):
    """A copy of the book tree with one real page, its scripts, d2l and its stored
    outputs in every tab, committed to a git repository of its own."""
    page = smallest_stored_page()
    root = tmp_path / 'book'
    paths = [ROOT / 'config.ini', ROOT / 'index.md', ROOT / page]
    paths += sorted((ROOT / 'd2l').glob('*.py')) + sorted((ROOT / page).parent.glob('*.py'))
    paths += [ROOT / pathlib.Path(so.STORE, tab, page).with_suffix('.ipynb') for tab in TABS]
    for path in paths:
        copy = root / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(committed(path))
    git(root, 'init', '-q')
    git(root, 'add', '.')
    git(root, 'commit', '-q', '-m', 'the book')
    return so.Book(root), page


def files(book, page, tab):
    """The bytes of the stored notebook of PAGE's TAB (None if absent)."""
    path = book.stored_path(page, tab)
    return path.read_bytes() if path.exists() else None


def status_lines(book, capsys):
    capsys.readouterr()
    damaged = so.status(book)
    return damaged, capsys.readouterr().out.splitlines()


def temporary_files(book):
    return sorted((book.root / so.STORE).rglob('.*.tmp'))


def fake_kernel(monkeypatch, quick=None):
    """Replace the kernels publish runs: the full-mode run prints `full run` in
    every cell; the quick one prints the same in the first cell and `quick run`
    in the others, or raises QUICK."""
    def execute(book, page, tab, nb, env, timeout=None):
        nb = nbformat.from_dict(json.loads(json.dumps(nb)))
        if env['D2L_QUICK'] == '1' and quick is not None:
            raise quick
        for i, cell in enumerate(so.code_cells(nb)):
            text = 'quick run\n' if env['D2L_QUICK'] == '1' and i else 'full run\n'
            cell.outputs = [nbformat.v4.new_output('stream', name='stdout', text=text)]
        return nb
    monkeypatch.setattr(so, 'execute', execute)


# Runs publish for one page and tab in a process of its own, with the
# kernel replaced (a run whose notebook is over 64 KiB) and its write
# interrupted as argv[5] says: 'kill' (the kernel kills the process at the
# file size limit of 32 KiB), 'fail' (the write fails there with EFBIG, as
# on a full disk) or 'ctrl-c' (SIGINT arrives in the middle of the write
# into outputs/).
CHILD = r'''
import importlib.util, os, resource, signal, sys
spec = importlib.util.spec_from_file_location('so', sys.argv[1])
so = importlib.util.module_from_spec(spec)
spec.loader.exec_module(so)
book, page, tab, how = so.Book(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

def execute(book, page, tab, nb, env, timeout=None):
    nb = so.copy.deepcopy(nb)
    for cell in so.code_cells(nb):
        cell.outputs = [so.nbformat.v4.new_output('stream', name='stdout',
                                                  text='new run\n' * 8192)]
    return nb

so.execute = execute
if how in ('kill', 'fail'):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, resource.RLIM_INFINITY))
    if how == 'kill':
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it
else:
    real_write, interrupted = os.write, []

    def write(fd, data):
        path = os.readlink(f'/proc/self/fd/{fd}')
        if interrupted or os.sep + so.STORE + os.sep not in path:
            return real_write(fd, data)
        interrupted.append(path)
        done = real_write(fd, bytes(data)[:len(data) // 2])
        signal.raise_signal(signal.SIGINT)
        return done

    os.write = write
so.publish(book, [page], [tab], classify=False)
'''


def publish_in_child(book, page, tab, how):
    return subprocess.run(
        [sys.executable, '-c', CHILD, spec.origin, str(book.root), page, tab, how],
        cwd=book.root, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE='1'))


@pytest.mark.parametrize('how', ['kill', 'fail'])
def test_a_publish_cut_off_in_its_write_leaves_the_previous_outputs_whole(
        real, capsys, monkeypatch, how):
    book, page = real
    before = {tab: files(book, page, tab) for tab in TABS}
    _, lines = status_lines(book, capsys)
    run = publish_in_child(book, page, 'pytorch', how)
    if how == 'kill':
        assert run.returncode == -signal.SIGXFSZ, run.stderr[-3000:]
    else:
        assert run.returncode == 1 and 'File too large' in run.stderr, run.stderr[-3000:]
        assert (f'publish: could not store the run of {page} [pytorch] in '
                f'{book.stored_path(page, "pytorch").relative_to(book.root).as_posix()} '
                f'(OSError: [Errno 27] File too large), nor keep it in _build/publish '
                ) in run.stderr and run.stderr.count(
                    f'make publish PAGES={page} TABS=pytorch') == 1
    assert {tab: files(book, page, tab) for tab in TABS} == before
    damaged, after = status_lines(book, capsys)
    assert damaged == 0
    assert [line for line in after if not line.startswith('leftover ')] == lines
    left = temporary_files(book)
    if how == 'fail':
        assert left == []
        return
    # Killed outright, the process could not remove its temporary file:
    # status names it, and the next publish of the page removes it.
    assert [path.name.split('.')[1:3] for path in left] == [[page.split('/')[-1][:-3], 'ipynb']]
    assert [line for line in after if line.startswith('leftover ')] == [
        f'leftover {path.relative_to(book.root).as_posix()}: a temporary file of an '
        f'interrupted write (the stored files are whole); the next publish there removes '
        f'it, or: rm {path.relative_to(book.root).as_posix()}' for path in left]
    fake_kernel(monkeypatch)
    so.publish(book, [page], ['pytorch'], classify=False)
    assert temporary_files(book) == []


def test_ctrl_c_in_the_middle_of_a_write_stores_the_new_notebook_whole(real, capsys):
    book, page = real
    old = files(book, page, 'pytorch')
    run = publish_in_child(book, page, 'pytorch', 'ctrl-c')
    # Ctrl-C takes effect once the notebook, its record inside, is in place.
    assert run.returncode == -signal.SIGINT, run.stderr[-3000:]
    assert run.stderr.rstrip().endswith('KeyboardInterrupt'), run.stderr[-3000:]
    new = files(book, page, 'pytorch')
    assert new != old, run.stderr[-3000:]
    assert new.decode().count('new run') == 8192 * len(
        so.code_cells(nbformat.reads(new.decode(), as_version=4)))
    state, record, _ = so.read_stored(book, page, 'pytorch')
    assert state == 'stored' and record['mode'] == 'full'
    assert temporary_files(book) == []


def test_an_interrupted_quick_pass_keeps_the_full_mode_run_stored(real, monkeypatch, capsys):
    book, page = real
    others = {tab: files(book, page, tab) for tab in TABS[1:]}
    fake_kernel(monkeypatch, quick=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        so.publish(book, [page], ['pytorch'])
    out = book.stored_path(page, 'pytorch').relative_to(book.root).as_posix()
    message = capsys.readouterr().err
    assert (f'the quick pass of {page} [pytorch] did not finish (KeyboardInterrupt). The '
            f'full-mode run') in message and f'stays stored in {out}, with its record' in message
    assert f'tag {book.root} --pages {page} --tabs pytorch' in message
    state, record, stored = so.read_stored(book, page, 'pytorch')
    assert state == 'stored' and record['nbval_tags'] == 'pending'
    assert {c.outputs[0].text for c in so.code_cells(stored)} == {'full run\n'}
    assert all(not c.metadata.get('tags') for c in so.code_cells(stored))
    assert {tab: files(book, page, tab) for tab in TABS[1:]} == others
    _, lines = status_lines(book, capsys)
    assert lines[lines.index(f'stored   {page} [pytorch]') + 1].startswith(
        '         its quick pass did not finish')
    # The tag command adds the tags without running the full mode again.
    fake_kernel(monkeypatch)
    so.tag(book, [page], ['pytorch'])
    state, record, tagged = so.read_stored(book, page, 'pytorch')
    assert state == 'stored' and 'nbval_tags' not in record
    assert [c.outputs for c in so.code_cells(tagged)] == [c.outputs for c in
                                                         so.code_cells(stored)]
    assert [c.metadata.get('tags', []) for c in so.code_cells(tagged)] == [[so.CHECK_TAG]] + [
        []] * (len(so.code_cells(tagged)) - 1)
    assert temporary_files(book) == []


def test_a_run_that_cannot_be_stored_is_kept_with_the_way_to_store_it(
        real, monkeypatch, capsys):
    book, page = real
    before = files(book, page, 'pytorch')
    real_mkstemp = so.tempfile.mkstemp

    def full_disk(dir, **kwargs):
        if pathlib.Path(dir).relative_to(book.root).parts[0] == so.STORE:
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_mkstemp(dir=dir, **kwargs)

    monkeypatch.setattr(so.tempfile, 'mkstemp', full_disk)
    fake_kernel(monkeypatch)
    with pytest.raises(OSError, match='No space left on device'):
        so.publish(book, [page], ['pytorch'], classify=False)
    assert files(book, page, 'pytorch') == before and temporary_files(book) == []
    message = capsys.readouterr().err
    assert f'could not store the run of {page} [pytorch]' in message
    monkeypatch.undo()
    moves = message.split('move it into place: ')[1].strip()
    assert moves.startswith('mv _build/publish/outputs/pytorch/')
    subprocess.run(moves, shell=True, cwd=book.root, check=True)
    state, _, stored = so.read_stored(book, page, 'pytorch')
    assert state == 'stored'
    assert {c.outputs[0].text for c in so.code_cells(stored)} == {'full run\n'}


def cut_notebook(book, page, tab):
    path = book.stored_path(page, tab)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    return path


def not_a_notebook(book, page, tab):
    path = book.stored_path(page, tab)
    path.write_text('[]\n')
    return path


def delete_notebook(book, page, tab):
    path = book.stored_path(page, tab)
    path.unlink()
    return path


def change_record(book, page, tab, change):
    path = book.stored_path(page, tab)
    nb = nbformat.read(str(path), as_version=4)
    change(nb.metadata)
    path.write_text(so.dumps(nb))
    return path


def remove_record(book, page, tab):
    return change_record(book, page, tab, lambda meta: meta.pop(so.RECORD))


def data_not_a_list(book, page, tab):
    """Issue 43: such a record passed as stored, then crashed `make html` with a TypeError."""
    return change_record(book, page, tab, lambda meta: meta[so.RECORD].update(data=5))


def key_parts_a_list(book, page, tab):
    """Issue 43: such a record passed as stored, then crashed `make html` (AttributeError)."""
    return change_record(book, page, tab, lambda meta: meta[so.RECORD].update(key_parts=[]))


def versions_not_strings(book, page, tab):
    return change_record(book, page, tab, lambda meta: meta[so.RECORD]['key_parts'].update(
        versions={'torch': 2}))


def notebook_of_another_tab(book, page, tab):
    path = book.stored_path(page, tab)
    shutil.copy(book.stored_path(page, 'mxnet'), path)
    return path


DAMAGE = [cut_notebook, not_a_notebook, delete_notebook, remove_record, data_not_a_list,
          key_parts_a_list, versions_not_strings, notebook_of_another_tab]


@pytest.mark.parametrize('damage', DAMAGE, ids=lambda f: f.__name__)
def test_status_and_restore_name_a_damaged_file_and_the_fix_that_works(
        real, capsys, damage):
    book, page = real
    _, before = status_lines(book, capsys)
    assert not any(line.startswith('damaged') for line in before)
    restored = so.restore(book, verbose=False)
    broken = damage(book, page, 'pytorch').relative_to(book.root).as_posix()
    damaged, lines = status_lines(book, capsys)
    assert damaged == 1
    fix = (f'git checkout -- {broken} (the committed outputs), or make publish '
           f'PAGES={page} TABS=pytorch')
    line = lines[before.index(next(b for b in before if b.endswith(f'{page} [pytorch]')))]
    assert line.startswith(f'damaged  {page} [pytorch]: {broken} ') and line.endswith(
        f'; fix: {fix}'), line
    # The other tabs are reported as before, and the command says it failed.
    assert [b for b in lines if b != line] == [b for b in before if not b.endswith('[pytorch]')]
    assert so.main(['status', str(book.root)]) == 1
    capsys.readouterr()
    # restore (make book) evaluates the page instead, and says why in one line.
    report = so.restore(book, verbose=False)
    assert report['damaged'] == [(page, 'pytorch')]
    assert {k: v for k, v in report.items() if k != 'damaged'} == {
        k: [pt for pt in v if pt != (page, 'pytorch')] for k, v in restored.items()
        if k != 'damaged'}
    assert not book.eval_path(page, 'pytorch').exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f'stored outputs: {page} [pytorch] is evaluated in quick mode: {broken} ') and \
        err[0].endswith(fix)
    # The fix as given brings back the committed outputs.
    subprocess.run(fix.split(' (')[0].split(), cwd=book.root, check=True)
    assert status_lines(book, capsys) == (0, before)


def test_every_committed_stored_page_reads_as_stored_or_stale(capsys):
    assert so.status(so.Book(ROOT)) == 0
    assert not [line for line in capsys.readouterr().out.splitlines()
                if not line.startswith(('stored ', 'stale ', 'missing '))]
