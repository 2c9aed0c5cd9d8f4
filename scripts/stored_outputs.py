#!/usr/bin/env python3
"""Stored outputs: what readers see comes from full-mode runs kept in the repository.

    python scripts/stored_outputs.py status   [BOOK_ROOT]
    python scripts/stored_outputs.py restore  [BOOK_ROOT]   (before d2lbook build eval)
    python scripts/stored_outputs.py annotate [BOOK_ROOT]   (after it)
    python scripts/stored_outputs.py publish  [BOOK_ROOT] --pages P.md ... --tabs T ...
    python scripts/stored_outputs.py tag      [BOOK_ROOT] --pages P.md ... --tabs T ...
    python scripts/stored_outputs.py normalise NOTEBOOK ...

For every page and tab, `outputs/<tab>/<page>.ipynb` holds the code cells of
that tab with the outputs of a full-mode run (D2L_QUICK=0), normalised so that
a diff shows what changed, and `outputs/<tab>/<page>.json` the record of the
run: its key and where it ran. The key is a hash of what produced the
outputs: the tab's code cells as d2lbook executes them, the part of the tab's
`d2l` module that this code can reach, the scripts beside the page that it
runs, and the versions of the framework and NumPy. The part of `d2l` is every
top-level statement of the module except the definitions no name in the code
leads to: a function, class or constant counts when the page's code or a
script names it, or when something counted names it (`d2l.name` or plain
`name`). Imports, calls, decorated definitions and anything else that runs
on import always count. So a new or changed helper makes stale the pages
that use it, directly or through other helpers, and no others.

`restore` writes the evaluated notebook d2lbook would have written
(`_build/eval[_<tab>]/<page>.ipynb`) from the current markdown and the stored
outputs of every page whose key matches, newer than its sources, so that
`d2lbook build eval` skips it; a page whose key differs is left to d2lbook,
which evaluates it (quick mode without a GPU). `annotate` then adds to each
page one short note on where its outputs were computed, and a visible notice
on a page evaluated by the build rather than taken from the store, and prints
which pages were reused and which evaluated.

`publish` evaluates the chosen pages and tabs in full mode and stores them.
It also runs each page once more in quick mode with no GPU visible, as CI
does: the cells whose outputs agree between the two runs (shapes, sizes,
sums, error messages) are tagged `nbval-check-output`, so that nbval compares
them with a fresh quick run; training cells differ and are exempt. The tags
are cell metadata, invisible on the page.

A notebook and its record are stored as one unit: each is written in full to
a temporary file beside it, and the two are renamed into place only then,
with Ctrl-C held back for those moments; the record holds the SHA-256 of its
notebook's text. An interrupted or failed write leaves the previous outputs
as they were. The full-mode run is stored as soon as it ends, before the
quick pass: if that pass fails or is interrupted, the run stays stored and a
message gives the `tag` command that adds the tags alone:

    python scripts/stored_outputs.py tag [BOOK_ROOT] --pages P.md --tabs T

A record or notebook that is missing, cut short or not the partner of the
other is damaged: `status` names the file and the fix (`git checkout` of the
committed pair, or `make publish`) and exits 1 after listing every page;
`restore` says the same in one line and leaves the page to d2lbook, which
evaluates it in quick mode. Records written before the hash was added are
checked by their code cells instead.
"""
import argparse
import ast
import configparser
import contextlib
import copy
import datetime
import functools
import glob
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
STORE = 'outputs'
RECORD = 'd2l_outputs'          # notebook metadata key of the record
CHECK_TAG = 'nbval-check-output'
# The distributions whose versions enter a tab's key (the first found counts).
FRAMEWORKS = {
    'pytorch': ('torch',),
    'mxnet': ('mxnet', 'mxnet-cu112', 'mxnet-cu110'),
    'paddle': ('paddlepaddle', 'paddlepaddle-gpu'),
}
FRAMEWORK_NAMES = {'pytorch': 'PyTorch', 'mxnet': 'MXNet', 'paddle': 'PaddlePaddle'}
LOADER_LINE = re.compile(r'Fashion-MNIST, (?:quick|full) mode[^\n]*')
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
        with chdir(self.root):
            self.config = Config()
        self.tabs = self.config.tabs
        self.default_tab = self.config.default_tab
        self.name = self.config.project['name']

    def pages(self):
        """Every notebook page, relative to the root, as `d2lbook build eval` finds them."""
        from d2lbook.utils import find_files
        build = self.config.build
        with chdir(self.root):
            files = find_files(build['notebooks'], build['source_dir'],
                               build['exclusions'] + ' ' + build['non-notebooks'])
        return sorted(pathlib.Path(os.path.normpath(f)).as_posix() for f in files)

    def eval_path(self, page, tab):
        folder = 'eval' if tab == self.default_tab else f'eval_{tab}'
        return self.root / self.config.tgt_dir / folder / pathlib.Path(page).with_suffix('.ipynb')

    def stored_path(self, page, tab, suffix='.ipynb'):
        return self.root / STORE / tab / pathlib.Path(page).with_suffix(suffix)

    def dependencies(self):
        """Modification times of the files whose change makes d2lbook evaluate every page."""
        from d2lbook.utils import find_files
        with chdir(self.root):
            return [os.path.getmtime(f) for f in
                    find_files(self.config.build['dependencies'], self.config.build['source_dir'])]

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

    def scripts(self, page, code):
        """{name: text} of the Python files beside PAGE (or under the root) that CODE names."""
        found = {}
        for name in sorted(set(SCRIPT_NAME.findall('\n'.join(code)))):
            for path in (self.root / page).parent / pathlib.Path(name).name, self.root / name:
                if path.is_file():
                    found[path.relative_to(self.root).as_posix()] = path.read_text()
                    break
        return found

    def key(self, page, tab, nb=None):
        """(key, parts): what produced the outputs of PAGE's TAB."""
        nb = nb if nb is not None else self.tab_notebook(page, tab)
        code = [c.source for c in nb.cells if c.cell_type == 'code']
        scripts = self.scripts(page, code)
        names = set(IDENTIFIER.findall('\n'.join(code + list(scripts.values()))))
        parts = {
            'code': sha256(json.dumps(code)),
            'd2l': sha256(json.dumps(reachable_source(self.lib_file(tab).read_text(), names))),
            'scripts': {name: sha256(text) for name, text in scripts.items()},
            'versions': framework_versions(tab),
        }
        return sha256(json.dumps(parts, sort_keys=True)), parts


IDENTIFIER = re.compile(r'\b[A-Za-z_]\w*\b')
SCRIPT_NAME = re.compile(r'[\w./-]*\w\.py\b')
# Decorators that only wrap the function below them, with no effect on import.
PLAIN_DECORATORS = {'contextlib.contextmanager', 'contextmanager', 'staticmethod',
                    'classmethod', 'property', 'functools.wraps'}


def defined_names(node):
    """The names a top-level statement defines, or None if it must always count."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        decorators = {ast.unparse(d) for d in node.decorator_list}
        return {node.name} if decorators <= PLAIN_DECORATORS else None
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = set()
        for target in targets:
            for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                if not isinstance(part, ast.Name):
                    return None  # an attribute or item set on import
                names.add(part.id)
        return names
    return None


def referenced_names(node):
    """Names NODE mentions as plain names or as attributes of `d2l`."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                and sub.value.id == 'd2l':
            names.add(sub.attr)
    return names


# Lines as ast.get_source_segment splits them (\r, \n and \r\n end a line).
SOURCE_LINE = re.compile(r'[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z')


def source_segment(lines, node):
    """ast.get_source_segment(text, node) for LINES, the text's lines split once.

    The same text (column offsets count UTF-8 bytes), without splitting the
    whole module again for every statement, which took seconds per module.
    """
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return ''.join([lines[first].encode()[node.col_offset:].decode()] + lines[first + 1:last]
                   + [lines[last].encode()[:node.end_col_offset].decode()])


@functools.lru_cache(maxsize=None)
def top_level_statements(lib_text):
    """(source, names it defines or None if it always counts, names it mentions) per statement."""
    lines = SOURCE_LINE.findall(lib_text)
    return [(source_segment(lines, node), defined_names(node), referenced_names(node))
            for node in ast.parse(lib_text).body]


def reachable_source(lib_text, names):
    """The top-level statements of a d2l module that code naming NAMES can reach, as source."""
    statements = top_level_statements(lib_text)
    definitions = {}
    todo = set(names)
    for statement in statements:
        _, defined, mentioned = statement
        if defined is None:
            todo |= mentioned
        for name in defined or ():
            definitions.setdefault(name, []).append(mentioned)
    reached = set()
    while todo:
        name = todo.pop()
        if name in reached or name not in definitions:
            continue
        reached.add(name)
        for mentioned in definitions[name]:
            todo |= mentioned
    return [source for source, defined, _ in statements if defined is None or defined & reached]


@contextlib.contextmanager
def chdir(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def sha256(data):
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def framework_versions(tab):
    """Versions of the tab's framework and NumPy, without a build's local label (+cpu, +cu128)."""
    versions = {}
    for dist in FRAMEWORKS.get(tab, ()) + ('numpy',):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = 'numpy' if dist == 'numpy' else FRAMEWORKS[tab][0]
        versions.setdefault(key, version.split('+')[0])
    return versions


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == 'code']


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


def _join(text):
    return ''.join(text) if isinstance(text, list) else text


def normalise_outputs(outputs, roots=()):
    """Outputs as d2lbook keeps them (stderr shown as stdout), without what varies run to run."""
    result = []
    for out in outputs:
        out = copy.deepcopy(out)
        kind = out.get('output_type')
        if kind == 'stream':
            text = clean_text(_join(out.get('text', '')), roots)
            if result and result[-1].get('output_type') == 'stream':
                # How a stream is cut into messages depends on timing.
                result[-1]['text'] += text
                continue
            result.append(nbformat.v4.new_output('stream', name='stdout', text=text))
            continue
        if kind in ('display_data', 'execute_result'):
            data = {}
            for mime, value in out.get('data', {}).items():
                if mime.startswith('text/plain') and _join(value).startswith('HBox'):
                    data = None  # a tqdm widget d2lbook drops too
                    break
                value = _join(value)
                if mime == 'image/svg+xml':
                    value = renumber_svg_ids(MPL_DATE.sub('', value))
                elif mime.startswith('text/'):
                    value = clean_text(value, roots)
                data[mime] = value
            if data is None:
                continue
            new = nbformat.v4.new_output('display_data', data=data)
            if kind == 'execute_result':
                new = nbformat.v4.new_output('execute_result', data=data, execution_count=None)
            result.append(new)
            continue
        if kind == 'error':
            result.append(nbformat.v4.new_output(
                'error', ename=out.get('ename', ''), evalue=clean_text(out.get('evalue', ''), roots),
                traceback=[clean_text(t, roots) for t in out.get('traceback', [])]))
    return result


def normalise(nb, roots=()):
    """A stored notebook: code cells only, their outputs normalised, no volatile metadata."""
    cells, ids = [], set()
    for cell in code_cells(nb):
        tags = [t for t in cell.get('metadata', {}).get('tags', []) if t.startswith('nbval')]
        source = _join(cell.source)
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
    out.metadata = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3',
                                   'language': 'python'},
                    'language_info': {'name': 'python'}}
    return out


def dumps(nb):
    return nbformat.writes(nb, version=4) + '\n'


def normalise_file(path):
    nb = nbformat.read(str(path), as_version=4)
    text = dumps(normalise(nb, roots=(ROOT,)))
    if pathlib.Path(path).read_text() != text:
        write_files({pathlib.Path(path): text})
        return True
    return False


# ---------------------------------------------------------------------------
# Where a run happened

def machine():
    """Devices of this machine, in words."""
    gpus = []
    try:
        out = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                             capture_output=True, text=True, timeout=30)
        gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                cpu = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    cpus = f'{os.cpu_count()} CPU cores ({cpu})'
    if gpus:
        names = sorted(set(gpus))
        return f'{len(gpus)} x {" / ".join(names)}, {cpus}', len(gpus)
    return f'{cpus}, no GPU', 0


def quick_now(num_gpus):
    flag = os.environ.get('D2L_QUICK', '').strip()
    return flag == '1' if flag in ('0', '1') else num_gpus == 0


def loader_lines(nb):
    found = []
    for cell in code_cells(nb):
        for out in cell.get('outputs', []):
            text = _join(out.get('text', '')) + _join(out.get('data', {}).get('text/plain', ''))
            found += LOADER_LINE.findall(text)
    return list(dict.fromkeys(line.rstrip() for line in found))


def run_record(book, page, tab, nb, quick, when=None):
    key, parts = book.key(page, tab)
    devices, _ = machine()
    return {
        'page': page, 'tab': tab, 'key': key, 'key_parts': parts,
        'mode': 'quick' if quick else 'full',
        'date': (when or datetime.datetime.now(datetime.timezone.utc)).strftime('%Y-%m-%d'),
        'devices': devices,
        'python': platform.python_version(),
        'data': loader_lines(nb),
        'env': {k: v for k, v in sorted(os.environ.items())
                if k.startswith('D2L_') or k == 'CUDA_VISIBLE_DEVICES'},
    }


# ---------------------------------------------------------------------------
# Writing whole files, and reading back what is stored

@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM back until the block ends; they take effect then."""
    received, old = [], {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            if handler is not None:  # None: set outside Python, cannot be put back
                old[sig] = signal.signal(sig, lambda num, frame: received.append(num))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)


def tmp_name(path):
    """A temporary file beside PATH, named after it and this process."""
    return f'.{path.name}.{os.getpid()}.'


def leftovers(folder, name='*'):
    """Temporary files in FOLDER left by a writing process that no longer runs."""
    found = []
    for tmp in sorted(pathlib.Path(folder).glob(f'.{name}.*.tmp')):
        pid = tmp.name[:-len('.tmp')].rsplit('.', 2)[-2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            found.append(tmp)
        except OSError:
            pass  # running, as another user
    return found


def file_mode(path):
    """PATH's permissions, or those a new file gets."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


def write_files(texts):
    """Write {path: text} so that every path holds either its old text or its new one.

    Each text goes in full to a temporary file beside its path and onto the
    disk; only then are the files renamed over their paths, in the order
    given, with SIGINT and SIGTERM held back until all are renamed. A failed
    or interrupted write leaves the old files as they were and removes its
    temporary file; one killed outright (SIGKILL, power loss) leaves the old
    files and a `.<name>.<pid>.*.tmp` file, removed by the next write there.
    """
    temps = {}
    with signals_deferred():
        try:
            for path, text in texts.items():
                path = pathlib.Path(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                for old in leftovers(path.parent, glob.escape(path.name)):
                    old.unlink(missing_ok=True)
                fd, temps[path] = tempfile.mkstemp(dir=path.parent, prefix=tmp_name(path),
                                                   suffix='.tmp')
                try:
                    os.fchmod(fd, file_mode(path))
                    data = memoryview(text.encode())
                    while data:
                        data = data[os.write(fd, data):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            for path in list(temps):
                os.replace(temps.pop(path), path)
        finally:
            for tmp in temps.values():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


class Damaged(Exception):
    """Stored outputs that cannot be used: the message names the file and the fix."""


def relative(book, path):
    try:
        return path.relative_to(book.root).as_posix()
    except ValueError:
        return str(path)


def fix_for(book, page, tab):
    """How to repair the stored outputs of PAGE's TAB: from git, or by a new run."""
    files = [relative(book, book.stored_path(page, tab, suffix)) for suffix in ('.json', '.ipynb')]
    publish = f'make publish PAGES={page} TABS={tab}'
    try:
        tracked = subprocess.run(['git', 'ls-files', '--', *files], cwd=book.root,
                                 capture_output=True, text=True, timeout=60).stdout.split()
        changed = subprocess.run(['git', 'status', '--porcelain', '--', *tracked],
                                 cwd=book.root, capture_output=True, text=True,
                                 timeout=60).stdout.strip() if tracked else ''
    except (OSError, subprocess.SubprocessError):
        changed = ''
    if changed:
        return f'git checkout -- {" ".join(tracked)} (the committed outputs), or {publish}'
    return publish


def read_stored(book, page, tab, nb=None, key=None):
    """(state, record, stored notebook) of PAGE's TAB; state is stored, stale or missing.

    Raises Damaged, naming the file and the fix, for a record or notebook that
    is missing, cut short or not what it should be, and for a notebook and
    record that do not belong together: the record holds the SHA-256 of its
    notebook's text (records written before it was added are checked by
    their code instead: a current key with other code cells is damaged).
    NB and KEY are the page's tab notebook and key, computed when not given.
    """
    record_path, nb_path = book.stored_path(page, tab, '.json'), book.stored_path(page, tab)

    def damaged(problem):
        return Damaged(f'{problem}; fix: {fix_for(book, page, tab)}')

    if not record_path.exists():
        if not nb_path.exists():
            return 'missing', None, None
        raise damaged(f'{relative(book, record_path)} is missing '
                      f'(its notebook {relative(book, nb_path)} is there)')
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError too
        raise damaged(f'{relative(book, record_path)} cannot be read, cut short or not a record '
                      f'({type(err).__name__}: {err})') from None
    if not isinstance(record, dict) or not isinstance(record.get('key'), str):
        raise damaged(f'{relative(book, record_path)} is not a record of stored outputs '
                      f'(a JSON object with a key)')
    if (record.get('page', page), record.get('tab', tab)) != (page, tab):
        raise damaged(f'{relative(book, record_path)} is the record of {record.get("page")} '
                      f'[{record.get("tab")}]')
    if not nb_path.exists():
        raise damaged(f'{relative(book, nb_path)} is missing '
                      f'(its record {relative(book, record_path)} is there)')
    try:
        text = nb_path.read_text()
    except (OSError, ValueError) as err:
        raise damaged(f'{relative(book, nb_path)} cannot be read ({type(err).__name__}: {err})'
                      ) from None
    if record.get('notebook_sha256', sha256(text)) != sha256(text):
        raise damaged(f'{relative(book, nb_path)} is not the notebook its record '
                      f'{relative(book, record_path)} was written with (one of the two was '
                      f'replaced or cut short)')
    try:
        json.loads(text)
    except ValueError as err:
        raise damaged(f'{relative(book, nb_path)} is cut short or not JSON '
                      f'({type(err).__name__}: {err})') from None
    try:
        stored = nbformat.reads(text, as_version=4)
        nbformat.validate(stored)
    except Exception as err:  # ValidationError, AttributeError on [] ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else ''
        raise damaged(f'{relative(book, nb_path)} is not a notebook '
                      f'({type(err).__name__}: {first[:200]})') from None
    nb = nb if nb is not None else book.tab_notebook(page, tab)
    key = key if key is not None else book.key(page, tab, nb)[0]
    if record['key'] != key:
        return 'stale', record, stored
    if [c.source for c in code_cells(nb)] != [_join(c.source) for c in code_cells(stored)]:
        raise damaged(f'{relative(book, nb_path)} holds other code than the page although '
                      f'its record {relative(book, record_path)} has the current key (the two '
                      f'do not belong together)')
    return 'stored', record, stored


def store(book, page, tab, nb, record, root=None):
    """Store notebook NB and its RECORD as one unit (see write_files); return NB's path.

    The record, which holds the notebook's SHA-256, is renamed into place
    first: a process killed between the two renames leaves a pair that
    read_stored reports as damaged, never a wrong pair taken as stored.
    ROOT, if given, stands for the book root (the pair goes to ROOT/outputs/).
    """
    text = dumps(nb)
    record = dict(record, notebook_sha256=sha256(text))
    path = book.stored_path(page, tab)
    if root is not None:
        path = root / path.relative_to(book.root)
    write_files({path.with_suffix('.json'): json.dumps(record, indent=1, sort_keys=True) + '\n',
                 path: text})
    return path


def store_run(book, page, tab, nb, record):
    """store(), and if that fails, keep the run under _build/publish/ and say so."""
    try:
        return store(book, page, tab, nb, record)
    except OSError as err:
        target = book.stored_path(page, tab)
        kept = book.root / book.config.tgt_dir / 'publish'
        try:
            path = store(book, page, tab, nb, record, root=kept)
        except OSError as second:
            print(f'publish: could not store the run of {page} [{tab}] in '
                  f'{relative(book, target)} ({type(err).__name__}: {err}), nor keep it in '
                  f'{relative(book, kept)} ({second}); the stored outputs are as they were. '
                  f'Once the cause is fixed, run it again: make publish PAGES={page} '
                  f'TABS={tab}', file=sys.stderr, flush=True)
            raise err from None
        moves = ' && '.join(f'mv {relative(book, path.with_suffix(suffix))} '
                            f'{relative(book, target.with_suffix(suffix))}'
                            for suffix in ('.json', '.ipynb'))
        print(f'publish: could not store the run of {page} [{tab}] in '
              f'{relative(book, target)} ({type(err).__name__}: {err}). It is kept in '
              f'{relative(book, path)} and its record beside it; once the cause is fixed, '
              f'move them into place: {moves}', file=sys.stderr, flush=True)
        raise


# ---------------------------------------------------------------------------
# restore: stored outputs into the eval folders

def assemble(book, page, tab, nb, stored, record):
    """The evaluated notebook d2lbook would write, outputs taken from STORED."""
    nb = copy.deepcopy(nb)
    cells, saved = code_cells(nb), code_cells(stored)
    if [c.source for c in cells] != [c.source for c in saved]:
        raise ValueError(f'{page} [{tab}]: stored code differs from the page although the keys match')
    for cell, old in zip(cells, saved):
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
        write_files({target: text})
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
                write_files({path: text})
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


# ---------------------------------------------------------------------------
# publish: evaluate in full mode and store

def execute(book, page, tab, nb, env, timeout=None):
    """Run NB as d2lbook does (in the eval folder, PYTHONPATH at the book root)."""
    from nbclient import NotebookClient
    nb = copy.deepcopy(nb)
    workdir = book.eval_path(page, tab).parent
    workdir.mkdir(parents=True, exist_ok=True)
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ['PYTHONPATH'] = str(book.root) + os.pathsep + saved.get('PYTHONPATH', '')
    os.environ['PYTHONWARNINGS'] = 'ignore'
    try:
        NotebookClient(nb, timeout=timeout, kernel_name='python3',
                       resources={'metadata': {'path': str(workdir)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


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


def publish(book, pages, tabs, timeout=None, classify=True):
    """Run PAGES' TABS in full mode and store them; then tag the cells nbval compares.

    The full-mode run is stored (notebook and record, as one unit) as soon as
    it finishes; the quick pass that finds the cells nbval can compare comes
    after it and stores the notebook again with their tags. If the quick pass
    fails or is interrupted, the full-mode run stays stored, its record says
    `"nbval_tags": "pending"`, and a message names the `tag` command that
    adds the tags without running the full mode again.
    """
    stored = []
    for page in pages:
        page = page_of(book, page, 'publish')
        for tab in tabs:
            check_tab(book, tab, 'publish')
            nb = book.tab_notebook(page, tab)
            if nb is None or not code_cells(nb):
                print(f'publish: {page} has no {tab} code; nothing to store')
                continue
            with tempfile.TemporaryDirectory() as tmp:
                env = matplotlib_env(pathlib.Path(tmp))
                began = datetime.datetime.now(datetime.timezone.utc)
                print(f'publish: {page} [{tab}] in full mode ...', flush=True)
                full = execute(book, page, tab, nb, dict(env, D2L_QUICK='0'), timeout)
                seconds = (datetime.datetime.now(datetime.timezone.utc) - began).total_seconds()
                record = run_record(book, page, tab, full, quick=False, when=began)
                record['seconds'] = round(seconds)
                if classify:
                    record['nbval_tags'] = 'pending'
                normalised = normalise(full, (book.root,))
                out_nb = store_run(book, page, tab, normalised, record)
                dirty = [line for text in output_texts(full) for line in dirty_lines(text)]
                if dirty:
                    print(f'publish: WARNING: {page} [{tab}] shows framework banners or C++ '
                          f'log lines (tests/test_stored_outputs.py fails on them):\n  '
                          + '\n  '.join(dirty[:10]))
                if classify:
                    print(f'publish: stored the full-mode run in {relative(book, out_nb)}; now '
                          f'{page} [{tab}] in quick mode without a GPU, to find the cells '
                          f'nbval can compare ...', flush=True)
                    try:
                        normalised = add_check_tags(book, page, tab, nb, normalised, record,
                                                    env, timeout)
                    except BaseException as err:
                        print(f'publish: the quick pass of {page} [{tab}] did not finish '
                              f'({type(err).__name__}). The full-mode run ({round(seconds)} s) '
                              f'stays stored in {relative(book, out_nb)}, with its record, but '
                              f'without the tags that let nbval compare its deterministic '
                              f'cells; to add them without running the full mode again: '
                              f'{command(book, "tag", "--pages", page, "--tabs", tab)}',
                              file=sys.stderr, flush=True)
                        raise
            checked = sum(CHECK_TAG in c.metadata.get('tags', []) for c in code_cells(normalised))
            print(f'publish: stored {relative(book, out_nb)} ({round(seconds)} s, '
                  f'{checked} of {len(code_cells(normalised))} cells compared by nbval)')
            stored.append(out_nb)
    return stored


def add_check_tags(book, page, tab, nb, stored, record, env, timeout=None):
    """Run NB in quick mode without a GPU, as CI does, and tag the cells of STORED
    (the normalised full-mode run) whose outputs agree; store it and RECORD again."""
    quick = execute(book, page, tab, nb, dict(env, D2L_QUICK='1', CUDA_VISIBLE_DEVICES=''),
                    timeout)
    stored = copy.deepcopy(stored)
    roots = (book.root,)
    for cell, fast in zip(code_cells(stored), code_cells(quick)):
        same = normalise_outputs(cell.outputs, roots) == normalise_outputs(fast.outputs, roots)
        tags = [t for t in cell.metadata.get('tags', []) if t != CHECK_TAG]
        if same and single_stream(fast) and not any(
                o.get('output_type') == 'error' or
                any(m.startswith('image/') for m in o.get('data', {}))
                for o in fast.outputs):
            tags.append(CHECK_TAG)
        cell.metadata['tags'] = tags
    stored = normalise(stored, roots)
    record = {k: v for k, v in record.items() if k not in ('nbval_tags', 'notebook_sha256')}
    store_run(book, page, tab, stored, record)
    return stored


def tag(book, pages, tabs, timeout=None):
    """Add the nbval tags to stored full-mode runs whose quick pass did not finish."""
    for page in pages:
        page = page_of(book, page, 'tag')
        for tab in tabs:
            check_tab(book, tab, 'tag')
            nb = book.tab_notebook(page, tab)
            if nb is None or not code_cells(nb):
                continue
            try:
                state, record, stored = read_stored(book, page, tab, nb)
            except Damaged as err:
                raise SystemExit(f'tag: {page} [{tab}]: {err}') from None
            if state != 'stored':
                raise SystemExit(f'tag: {page} [{tab}] has no current stored outputs ({state}); '
                                 f'run it in full mode: make publish PAGES={page} TABS={tab}')
            print(f'tag: {page} [{tab}] in quick mode without a GPU, to find the cells nbval '
                  f'can compare ...', flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                stored = add_check_tags(book, page, tab, nb, stored, record,
                                        matplotlib_env(pathlib.Path(tmp)), timeout)
            checked = sum(CHECK_TAG in c.metadata.get('tags', []) for c in code_cells(stored))
            print(f'tag: stored {relative(book, book.stored_path(page, tab))} '
                  f'({checked} of {len(code_cells(stored))} cells compared by nbval)')


def status(book):
    """Print the state of every page and tab; return how many are damaged."""
    damaged = 0
    for page in book.pages():
        for tab in book.tabs:
            nb = book.tab_notebook(page, tab)
            if nb is None or not code_cells(nb):
                continue
            try:
                state, record, _ = read_stored(book, page, tab, nb)
            except Damaged as err:
                damaged += 1
                print(f'damaged  {page} [{tab}]: {err}')
                continue
            print(f'{state:8} {page} [{tab}]')
            if record and record.get('nbval_tags') == 'pending':
                print(f'         its quick pass did not finish, so nbval compares none of its '
                      f'cells: {command(book, "tag", "--pages", page, "--tabs", tab)}')
    store_dir = book.root / STORE
    folders = [f for f in [store_dir, *store_dir.rglob('*')] if f.is_dir()]
    for tmp in [t for folder in folders for t in leftovers(folder)]:
        print(f'leftover {relative(book, tmp)}: a temporary file of an interrupted write '
              f'(the stored files are whole); the next publish there removes it, or: '
              f'rm {relative(book, tmp)}')
    return damaged


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    for name in ('status', 'restore', 'annotate'):
        sub.add_parser(name).add_argument('root', nargs='?', default=str(ROOT))
    pub = sub.add_parser('publish')
    pub.add_argument('root', nargs='?', default=str(ROOT))
    pub.add_argument('--pages', nargs='+', help='page sources (default: every page)')
    pub.add_argument('--tabs', nargs='+')
    pub.add_argument('--timeout', type=int, default=None, help='seconds per cell (default: none)')
    retag = sub.add_parser('tag', help='only the quick pass of publish, for stored runs whose '
                                       'quick pass did not finish')
    retag.add_argument('root', nargs='?', default=str(ROOT))
    retag.add_argument('--pages', nargs='+', required=True)
    retag.add_argument('--tabs', nargs='+', required=True)
    retag.add_argument('--timeout', type=int, default=None)
    norm = sub.add_parser('normalise')
    norm.add_argument('notebooks', nargs='+')
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
    elif args.command == 'status':
        return 1 if status(book) else 0
    else:
        {'restore': restore, 'annotate': annotate}[args.command](book)
    return 0


if __name__ == '__main__':
    sys.exit(main())
