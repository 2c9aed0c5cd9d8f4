#!/usr/bin/env python3
"""Stored outputs: what readers see comes from full-mode runs kept in the repository.

    python scripts/stored_outputs.py status    [BOOK_ROOT]
    python scripts/stored_outputs.py restore   [BOOK_ROOT]   (before d2lbook build eval)
    python scripts/stored_outputs.py annotate  [BOOK_ROOT]   (after it)
    python scripts/stored_outputs.py publish   [BOOK_ROOT] [--pages P.md ...] [--tabs T ...]
    python scripts/stored_outputs.py tag       [BOOK_ROOT] --pages P.md ... --tabs T ...
    python scripts/stored_outputs.py store-gpu [BOOK_ROOT] [--run _build/gpu-run]
    python scripts/stored_outputs.py normalise NOTEBOOK ...

`outputs/<tab>/<page>.ipynb` holds a page's tab as a full-mode run
(D2L_QUICK=0) left it, normalised so that a diff shows what changed, and in its
metadata (RECORD) the record of the run, with its key (page_runner.key_parts).
`restore` writes, for every page whose key matches, the evaluated notebook
d2lbook would write, so that `d2lbook build eval` evaluates only the rest;
`annotate` then says on each page where its outputs come from. `publish` runs
pages in full mode and stores them, then in quick mode as CI does, to tag the
cells nbval compares (`tag` redoes that pass alone). A damaged store names the
file and the fix. `store-gpu` stores a gpu_run.py run in outputs/gpu/. The
README's "Stored outputs" tells the rest.
"""
import argparse
import copy
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import nbformat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import page_runner as runner  # noqa: E402
from page_runner import (RECORD, code_cells, framework_versions, leftovers,  # noqa: E402,F401
                         machine, quick_now, reachable_source, sha256)

ROOT = pathlib.Path(__file__).resolve().parent.parent
STORE = 'outputs'
GPU = 'gpu'  # outputs/gpu/<tab>/<page>.ipynb: runs of scripts/gpu_run.py
CHECK_TAG = 'nbval-check-output'
FRAMEWORK_NAMES = {'pytorch': 'PyTorch', 'mxnet': 'MXNet', 'paddle': 'PaddlePaddle'}
_join = runner.join
# What no reader should see in an output: framework banners, glog-style C++
# log lines (I1122 10:00:00.123 4567 file.cc:89] ...), abort dumps, and a
# library's own failure text where the book should say in one line what
# failed: a C++ source location ([.../gloo/transport/tcp/pair.cc:537]), a
# Python warning's location (x.py:12: UserWarning) or PaddlePaddle's refusal
# of a device ("... only support gpu, xpu and custom_device now").
DIRTY = re.compile(
    r'Modified FLAGS detected'
    r'|[\w.-]\.(?:cc|cpp|cxx|cu|h|hpp):\d+\b'
    r'|\.py:\d+: \w*Warning\b'
    r'|\bonly supports? (?:cpu|gpu|xpu|custom_device)\b'
    r'|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+[\w./-]+:\d+\]'
    r'|FatalError|Process abort signal|\*\*\* Aborted at|C\+\+ Traceback'
    r'|terminate called after throwing|Error Message Summary'
    # Python logging in PaddlePaddle's format, e.g. matplotlib's font cache note.
    r'|^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[\s*(?:DEBUG|INFO|WARNING)\]', re.M)


def dirty_lines(text):
    """The lines of TEXT that hold a banner, a C++ log line, an abort dump or raw failure text."""
    return [line for line in text.splitlines() if DIRTY.search(line)]


def output_texts(nb):
    """Every text an output of NB shows (streams, text/plain, tracebacks)."""
    for cell in code_cells(nb):
        for out in cell.get('outputs', []):
            yield _join(out.get('text', ''))
            for mime, value in out.get('data', {}).items():
                if mime.startswith('text/'):
                    yield _join(value)
            yield '\n'.join(out.get('traceback', []))


# ---------------------------------------------------------------------------
# The book: pages, tabs and the notebooks d2lbook makes of them

class Book:
    """The pages and tabs of a book root, read as d2lbook reads them."""

    def __init__(self, root):
        from d2lbook.config import Config
        self.root = pathlib.Path(root).resolve()
        with runner.environment({}, self.root):
            self.config = Config()
        self.tabs = self.config.tabs
        self.default_tab = self.config.default_tab
        self.name = self.config.project['name']

    def find(self, patterns, exclusions=None):
        from d2lbook.utils import find_files
        with runner.environment({}, self.root):
            return find_files(patterns, self.config.build['source_dir'], exclusions)

    def pages(self):
        """Every notebook page, relative to the root, as `d2lbook build eval` finds them."""
        build = self.config.build
        return sorted(pathlib.Path(os.path.normpath(f)).as_posix() for f in self.find(
            build['notebooks'], build['exclusions'] + ' ' + build['non-notebooks']))

    def eval_path(self, page, tab):
        folder = 'eval' if tab == self.default_tab else f'eval_{tab}'
        return self.root / self.config.tgt_dir / folder / pathlib.Path(page).with_suffix('.ipynb')

    def stored_path(self, page, tab, gpu=False):
        return self.root.joinpath(STORE, *[GPU] * gpu, tab, pathlib.Path(page).with_suffix(
            '.ipynb'))

    def dependencies(self):
        """Modification times of the files whose change makes d2lbook evaluate every page."""
        return [os.path.getmtime(self.root / f) for f in self.find(
            self.config.build['dependencies'])]

    def lib_file(self, tab):
        return self.root / self.config.library[tab]['lib_file']

    def tab_notebook(self, page, tab):
        """The notebook `d2lbook build eval --tab TAB` executes for PAGE, or None."""
        from d2lbook import library, notebook
        nb = notebook.read_markdown((self.root / page).read_text())
        nb = notebook.split_markdown_cell(nb)
        nb = notebook.get_tab_notebook(nb, tab, self.default_tab)
        if not nb:
            return None
        if tab in self.config.library:
            nb = library.replace_alias(nb, self.config.library[tab])
        return library.format_code_nb(nb)

    def key(self, page, tab, nb=None, gpu_versions=None):
        """(key, parts): what produced the outputs of PAGE's TAB, whose tab notebook is NB;
        for a run of gpu_run.py, with its GPU_VERSIONS, the cells as page_runner reads them."""
        if gpu_versions is not None:
            code = runner.page_cells(self.root, page, tab, self.default_tab)
        else:
            nb = nb if nb is not None else self.tab_notebook(page, tab)
            code = [c.source for c in code_cells(nb)]
        return runner.key_parts(self.root, self.lib_file(tab), page, code,
                                gpu_versions or framework_versions(tab))


def fixed_ids(nb):
    """Cell ids from position and content (nbformat makes random ones), for byte-identical rebuilds."""
    for i, cell in enumerate(nb.cells):
        if 'id' in cell:
            cell.id = sha256(f'{i}:{cell.cell_type}:{_join(cell.source)}')[:8]
    return nb


# ---------------------------------------------------------------------------
# Normalising notebooks

SVG_ID = re.compile(r'\bid="([^"]+)"')
MPL_DATE = re.compile(r'\s*<dc:date>[^<]*</dc:date>')
ADDRESS = re.compile(r'\bat 0x[0-9a-fA-F]+')
TMP_PATH = re.compile(r'/tmp/[\w.-]*?(?:tmp|pymp-|torchelastic_)[\w.-]*')


def renumber_svg_ids(svg):
    """Give the ids of an SVG fixed names in order of appearance, references included."""
    ids = list(dict.fromkeys(SVG_ID.findall(svg)))
    if not ids:
        return svg
    names = {old: f'svg{i}' for i, old in enumerate(ids)}
    # One pass over ids and #references keeps a new name from being renamed again.
    pattern = re.compile(r'(\bid="|#)(' + '|'.join(re.escape(i) for i in
                                                    sorted(ids, key=len, reverse=True)) + r')(?=["\)])')
    return pattern.sub(lambda m: m[1] + names[m[2]], svg)


def clean_text(text, roots=()):
    for root in roots:
        if root and len(str(root)) > 1:
            text = text.replace(str(root), '<book>')
    text = ADDRESS.sub('at 0x...', text)
    return TMP_PATH.sub('/tmp/...', text)


def normalise_outputs(outputs, roots=()):
    """Outputs as d2lbook keeps them (stderr shown as stdout), without what varies run to run."""
    result = []
    for out in outputs:
        kind = out.get('output_type')
        if kind == 'stream':
            text = clean_text(_join(out.get('text', '')), roots)
            if result and result[-1].output_type == 'stream':
                result[-1].text += text  # how a stream is cut into messages depends on timing
            else:
                result.append(nbformat.v4.new_output('stream', name='stdout', text=text))
        elif kind in ('display_data', 'execute_result'):
            data = {mime: _join(value) for mime, value in out.get('data', {}).items()}
            if str(data.get('text/plain', '')).startswith('HBox'):
                continue  # a tqdm widget d2lbook drops too
            data = {mime: renumber_svg_ids(MPL_DATE.sub('', value)) if mime == 'image/svg+xml'
                    else clean_text(value, roots) if mime.startswith('text/') else value
                    for mime, value in data.items()}
            result.append(nbformat.v4.new_output(kind, data=data, **(
                {'execution_count': None} if kind == 'execute_result' else {})))
        elif kind == 'error':
            result.append(nbformat.v4.new_output(
                'error', ename=out.get('ename', ''), evalue=clean_text(out.get('evalue', ''), roots),
                traceback=[clean_text(t, roots) for t in out.get('traceback', [])]))
    return result


def normalise(nb, roots=(), record=None):
    """A stored notebook: code cells only, their outputs normalised, no volatile
    metadata; RECORD (default: NB's own) in its metadata."""
    cells, ids = [], set()
    record = record if record is not None else nb.get('metadata', {}).get(RECORD)
    for cell in code_cells(nb):
        tags = [t for t in cell.get('metadata', {}).get('tags', []) if t.startswith('nbval')]
        source = _join(cell['source'])
        new = nbformat.v4.new_code_cell(source=source,
                                        metadata={'tags': sorted(set(tags))} if tags else {})
        new.outputs = normalise_outputs(cell.get('outputs', []), roots)
        # An id from the code, not a random one, so that adding a cell renames no other.
        new.id = cell_id = sha256(source)[:8]
        while new.id in ids:
            new.id = sha256(new.id + cell_id)[:8]
        ids.add(new.id)
        cells.append(new)
    out = nbformat.v4.new_notebook(cells=cells)
    out.metadata = {'kernelspec': runner.KERNELSPEC, 'language_info': {'name': 'python'}}
    if record is not None:
        out.metadata[RECORD] = json.loads(json.dumps(record))
    return out


def dumps(nb):
    return nbformat.writes(nb, version=4) + '\n'


def normalise_file(path):
    nb = nbformat.read(str(path), as_version=4)
    text = dumps(normalise(nb, roots=(ROOT,)))
    if pathlib.Path(path).read_text() != text:
        runner.write_file(path, text)
        return True
    return False


# ---------------------------------------------------------------------------
# Reading back what is stored, and storing

class Damaged(Exception):
    """Stored outputs that cannot be used: the message names the file and the fix."""


def relative(book, path):
    try:
        return pathlib.Path(path).relative_to(book.root).as_posix()
    except ValueError:
        return str(path)


def git(book, *args):
    try:
        return subprocess.run(['git', *args], cwd=book.root, capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ''


def fix_for(book, page, tab, gpu=False):
    """How to repair the stored outputs of PAGE's TAB: from git, or by a new run."""
    path = relative(book, book.stored_path(page, tab, gpu))
    again = (f'make gpu-run GPU_RUN_ARGS="--pages {page}" on a GPU machine, then '
             f'{command(book, "store-gpu")}' if gpu else f'make publish PAGES={page} TABS={tab}')
    if git(book, 'ls-files', '--', path) and git(book, 'status', '--porcelain', '--', path):
        return f'git checkout -- {path} (the committed outputs), or {again}'
    return again


# The fields of a record that the build reads, and their types.
RECORD_FIELDS = {'page': str, 'tab': str, 'key': str, 'key_parts': dict, 'mode': str,
                 'devices': str, 'date': str, 'data': list, 'env': dict}


def record_problem(record, page, tab):
    """What is wrong with RECORD, the record of PAGE's TAB, or None."""
    if not isinstance(record, dict):
        return f'holds no record of its run (notebook metadata {RECORD!r})'
    wrong = [f'{name} ({type(record.get(name)).__name__}, not {kind.__name__})'
             for name, kind in RECORD_FIELDS.items() if not isinstance(record.get(name), kind)]
    parts = record.get('key_parts')
    versions = parts.get('versions') if isinstance(parts, dict) else {}
    if not isinstance(versions, dict) or not all(
            isinstance(v, str) for v in [*versions, *versions.values()]):
        wrong.append('key_parts.versions (not names of packages and their versions)')
    if isinstance(record.get('data'), list) and not all(isinstance(d, str) for d in record['data']):
        wrong.append('data (not lines of text)')
    if not isinstance(record.get('epochs'), (int, type(None))):
        wrong.append(f'epochs ({type(record["epochs"]).__name__}, not int)')
    if wrong:
        return f'has a record with missing or wrong fields: {", ".join(wrong)}'
    if (record['page'], record['tab']) != (page, tab):
        return f'holds the record of {record["page"]} [{record["tab"]}]'
    return None


def read_stored(book, page, tab, nb=None, key=None, gpu=False):
    """(state, record, stored notebook) of PAGE's TAB; state is stored, stale or missing.

    Raises Damaged, naming the file and the fix, for a notebook that is
    committed but missing, cut short, not a notebook, whose record is missing
    or malformed, or whose record has the current key but other code. NB and
    KEY are the page's tab notebook and key, computed when not given. GPU: the
    store of gpu_run.py's runs, whose key takes the versions of their record.
    """
    path = book.stored_path(page, tab, gpu)
    where = relative(book, path)

    def damaged(problem):
        return Damaged(f'{where} {problem}; fix: {fix_for(book, page, tab, gpu)}')

    if not path.exists():
        if git(book, 'ls-files', '--', where):
            raise damaged('is missing (it is committed)')
        return 'missing', None, None
    try:
        text = path.read_text()
        json.loads(text)
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError too
        raise damaged(f'cannot be read, is cut short or is not JSON ({type(err).__name__}: '
                      f'{err})') from None
    try:
        stored = nbformat.reads(text, as_version=4)
        nbformat.validate(stored)
    except Exception as err:  # ValidationError, AttributeError on [] ...
        first = (str(err).strip().splitlines() or [''])[0]
        raise damaged(f'is not a notebook ({type(err).__name__}: {first[:200]})') from None
    record = stored.metadata.get(RECORD)
    problem = record_problem(record, page, tab)
    if problem:
        raise damaged(problem)
    record = json.loads(json.dumps(record))
    if gpu:
        code = runner.page_cells(book.root, page, tab, book.default_tab)
        key = book.key(page, tab, gpu_versions=record['key_parts']['versions'])[0]
    else:
        nb = nb if nb is not None else book.tab_notebook(page, tab)
        code = [c.source for c in code_cells(nb)]
        key = key if key is not None else book.key(page, tab, nb)[0]
    if record['key'] != key:
        return 'stale', record, stored
    if code != [_join(c.source) for c in code_cells(stored)]:
        raise damaged('holds other code than the page although its record has the current key')
    return 'stored', record, stored


def store_run(book, page, tab, nb, gpu=False):
    """Write the stored notebook NB (its record inside) whole; return its path. If that
    fails, keep it under _build/publish/ and say how to move it into place."""
    target = book.stored_path(page, tab, gpu)
    try:
        runner.write_file(target, dumps(nb))
        return target
    except OSError as err:
        why = f'could not store the run of {page} [{tab}] in {relative(book, target)} ' \
              f'({type(err).__name__}: {err})'
        folder = book.root / book.config.tgt_dir / 'publish'
        kept = folder / target.relative_to(book.root)
        try:
            runner.write_file(kept, dumps(nb))
        except OSError as second:
            print(f'publish: {why}, nor keep it in {relative(book, folder)} ({second}); the '
                  f'stored outputs are as they were. Once the cause is fixed, run it again: '
                  f'make publish PAGES={page} TABS={tab}', file=sys.stderr, flush=True)
            raise err from None
        print(f'publish: {why}. It is kept in {relative(book, kept)}; once the cause is fixed, '
              f'move it into place: mv {relative(book, kept)} {relative(book, target)}',
              file=sys.stderr, flush=True)
        raise


# ---------------------------------------------------------------------------
# restore: stored outputs into the eval folders

def assemble(book, page, tab, nb, stored, record):
    """The evaluated notebook d2lbook would write, outputs taken from STORED."""
    nb = copy.deepcopy(nb)
    for cell, old in zip(code_cells(nb), code_cells(stored)):  # the same code (read_stored)
        cell.outputs = copy.deepcopy(old.outputs)
        tags = old.get('metadata', {}).get('tags')
        if tags:
            cell.metadata['tags'] = list(tags)
    nb.metadata['language_info'] = {'name': 'python'}
    nb.metadata[RECORD] = dict(record, source='stored')
    return nbformat.writes(fixed_ids(nb))


def restore(book, verbose=True):
    """Write every page and tab whose stored key matches; drop stale restored ones.

    A damaged stored page (see read_stored) counts as stale: d2lbook
    evaluates it, and one line on stderr names the file and the fix.
    """
    deps = book.dependencies()
    report = {'stored': [], 'no code': [], 'stale': [], 'missing': [], 'damaged': []}
    for page in book.pages():
        for tab in book.tabs:
            nb = book.tab_notebook(page, tab)
            if nb is None:
                continue
            target = book.eval_path(page, tab)
            newest_source = max([(book.root / page).stat().st_mtime] + deps)
            if not code_cells(nb):
                text = nbformat.writes(_with_language(nb, {'source': 'no code'}))
                write_fresh(target, text, newest_source)
                report['no code'].append((page, tab))
                continue
            key, _ = book.key(page, tab, nb)
            try:
                state, record, stored = read_stored(book, page, tab, nb, key)
            except Damaged as err:
                state = 'damaged'
                print(f'stored outputs: {page} [{tab}] is evaluated in quick mode: {err}',
                      file=sys.stderr, flush=True)
            if state == 'stored':
                write_fresh(target, assemble(book, page, tab, nb, stored, record), newest_source)
                report['stored'].append((page, tab))
                continue
            report[state].append((page, tab))
            if target.exists() and target.stat().st_size:
                try:
                    source = nbformat.read(str(target), as_version=4).metadata.get(
                        RECORD, {}).get('source')
                except Exception:  # cut short by an interrupted build: evaluate it again
                    source = 'stored'
                if source in ('stored', 'no code'):
                    target.unlink()  # d2lbook evaluates it again
    if verbose:
        evaluated = sum(len(report[k]) for k in ('stale', 'missing', 'damaged'))
        print(f'stored outputs: {len(report["stored"])} page tabs reused from {STORE}/, '
              f'{evaluated} to evaluate')
        for page, tab in report['stale']:
            print(f'  stale (code, d2l or versions changed): {page} [{tab}]')
        for page, tab in report['damaged']:
            print(f'  damaged (see above): {page} [{tab}]')
    return report


def _with_language(nb, record):
    nb = fixed_ids(copy.deepcopy(nb))
    nb.metadata['language_info'] = {'name': 'python'}
    nb.metadata[RECORD] = record
    return nb


def write_fresh(target, text, not_before):
    """Write TEXT unless it is there already, and keep the file newer than the sources."""
    if not target.exists() or target.read_text() != text:
        runner.write_file(target, text)
    now = max(datetime.datetime.now().timestamp(), not_before + 1)
    if target.stat().st_mtime <= not_before:
        os.utime(target, (now, now))


# ---------------------------------------------------------------------------
# annotate: one note per page on where its outputs come from

# What d2l's train_epochs gives in quick mode (QUICK_MAX_EPOCHS, helpers.md).
QUICK_MAX_EPOCHS = 1
# How a page asks for its epochs: d2l.train_epochs(10), or a default
# num_epochs=10 of a function that passes it to train_epochs.
EPOCHS = re.compile(r'\btrain_epochs\((\d+)\)|\bnum_epochs\s*=\s*(\d+)\b')
DATA_SIZES = re.compile(r'(\d+) training and (\d+) test images')
PACKAGE_NAMES = {'torch': 'PyTorch', 'mxnet': 'MXNet', 'paddlepaddle': 'PaddlePaddle',
                 'numpy': 'NumPy'}


def epochs_of(nb, quick):
    """The epochs NB's training runs for, as train_epochs gives them; None if NB trains nothing."""
    code = '\n'.join(_join(c.source) for c in code_cells(nb))
    if 'train_epochs(' not in code:
        return None
    asked = [int(a or b) for a, b in EPOCHS.findall(code)]
    if not asked:
        return None
    return min(max(asked), QUICK_MAX_EPOCHS) if quick else max(asked)


def describe_data(line):
    """The loader's line in a reader's words: '6,000 training images, 600 per class, ...'."""
    sizes = DATA_SIZES.search(line)
    if not sizes:
        return line.split(': ', 1)[-1]
    train, test = int(sizes[1]), int(sizes[2])
    if 'full mode:' in line:  # the whole data set
        return f'all {train:,} training and {test:,} test images'
    per_class = f', {train // 10:,} per class' if (
        line.startswith('Fashion-MNIST') and train % 10 == 0) else ''
    return f'{train:,} training images{per_class}, {test:,} test images'


def _listing(names):
    return names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]


def _grouped(pairs):
    """{value: [names]} in the order the values first appear."""
    groups = {}
    for name, value in pairs:
        groups.setdefault(value, []).append(name)
    return groups


def _attributed(groups, everyone):
    """One group's value alone when all share it, else each value with its frameworks."""
    if len(groups) == 1 and list(groups.values())[0] == everyone:
        return [next(iter(groups))]
    return [f'{_listing(names)}: {value}' for value, names in groups.items()]


def describe(records):
    """The run behind the page in one line: devices, versions, data, epochs, date."""
    names = [FRAMEWORK_NAMES.get(tab, tab) for tab, _ in records]
    devices = _grouped((name, rec.get('devices') or 'unknown devices')
                       for name, (_, rec) in zip(names, records))
    parts = ['; '.join(_attributed(devices, names))]
    versions, numpy = [], {}
    for name, (_, rec) in zip(names, records):
        found = rec.get('key_parts', {}).get('versions', {})
        for package, version in sorted(found.items()):
            if package == 'numpy':
                numpy.setdefault(version, []).append(name)
            else:
                versions.append(f'{PACKAGE_NAMES.get(package, package)} {version}')
    if len(numpy) == 1:
        versions.append(f'NumPy {next(iter(numpy))}')
    else:
        versions += [f'NumPy {v} ({_listing(ns)})' for v, ns in numpy.items()]
    parts.append(', '.join(versions))
    runs = []
    for name, (_, rec) in zip(names, records):
        data = '; '.join(describe_data(line) for line in rec.get('data', []))
        epochs = rec.get('epochs')
        what = ', '.join(filter(None, [
            data, epochs and f'{epochs} epoch{"" if epochs == 1 else "s"}']))
        if what:
            runs.append((name, what))
    if runs:
        parts += _attributed(_grouped(runs), names)
    dates = sorted({rec.get('date') for _, rec in records if rec.get('date')})
    if dates:
        parts.append(dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}')
    return '; '.join(parts) + '.'


def note_text(records):
    """The page's note, the same in every tab, from each tab's record.

    A record may carry 'epochs' (see epochs_of); a page that trains nothing
    names none.
    """
    built = [FRAMEWORK_NAMES.get(tab, tab) for tab, rec in records
             if rec.get('source') == 'evaluated']
    if built:
        kind = 'a quick run' if any(rec.get('mode') == 'quick' for _, rec in records) \
            else 'this build\'s own run'
        head = (f'**Outputs of this page come from {kind}** ({_listing(built)}), not '
                f'from the book\'s stored runs, which are missing or older than the '
                f'code:')
    else:
        head = '*Where these outputs come from:*'
    return f'{head} {describe(records)}'


HEADING_LINES = re.compile(r'(?:(?:#|:label:)[^\n]*(?:\n|$))+')


def strip_note(nb):
    """NB as it was before add_note (which inserted '\\n' + note + '\\n')."""
    note = nb.metadata.get(RECORD, {}).get('note')
    if note and nb.cells and nb.cells[0].cell_type == 'markdown':
        nb.cells[0].source = nb.cells[0].source.replace('\n' + note + '\n', '', 1)
    return nb


def add_note(nb, note):
    """Put NOTE as a paragraph after the page's title and label, in the first markdown cell."""
    cell = nb.cells[0]
    heading = HEADING_LINES.match(cell.source)
    at = heading.end() if heading else 0
    # The blank line that followed the label now follows the note.
    cell.source = cell.source[:at] + '\n' + note + '\n' + cell.source[at:]
    nb.metadata[RECORD]['note'] = note
    return nb


def annotate(book, verbose=True):
    num_devices = None
    evaluated, reused, earlier = [], [], []
    for page in book.pages():
        notebooks = {}
        for tab in book.tabs:
            path = book.eval_path(page, tab)
            if not path.exists() or not path.stat().st_size:
                continue
            nb = nbformat.read(str(path), as_version=4)
            record = nb.metadata.get(RECORD)
            if record is None:  # evaluated by d2lbook in this build
                if num_devices is None:
                    _, num_devices = machine()
                mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
                record = dict(run_record(book, page, tab, nb, quick_now(num_devices), mtime),
                              source='evaluated')
                nb.metadata[RECORD] = record
                evaluated.append((page, tab))
            elif record.get('source') == 'stored':
                reused.append((page, tab))
            elif record.get('source') == 'evaluated':
                earlier.append((page, tab))
            notebooks[tab] = (path, strip_note(nb))
        records = [(tab, dict(nb.metadata[RECORD], epochs=nb.metadata[RECORD].get(
                    'epochs', epochs_of(nb, nb.metadata[RECORD].get('mode') == 'quick'))))
                   for tab, (_, nb) in notebooks.items()
                   if nb.metadata[RECORD].get('source') != 'no code']
        note = note_text(records) if records else None
        for tab, (path, nb) in notebooks.items():
            if note and nb.cells and nb.cells[0].cell_type == 'markdown':
                add_note(nb, note)
            else:
                nb.metadata[RECORD].pop('note', None)
            text = nbformat.writes(nb)
            if path.read_text() != text:
                mtime = path.stat().st_mtime
                runner.write_file(path, text)
                os.utime(path, (mtime, mtime))  # keep d2lbook's view of freshness
    if verbose:
        def show(label, items):
            print(f'{label}: {len(items)}')
            for page, tab in items:
                print(f'  {page} [{tab}]')
        show('reused stored outputs', reused)
        show('evaluated in this build (the page says so)', evaluated)
        if earlier:
            show('kept from an earlier build\'s evaluation (the page says so)', earlier)
    return reused, evaluated, earlier


def matplotlib_env(tmp):
    """Fixed SVG ids from matplotlib, so that a rerun of a figure diffs as unchanged."""
    (tmp / 'matplotlibrc').write_text('svg.hashsalt: d2l-stored-outputs\n')
    # MATPLOTLIBRC, not MPLCONFIGDIR: an empty config folder would make
    # matplotlib rebuild its font cache and log that into the first figure's
    # cell (PaddlePaddle prints INFO logs).
    return {'MATPLOTLIBRC': str(tmp / 'matplotlibrc')}


def single_stream(cell):
    streams = [o for o in cell.outputs if o.get('output_type') == 'stream']
    return len(streams) <= 1 and all(o.get('name') == 'stdout' for o in streams)


def page_of(book, page, who):
    page = pathlib.Path(os.path.relpath((book.root / page).resolve(), book.root)).as_posix()
    if page not in book.pages():
        raise SystemExit(f'{who}: {page} is not a page of the book (config.ini [build])')
    return page


def check_tab(book, tab, who):
    if tab not in book.tabs:
        raise SystemExit(f'{who}: unknown tab {tab!r}; the tabs are {book.tabs}')


def command(book, name, *args):
    """The command line that runs this script's command NAME on BOOK with ARGS."""
    python = sys.executable
    if python.startswith(str(book.root) + os.sep):
        python = os.path.relpath(python, book.root)
    script = relative(book, pathlib.Path(__file__).resolve())
    root = [] if book.root == ROOT else [str(book.root)]
    return ' '.join([python, script, name, *root, *args])


# ---------------------------------------------------------------------------
# publish: run in full mode and store

def execute(book, page, tab, nb, env, timeout=None):
    """Run NB in a kernel as d2lbook does (page_runner, in the eval folder); raise if a cell fails."""
    out, failed = runner.run(nb, book.root, book.eval_path(page, tab).parent, env, timeout)
    if failed:
        raise RuntimeError(f'{page} [{tab}]: a cell failed ({failed}); to see every output: '
                           f'python scripts/page_runner.py {page} {tab}')
    return out


def run_record(book, page, tab, nb, quick, when=None):
    return runner.run_record(page, tab, *book.key(page, tab), nb, quick, when)


def checked(nb):
    return f'{sum(CHECK_TAG in c.metadata.get("tags", []) for c in code_cells(nb))} of ' \
           f'{len(code_cells(nb))} cells compared by nbval'


def publish(book, pages, tabs, timeout=None, classify=True):
    """Run PAGES' TABS in full mode and store them; then tag the cells nbval compares.

    The full-mode run is stored as soon as it finishes; the quick pass that
    finds the cells nbval can compare comes after it and stores the notebook
    again with their tags. If the quick pass fails or is interrupted, the
    full-mode run stays stored, its record says `"nbval_tags": "pending"`, and
    a message names the `tag` command that adds the tags alone.
    """
    stored = []
    for page, tab, nb in page_tabs(book, pages, tabs, 'publish'):
        with tempfile.TemporaryDirectory() as tmp:
            env = matplotlib_env(pathlib.Path(tmp))
            began = datetime.datetime.now(datetime.timezone.utc)
            print(f'publish: {page} [{tab}] in full mode ...', flush=True)
            full = execute(book, page, tab, nb, dict(env, D2L_QUICK='0'), timeout)
            seconds = round((datetime.datetime.now(datetime.timezone.utc) - began).total_seconds())
            record = dict(run_record(book, page, tab, full, quick=False, when=began),
                          seconds=seconds, **({'nbval_tags': 'pending'} if classify else {}))
            normalised = normalise(full, (book.root,), record)
            out = store_run(book, page, tab, normalised)
            dirty = [line for text in output_texts(full) for line in dirty_lines(text)]
            if dirty:
                print(f'publish: WARNING: {page} [{tab}] shows framework banners or C++ log '
                      f'lines (tests/test_stored_outputs.py fails on them):\n  '
                      + '\n  '.join(dirty[:10]))
            if classify:
                print(f'publish: stored the full-mode run in {relative(book, out)}; now {page} '
                      f'[{tab}] in quick mode without a GPU, to find the cells nbval can '
                      f'compare ...', flush=True)
                try:
                    normalised = add_check_tags(book, page, tab, nb, normalised, env, timeout)
                except BaseException as err:
                    print(f'publish: the quick pass of {page} [{tab}] did not finish '
                          f'({type(err).__name__}). The full-mode run ({seconds} s) stays '
                          f'stored in {relative(book, out)}, with its record, but without the '
                          f'tags that let nbval compare its deterministic cells; to add them '
                          f'without running the full mode again: '
                          f'{command(book, "tag", "--pages", page, "--tabs", tab)}',
                          file=sys.stderr, flush=True)
                    raise
        print(f'publish: stored {relative(book, out)} ({seconds} s, {checked(normalised)})')
        stored.append(out)
    return stored


def page_tabs(book, pages, tabs, who):
    """(page, tab, tab notebook) for each of PAGES' TABS that has code."""
    for page in pages:
        page = page_of(book, page, who)
        for tab in tabs:
            check_tab(book, tab, who)
            nb = book.tab_notebook(page, tab)
            if nb is None or not code_cells(nb):
                print(f'{who}: {page} has no {tab} code; nothing to store')
                continue
            yield page, tab, nb


def add_check_tags(book, page, tab, nb, stored, env, timeout=None):
    """Run NB in quick mode without a GPU, as CI does, tag the cells of STORED (the
    normalised full-mode run) whose outputs agree, and store it again."""
    quick = execute(book, page, tab, nb, dict(env, D2L_QUICK='1', CUDA_VISIBLE_DEVICES=''),
                    timeout)
    stored, roots = copy.deepcopy(stored), (book.root,)
    for cell, fast in zip(code_cells(stored), code_cells(quick)):
        same = normalise_outputs(cell.outputs, roots) == normalise_outputs(fast.outputs, roots)
        tags = [t for t in cell.metadata.get('tags', []) if t != CHECK_TAG]
        if same and single_stream(fast) and not any(
                o.get('output_type') == 'error' or
                any(m.startswith('image/') for m in o.get('data', {})) for o in fast.outputs):
            tags.append(CHECK_TAG)
        cell.metadata['tags'] = tags
    record = {k: v for k, v in stored.metadata[RECORD].items() if k != 'nbval_tags'}
    stored = normalise(stored, roots, record)
    store_run(book, page, tab, stored)
    return stored


def tag(book, pages, tabs, timeout=None):
    """Add the nbval tags to stored full-mode runs whose quick pass did not finish."""
    for page, tab, nb in page_tabs(book, pages, tabs, 'tag'):
        try:
            state, _, stored = read_stored(book, page, tab, nb)
        except Damaged as err:
            raise SystemExit(f'tag: {page} [{tab}]: {err}') from None
        if state != 'stored':
            raise SystemExit(f'tag: {page} [{tab}] has no current stored outputs ({state}); '
                             f'run it in full mode: make publish PAGES={page} TABS={tab}')
        print(f'tag: {page} [{tab}] in quick mode without a GPU, to find the cells nbval '
              f'can compare ...', flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            stored = add_check_tags(book, page, tab, nb, stored,
                                    matplotlib_env(pathlib.Path(tmp)), timeout)
        print(f'tag: stored {relative(book, book.stored_path(page, tab))} ({checked(stored)})')


def store_gpu(book, run_dir):
    """Store the notebooks of a gpu_run.py run (RUN_DIR/<tab>/<page>.ipynb) that ran the
    pages' current code in full mode and finished, in outputs/gpu/<tab>/<page>.ipynb."""
    stored, refused = [], []
    for path in sorted(pathlib.Path(run_dir).glob('*/**/*.ipynb')):
        tab, *rest = path.relative_to(run_dir).parts
        page = pathlib.Path(*rest).with_suffix('.md').as_posix()
        nb = nbformat.read(str(path), as_version=4)
        record = nb.metadata.get(RECORD)
        why = record_problem(record, page, tab)
        if not why and record.get('failed'):
            why = f'a cell failed ({record["failed"]})'
        elif not why and record['mode'] != 'full':
            why = 'a quick-mode run'
        elif not why and record['key'] != book.key(
                page, tab, gpu_versions=record['key_parts']['versions'])[0]:
            why = 'its code, d2l or scripts differ from the page\'s now'
        if why:
            refused.append(f'{relative(book, path)}: {why}')
            continue
        stored.append(store_run(book, page, tab, normalise(nb, (book.root,)), gpu=True))
        print(f'store-gpu: stored {relative(book, stored[-1])} ({record["devices"]})')
    for line in refused:
        print(f'store-gpu: not stored: {line}', file=sys.stderr)
    return stored, refused


def status(book):
    """Print the state of every page and tab; return how many are damaged."""
    damaged = 0

    def show(page, tab, label, **gpu):
        nonlocal damaged
        try:
            state, record, _ = read_stored(book, page, tab, **gpu)
        except Damaged as err:
            damaged += 1
            print(f'damaged  {page} [{label}]: {err}')
            return
        print(f'{state:8} {page} [{label}]')
        if record and record.get('nbval_tags') == 'pending':
            print(f'         its quick pass did not finish, so nbval compares none of its '
                  f'cells: {command(book, "tag", "--pages", page, "--tabs", tab)}')

    for page in book.pages():
        for tab in book.tabs:
            nb = book.tab_notebook(page, tab)
            if nb is not None and code_cells(nb):
                show(page, tab, tab, nb=nb)
    gpu_store = book.root / STORE / GPU
    for path in sorted(gpu_store.glob('*/**/*.ipynb')):
        tab, *rest = path.relative_to(gpu_store).parts
        page = pathlib.Path(*rest).with_suffix('.md').as_posix()
        if page in book.pages():
            show(page, tab, f'{tab} on a GPU', gpu=True)
        else:
            print(f'stale    {page} [{tab} on a GPU]: no longer a page of the book')
    store_dir = book.root / STORE
    for tmp in [t for f in [store_dir, *store_dir.rglob('*')] if f.is_dir() for t in leftovers(f)]:
        print(f'leftover {relative(book, tmp)}: a temporary file of an interrupted write '
              f'(the stored files are whole); the next publish there removes it, or: '
              f'rm {relative(book, tmp)}')
    return damaged


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    commands = {name: sub.add_parser(name) for name in (
        'status', 'restore', 'annotate', 'publish', 'tag', 'store-gpu')}
    for name, command_parser in commands.items():
        command_parser.add_argument('root', nargs='?', default=str(ROOT))
        if name in ('publish', 'tag'):
            command_parser.add_argument('--pages', nargs='+', required=name == 'tag',
                                        help='page sources (default: every page)')
            command_parser.add_argument('--tabs', nargs='+', required=name == 'tag')
            command_parser.add_argument('--timeout', type=int, help='seconds per cell')
    commands['tag'].description = 'only the quick pass of publish, for stored runs whose ' \
                                  'quick pass did not finish'
    commands['store-gpu'].add_argument('--run', default=str(ROOT / '_build' / 'gpu-run'),
                                       help='the --out folder of scripts/gpu_run.py')
    sub.add_parser('normalise').add_argument('notebooks', nargs='+')
    args = parser.parse_args(argv)
    if args.command == 'normalise':
        for path in args.notebooks:
            if normalise_file(path):
                print(f'normalised {path}')
        return 0
    book = Book(args.root)
    if args.command == 'publish':
        publish(book, args.pages or book.pages(), args.tabs or book.tabs, args.timeout)
    elif args.command == 'tag':
        tag(book, args.pages, args.tabs, args.timeout)
    elif args.command == 'store-gpu':
        return 1 if store_gpu(book, args.run)[1] else 0
    elif args.command == 'status':
        return 1 if status(book) else 0
    else:
        {'restore': restore, 'annotate': annotate}[args.command](book)
    return 0


if __name__ == '__main__':
    sys.exit(main())
