"""The claims of the appendix page chapter_appendix/machinery.md: argument
checks that name the culprit and CPU threads, per framework, and the data
machinery of d2l/runtime.py, once (search order, hashes, atomic downloads, the
download lock, IDX parsing)."""
import gzip
import hashlib
import http.server
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from d2l import runtime

from conftest import FRAMEWORKS, MODULES, ROOT, tensor as conftest_tensor


def tensor(framework, values, dtype='float32'):
    """A framework tensor on the CPU holding `values` as `dtype`."""
    return conftest_tensor(framework, np.asarray(values, dtype=dtype))


# ---------------------------------------------------------------- argument checks

def test_try_gpu_rejects_a_negative_index(d2l):
    with pytest.raises(ValueError, match='non-negative'):
        d2l.try_gpu(-1)


@pytest.mark.parametrize('bad', [0, -1, 1.5, '2', True, None])
def test_try_gpus_rejects_a_count_that_is_not_a_positive_int(d2l, bad):
    with pytest.raises(ValueError, match='num_devices must be a positive'):
        d2l.try_gpus(bad)


@pytest.mark.parametrize('devices, num_asked, name', [
    ([], None, 'devices'), ('cpu', None, 'devices'), (None, None, 'devices'),
    ('ok', 0, 'num_asked'), ('ok', 2.0, 'num_asked')])
def test_describe_devices_rejects_bad_arguments(d2l, devices, num_asked,
                                                name):
    if devices == 'ok':
        devices = d2l.try_gpus(1)
    with pytest.raises(ValueError, match=name):
        d2l.describe_devices(devices, num_asked)


@pytest.mark.parametrize('batch_size, resize, message', [
    (0, None, 'batch_size must be a positive integer, got 0'),
    ('64', None, "batch_size must be a positive integer, got '64'"),
    (64, 0, 'resize must be a positive integer'),
    (64, (28, 28, 3), 'resize must be a positive integer'),
])
def test_loader_rejects_bad_arguments(d2l, batch_size, resize, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(')):
        d2l.load_data_fashion_mnist(batch_size, resize=resize)


def test_evaluate_accuracy_gpu_on_no_data_names_data_iter(d2l):
    with pytest.raises(ValueError, match='data_iter yielded no examples'):
        d2l.evaluate_accuracy_gpu(lambda X: X, [])


@pytest.mark.parametrize('scores_shape, labels_shape', [
    ((4, 1), (4,)), ((4,), (4, 1)), ((4, 1), (4, 1)), ((4, 3), (4, 1))])
def test_accuracy_of_a_column_counts_each_example_once(framework, d2l,
                                                       scores_shape,
                                                       labels_shape):
    """Labels or scores shaped (N, 1) are one column, not an N-by-N table."""
    labels = np.array([0, 1, 1, 0])
    if scores_shape == (4, 3):
        scores = np.eye(3, dtype='float32')[[0, 1, 2, 2]]
        expected = 2
    else:
        scores = np.array([0, 1, 0, 0], dtype='float32')
        expected = 3
    label_dtype = 'int32' if framework == 'mxnet' else 'int64'
    count = d2l.accuracy(tensor(framework, scores.reshape(scores_shape)),
                         tensor(framework, labels.reshape(labels_shape),
                                label_dtype))
    assert count == expected


def test_accuracy_rejects_unpaired_lengths(framework, d2l):
    with pytest.raises(ValueError, match=r'y_hat .*\(5, 3\) and y \(4,\)'):
        d2l.accuracy(tensor(framework, np.zeros((5, 3))),
                     tensor(framework, np.zeros(4)))


# ---------------------------------------------------------------- finding the files

LABELS = 'train-labels-idx1-ubyte'


def idx_labels(values):
    """The bytes of an IDX file holding a vector of uint8 labels."""
    values = bytes(values)
    return b'\x00\x00\x08\x01' + len(values).to_bytes(4, 'big') + values


@pytest.fixture
def fixture_data(monkeypatch, tmp_path):
    """Tiny label files in three search locations; the real hash table knows them.

    Each location holds labels of a different value, so the value read back
    says which location won. Returns (env_dir, cache_dir, system_dir).
    """
    contents = {v: idx_labels([v] * 5) for v in (1, 2, 3)}
    monkeypatch.setattr(runtime, '_FASHION_MNIST_CACHE', {})
    monkeypatch.setattr(runtime, '_SAID', set())
    monkeypatch.setitem(runtime.FASHION_MNIST_SHA256, LABELS,
                        hashlib.sha256(contents[1]).hexdigest())
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    dirs = (tmp_path / 'env', tmp_path / 'cache' / 'd2l' / 'fashion-mnist',
            tmp_path / 'system')
    for folder, value in zip(dirs, (1, 2, 3)):
        folder.mkdir(parents=True)
        (folder / f'{LABELS}.gz').write_bytes(gzip.compress(contents[value]))
    monkeypatch.setenv('D2L_DATA_DIR', str(dirs[0]))
    monkeypatch.setattr(runtime, 'FASHION_MNIST_SYSTEM_DIR', str(dirs[2]))
    # A port nothing listens on: the "internet" refuses at once.
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        closed_port = s.getsockname()[1]
    monkeypatch.setenv('D2L_FASHION_MNIST_MIRROR',
                       f'http://127.0.0.1:{closed_port}/')
    return dirs, contents


def read_value():
    return int(runtime.read_idx_file(LABELS)[0])


def test_search_order_is_env_then_user_cache_then_system(monkeypatch,
                                                    fixture_data):
    (env_dir, local_dir, system_dir), contents = fixture_data
    # Every copy must verify, so give each location the same hash.
    for folder, value in zip((env_dir, local_dir, system_dir), (1, 2, 3)):
        monkeypatch.setitem(runtime.FASHION_MNIST_SHA256, LABELS,
                            hashlib.sha256(contents[value]).hexdigest())
        assert read_value() == value
        (folder / f'{LABELS}.gz').unlink()


def test_unpacked_files_are_accepted(fixture_data):
    (env_dir, _, _), contents = fixture_data
    (env_dir / f'{LABELS}.gz').unlink()
    (env_dir / LABELS).write_bytes(contents[1])
    assert read_value() == 1


def test_missing_everywhere_and_offline_names_the_three_remedies(
        monkeypatch, fixture_data):
    (env_dir, local_dir, system_dir), _ = fixture_data
    for folder in (env_dir, local_dir, system_dir):
        (folder / f'{LABELS}.gz').unlink()
    with pytest.raises(runtime.DatasetError) as info:
        runtime.read_idx_file(LABELS)
    message = str(info.value)
    assert 'D2L_DATA_DIR' in message
    assert 'apt-get install dataset-fashion-mnist' in message
    assert 'connect to the internet' in message
    assert str(env_dir) in message
    # One clear error, not a chain ending deep inside urllib.
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_truncated_file_names_the_file_and_the_expected_hash(fixture_data):
    (env_dir, _, _), _ = fixture_data
    path = env_dir / f'{LABELS}.gz'
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(runtime.DatasetError) as info:
        runtime.read_idx_file(LABELS)
    assert str(path) in str(info.value)
    assert runtime.FASHION_MNIST_SHA256[LABELS] in str(info.value)


def test_wrong_contents_are_a_hash_mismatch(fixture_data):
    (env_dir, _, _), contents = fixture_data
    (env_dir / f'{LABELS}.gz').write_bytes(gzip.compress(idx_labels([9] * 5)))
    with pytest.raises(runtime.DatasetError, match='corrupt or truncated') as info:
        runtime.read_idx_file(LABELS)
    assert runtime.FASHION_MNIST_SHA256[LABELS] in str(info.value)


# ---------------------------------------------------------------- downloads

class _Mirror(http.server.BaseHTTPRequestHandler):
    """Serves one fixed body for every path, like a mirror on loopback."""
    body = b''

    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-Length', str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(monkeypatch):
    """A real HTTP server on 127.0.0.1 standing in for the dataset mirror."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Mirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv('D2L_FASHION_MNIST_MIRROR',
                       f'http://127.0.0.1:{server.server_port}/')
    yield _Mirror
    server.shutdown()
    server.server_close()


def empty_search_path(env_dir, local_dir, system_dir):
    for folder in (env_dir, local_dir, system_dir):
        (folder / f'{LABELS}.gz').unlink()


def test_download_is_verified_and_written_atomically(fixture_data,
                                                     mirror):
    dirs, contents = fixture_data
    empty_search_path(*dirs)
    mirror.body = gzip.compress(contents[1])
    assert read_value() == 1
    assert sorted(p.name for p in dirs[0].iterdir()) == [f'{LABELS}.gz']
    assert gzip.decompress((dirs[0] / f'{LABELS}.gz').read_bytes()) == \
        contents[1]


def test_corrupt_download_is_rejected_and_nothing_is_kept(fixture_data,
                                                          mirror):
    dirs, contents = fixture_data
    empty_search_path(*dirs)
    mirror.body = gzip.compress(idx_labels([7] * 5))
    with pytest.raises(runtime.DatasetError) as info:
        runtime.read_idx_file(LABELS)
    assert runtime.FASHION_MNIST_SHA256[LABELS] in str(info.value)
    assert '127.0.0.1' in str(info.value)
    assert list(dirs[0].iterdir()) == []


def test_downloads_go_to_the_user_cache_without_d2l_data_dir(
        monkeypatch, fixture_data, mirror):
    dirs, contents = fixture_data
    empty_search_path(*dirs)
    monkeypatch.delenv('D2L_DATA_DIR')
    mirror.body = gzip.compress(contents[1])
    assert read_value() == 1
    assert (dirs[1] / f'{LABELS}.gz').is_file()


# ---------------------------------------------------------------- one data folder, one download

def test_the_data_folder_does_not_depend_on_the_working_directory(
        machinery_framework, tmp_path):
    """From any folder the loader finds the files and writes nothing there."""
    workdir, cache = tmp_path / 'elsewhere', tmp_path / 'cache'
    workdir.mkdir()
    # The files sit in the user's cache only; the system copy is hidden and
    # the mirror refuses, so only a working-directory-free search finds them.
    data_dir = cache / 'd2l' / 'fashion-mnist'
    data_dir.mkdir(parents=True)
    system = pathlib.Path('/usr/share/datasets/fashion-mnist')
    if not system.is_dir():
        pytest.skip('needs the Debian package dataset-fashion-mnist')
    for f in system.iterdir():
        (data_dir / f.name).symlink_to(f)
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        closed_port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cache),
               D2L_QUICK='1',
               D2L_FASHION_MNIST_MIRROR=f'http://127.0.0.1:{closed_port}/')
    env.pop('D2L_DATA_DIR', None)
    code = (f'from d2l import {MODULES[machinery_framework]} as d2l, '
            'runtime; '
            f'runtime.FASHION_MNIST_SYSTEM_DIR = {str(tmp_path / "none")!r}; '
            'd2l.load_data_fashion_mnist(64)')
    out = subprocess.run([sys.executable, '-c', code], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(workdir.iterdir()) == []
    # It names the folder it used, once, and the mode, once.
    folders = [line for line in out.stdout.splitlines()
               if line.startswith('Fashion-MNIST files from ')]
    assert folders == [f'Fashion-MNIST files from {data_dir}']
    assert out.stdout.count('quick mode') == 1


class _SlowCountingMirror(_Mirror):
    """Counts requests and answers slowly, so concurrent readers overlap."""
    body, requests = b'', []

    def do_GET(self):
        self.requests.append(self.path)
        time.sleep(0.3)
        super().do_GET()


def serve(handler, monkeypatch):
    """Start `handler` on a loopback port and point the loader's mirror at it."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv('D2L_FASHION_MNIST_MIRROR',
                       f'http://127.0.0.1:{server.server_port}/')
    return server


def test_readers_that_start_together_download_once(monkeypatch,
                                                   fixture_data):
    """Four readers without the file: one downloads, the others wait and reuse it."""
    dirs, contents = fixture_data
    empty_search_path(*dirs)
    _SlowCountingMirror.body = gzip.compress(contents[1])
    _SlowCountingMirror.requests = []
    server = serve(_SlowCountingMirror, monkeypatch)
    values, errors = [], []

    def reader():
        try:
            values.append(read_value())
        except Exception as err:  # reported below, in the test's thread
            errors.append(err)
    try:
        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert not errors, errors
    assert values == [1] * 4
    assert len(_SlowCountingMirror.requests) == 1
    assert sorted(p.name for p in dirs[0].iterdir()) == [f'{LABELS}.gz']


class _CutOffMirror(http.server.BaseHTTPRequestHandler):
    """Promises a whole file, sends part of it, then drops the connection."""
    body, reset = b'', False

    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-Length', str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[:len(self.body) // 2])
        self.wfile.flush()
        if self.reset:  # an abortive close: the client sees a reset
            import struct
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack('ii', 1, 0))
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.mark.parametrize('reset', [False, True],
                         ids=['cut-short', 'connection-reset'])
def test_a_download_cut_off_midway_names_file_url_and_remedy(
        monkeypatch, fixture_data, reset):
    dirs, contents = fixture_data
    empty_search_path(*dirs)
    _CutOffMirror.body = gzip.compress(contents[1]) * 50
    _CutOffMirror.reset = reset
    server = serve(_CutOffMirror, monkeypatch)
    try:
        with pytest.raises(runtime.DatasetError) as info:
            runtime.read_idx_file(LABELS)
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert LABELS in message
    assert f'127.0.0.1:{server.server_port}/{LABELS}.gz' in message
    assert 'cut off' in message and 'Run again' in message
    assert 'D2L_DATA_DIR' in message
    assert list(dirs[0].iterdir()) == []  # no partial file, no lock


def test_ranks_other_than_zero_stay_silent(d2l, quick, monkeypatch, capsys):
    monkeypatch.setattr(runtime, '_SAID', set())
    monkeypatch.setenv('RANK', '1')
    d2l.load_data_fashion_mnist(batch_size=32)
    assert capsys.readouterr().out == ''


def labels_served(framework, data_iter):
    return np.concatenate([np.asarray(y.asnumpy() if framework == 'mxnet' else y.numpy())
                           for _, y in data_iter])


def test_a_full_mode_subset_serves_that_many_images_per_class_and_says_so(
        framework, d2l, monkeypatch, capsys):
    monkeypatch.setenv('D2L_QUICK', '0')
    monkeypatch.setenv('D2L_SUBSET', '30, 20')
    monkeypatch.setattr(runtime, '_SAID', set())
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size=100)
    assert ('Fashion-MNIST, full mode on a subset (D2L_SUBSET=30, 20): 300 training '
            'and 200 test images') in capsys.readouterr().out
    for data_iter, per_class in ((train_iter, 30), (test_iter, 20)):
        labels = labels_served(framework, data_iter)
        assert np.bincount(labels, minlength=10).tolist() == [per_class] * 10
    # The first images of each class in file order, as quick mode takes them.
    _, quick_labels = d2l.fashion_mnist_arrays('test', True)
    monkeypatch.setenv('D2L_SUBSET', '{train},{test}'.format(**d2l.QUICK_PER_CLASS))
    _, labels = d2l.fashion_mnist_arrays('test', False)
    assert labels.tolist() == quick_labels.tolist()


def test_quick_mode_ignores_the_subset(d2l, quick, monkeypatch):
    monkeypatch.setenv('D2L_SUBSET', '600,200')
    _, labels = d2l.fashion_mnist_arrays('train', d2l.quick_mode(0))
    assert len(labels) == 10 * d2l.QUICK_PER_CLASS['train']


@pytest.mark.parametrize('flag', ['600', '600,0', 'a,b', '600,200,5', '-1,2', '6e2,200'])
def test_a_bad_subset_names_d2l_subset_and_the_fix(d2l, monkeypatch, flag):
    monkeypatch.setenv('D2L_QUICK', '0')
    monkeypatch.setenv('D2L_SUBSET', flag)
    with pytest.raises(ValueError, match=r'D2L_SUBSET must be two positive numbers .*'
                       r'e\.g\. 600,200\), got .*unset it for the full data'):
        d2l.load_data_fashion_mnist(32)


# ---------------------------------------------------------------- one API

def test_the_machinery_is_one_module_shared_by_every_framework():
    """The data helpers are d2l.runtime's own functions in every flavour."""
    import importlib
    from d2l import runtime
    modules = [importlib.import_module(f'd2l.{MODULES[f]}') for f in FRAMEWORKS]
    for name in ('fashion_mnist_dirs', 'read_idx_file', 'balanced_subset',
                 'fashion_mnist_arrays', 'describe_mode', 'add_to_class'):
        assert all(getattr(m, name) is getattr(runtime, name)
                   for m in modules), name


# ---------------------------------------------------------------- CPU threads

_COUNT_THREADS = """
import os, sys
import paddle
if sys.argv[1] == 'd2l':
    from d2l import paddle as d2l
x, w = paddle.rand([8, 16, 28, 28]), paddle.rand([16, 16, 3, 3])
paddle.nn.functional.conv2d(x, w, padding=1).numpy()
print(len(os.listdir('/proc/self/task')))
"""


def _threads_after_a_convolution(importing, env=None):
    """OS threads of a fresh Python that imports paddle (and d2l) and runs one convolution."""
    out = subprocess.run(
        [sys.executable, '-c', _COUNT_THREADS, importing], capture_output=True,
        text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason='needs two cores')
@pytest.mark.skipif(not pathlib.Path('/proc/self/task').is_dir(), reason='Linux only')
def test_paddle_package_runs_cpu_kernels_on_every_core():
    pytest.importorskip('paddle')
    plain = _threads_after_a_convolution('plain')
    # One pool thread joins the calling thread per further core.
    assert _threads_after_a_convolution('d2l') == plain + os.cpu_count() - 1
    # A reader's own FLAGS_paddle_num_threads is left alone.
    assert _threads_after_a_convolution(
        'd2l', {'FLAGS_paddle_num_threads': '1'}) == plain


def test_one_thread_leaves_pytorch_one_thread_per_operator():
    torch = pytest.importorskip('torch')
    from d2l import torch as d2l
    before = torch.get_num_threads()
    try:
        d2l._one_thread()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


_MXNET_THREADS = """
import os
from mxnet import np, npx
x, w = np.ones((8, 16, 28, 28)), np.ones((16, 16, 3, 3))
npx.convolution(x, w, kernel=(3, 3), pad=(1, 1), num_filter=16,
                no_bias=True).wait_to_read()
print(len(os.listdir('/proc/self/task')))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason='needs two cores')
@pytest.mark.skipif(not pathlib.Path('/proc/self/task').is_dir(), reason='Linux only')
def test_mxnet_takes_its_thread_count_from_omp_num_threads_at_import():
    pytest.importorskip('mxnet')

    def threads(n):
        out = subprocess.run([sys.executable, '-c', _MXNET_THREADS],
                             capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, OMP_NUM_THREADS=str(n)))
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.split()[-1])

    assert threads(1) < threads(os.cpu_count())


@pytest.mark.parametrize('framework', FRAMEWORKS)
def test_a_framework_side_imported_first_leaves_its_flavour_whole(framework):
    """Unpickling a worker of d2l._paddle in a fresh process imports it first."""
    module = MODULES[framework]
    code = (f'import d2l._{module} as side, d2l.{module} as flavour\n'
            'print([n for n in side.__all__ if not hasattr(flavour, n)])')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=180, env=dict(
                              os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == '[]', done.stdout


# ------------------------------------------------- functions for a launcher
def _notebook_function(x):
    """Stands for a function defined in a notebook."""
    return x + 1


def test_by_value_sends_notebook_code_that_a_launcher_can_name_and_call(
        monkeypatch):
    import pickle
    assert runtime.by_value(len) is len  # importable: sent by reference
    monkeypatch.setattr(_notebook_function, '__module__', '__main__')
    monkeypatch.setattr(sys.modules['__main__'], '__file__', None,
                        raising=False)  # a notebook's main has no file
    sent = runtime.by_value(_notebook_function)
    assert sent is not _notebook_function
    assert (sent.__name__, sent.__qualname__) == ('_notebook_function',
                                                  '_notebook_function')
    assert sent(1) == 2 and pickle.loads(pickle.dumps(sent))(2) == 3
    with pytest.raises(TypeError, match='fn must be a function, got int'):
        runtime.by_value(3)


def test_quiet_launcher_hides_the_agent_s_errors_and_restores_its_level():
    import logging
    agent = logging.getLogger('torch.distributed.elastic.multiprocessing')
    before = logging.getLogger('torch.distributed.elastic').level
    with runtime.quiet_launcher():
        assert not agent.isEnabledFor(logging.CRITICAL)
    assert logging.getLogger('torch.distributed.elastic').level == before
    assert agent.isEnabledFor(logging.ERROR)
