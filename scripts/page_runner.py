#!/usr/bin/env python3
"""The one page runner: a page's code cells for one tab, run in order, as a notebook.

    python scripts/page_runner.py PAGE TAB [--timeout S] [--in-process]

runs PAGE in TAB into _build/sections/<tab>/<page>.ipynb and prints each
cell's text (exit status 1 if a cell raises). A page runs in a Jupyter kernel
(`make publish`, this command) or in one namespace of this process
(`--in-process`; scripts/gpu_run.py, on a GPU machine without Jupyter), so
this module imports only the standard library at module level. It also holds
what every stored run records wherever it ran (key_parts, run_record) and
write_file, which replaces a file only with its whole new text.
"""
import argparse
import ast
import contextlib
import copy
import datetime
import functools
import glob
import hashlib
import importlib.metadata
import io
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
import time
import traceback
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORD = 'd2l_outputs'  # the notebook metadata that holds a run's record
CELL = re.compile(r'^```\{\.python \.input\}\n(.*?)^```', re.M | re.S)
TAB_MARK = re.compile(r'^\s*# *@tab +([\w, ]+)')  # d2lbook's source_tab_pattern
KERNELSPEC = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}


def sha256(data):
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def join(text):
    return ''.join(text) if isinstance(text, list) else text


def code_cells(nb):
    return [c for c in nb['cells'] if c['cell_type'] == 'code']


# ---------------------------------------------------------------------------
# A page's cells, and running them

def page_cells(root, page, tab, default_tab='pytorch'):
    """The code of PAGE's cells in TAB, read from the markdown as d2lbook assigns
    them (`#@tab` lines name their tabs or all; unmarked cells belong to the
    default tab), without the mark. d2lbook's eval also sorts each cell's
    imports with isort, which this reader, needing no package, does not."""
    cells = []
    for code in CELL.findall((pathlib.Path(root) / page).read_text()):
        lines = code.split('\n')
        marks = [i for i, line in enumerate(lines) if TAB_MARK.match(line)]
        if marks:
            tabs = {t.strip() for t in TAB_MARK.match(lines.pop(marks[0]))[1].split(',')}
            if not tabs & {'all', tab}:
                continue
        elif tab != default_tab:
            continue
        cells.append('\n'.join(line.rstrip() for line in lines).strip())
    return cells


def new_notebook(sources):
    """An nbformat-4 notebook (a plain dict) of code cells."""
    cells = [{'cell_type': 'code', 'execution_count': None, 'id': sha256(f'{i}:{s}')[:8],
              'metadata': {}, 'outputs': [], 'source': s} for i, s in enumerate(sources)]
    return {'cells': cells, 'nbformat': 4, 'nbformat_minor': 5,
            'metadata': {'kernelspec': KERNELSPEC, 'language_info': {'name': 'python'}}}


@contextlib.contextmanager
def environment(env, workdir=None):
    """ENV added to os.environ, and WORKDIR the working folder, inside the block."""
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(env)
    if workdir:
        os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def run(nb, root, workdir, env=(), timeout=None, in_process=False):
    """Run the code cells of notebook NB in order, in WORKDIR, with ENV added to
    the environment and ROOT (the book) on the import path.

    Returns (the notebook with its outputs, None or what failed): a failing
    cell ends the run with its error among its outputs, as in Jupyter. TIMEOUT
    is seconds per cell, in a kernel only.
    """
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(root), os.environ.get('PYTHONPATH')]))
    with environment(dict(env, PYTHONPATH=path, PYTHONWARNINGS='ignore'),
                     workdir if in_process else None):
        if in_process:
            return _in_process(copy.deepcopy(nb), root)
        return _in_kernel(nb, workdir, timeout)


def _in_kernel(nb, workdir, timeout):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.from_dict(copy.deepcopy(nb))
    try:
        NotebookClient(nb, timeout=timeout, kernel_name='python3',
                       resources={'metadata': {'path': str(workdir)}}).execute()
    except CellExecutionError as err:
        return nb, f'{err.ename}: {err.evalue}'
    return nb, None


def _in_process(nb, root):
    import matplotlib
    matplotlib.use('Agg')
    sys.path.insert(0, str(root))
    # As in a kernel, the cells run in a main module without a file, so that
    # d2l.spawn_ranks sends the functions a page defines by value.
    main, saved = types.ModuleType('__main__'), sys.modules['__main__']
    namespace, shown = vars(main), {}  # id: figure, kept so that no id is reused
    sys.modules['__main__'] = main
    made = _animators_made()
    try:
        for count, cell in enumerate(code_cells(nb), 1):
            source = '\n'.join(line for line in join(cell['source']).splitlines()
                               if not line.startswith(('%', '!')))  # no magics without IPython
            cell['outputs'], failed = run_cell(source, namespace, count, shown, made)
            cell['execution_count'] = count
            if failed:
                del nb['cells'][nb['cells'].index(cell) + 1:]  # the cells a kernel never ran
                return nb, failed
    finally:
        sys.modules['__main__'] = saved
    return nb, None


def _animators_made():
    """A list that every d2l Animator made from now on joins: a training function
    that keeps its Animator to itself still shows its curves, as in a kernel."""
    from d2l import runtime
    made, init = [], runtime.Animator.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    runtime.Animator.__init__ = recorded
    return made


def run_cell(source, namespace, count, shown, made):
    """Execute one cell like a kernel; return its outputs and None or its error."""
    text, failed, value = io.StringIO(), None, None
    try:
        tree = ast.parse(source)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(';'):
            last = ast.Expression(tree.body.pop().value)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            exec(compile(tree, f'<cell {count}>', 'exec'), namespace)
            if last is not None:
                value = eval(compile(last, f'<cell {count}>', 'eval'), namespace)
    except BaseException as err:  # a cell's error ends the page, as in nbclient
        text.write(traceback.format_exc())
        failed = f'{type(err).__name__}: {err}'
    outputs = [{'output_type': 'stream', 'name': 'stdout', 'text': text.getvalue()}
               ] if text.getvalue() else []
    outputs += figures(namespace, shown, made)
    if value is not None:
        outputs.append({'output_type': 'execute_result', 'metadata': {}, 'execution_count': count,
                        'data': {'text/plain': repr(value)}})
    return outputs, failed


def figures(namespace, shown, made):
    """A cell's new figures as outputs: pyplot's (closed after) and d2l.Animator's,
    those in the namespace and those the cell made (`made`, emptied here)."""
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure
    found = [plt.figure(n) for n in plt.get_fignums()]
    plt.close('all')
    animators = [getattr(value, 'fig', None) for value in [*namespace.values(), *made]]
    made.clear()
    found += [f for f in animators if isinstance(f, Figure) and id(f) not in shown]
    shown.update((id(f), f) for f in found)
    outputs = []
    for figure in found:
        figure.savefig(svg := io.StringIO(), format='svg', bbox_inches='tight')
        outputs.append({'output_type': 'display_data', 'metadata': {},
                        'data': {'image/svg+xml': svg.getvalue(), 'text/plain': '<Figure>'}})
    return outputs


# ---------------------------------------------------------------------------
# The key: what produced the outputs

IDENTIFIER = re.compile(r'\b[A-Za-z_]\w*\b')
SCRIPT_NAME = re.compile(r'[\w./-]*\w\.py\b')
# Decorators that only wrap the function below them, with no effect on import.
PLAIN_DECORATORS = {'contextlib.contextmanager', 'contextmanager', 'staticmethod',
                    'classmethod', 'property', 'functools.wraps'}
# The distributions whose versions enter a tab's key (the first found counts).
FRAMEWORKS = {'pytorch': ('torch',), 'mxnet': ('mxnet', 'mxnet-cu112', 'mxnet-cu110'),
              'paddle': ('paddlepaddle', 'paddlepaddle-gpu')}


def key_parts(root, lib_file, page, code, versions):
    """(key, parts) of a run of CODE (PAGE's cells in one tab) with the d2l module
    LIB_FILE and the framework VERSIONS: the key is a hash of the code, the part
    of d2l the code can reach (reachable_source), the scripts beside the page
    that it names, and the versions."""
    root = pathlib.Path(root)
    scripts = {}
    for name in sorted(set(SCRIPT_NAME.findall('\n'.join(code)))):
        for path in (root / page).parent / pathlib.Path(name).name, root / name:
            if path.is_file():
                scripts[path.relative_to(root).as_posix()] = path.read_text()
                break
    names = set(IDENTIFIER.findall('\n'.join(code + list(scripts.values()))))
    parts = {'code': sha256(json.dumps(code)),
             'd2l': sha256(json.dumps(reachable_source(d2l_modules(lib_file), names))),
             'scripts': {name: sha256(text) for name, text in scripts.items()},
             'versions': versions}
    return sha256(json.dumps(parts, sort_keys=True)), parts


def framework_versions(tab):
    """Versions of the tab's framework and NumPy, without a build's local label (+cpu, +cu128)."""
    versions = {}
    for dist in FRAMEWORKS.get(tab, ()) + ('numpy',):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        versions.setdefault('numpy' if dist == 'numpy' else FRAMEWORKS[tab][0],
                            version.split('+')[0])
    return versions


def imported_modules(text, package):
    """{file: names that stand for it} of the modules of PACKAGE (a folder) that TEXT
    imports: `from d2l.X import ...`, `from .X import ...`, `from d2l import X`,
    `import d2l.X` (as Y)."""
    found = {}

    def add(dotted, *aliases):
        name = dotted.replace('.', '/')
        for file in (package / f'{name}.py', package / name / '__init__.py'):
            if name and file.is_file():
                return found.setdefault(file.resolve(), set()).update(aliases)

    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.level <= 1:
            first, _, rest = (node.module or '').partition('.')
            base = (node.module or '') if node.level else rest
            if node.level == 0 and first != package.name:
                continue
            if base:
                add(base)
            for alias in node.names if not base else ():  # from d2l import runtime
                add(alias.name, alias.asname or alias.name)
        for alias in node.names if isinstance(node, ast.Import) else ():
            first, _, rest = alias.name.partition('.')
            if first == package.name:
                add(rest, alias.asname or alias.name)
    return found


def d2l_modules(lib_file):
    """[(text, names that stand for it)] of the d2l module LIB_FILE and, recursively,
    of every module of its package that it imports (the hand-written ones)."""
    lib_file = pathlib.Path(lib_file).resolve()
    modules, todo = {lib_file: set()}, [lib_file]
    while todo:
        for file, aliases in imported_modules(todo.pop(0).read_text(), lib_file.parent).items():
            if file not in modules:
                todo.append(file)
            modules.setdefault(file, set()).update(aliases)
    return [(file.read_text(), frozenset(aliases)) for file, aliases in modules.items()]


def defined_names(node):
    """The names a top-level statement defines, or None if it must always count."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        decorators = {ast.unparse(d) for d in node.decorator_list}
        return {node.name} if decorators <= PLAIN_DECORATORS else None
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        names = set()
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                if not isinstance(part, ast.Name):
                    return None  # an attribute or item set on import
                names.add(part.id)
        return names
    return None


def dotted(node):
    """'a.b.c' for the expression a.b.c, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and dotted(node.value):
        return f'{dotted(node.value)}.{node.attr}'
    return None


def referenced_names(node, modules=frozenset({'d2l'})):
    """Names NODE mentions as plain names or as attributes of a module in MODULES (`d2l.x`)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute) and dotted(sub.value) in modules:
            names.add(sub.attr)
    return names


# Lines as ast.get_source_segment splits them (\r, \n and \r\n end a line).
SOURCE_LINE = re.compile(r'[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z')


def source_segment(lines, node):
    """ast.get_source_segment(text, node) for LINES, the text's lines split once
    (splitting the whole module for every statement took seconds per module)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return ''.join([lines[first].encode()[node.col_offset:].decode()] + lines[first + 1:last]
                   + [lines[last].encode()[:node.end_col_offset].decode()])


@functools.lru_cache(maxsize=None)
def top_level_statements(text, modules=frozenset({'d2l'})):
    """(source, names it defines or None if it always counts, names it mentions) per statement.

    Two kinds of statement count with a definition rather than always:
    `f.attr = value` for a function or class `f` of the same text counts when
    `f` does; and each function that a factory (`_factory_parts`) defines and
    returns counts as a definition of its own name, the factory's other
    lines as the factory's."""
    lines = SOURCE_LINE.findall(text)
    tree = ast.parse(text)
    defined_here = {node.name for node in tree.body if isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    statements = []
    for node in tree.body:
        source, mentioned = source_segment(lines, node), referenced_names(node, modules)
        owner, nested = _attribute_owner(node), _factory_parts(node)
        if owner in defined_here:
            statements.append((source, {owner}, mentioned))
        elif nested:
            rest = set()  # what the factory's own lines name, its list aside
            for part in node.body[:-1]:
                if part not in nested:
                    rest |= referenced_names(part, modules)
            statements.append((source_segment(lines, node).split('\n', 1)[0], {node.name},
                               rest | referenced_names(node.args, modules)))
            for part in node.body[:-1]:
                if part not in nested:
                    statements.append((source_segment(lines, part), {node.name}, set()))
            statements.append((source_segment(lines, node.body[-1]), {node.name}, set()))
            statements += [(source_segment(lines, part), {part.name},
                            referenced_names(part, modules)) for part in nested]
        else:
            statements.append((source, defined_names(node), mentioned))
    return statements


def reachable_source(modules, names):
    """The top-level statements of the d2l MODULES that code naming NAMES can reach.

    MODULES is a module's text, or [(text, names that stand for it)] for a
    generated module and the hand-written ones it imports, read as one
    namespace. A definition counts when NAMES or a counted statement name it
    (`name`, `d2l.name`, `runtime.name`); imports, calls, decorated definitions
    and whatever else runs on import always count."""
    if isinstance(modules, str):
        modules = [(modules, frozenset())]
    aliases = frozenset({'d2l'}.union(*(a for _, a in modules)))
    aliases |= {f'd2l.{a}' for a in aliases}
    statements = [s for text, _ in modules for s in top_level_statements(text, aliases)]
    definitions, todo = {}, set(names)
    for _, defined, mentioned in statements:
        if defined is None:
            todo |= mentioned
        for name in defined or ():
            definitions.setdefault(name, []).append(mentioned)
    reached = set()
    while todo:
        name = todo.pop()
        if name not in reached and name in definitions:
            reached.add(name)
            for mentioned in definitions[name]:
                todo |= mentioned
    return [source for source, defined, _ in statements if defined is None or defined & reached]


def _attribute_owner(node):
    """X for a statement `X.attr = value` (one target), else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            return target.value.id
    return None


def _factory_parts(node):
    """For a function that defines functions and returns a list of them (the
    machinery's `_shared_helpers(d2l)`, installed by a call on import), the
    nested definitions it returns, else []."""
    if not isinstance(node, ast.FunctionDef) or not node.body:
        return []
    last = node.body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.List)
            and all(isinstance(e, ast.Name) for e in last.value.elts)):
        return []
    returned = {e.id for e in last.value.elts}
    nested = [n for n in node.body if isinstance(n, ast.FunctionDef)
              and n.name in returned and not n.decorator_list]
    return nested if {n.name for n in nested} == returned else []


# ---------------------------------------------------------------------------
# Where and how a run happened

LOADER_LINE = re.compile(r'Fashion-MNIST, (?:quick|full) mode[^\n]*')


def machine():
    """(this machine's devices in words, number of GPUs)."""
    gpus = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpus = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                              capture_output=True, text=True, timeout=30).stdout.split('\n')
        gpus = [g.strip() for g in gpus if g.strip()]
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = next((line.split(':', 1)[1].strip() for line in
                    pathlib.Path('/proc/cpuinfo').read_text().splitlines()
                    if line.startswith('model name')), cpu)
    cpus = f'{os.cpu_count()} CPU cores ({cpu})'
    if gpus:
        return f'{len(gpus)} x {" / ".join(sorted(set(gpus)))}, {cpus}', len(gpus)
    return f'{cpus}, no GPU', 0


def quick_now(num_gpus):
    flag = os.environ.get('D2L_QUICK', '').strip()
    return flag == '1' if flag in ('0', '1') else num_gpus == 0


def loader_lines(nb):
    """The data loader's lines in NB's outputs (which data the run used)."""
    found = []
    for cell in code_cells(nb):
        for out in cell.get('outputs', []):
            found += LOADER_LINE.findall(join(out.get('text', '')) +
                                         join(out.get('data', {}).get('text/plain', '')))
    return list(dict.fromkeys(line.rstrip() for line in found))


def run_record(page, tab, key, parts, nb, quick, when=None):
    """The record of a run of PAGE's TAB that left notebook NB."""
    return {
        'page': page, 'tab': tab, 'key': key, 'key_parts': parts,
        'mode': 'quick' if quick else 'full',
        'date': (when or datetime.datetime.now(datetime.timezone.utc)).strftime('%Y-%m-%d'),
        'devices': machine()[0], 'python': platform.python_version(),
        'data': loader_lines(nb),
        'env': {k: v for k, v in sorted(os.environ.items())
                if k.startswith('D2L_') or k == 'CUDA_VISIBLE_DEVICES'},
    }


# ---------------------------------------------------------------------------
# Writing a file whole

@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM back until the block ends; they take effect then."""
    received, old = [], {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not None:  # None: set outside Python, cannot be put back
                old[sig] = signal.signal(sig, lambda num, frame: received.append(num))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)


def leftovers(folder, name='*'):
    """Temporary files in FOLDER left by a writing process that no longer runs."""
    found = []
    for tmp in sorted(pathlib.Path(folder).glob(f'.{name}.*.tmp')):
        pid = tmp.name[:-len('.tmp')].rsplit('.', 2)[-2]
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                found.append(tmp)
            except OSError:
                pass  # running, as another user
    return found


def write_file(path, text):
    """Write TEXT to PATH so that PATH holds either its old text or the new one.

    The text goes in full to a temporary file beside PATH and onto the disk,
    which is then renamed over PATH, with SIGINT and SIGTERM held back
    meanwhile. A failed or interrupted write leaves the old file and removes
    its temporary file; one killed outright (SIGKILL, power loss) leaves the
    old file and a `.<name>.<pid>.*.tmp` file, removed by the next write there.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        for old in leftovers(path.parent, glob.escape(path.name)):
            old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.{os.getpid()}.',
                                   suffix='.tmp')
        try:
            with os.fdopen(fd, 'wb'):  # closes fd
                umask = os.umask(0o022)
                os.umask(umask)
                os.fchmod(fd, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~umask)
                data = memoryview(text.encode())
                while data:  # os.write, not f.write: a short write is not lost
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# ---------------------------------------------------------------------------
# An author's check of one page

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('page', help='a page source, such as chapter_multi_gpu/helpers.md')
    parser.add_argument('tab', choices=list(FRAMEWORKS))
    parser.add_argument('--timeout', type=int, default=1200, help='seconds per cell (kernel)')
    parser.add_argument('--in-process', action='store_true',
                        help='run in this process, as scripts/gpu_run.py does')
    args = parser.parse_args(argv)
    if not (ROOT / args.page).is_file():
        parser.error(f'no page {args.page}: give a path such as chapter_multi_gpu/helpers.md')
    if not (cells := page_cells(ROOT, args.page, args.tab)):
        parser.exit(1, f'{args.page} has no cells for the {args.tab} tab\n')
    out = ROOT / '_build' / 'sections' / args.tab / pathlib.Path(args.page).with_suffix('.ipynb')
    began = time.time()
    nb, failed = run(new_notebook(cells), ROOT, out.parent, timeout=args.timeout,
                     in_process=args.in_process)
    write_file(out, json.dumps(nb, indent=1, sort_keys=True) + '\n')
    for cell in code_cells(nb):
        for o in cell.get('outputs', []):
            text = join(o.get('text') or o.get('data', {}).get('text/plain') or '')
            if text and 'ccache' not in text:
                print(text.rstrip()[:2000])
    print(f'== {args.page} [{args.tab}] in {time.time() - began:.0f} s -> {out}')
    return f'a cell failed: {failed}' if failed else 0  # sys.exit prints it, exit status 1


if __name__ == '__main__':
    sys.exit(main())
