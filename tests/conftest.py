"""Shared fixtures: every test that takes `d2l` runs once per framework."""
import fcntl
import importlib
import json
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# D2L_TEST_FRAMEWORKS=pytorch,paddle runs the suite in an environment without
# MXNet (scripts/test-numpy2.sh: NumPy 2, which MXNet 1.9 cannot import).
FRAMEWORKS = tuple(os.environ.get('D2L_TEST_FRAMEWORKS', 'pytorch,mxnet,paddle')
                   .split(','))
MODULES = {'pytorch': 'torch', 'mxnet': 'mxnet', 'paddle': 'paddle'}
needs_mxnet = pytest.mark.skipif('mxnet' not in FRAMEWORKS,
                                 reason='MXNet is not in D2L_TEST_FRAMEWORKS')


def saved_signatures(module, label, also=()):
    """Signatures of the public names `module` saved from section `label` (and of `also`)."""
    import inspect
    found = {}
    for name, obj in vars(module).items():
        if name.startswith('_') or not callable(obj) or \
                getattr(obj, '__module__', None) != module.__name__:
            continue
        target = obj.__init__ if inspect.isclass(obj) else obj
        if label in (obj.__doc__ or '') + (target.__doc__ or '') or name in also:
            found[name] = str(inspect.signature(target))
    return found


# The book's code cells, as d2lbook reads them from a page's markdown.
CELL = re.compile(r'^```\{\.python \.input\}\n(.*?)^```', re.M | re.S)


def tab_cells(page, tab, default_tab='pytorch'):
    """The code cells of the markdown `page` in `tab`, in order, as d2lbook assigns them."""
    cells = []
    for code in CELL.findall(page.read_text()):
        first = code.split('\n', 1)[0].strip()
        if first.startswith('#@tab'):
            tabs = [t.strip() for t in first[len('#@tab'):].split(',')]
            if 'all' not in tabs and tab not in tabs:
                continue
        elif tab != default_tab:
            continue
        cells.append(code)
    return cells


def page_definitions(page, tab, definitions, namespace=None):
    """A namespace after `page`'s imports cell in `tab` and its plain cells
    (not #@save) that contain one of `definitions`; `namespace` if given
    (such as a module's __dict__, to define the cells in that module)."""
    cells = tab_cells(page, tab)
    namespace = {} if namespace is None else namespace
    exec(cells[0], namespace)
    for code in cells[1:]:
        if '#@save' not in code and any(d in code for d in definitions):
            exec(code, namespace)
    return namespace


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """The name of the framework (tab) under test."""
    return request.param


@pytest.fixture
def paddle_default_device_is_the_cpu(framework):
    """PaddlePaddle runs operations on its default device; on a GPU machine make
    that the CPU the tests place their arrays on (the book uses device_guard)."""
    if framework != 'paddle':
        yield
        return
    import paddle
    with paddle.device.device_guard(paddle.CPUPlace()):
        yield


@pytest.fixture
def d2l(framework):
    """The generated d2l module of the framework under test."""
    return importlib.import_module(f'd2l.{MODULES[framework]}')


@pytest.fixture
def quick(monkeypatch):
    """Force quick mode, whatever hardware the tests run on."""
    monkeypatch.setenv('D2L_QUICK', '1')


# Tensors and devices the way the book's CPU fallback makes them, per framework.

def cpu_devices(framework, k):
    """k devices for the framework at hand, as the book's CPU fallback gives them."""
    if framework == 'mxnet':
        import mxnet as mx
        return [mx.cpu(i) for i in range(k)]
    if framework == 'paddle':
        import paddle
        return [paddle.CPUPlace() for _ in range(k)]
    import torch
    return [torch.device('cpu')] * k


def tensor(framework, array, device=None):
    """A framework tensor holding a copy of a NumPy array, on `device` if given."""
    if framework == 'mxnet':
        import mxnet as mx
        return mx.np.array(array, ctx=device or mx.cpu(), dtype=array.dtype)
    if framework == 'paddle':
        import paddle
        return paddle.to_tensor(array, place=device or paddle.CPUPlace())
    import torch
    return torch.tensor(array, device=device)


def numpy(framework, x):
    """A NumPy copy of a framework tensor."""
    if framework == 'mxnet':
        return x.asnumpy()  # an mx.np ndarray, as the book's MXNet code makes
    if framework == 'paddle':
        return x.numpy()
    return x.detach().cpu().numpy()


# Who listens during a run: the TCP sockets of a process tree (Linux /proc).

def process_tree(root):
    """The process id `root` and the ids of all its descendants."""
    parent_of = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                # the name in parentheses may hold spaces: split after it
                parent_of[int(entry)] = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += [child for child, parent in parent_of.items() if parent == pid]
    return tree


def listening_addresses(pids):
    """(address, port, pid) of every TCP socket in LISTEN state that one of `pids` holds."""
    import ipaddress
    owner = {}  # socket inode -> process id
    for pid in pids:
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f'/proc/{pid}/fd/{fd}')
            except OSError:
                continue
            if target.startswith('socket:['):
                owner.setdefault(target[len('socket:['):-1], pid)
    found = []
    for table in ('tcp', 'tcp6'):
        with open(f'/proc/self/net/{table}') as f:
            next(f)  # column names
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != '0A' or inode not in owner:  # 0A is LISTEN
                    continue
                host, port = local.split(':')
                raw = bytes.fromhex(host)  # 32-bit words in host byte order
                raw = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((ipaddress.ip_address(raw), int(port, 16),
                              owner[inode]))
    return found


def on_loopback(address):
    """Whether an IPv4 or IPv6 address (an IPv4-mapped one too) is on loopback."""
    mapped = getattr(address, 'ipv4_mapped', None)
    return (mapped or address).is_loopback


def watch_listeners(proc, deadline_s, every_s=0.2):
    """Wait for `proc` at most `deadline_s`, noting what its process tree listens on; (stdout, stderr, listeners).

    listeners holds (address as text, port, command line of the owner) for
    every TCP socket seen in LISTEN state. The whole process group of `proc`
    (started with start_new_session=True) is killed at the end in any case.
    """
    import signal
    import subprocess
    import threading
    outcome = {}

    def wait():
        try:
            outcome['io'] = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            outcome['io'] = proc.communicate()
            outcome['late'] = True
    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    seen = set()
    while waiter.is_alive():
        for address, port, pid in listening_addresses(process_tree(proc.pid)):
            try:
                with open(f'/proc/{pid}/cmdline', 'rb') as f:
                    command = f.read().replace(b'\0', b' ').decode().strip()
            except OSError:
                command = ''
            seen.add((str(address), port, command))
        waiter.join(every_s)
    # A process that is exiting reads an empty command line: its sockets then
    # appear twice, with and without their owner; keep the named entry.
    named = {(address, port) for address, port, command in seen if command}
    seen = {entry for entry in seen if entry[2] or entry[:2] not in named}
    try:  # processes that outlived the leader go too
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, err = outcome['io']
    if outcome.get('late'):
        pytest.fail(f'still running after {deadline_s} s and killed; its '
                    f'stderr ended with:\n{err[-3000:]}')
    return out, err, sorted(seen)


def exposed(listeners):
    """The listeners of watch_listeners (or listening_addresses) that are not on loopback."""
    import ipaddress
    return [entry for entry in listeners
            if not on_loopback(ipaddress.ip_address(str(entry[0])))]


# Modules whose tests start processes: after the tests marked slow, before
# the rest, so that the workers of `pytest -n` finish at about the same time.
STARTS_PROCESSES = {'test_process_groups.py', 'test_parameter_server.py',
                    'test_distributed_data_parallel.py', 'test_gpu_run.py',
                    'test_stored_outputs.py'}


# What the tests' processes leave in the temporary folder (the fork server's
# socket folder of a process killed at its deadline, torchrun's log folder)
# goes into one folder per test session, removed at its end. The pytest
# processes keep the usual folder for their own files.
_SESSION_TMPDIR = []


def pytest_configure(config):
    import tempfile
    own = os.environ.get('D2L_TESTS_OWN_TMPDIR')
    if own:  # a pytest-xdist worker, or a pytest a test started
        tempfile.tempdir = own  # as its controller: munged, for one, wants
        return  # every folder above its socket open to all
    own = tempfile.gettempdir()
    folder = tempfile.mkdtemp(prefix='d2l-tests-')
    os.environ.update(D2L_TESTS_OWN_TMPDIR=own, TMPDIR=folder)
    _SESSION_TMPDIR.append(folder)


def pytest_unconfigure(config):
    import shutil
    for folder in _SESSION_TMPDIR:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Run the long tests first: slow ones, then those that start processes."""
    items.sort(key=lambda item: (item.get_closest_marker('slow') is None,
                                 item.path.name not in STARTS_PROCESSES))


@pytest.fixture(scope='session')
def shared_results(tmp_path_factory):
    """results(name, compute): compute() once per test session, in whichever
    pytest-xdist worker asks first; the others wait for its JSON and read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent  # the session's folder, above each worker's own
    folder = root / 'shared-results'
    folder.mkdir(exist_ok=True)

    def results(name, compute):
        path = folder / f'{name}.json'
        with open(folder / f'{name}.lock', 'w') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not path.exists():
                path.write_text(json.dumps(compute()))
        return json.loads(path.read_text())
    return results


@pytest.fixture
def machinery_framework():
    """The one framework through which a test reaches d2l.runtime's machinery, which is written once and so tested once."""
    return FRAMEWORKS[0]
