"""The machinery of the d2l package, written once for all three frameworks.

Process start and stop, failure reports, deadlines, the Fashion-MNIST
files, timing and argument checks: what the book's helpers rely on but
do not teach. The appendix page "The Machinery of the d2l Package" states
what it promises. Nothing here imports a deep-learning framework."""
import ast
import contextlib
import gzip
import hashlib
import http.client
import io
import ipaddress
import logging
import math
import multiprocessing.connection
import multiprocessing.forkserver
import numbers
import os
import pickle
import queue
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
import types
import urllib.error
import urllib.request

# The check family: every check takes the value first, then the name the
# caller knows it by, and raises an error that names it and what to pass.

def check(ok, message):
    """Raise ValueError with `message` (what to pass instead) unless `ok`."""
    # message: a string, or a function that builds it only when it is needed
    if not ok:
        raise ValueError(message() if callable(message) else message)


def _is_int(value):
    """Whether `value` is an integer of any type, NumPy's too, but no bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_count(value, least=0):
    """Whether `value` is an integer (not a bool) of at least `least`."""
    return _is_int(value) and value >= least


def check_count(value, name, least=0, why=''):
    """Reject `value` unless it is an integer of at least `least`; name it."""
    if not is_count(value, least):
        kind = {0: 'a non-negative integer', 1: 'a positive integer'}.get(
            least, f'an integer of at least {least}')
        raise ValueError(f'{name} must be {kind}{why}, got {value!r}')


def check_number(value, name, positive=False, below=None):
    """Reject `value` unless it is a finite number >= 0 (> 0, < `below`)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0 and \
        not (positive and value == 0) and (below is None or value < below)
    if not ok:
        least = 'positive' if positive else 'non-negative'
        limit = '' if below is None else f' below {below}'
        raise ValueError(f'{name} must be a finite {least} number{limit}, '
                         f'got {value!r}')


def check_arrays(value, name):
    """Reject `value` unless it is a non-empty list of arrays."""
    check(isinstance(value, (list, tuple)) and value, lambda: f'{name} must be a '
          f'non-empty list of arrays; got {value!r:.60}')
    for i, x in enumerate(value):
        check(hasattr(x, 'shape'), lambda: f'{name}[{i}] is {x!r:.40}, not an array '
              '(a gradient is None until a backward pass ran)')


def check_devices(value, name='devices', allow_none=False):
    """Reject an empty device list (or None, unless allowed)."""
    if value is None and allow_none:
        return
    check(isinstance(value, (list, tuple)) and len(value) > 0,
          lambda: f'{name} is empty or not a list ({value!r:.60}); pass at least '
          'one device, e.g. d2l.try_gpus(1)')


def check_batches(value, name):
    """`value`'s minibatches; refuse a non-iterable now, an empty one at its end."""
    if not hasattr(value, '__iter__'):
        raise TypeError(f'{name} must be an iterable of (X, y) minibatches, '
                        f'got {type(value).__name__}')

    def batches():
        num_examples = 0
        for batch in value:
            num_examples += len(batch[1])
            yield batch
        check(num_examples != 0, lambda: f'{name} yielded no examples; pass an '
              'iterator with at least one non-empty minibatch')
    return batches()


def _finite_total(values):
    """The sum of numbers and arrays as a float; of a model's parameters."""
    if hasattr(values, 'collect_params'):  # a Gluon Block
        values = values.collect_params().values()
    elif callable(getattr(values, 'parameters', None)):  # Module or Layer
        values = values.parameters()
    total = 0.0
    for v in values:
        if v is None:  # a parameter without a gradient
            continue
        v = v.list_data()[0] if hasattr(v, 'list_data') else v  # Parameter
        v = v.detach() if hasattr(v, 'detach') else v
        total += float(v.sum() if hasattr(v, 'sum') else v)
    return total


def check_finite(value, name, params=()):
    """The sum of `value` (a loss, or a list of them) as a float, if finite.

    `params` (a model, its parameters after an update, or gradients) must
    sum to a finite number too: PaddlePaddle's ReLU turns a nan activation
    into 0, so a nan input can leave the loss finite and the weights nan."""
    values = value if isinstance(value, (list, tuple)) else [value]
    total = _finite_total(values)
    what, bad = 'the training loss', total
    if math.isfinite(total):
        what = 'the parameters (or their gradients)'
        bad = _finite_total(params)
    if not math.isfinite(bad):
        raise FloatingPointError(
            f'{what} became {bad} at the end of {name}, so training '
            'diverged; try a smaller learning rate (or a warm-up), and check '
            'that the inputs hold no nan or inf')
    return total


def check_gpu_index(i):
    """Reject a GPU index that is not a non-negative integer, saying so."""
    if not _is_int(i) or i < 0:
        raise ValueError(f'GPU index i must be a non-negative integer, got '
                         f'{i!r}')


def check_num_devices(num_devices, name='num_devices'):
    """Reject a device count that is not a positive integer, saying so."""
    if not _is_int(num_devices) or num_devices < 1:
        raise ValueError(f'{name} must be a positive integer (the number of '
                         f'model copies), got {num_devices!r}')


def _labels_and_predictions(y_hat, y, argmax):
    """`y_hat` as N predicted labels and `y` as N labels, or a ValueError."""
    for name, t in (('y_hat', y_hat), ('y', y)):
        if not hasattr(t, 'shape') or not hasattr(t, 'reshape'):
            raise TypeError(f'{name} must be a tensor of this framework, got '
                            f'{type(t).__name__}')
    y_hat_shape, y_shape = tuple(y_hat.shape), tuple(y.shape)
    if len(y_hat_shape) == 2 and y_hat_shape[1] > 1:
        y_hat = argmax(y_hat)
    elif len(y_hat_shape) == 2 and y_hat_shape[1] == 1:
        y_hat = y_hat.reshape((-1,))
    if len(y_shape) == 2 and y_shape[1] == 1:
        y = y.reshape((-1,))
    if len(y_hat.shape) != 1 or len(y.shape) != 1 or \
            y_hat.shape[0] != y.shape[0]:
        raise ValueError(
            f'accuracy needs y_hat of shape (N, num_classes) or (N,) and y of '
            f'shape (N,) for the same N, got y_hat {y_hat_shape} and y '
            f'{y_shape}')
    return y_hat, y


def _minibatches(data_iter):
    """An iterator over `data_iter`, or a TypeError that names it."""
    try:
        return iter(data_iter)
    except TypeError:
        raise TypeError('data_iter must be an iterable of (X, y) minibatches, '
                        f'got {type(data_iter).__name__}') from None


def _fraction_correct(counts, data_iter):
    """correct / examples of an Accumulator filled from `data_iter`."""
    # a ValueError if `data_iter` held no examples
    if counts[1] == 0:
        raise ValueError('data_iter yielded no examples: pass an iterator '
                         'over at least one (X, y) minibatch, such as the '
                         'test iterator of load_data_fashion_mnist')
    return counts[0] / counts[1]


def _check_sgd(params, lr, batch_size):
    """Reject arguments of `sgd` that would corrupt the parameters; say why."""
    check_number(lr, 'lr')
    if isinstance(batch_size, bool) or not isinstance(
            batch_size, numbers.Real) or not 0 < batch_size < math.inf:
        raise ValueError(f'batch_size must be a positive number (the '
                         f'examples the loss was summed over), got '
                         f'{batch_size!r}')
    params = list(params)
    for i, param in enumerate(params):
        if getattr(param, 'grad', None) is None:
            raise ValueError(
                f'params[{i}] has no gradient: compute the loss from it and '
                f'call backward() before sgd (in MXNet, attach_grad() first)')
    return params


def _points(x, y, curves):
    """The x and y values of one `Animator.add` call, one per curve."""
    ys = list(y) if hasattr(y, '__len__') else [y]
    xs = list(x) if hasattr(x, '__len__') else [x] * len(ys)
    if len(xs) != len(ys):
        raise ValueError(f'x has {len(xs)} values but y has {len(ys)}; '
                         f'give one x, or one x per curve')
    if curves is not None and len(ys) != len(curves):
        raise ValueError(f'this animator draws {len(curves)} curves, got '
                         f'{len(ys)} values in y')
    return xs, ys


def _check_loader_args(batch_size, resize):
    """The batch size and (height, width) as ints, or an error saying why."""
    check_count(batch_size, 'batch_size', 1)
    if resize is None:
        return int(batch_size), None
    size = (resize, resize) if _is_int(resize) else resize
    if not isinstance(size, (tuple, list)) or len(size) != 2 or \
            not all(_is_int(s) and s > 0 for s in size):
        raise ValueError(f'resize must be a positive integer or a (height, '
                         f'width) pair of them, got {resize!r}')
    return int(batch_size), tuple(int(s) for s in size)


def use_svg_display():
    """Make Jupyter render matplotlib figures as SVG."""
    try:
        from matplotlib_inline import backend_inline
        backend_inline.set_matplotlib_formats('svg')
    except ImportError:  # not running under IPython: nothing to configure
        pass


def in_notebook():
    """Whether the code runs inside a Jupyter kernel that can show figures."""
    shell = sys.modules.get('IPython')
    shell = shell.get_ipython() if shell else None
    return shell is not None and 'IPKernelApp' in shell.config


def add_to_class(Class):
    """Decorator: attach the function below it to `Class` as a method."""
    def attach(method):
        setattr(Class, method.__name__, method)
    return attach


class Animator:
    """Plot curves that grow one point at a time, redrawn in Jupyter."""
    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None,
                 ylim=None, xscale='linear', yscale='linear',
                 fmts=('-', 'm--', 'g-.', 'r:'), nrows=1, ncols=1,
                 figsize=(3.5, 2.5)):
        # A Figure not registered with pyplot is shown only when we ask,
        # so Jupyter does not print it a second time at the end of the cell.
        from matplotlib.figure import Figure
        check_count(nrows, 'nrows', 1)
        check_count(ncols, 'ncols', 1)
        use_svg_display()
        self.fig = Figure(figsize=figsize)
        self.axes = [self.fig.add_subplot(nrows, ncols, i + 1)
                     for i in range(nrows * ncols)]
        self.legend, self.fmts = legend, fmts
        self.style = dict(xlabel=xlabel, ylabel=ylabel, xlim=xlim, ylim=ylim,
                          xscale=xscale, yscale=yscale)
        self.X, self.Y = None, None
        self._shown = None  # the notebook display that add() updates

    def draw(self):
        """Redraw every curve on the first axes, from a clean axis."""
        ax = self.axes[0]
        ax.cla()
        for xs, ys, fmt in zip(self.X or [], self.Y or [], self.fmts):
            ax.plot(xs, ys, fmt)
        ax.set(**{k: v for k, v in self.style.items() if v is not None})
        if self.legend:
            ax.legend(self.legend)
        ax.grid(True)

    def savefig(self, path):
        """Write the current figure to `path` (SVG, PNG or PDF by extension)."""
        self.draw()
        self.fig.savefig(path, bbox_inches='tight')

    def add(self, x, y):
        """Append one point to each curve (`y`: a value or one per curve)."""
        xs, ys = _points(x, y, self.Y)
        if self.X is None:
            self.X, self.Y = [[] for _ in ys], [[] for _ in ys]
        for i, (a, b) in enumerate(zip(xs, ys)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)
        self.draw()
        if in_notebook():
            # One output, replaced in place: later prints of the cell appear
            # below it and never clear it.
            from IPython import display
            if self._shown is None:
                self._shown = display.display(self.fig, display_id=True)
            else:
                self._shown.update(self.fig)


def _pin_threads(core):
    """Keep every thread of this process on core `core`, if the OS lets us."""
    if not hasattr(os, 'sched_setaffinity'):  # macOS and Windows
        return False
    for thread in os.listdir('/proc/self/task'):
        try:
            os.sched_setaffinity(int(thread), {core})
        except OSError:  # a thread that ended meanwhile
            pass
    return True


def _usable_cores():
    """The CPU cores this process may run on, in increasing order."""
    if hasattr(os, 'sched_getaffinity'):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# Of the unpacked IDX bytes, so that any gzip wrapping verifies.
FASHION_MNIST_SHA256 = {
    'train-images-idx3-ubyte':
    'c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888',
    'train-labels-idx1-ubyte':
    'bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9',
    't10k-images-idx3-ubyte':
    '5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b',
    't10k-labels-idx1-ubyte':
    '0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34'}


FASHION_MNIST_MIRROR = ('http://fashion-mnist.s3-website.eu-central-1'
                        '.amazonaws.com/')


FASHION_MNIST_SYSTEM_DIR = '/usr/share/datasets/fashion-mnist'


class DatasetError(RuntimeError):
    """A dataset file is missing, damaged or cannot be downloaded."""


def fashion_mnist_dirs():
    """Folders searched for Fashion-MNIST, in order, and the download one."""
    env_dir = os.environ.get('D2L_DATA_DIR', '').strip()
    env_dir = os.path.abspath(os.path.expanduser(env_dir)) if env_dir else ''
    cache_root = os.environ.get('XDG_CACHE_HOME', '').strip() or \
        os.path.join(os.path.expanduser('~'), '.cache')
    cache_dir = os.path.join(os.path.abspath(cache_root), 'd2l',
                             'fashion-mnist')
    search = ([env_dir] if env_dir else []) + [cache_dir,
                                               FASHION_MNIST_SYSTEM_DIR]
    return search, env_dir or cache_dir


_SAID = set()


def _say_once(message, everywhere=False):
    """Print `message` once per process: on rank 0, or stderr `everywhere`."""
    # Launchers give every process of a job its rank; a report from each of
    # eight processes would bury the one that matters.
    rank = os.environ.get('RANK', os.environ.get('PADDLE_TRAINER_ID', '0'))
    if message not in _SAID:
        _SAID.add(message)
        if everywhere:
            print(message, file=sys.stderr)
        elif rank.strip() in ('', '0'):
            print(message)


def _unpack_and_check(path, name, raw):
    """Unpack `raw` bytes read from `path`, verify them against the hash."""
    expected = FASHION_MNIST_SHA256[name]
    try:
        data = gzip.decompress(raw) if path.endswith('.gz') else raw
    except (OSError, EOFError) as err:  # bad gzip stream or cut-off file
        raise DatasetError(
            f'{path} is not a complete gzip file ({err}). Delete it and run '
            f'again; its unpacked contents should have SHA-256 {expected}.'
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DatasetError(
            f'{path} is corrupt or truncated: its unpacked contents have '
            f'SHA-256 {actual}, expected {expected}. Delete it and run again.')
    return data


def _find_idx_file(name, search):
    """Path of the first copy of `name` (packed or not) in `search`; None."""
    for folder in search:
        for path in (os.path.join(folder, name + '.gz'),
                     os.path.join(folder, name)):
            if os.path.isfile(path):
                return path
    return None


DOWNLOAD_WAIT_S = 600  # how long to wait for another process's download


def _lock_or_wait(file, path):
    """Lock the open `file` at `path`; wait at most DOWNLOAD_WAIT_S for it."""
    import fcntl
    deadline = time.monotonic() + DOWNLOAD_WAIT_S
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() > deadline:
            file.close()
            raise DatasetError(
                f'another process has held {path} for '
                f'{DOWNLOAD_WAIT_S} s without finishing its download; '
                f'stop it, or set D2L_DATA_DIR to a folder that holds '
                f'the four Fashion-MNIST files')
        _say_once(f'Waiting for another process to download into '
                  f'{os.path.dirname(path)} (at most '
                  f'{DOWNLOAD_WAIT_S} s)', everywhere=True)
        time.sleep(0.2)


class _FileLock:
    """Hold an exclusive lock on `path`; wait at most DOWNLOAD_WAIT_S."""
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, 'a')
        try:
            import fcntl  # noqa: F401 (whether this system has locks)
        except ImportError:  # Windows: no lock, but renames keep files whole
            return self
        _lock_or_wait(self.file, self.path)
        return self

    def __exit__(self, *exc):
        # Removing the file while holding it is safe: a process that wakes up
        # on it looks for the data again before it downloads anything.
        try:
            os.remove(self.path)
        except OSError:
            pass
        self.file.close()


def _check_download_dir(name, target_dir):
    """Create `target_dir` for downloading `name`, or say why it cannot be."""
    try:
        os.makedirs(target_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=target_dir).close()  # may we write there?
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise DatasetError(
            f'Fashion-MNIST file {name} is in none of '
            f'{", ".join(fashion_mnist_dirs()[0])}, and it cannot be '
            f'downloaded into {target_dir} ({why}). Set D2L_DATA_DIR to a '
            f'folder that holds the four files or that you may write to, or '
            f'install them: sudo apt-get install dataset-fashion-mnist'
        ) from None


def _write_atomically(path, raw):
    """Write `raw` to `path` by renaming a finished temporary file."""
    tmp = f'{path}.part-{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            f.write(raw)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        if os.path.exists(tmp):  # the disk filled up or we were interrupted
            os.remove(tmp)
    return path


def _download_fashion_mnist(name, target_dir):
    """Fetch `name`.gz into `target_dir`, verified, written atomically."""
    url = os.environ.get('D2L_FASHION_MNIST_MIRROR',
                         FASHION_MNIST_MIRROR).rstrip('/') + f'/{name}.gz'
    remedies = (
        f'(1) set D2L_DATA_DIR to a folder holding the four Fashion-MNIST '
        f'files; (2) install the Debian package: sudo apt-get install '
        f'dataset-fashion-mnist; (3) connect to the internet so the files '
        f'can be downloaded into {target_dir}.')
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            raw = response.read()
    except (http.client.IncompleteRead, ConnectionError) as err:
        raise DatasetError(
            f'The download of Fashion-MNIST file {name} from {url} was cut '
            f'off ({type(err).__name__}: {err}); nothing was saved. Run '
            f'again to retry. If it keeps failing: {remedies}') from None
    except (urllib.error.URLError, http.client.HTTPException, OSError,
            ValueError) as err:
        reason = getattr(err, 'reason', err)
        raise DatasetError(
            f'Fashion-MNIST file {name} was not found in any of: '
            f'{", ".join(fashion_mnist_dirs()[0])}; downloading it from {url} '
            f'failed ({reason}). Fix it in one of three ways: {remedies}'
        ) from None
    _unpack_and_check(url, name, raw)
    return _write_atomically(os.path.join(target_dir, f'{name}.gz'), raw)


def read_idx_file(name):
    """Find, verify and parse one Fashion-MNIST IDX file into a NumPy array."""
    if name not in FASHION_MNIST_SHA256:
        raise ValueError(f'name must be one of {sorted(FASHION_MNIST_SHA256)}'
                         f', got {name!r}')
    search, target_dir = fashion_mnist_dirs()
    path = _find_idx_file(name, search)
    if path is None:
        _check_download_dir(name, target_dir)
        with _FileLock(os.path.join(target_dir, f'{name}.gz.lock')):
            # Another process may have downloaded it while we waited.
            path = _find_idx_file(name, search) or \
                _download_fashion_mnist(name, target_dir)
    with open(path, 'rb') as f:
        data = _unpack_and_check(path, name, f.read())
    _say_once(f'Fashion-MNIST files from {os.path.dirname(path)}')
    # NumPy proper in every framework's module (MXNet's np cannot view bytes).
    import numpy
    # IDX header: two zero bytes, a type code (8 = uint8), the number of
    # dimensions, then one big-endian 32-bit size per dimension.
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                  for i in range(ndim))
    return numpy.frombuffer(data, 'uint8',
                            offset=4 + 4 * ndim).reshape(shape)


def balanced_subset(labels, per_class):
    """Indices of the first `per_class` examples of each class (file order)."""
    check_count(per_class, 'per_class', 1)
    picks = [(labels == c).nonzero()[0][:per_class].tolist()
             for c in sorted(set(labels.tolist()))]
    return sorted(i for pick in picks for i in pick)


def subset_per_class():
    """Images per class {'train': n, 'test': m} from D2L_SUBSET; None: all."""
    flag = os.environ.get('D2L_SUBSET', '').strip()
    if not flag:
        return None
    sizes = [part.strip() for part in flag.split(',')]
    if len(sizes) != 2 or not all(n.isdigit() and int(n) > 0 for n in sizes):
        raise ValueError(f'D2L_SUBSET must be two positive numbers of images '
                         f'per class, training then test (e.g. 600,200), '
                         f'got {flag!r}; unset it for the full data')
    return {'train': int(sizes[0]), 'test': int(sizes[1])}


_FASHION_MNIST_CACHE = {}


def describe_mode(quick, n_train, n_test):
    """One line saying which data the loader serves, and how to change it."""
    if quick:
        why = ('D2L_QUICK=1' if os.environ.get('D2L_QUICK', '').strip()
               else 'no GPU found')
        return (f'Fashion-MNIST, quick mode ({why}; set D2L_QUICK=0 for the '
                f'full data): {n_train} training and {n_test} test images')
    subset = os.environ.get('D2L_SUBSET', '').strip()
    part = f' on a subset (D2L_SUBSET={subset})' if subset else ''
    return (f'Fashion-MNIST, full mode{part}: {n_train} training and {n_test} '
            f'test images')


# What spawn_ranks or a launcher told this process: the folder its failure
# report goes to (_start_rank), and the timeout of the groups it joins when
# process_group is given none (launcher_deadline's, or GROUP_TIMEOUT_S).
_PROCESS = {'report_dir': None, 'group_timeout_s': None}


# How long a collective of a group in spawn_ranks' processes waits for a peer
# unless process_group is given a timeout_s: long enough for any exchange of
# the book's runs on a busy CPU, short enough to wait for in a notebook.
GROUP_TIMEOUT_S = 120.0


def _record_rank_failure(rank):
    """In a process of spawn_ranks, record the exception handled, if first."""
    if _PROCESS['report_dir'] is None:
        return
    path = os.path.join(_PROCESS['report_dir'], f'rank{rank}.error')
    if not os.path.exists(path):  # the first error is the cause
        with open(path + '.part', 'w') as f:
            f.write(f'{time.time()!r}\n{traceback.format_exc()}')
        os.replace(path + '.part', path)  # readers never see half a file


def _collect_results(out_dir, world_size):
    """The results that the ranks of spawn_ranks stored, by rank."""
    results = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f'rank{rank}.pkl'), 'rb') as f:
            results.append(pickle.load(f))
    return results


def _main_file(main):
    """The file the main module `main` was read from; None if there is none."""
    # a notebook, python -c and the interactive prompt give none; a script
    # read on standard input gives '<stdin>', which names no file
    path = getattr(main, '__file__', None)
    return path if isinstance(path, str) and os.path.isfile(path) else None


def _from_main(value):
    """Whether pickling `value` needs code of the main module, such as a
    function, class or lambda defined in a notebook."""
    found = []

    class Finder(pickle.Pickler):
        def reducer_override(self, obj):
            if '__main__' in (getattr(obj, '__module__', None),
                              type(obj).__module__):
                found.append(obj)
            return NotImplemented  # then pickle as usual

    try:
        Finder(io.BytesIO()).dump(value)
    except Exception:  # a lambda, say: cloudpickle may yet send it
        return True
    return bool(found)


class _ByValue:
    """A value in cloudpickle's bytes: new processes rebuild it, code and
    all, without importing the module that defined it."""
    def __init__(self, payload):
        self.payload = payload

    def __reduce__(self):
        return pickle.loads, (self.payload,)


def _sendable(value):
    """`value` as new processes can receive it: by value (cloudpickle) if
    it holds code of a main module without a file, such as a notebook's."""
    if _main_file(sys.modules.get('__main__')) is not None or \
            not _from_main(value):
        return value  # they import what it names
    import cloudpickle
    return _ByValue(cloudpickle.dumps(value))


def by_value(fn):
    """`fn` as a launcher's new processes can receive it from a notebook."""
    if not callable(fn):
        raise TypeError(f'fn must be a function, got {type(fn).__name__}')
    sent = _sendable(fn)
    return fn if sent is fn else _CallableByValue(fn, sent.payload)


class _CallableByValue(_ByValue):
    """A function sent by value that stays callable here and keeps its
    names, as launchers such as torch's elastic_launch expect."""
    def __init__(self, fn, payload):
        super().__init__(payload)
        self.fn = fn
        self.__name__, self.__qualname__ = fn.__name__, fn.__qualname__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _check_worker(worker, world_size, args):
    """Fail in this process, before any starts, if the new processes could
    not receive `worker` or `args`, or if `worker.check` refuses
    (world_size, *args): the checks a worker carries for this moment."""
    if not callable(worker):
        raise TypeError(f'worker must be a function, got {worker!r}')
    _check_main_guard(sys.modules.get('__main__'))
    for name, value in (('worker', worker), ('args', args)):
        try:
            pickle.dumps(_sendable(value))
        except ImportError:
            raise ValueError(
                f'{name} holds code defined in this notebook or interpreter '
                f'session, which new processes receive through cloudpickle: '
                f'install it (pip install cloudpickle), or save the code in '
                f'a module and import it') from None
        except Exception as err:
            raise ValueError(
                f'{name} cannot be sent to new processes ({err}); use a '
                f'function and arguments that pickle') from None
    check = getattr(worker, 'check', None)
    if check is not None:  # e.g. train_ddp.check: its arguments, refused here
        check(world_size, *args)


def _guarded_lines(path):
    """The line ranges of the `if __name__ == '__main__':` blocks of `path`."""
    try:
        with open(path, errors='replace') as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):  # changed since it started
        return None
    return [(node.lineno, node.end_lineno) for node in tree.body
            if isinstance(node, ast.If) and '__main__' in ast.unparse(node.test)]


def _check_main_guard(main):
    """Fail early if a script's top-level code starts ranks, unguarded."""
    # directly or through functions it calls: every new process imports the
    # script again and would run that code too
    path, frame = _main_file(main), sys._getframe(2)
    while frame is not None and not (frame.f_globals is vars(main) and
                                     frame.f_code.co_name == '<module>'):
        frame = frame.f_back  # the script's top-level code, if it runs now
    if path is None or frame is None:
        return
    guarded = _guarded_lines(path)
    if guarded is None or any(first <= frame.f_lineno <= last
                              for first, last in guarded):
        return
    raise RuntimeError(
        f'{path} starts processes at its top level, and every new process '
        f'imports that script again: put the code that starts them under '
        f"`if __name__ == '__main__':`")


@contextlib.contextmanager
def _no_main_rerun():
    """While processes start, hide a main module's `__file__` that names no
    file ('<stdin>'): multiprocessing would make each process run it."""
    main = sys.modules.get('__main__')
    path = getattr(main, '__file__', None)
    if path is None or _main_file(main) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


@contextlib.contextmanager
def _quiet_logger(name):
    """Hide the informational and warning records of logger `name` in the body of a `with` block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def quiet_launcher():
    """Hide a launcher agent's log records (such as its report of a failed
    attempt, with process ids and a traceback) in a `with` block."""
    loggers = [logging.getLogger(name) for name in (
        'torch.distributed.elastic', 'torch.multiprocessing')]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _fork_server():
    """'forkserver', with d2l imported in the server that forks each rank."""
    # the framework modules this process uses, so no rank imports them again
    multiprocessing.set_forkserver_preload([
        name for name in ('d2l.torch', 'd2l.mxnet', 'd2l.paddle')
        if name in sys.modules])
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError:  # its socket's path, under TMPDIR, is over 107 bytes
        return 'spawn'
    return 'forkserver'


def _take_environment(env, keep=()):
    """Make `env` this process's environment, keeping the names in `keep`."""
    kept = {name: os.environ[name] for name in keep if name in os.environ}
    os.environ.clear()
    os.environ.update(env, **kept)


def _die_with_parent(parent_pid):
    """Die when the fork server does; exit now if `parent_pid` is gone."""
    # The server ends with the process that started it, parent_pid.
    server = os.getppid()
    if sys.platform.startswith('linux'):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    try:
        os.kill(parent_pid, 0)  # signal 0 only asks whether it exists
    except ProcessLookupError:
        os._exit(1)
    if os.getppid() != server:  # the server ended before we asked
        os._exit(1)


def _start_rank(rank, out_dir, parent_pid, env, keep=()):
    """Prepare a new process: take `env`, log to out_dir, die with parent."""
    _PROCESS['report_dir'] = out_dir
    _PROCESS['group_timeout_s'] = GROUP_TIMEOUT_S
    _take_environment(env, keep)
    log = os.open(os.path.join(out_dir, f'rank{rank}.log'),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):  # C++ log lines and dumps bypass sys.stdout/stderr
        os.dup2(log, stream)
    os.close(log)
    _die_with_parent(parent_pid)
    beat = os.path.join(out_dir, f'rank{rank}.alive')
    open(beat, 'w').close()
    threading.Thread(target=_heartbeat, args=(beat,), daemon=True).start()


def _finish_rank(rank, out_dir, result):
    """Store the result of a worker where spawn_ranks collects it."""
    with open(os.path.join(out_dir, f'rank{rank}.pkl.part'), 'wb') as f:
        pickle.dump(result, f)
    os.replace(os.path.join(out_dir, f'rank{rank}.pkl.part'),
               os.path.join(out_dir, f'rank{rank}.pkl'))


def _rank_errors(out_dir, world_size):
    """{rank: (time, traceback)} of the ranks that wrote down an error."""
    written = {}
    for rank in range(world_size):
        path = os.path.join(out_dir, f'rank{rank}.error')
        if os.path.exists(path):
            with open(path) as f:
                when, trace = f.read().split('\n', 1)
            written[rank] = (float(when), trace)
    return written


# The last words of a wait that gave up: Gloo's 'Timed out waiting',
# PaddlePaddle's 'TIMEOUT', NCCL's watchdog 'timing out', TimeoutError.
_TIMED_OUT = re.compile(r'time ?out|timed out|timing out', re.IGNORECASE)


def _rank_failure(out_dir, world_size, exit_codes):
    """The error to raise for a failed group, given the ranks' exit codes."""
    # None: still running when the others had ended
    written = _rank_errors(out_dir, world_size)
    # A rank that died without a Python error is the cause, and its peers'
    # errors (a lost connection) are echoes; Gloo's abort (SIGABRT) on a lost
    # peer is an echo too.
    died = [rank for rank, code in enumerate(exit_codes) if code is not None
            and code < 0 and -code != signal.SIGABRT] + [
        rank for rank, code in enumerate(exit_codes) if code is not None
        and code > 0 and rank not in written]
    if written and not died:
        _, rank = min((when, rank) for rank, (when, _) in written.items())
        message = f'rank {rank} of {world_size} failed:\n{written[rank][1]}'
        last_words = written[rank][1].strip().splitlines()[-1:]
    else:
        rank = died[0] if died else next(
            r for r, code in enumerate(exit_codes) if code not in (None, 0))
        code = exit_codes[rank]
        how = (f'signal {signal.Signals(-code).name}' if code < 0
               else f'exit code {code}')
        message = (f'rank {rank} of {world_size} died ({how}) without a '
                   f'Python error')
        last_words = []
        log = os.path.join(out_dir, f'rank{rank}.log')
        if os.path.exists(log):
            with open(log, errors='replace') as f:
                last_words = [f.read()[-3000:]]
            message += f'.\nThe end of its output:\n{last_words[0]}'
    # A rank that gave up waiting blames the ranks that never came: those
    # still running, without an error, when it and the others had ended.
    stuck = [r for r, code in enumerate(exit_codes)
             if code is None and r not in written]
    if stuck and not died and _TIMED_OUT.search(''.join(last_words)):
        who = ', '.join(map(str, stuck))
        return RuntimeError(
            f'rank{"s" * (len(stuck) > 1)} {who} of {world_size} did not '
            f'arrive: still running, without an error, when rank {rank} '
            f'gave up waiting for {"them" if len(stuck) > 1 else "it"} '
            f'(stuck, sleeping or in an endless loop before a collective '
            f'the others had reached). What rank {rank} said:\n{message}')
    return RuntimeError(message)


def _stop_processes(processes, grace_s=3.0):
    """Terminate running processes, kill those that ignore it, reap all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _join_ranks(context, out_dir, world_size, silence_s, servers=()):
    """Wait for the processes of spawn_ranks; stop them all if one fails."""
    # or if a rank falls silent, or on an interrupt or SIGTERM
    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the clean-up below

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = in_main_thread and signal.signal(signal.SIGTERM, on_sigterm)
    try:
        codes = _wait_for_ranks(context.processes, out_dir, silence_s,
                                servers)
    finally:  # KeyboardInterrupt, SystemExit from SIGTERM, a silent rank
        _stop_processes([*context.processes, *servers])
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    if codes is not None:
        raise _rank_failure(out_dir, world_size, codes) from None


def _heartbeat(path):
    """Touch the file at `path` every second, as a sign of life for spawn_ranks."""
    while True:
        os.utime(path)
        time.sleep(1.0)


FAILED_GRACE_S = 5.0  # how long the others may run on once a rank failed


def _wait_for_ranks(processes, out_dir, silence_s, servers=()):
    """Wait until all ranks end well (None) or one fails (their exit codes); raise if one falls silent or a server ends."""
    seen, checked = {}, time.monotonic()  # rank: (heartbeat, when it changed)
    failed_at = None  # when a rank was first seen to fail
    while True:
        codes = [process.exitcode for process in processes]
        if all(code == 0 for code in codes):
            return None
        for server in servers:  # MXNet's: they end well after the workers
            if server.exitcode not in (None, 0):
                raise RuntimeError(
                    f'a parameter-server process ended (exit code '
                    f'{server.exitcode}) while the workers still ran')
        now = time.monotonic()
        # A rank has failed once it exits with an error or writes one down,
        # even if it then hangs on its way out (MXNet's store, freed, waits
        # for its peers). The others get a few seconds to end by themselves:
        # a killed process with many threads ends slowly on a busy machine,
        # and a peer's death may show after the error it caused.
        if failed_at is None and any(
                code not in (None, 0) or os.path.exists(os.path.join(
                    out_dir, f'rank{rank}.error'))
                for rank, code in enumerate(codes)):
            failed_at = now
        if failed_at is not None and (now - failed_at > FAILED_GRACE_S or
                                      None not in codes):
            return codes
        if now - checked > 5:  # this process was stopped or suspended too
            seen = {}
        checked = now
        for rank, code in enumerate(codes):
            path = os.path.join(out_dir, f'rank{rank}.alive')
            if code is not None or not os.path.exists(path):
                continue  # ended well, or not started yet
            beat = os.stat(path).st_mtime_ns
            if seen.get(rank, (None,))[0] != beat:
                seen[rank] = (beat, now)
            elif silence_s and now - seen[rank][1] > silence_s:
                raise RuntimeError(
                    f'rank {rank} of {len(processes)} showed no sign of life '
                    f'for {silence_s:g} s (stopped, or hung holding Python\'s '
                    f'lock), so all ranks were stopped; if it needs longer, '
                    f'pass a larger silence_s to spawn_ranks')
        multiprocessing.connection.wait(
            [p.sentinel for p in [*processes, *servers]], 0.2)


def _check_seed(seed):
    """Raise ValueError, saying what to pass, unless `seed` is a non-negative integer."""
    check(is_count(seed), lambda: f'seed must be a non-negative integer such as 0; got {seed!r}')


def check_scores_and_labels(y_hat, y):
    """Raise ValueError, saying what to pass, unless `y` holds one class per row of `y_hat`."""
    check(len(y_hat.shape) == 2, lambda: 'y_hat must hold one row of class scores per '
             f'example, shape (examples, classes); got {tuple(y_hat.shape)}')
    n, num_classes = y_hat.shape
    check(tuple(y.shape) in ((n,), (n, 1)), lambda: 'y must hold one label per row of '
             f'y_hat, shape ({n},); got shape {tuple(y.shape)}')
    # MXNet clips labels out of range, Paddle reads negative ones from the end
    low, high = (int(y.min()), int(y.max())) if n else (0, 0)
    check(0 <= low and high < num_classes, lambda: f'y holds labels from {low} to '
             f'{high}, but y_hat scores classes 0 to {num_classes - 1}; pass '
             'labels in that range')


def check_reduce_args(data, devices):
    """Raise ValueError, saying what to pass, unless `data` and `devices` suit an allreduce."""
    check_arrays(data, 'data')
    shapes = [tuple(x.shape) for x in data]
    check(all(shape == shapes[0] for shape in shapes), lambda: f'data holds arrays of '
             f'different shapes {shapes}; pass the same-shaped arrays of one '
             'parameter, one per device')
    check(devices is None or (isinstance(devices, (list, tuple)) and len(
        devices) == len(data)), lambda: 'devices must be a list with one device per '
        f'array of data ({len(data)}), or None; got {devices!r:.60}')


def check_split(X, y, devices):
    """Raise ValueError, saying what to change, if a batch cannot be split over the devices."""
    for name, a in (('X', X), ('y', y)):
        check(len(getattr(a, 'shape', ())), lambda: f'{name} must be an array with '
                 f'one row per example; got {a!r:.60}')
    check(isinstance(devices, (list, tuple)), lambda: 'devices must be a list of '
             f'devices such as d2l.try_gpus(2); got {devices!r:.60}')
    n, k = X.shape[0], len(devices)
    check(n == y.shape[0], lambda: f'X holds {n} examples but y holds {y.shape[0]} '
             'labels; pass one label per example')
    check(k >= 1, 'devices is empty; pass at least one device, e.g. d2l.try_gpus(1)')
    check(n >= k, lambda: f'cannot split {n} examples over {k} devices, each needs at '
             f'least one; use a batch of at least {k} examples or fewer devices')


def check_replicas(device_params, devices, allreduce_fn=None):
    """Raise ValueError, saying what to pass, unless there is one replica per device (and `allreduce_fn`, if given, is a function)."""
    if allreduce_fn is not None:
        check_collective(allreduce_fn, 'allreduce_fn', 'd2l.allreduce')
    for name, value in (('device_params', device_params), ('devices', devices)):
        check(isinstance(value, (list, tuple)), lambda: f'{name} must be a list, one '
                 f'entry per device; got {value!r:.60}')
    check(len(device_params) == len(devices), lambda: f'device_params holds '
             f'{len(device_params)} replicas but devices names {len(devices)} '
             'devices; build one replica per device with get_params')


def check_collective(value, name, example):
    """Reject a collective that is not a function (a name, say), saying so."""
    check(callable(value), lambda: f'{name} must be a function such as {example}, '
          f'got {value!r:.60}')


def check_resnet_args(num_classes, in_channels):
    """Reject a class or channel count that is not a positive integer, saying which."""
    for name, value in (('num_classes', num_classes), ('in_channels', in_channels)):
        check(is_count(value, 1),
                     lambda: f'{name} must be a positive integer, got {value!r}')


def check_step(X, y, devices):
    """Reject a minibatch or device list that a training step cannot use."""
    check_devices(devices)
    check(X.shape[0] == y.shape[0], lambda: f'X holds {X.shape[0]} examples but '
                 f'y holds {y.shape[0]} labels; pass one label per example')
    check(X.shape[0] > 0, 'X is an empty minibatch; pass at least one example')


def _check_model(net, kind, kind_name):
    """Reject `net` unless it is a model of class `kind`, saying what to pass."""
    if not isinstance(net, kind):
        raise TypeError(f'net must be a model ({kind_name}), got '
                        f'{type(net).__name__}; pass e.g. d2l.resnet18(10)')


def check_warmup(warmup, num_epochs):
    """Reject a warm-up that is not a count shorter than the run, saying so."""
    check_count(warmup, 'warmup')
    check(warmup < num_epochs, lambda: f'warmup must be below num_epochs, '
                 f'got warmup={warmup!r}, num_epochs={num_epochs!r}')


def check_global_batch(batch_size, world_size):
    """Reject a global minibatch that `world_size` processes cannot share equally."""
    check_count(batch_size, 'batch_size', 1)
    check_count(world_size, 'world_size', 1)
    if batch_size < world_size or batch_size % world_size:
        below = max(world_size, batch_size - batch_size % world_size)
        raise ValueError(
            f'a global batch of {batch_size} cannot be shared equally by '
            f'{world_size} processes; use a multiple of {world_size}, such as '
            f'{below} or {below + world_size}')


def check_train_ddp(world_size, init_method, num_epochs, batch_size, lr,
                    local_rank=None, local_world_size=None, warmup=0):
    """The checks of train_ddp (its arguments but the rank), which
    spawn_ranks runs before it starts any process: train_ddp.check."""
    check_count(num_epochs, 'num_epochs', 1)
    check_number(lr, 'lr')
    check_warmup(warmup, num_epochs)
    check_global_batch(batch_size, world_size)


def check_epoch(epoch, num_epochs):
    """Reject an epoch outside [0, num_epochs), or a bad num_epochs, saying so;
    a step's epoch, the epochs done before it, may be a fraction."""
    real = isinstance(epoch, numbers.Real) and not isinstance(epoch, bool)
    check(is_count(num_epochs, 1) and real and 0 <= epoch < num_epochs,
          lambda: f'epoch must be a number in [0, num_epochs) and num_epochs '
                  f'a positive integer, got epoch={epoch!r}, '
                  f'num_epochs={num_epochs!r}')


def check_lr(lr, epoch, num_epochs, warmup=0, start=0.0):
    """The checks of cosine_lr and warmup_cosine_lr, in the caller's values."""
    check_number(lr, 'lr')
    check_epoch(epoch, num_epochs)
    check_count(warmup, 'warmup')
    check_number(start, 'start')
    check_warmup(warmup, num_epochs)


def check_rank(rank, world_size, what='rank'):
    """Reject a world size below 1 or a rank outside 0..world_size-1, naming the culprit."""
    size = what.replace('rank', 'world_size')  # local_rank: local_world_size
    for name, value in ((size, world_size), (what, rank)):
        if not _is_int(value):
            raise ValueError(f'{name} must be an integer, got {value!r}')
    if world_size < 1:
        raise ValueError(f'{size} must be at least 1, got {world_size}')
    if not 0 <= rank < world_size:
        raise ValueError(f'{what} must lie in 0..{world_size - 1} for a '
                         f'{size} of {world_size}, got {rank}')


def _int_from_env(name, least, default=None):
    """The integer in environment variable `name`, at least `least`; `default` if unset."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise ValueError(
            f'environment variable {name}={text!r} must be an integer of at '
            f'least {least}: unset it and start the script with the '
            f"framework's launcher, which sets it")
    return value


def _check_timeout(timeout_s, name='timeout_s'):
    """Accept None or a positive number of seconds for a process group's timeout."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(
            timeout_s, (int, float)) or not 0 < timeout_s < float('inf')):
        raise ValueError(f'{name} must be a positive number of seconds or '
                         f'None, got {timeout_s!r}')




def _loopback_interface():
    """Name of the network interface that carries this machine's loopback address."""
    return 'lo0' if sys.platform == 'darwin' else 'lo'


@contextlib.contextmanager
def _environment(values, **more):
    """Set environment variables for the body of a `with` block, then restore them."""
    values = {**values, **more}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _is_loopback(host):
    """Whether `host` names an address of this machine's loopback interface."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, TypeError, ValueError):  # no such host, or no host
        return False


_WATCHDOG = (  # the program of launcher_deadline's watchdog process
    'import os, select, signal, sys\n'
    'pid, seconds = int(sys.argv[1]), float(sys.argv[2])\n'
    'if not select.select([sys.stdin], [], [], seconds)[0]:  # no EOF\n'
    '    print(sys.argv[3], file=sys.stderr, flush=True)\n'
    '    os.kill(pid, signal.SIGKILL)\n')


@contextlib.contextmanager
def _deadline_watchdog(who, timeout_s, where, peers, what, fix, joined):
    """Say where and until when `who` waits for its `peers`; if `joined()` is
    still false after `timeout_s`, end the process with one line: no `what`
    formed, and `fix`. A process, not a thread: PaddlePaddle waits holding
    Python's lock."""
    import subprocess
    until = time.strftime('%H:%M:%S %Z',
                          time.localtime(time.time() + timeout_s))
    print(f'{who} waits for {peers} at {where} until {until} '
          f'(timeout {timeout_s:g} s)', flush=True)
    message = (f'{who}: no {what} formed at {where} within {timeout_s:g} s; '
               f'{fix}')
    watchdog = subprocess.Popen([sys.executable, '-c', _WATCHDOG, str(
        os.getpid()), str(timeout_s), message], stdin=subprocess.PIPE)
    done = threading.Event()

    def stand_down():
        while not joined() and not done.wait(0.2):
            pass
        watchdog.stdin.close()  # end of its input: the watchdog exits quietly

    threading.Thread(target=stand_down, daemon=True).start()
    try:
        yield
    finally:
        done.set()
        watchdog.wait()  # it ends when told to stand down


def _script_path(framework):
    """Path of the book's launcher script for 'torch', 'mxnet', 'paddle'."""
    names = {'torch': 'ddp_train.py', 'mxnet': 'ddp_train_mxnet.py',
             'paddle': 'ddp_train_paddle.py'}
    if framework not in names:
        raise ValueError(f"framework must be 'torch', 'mxnet' or "
                         f"'paddle', got {framework!r}")
    name = names[framework]
    # Next to d2l/ in the repository, or beside a downloaded notebook.
    book_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    places = [os.path.join(book_root, 'chapter_multi_gpu', name),
              os.path.join(os.getcwd(), name),
              os.path.join(os.getcwd(), 'chapter_multi_gpu', name)]
    for place in places:
        if os.path.isfile(place):
            return place
    raise FileNotFoundError(f'{name} is in none of ' + ', '.join(places) +
                            ": run from the book's root or notebook folder")


def step_needs(stage, op, i, num_stages):
    """The steps that must end before step (stage, op, i) can start."""
    if op == 'W':  # the weights' gradients need the output's gradient
        return [(stage, 'B', i)]
    if op == 'F':
        return [(stage - 1, 'F', i)] if stage > 0 else []
    after = [(stage + 1, 'B', i)] if stage < num_stages - 1 else []
    return [(stage, 'F', i)] + after


def _interleave(orders):
    """The devices' orders of steps (stage, op, micro-batch) as one list,
    each device stepping when it can."""
    done, schedule = set(), []
    num_stages = 1 + max(step[0] for order in orders for step in order)
    while any(orders):
        ready = [order[0] for order in orders if order and all(
            n in done for n in step_needs(*order[0], num_stages))]
        if not ready:
            raise ValueError('the devices wait on each other')
        for order in orders:
            if order and order[0] in ready:
                order.pop(0)
        done.update(ready)
        schedule += ready
    return schedule


def check_stage_number(stage, num_stages):
    """Refuse a stage outside 0..num_stages-1, naming both."""
    if not (_is_int(stage) and _is_int(num_stages)
            and 0 <= stage < num_stages):
        raise ValueError(f'stage must lie in 0..num_stages-1, got stage='
                         f'{stage!r} and num_stages={num_stages!r}')


def _queue_link(num_stages, num_microbatches, timeout_s, failed):
    """send and recv between stage threads: a queue per message."""
    boxes = {(s, op, i): queue.Queue() for s in range(num_stages)
             for op in 'FB' for i in range(num_microbatches)}
    send = lambda stage, op, i, x: boxes[stage, op, i].put(x)
    def recv(source, op, i):
        me = source + 1 if op == 'F' else source - 1
        return _next_message(boxes[me, op, i], failed.is_set, timeout_s, lambda: TimeoutError(
            f'stage {me} waited for {op} of micro-batch {i} from stage {source}: '
            + ('another stage failed' if failed.is_set() else f'over {timeout_s:g} s')))
    return send, recv


def _next_message(box, stop, timeout_s, failure):
    """The next item of queue `box`; raise failure() once stop() or after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not stop() and time.monotonic() < deadline:
        try:
            return box.get(timeout=0.05)
        except queue.Empty:
            pass
    raise failure()


def _merge(records, grads=(), name='run_pipeline'):
    """One run's record from its devices' records; a nan stops the run."""
    # grads: the stages' gradients, which show a nan that the loss hides
    return {'times': sorted(t for r in records for t in r['times']),
            'peak_bytes': [r['peak_bytes'] for r in records],
            'loss': check_finite(sum(r['loss'] for r in records), name, grads)}


def check_steps(schedule, num_stages, num_microbatches):
    """Reject a schedule that is not a list of steps, or bad sizes."""
    check_count(num_stages, 'num_stages', 1)
    check_count(num_microbatches, 'num_microbatches', 1)
    check(isinstance(schedule, (list, tuple)) and all(
        isinstance(t, (list, tuple)) and len(t) == 3 for t in schedule),
        lambda: "schedule must be a list of steps (stage, 'F', 'B' or 'W', "
        f'micro-batch), as pipeline_schedule returns; got {schedule!r:.60}')


def check_device_steps(stages, num_stages, steps):
    """The checks of run_device: its stages by number, steps of those only."""
    check_count(num_stages, 'num_stages', 1)
    check(isinstance(stages, dict) and stages and all(
        _is_int(s) and 0 <= s < num_stages for s in stages), lambda: 'stages must '
        'map stage numbers below num_stages to lists of layers, such as '
        f'{{0: layers}}; got {stages!r:.60} with num_stages={num_stages!r}')
    for step in steps:
        check(isinstance(step, (list, tuple)) and len(step) == 3
              and step[0] in stages, lambda: 'steps must be (stage, op, '
              'micro-batch) steps of the stages this device holds, '
              f'{sorted(stages)}; got {step!r:.60}')


def check_schedule(schedule, num_stages, num_microbatches):
    """Refuse a schedule that misses, repeats or misorders a step, naming it."""
    check_steps(schedule, num_stages, num_microbatches)
    p, m, schedule = num_stages, num_microbatches, list(map(tuple, schedule))
    ops = 'FBW' if any(t[1] == 'W' for t in schedule) else 'FB'
    steps = {(s, op, i) for s in range(p) for op in ops for i in range(m)}
    seen = set()
    for step in schedule:
        if step not in steps or step in seen:
            raise ValueError(f'step {step!r} ' + (
                'appears twice' if step in steps else f'is not (stage < {p}, '
                f'one of {tuple(ops)}, micro-batch < {m})'))
        seen.add(step)
    if steps - seen:
        raise ValueError(f'the schedule never runs step(s) {sorted(steps - seen)}')
    done = set()
    for step in schedule:
        missing = [n for n in step_needs(*step, p) if n not in done]
        if missing:
            raise ValueError(f'step {step!r} comes before {missing[0]!r}, '
                             f'which it needs')
        done.add(step)


_grad_lock = threading.Lock()


def _one_at_a_time(f, *args, **kwargs):
    """f(*args, **kwargs), one thread at a time: PaddlePaddle's paddle.grad
    crashes when two threads call it at once."""
    with _grad_lock:
        return f(*args, **kwargs)


def _merge_runs(ranks):
    """time_pipeline's records from its ranks' lists of records, the last
    run's with the gradients of every stage, in stage order."""
    by_stage = {s: g for r in ranks for s, g in r[-1]['grads'].items()}
    grads = [g for s in sorted(by_stage) for g in by_stage[s]]
    records = [_merge([r[j] for r in ranks], grads, 'time_pipeline')
               for j in range(len(ranks[0]))]
    records[-1]['grads'] = grads
    return records


def _in_threads(body, num_threads, failed, deadline_s):
    """body(0), ..., body(num_threads - 1) in threads: their results, or a
    RuntimeError naming the first device that failed (a timeout only if no
    other error); `failed` is set when one fails, `deadline_s` bounds all."""
    results, errors = [None] * num_threads, []
    def run(d):
        try:
            results[d] = body(d)
        except BaseException as error:
            errors.append((isinstance(error, TimeoutError), d, error))
            failed.set()
    threads = [threading.Thread(target=run, args=(d,), daemon=True)
               for d in range(num_threads)]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    if errors or any(thread.is_alive() for thread in threads):
        _, d, error = min(errors, default=(0, '?', 'deadline passed'))
        raise RuntimeError(f'device {d} failed: {error}')
    return results


def check_stages(stages, timeout_s):
    """The checks of run_pipeline: a list of stages, each a list of layers."""
    check(isinstance(stages, (list, tuple)) and stages and all(
        isinstance(s, (list, tuple)) and s for s in stages), lambda: 'stages must be '
        'a non-empty list of stages, each a non-empty list of layers, as '
        f'split_stages returns; got {stages!r:.60}')
    check_number(timeout_s, 'timeout_s')


def check_runs(runs):
    """The runs of time_pipeline: (schedule, num_microbatches) pairs."""
    check(isinstance(runs, (list, tuple)) and runs and all(
        isinstance(r, (list, tuple)) and len(r) == 2 for r in runs),
        lambda: 'runs must list (schedule, num_microbatches) pairs; got '
        f'{runs!r:.60}')


def check_microbatches(X, y, num_microbatches):
    """Reject a minibatch that cannot be cut into `num_microbatches`."""
    check_count(num_microbatches, 'num_microbatches', 1)
    for name, a in (('X', X), ('y', y)):
        check(len(getattr(a, 'shape', ())), lambda: f'{name} must be an array with '
              f'one row per example; got {a!r:.60}')
    check(X.shape[0] == y.shape[0], lambda: f'X holds {X.shape[0]} examples but y '
          f'holds {y.shape[0]} labels; pass one label per example')
    if num_microbatches > X.shape[0]:
        raise ValueError(f'num_microbatches={num_microbatches} exceeds the '
                         f'{X.shape[0]} examples of the minibatch')
    dtype = str(X.dtype).split('.')[-1]  # torch.float32, float32, ...
    check(dtype == 'float32', lambda: f'X holds {dtype} numbers, but the stages '
          'compute in float32; convert it first, e.g. X.astype(\'float32\')')


def check_run_times(times, num_devices=None):
    """Reject a run's times that are not steps of a run of some length."""
    if num_devices is not None:
        check_count(num_devices, 'num_devices', 1)
    check(isinstance(times, (list, tuple)) and times,
          "times must hold a run's steps, as run_pipeline's")
    for t in times:
        check(isinstance(t, (list, tuple)) and len(t) == 5 and all(
            isinstance(x, (int, float)) for x in t[3:]), lambda: "times must hold "
            "a run's steps, (stage, op, micro-batch, start, end) each; got "
            f'{t!r:.60}')
    check(max(t[4] for t in times) > min(t[3] for t in times),
          lambda: f'times span no time (every step starts and ends at '
          f'{times[0][3]}); pass the times of a run that took some')


def _shard_axes(net):
    """For each parameter of `net`, the axis its slices are cut along."""
    return [axis for i in range(len(net))
            for axis in getattr(net[i], 'shard_axes', ())]


def _check_row_input(got, expected, k):
    """Raise unless a row-parallel layer's input has its slice's columns."""
    if got != expected:
        raise ValueError(
            f"RowParallelLinear expects this rank's {expected} hidden units, "
            f'got {got}: feed it the output of a ColumnParallelLinear over '
            f'the same {k} ranks')


def check_shards(results, key):
    """Reject results that gather_shards cannot join under `key`."""
    check(isinstance(results, (list, tuple)) and results and all(
        isinstance(r, dict) for r in results), lambda: 'results must be a non-empty '
        f"list of the ranks' results, as spawn_ranks returns; got "
        f'{results!r:.60}')
    check(key in results[0] and 'axes' in results[0], lambda: f'key {key!r} is not '
          f"among the results' keys {sorted(results[0])}; pass one of them "
          "(and results that hold 'axes')")


def check_flat_shards(shards):
    """Reject shards that all_gather cannot join: not 1-D tensors."""
    check(isinstance(shards, (list, tuple)) and shards and all(
        len(getattr(s, 'shape', (0, 0))) == 1 for s in shards), lambda: 'shards '
        'must be a non-empty list of 1-D tensors, one per device (flatten '
        f'them first); got {shards!r:.60}')


def check_summary(summary):
    """Reject a summary that is not train_ddp's for at least one epoch."""
    keys = ('rank', 'world_size', 'device', 'backend', 'data', 'train_loss',
            'test_acc', 'epoch_s')
    check(isinstance(summary, dict) and all(k in summary for k in keys),
          lambda: f'summary must be the dictionary that train_ddp returns, with keys '
          f'{", ".join(keys)}; got {summary!r:.60}')
    check(summary['epoch_s'], 'summary holds no epoch: pass what train_ddp '
          'returned for num_epochs of at least 1')


def check_mesh_args(world_size, d, hidden, batch_size, dp=2, tp=2):
    """Reject sizes that a dp x tp mesh cannot share, before any group forms."""
    check_mlp_sizes(d, hidden, 0)
    check_count(batch_size, 'batch_size', 1)
    check(world_size == dp * tp, lambda: f'the {dp} x {tp} mesh needs world_size='
          f'{dp * tp}, got world_size={world_size!r}')
    check(batch_size % dp == 0, lambda: f'batch_size={batch_size} cannot be halved '
          f'equally between the {dp} data-parallel replicas (each averages '
          f'its own examples); pass a multiple of {dp}')
    check(hidden >= tp, lambda: f'hidden={hidden} leaves a rank of the {tp} '
          f'tensor-parallel ranks without hidden units; pass at least {tp}')


def check_heads(h, num_heads):
    """Reject a width `h` that `num_heads` attention heads cannot share."""
    check_count(h, 'h', 1)
    check_count(num_heads, 'num_heads', 1)
    check(h % num_heads == 0, lambda: f'num_heads={num_heads} must divide '
          f'h={h}: each head gets h/num_heads features')


def check_head_split(num_heads, k):
    """Reject `k` tensor-parallel ranks that cannot share `num_heads` heads."""
    check_count(num_heads, 'num_heads', 1)
    check_count(k, 'k', 1)
    check(num_heads % k == 0, lambda: f'num_heads={num_heads} heads cannot be '
          f'split over k={k} ranks: each rank computes whole heads; use a k '
          f'that divides num_heads')


def check_token_split(s, k, sequence):
    """Reject `k` sequence-parallel ranks that cannot share `s` tokens."""
    check_count(s, 's', 1)
    check(not sequence or s % k == 0, lambda: f's={s} tokens cannot be split '
          f'evenly over {k} ranks; use a sequence length that k divides')


def check_tp_block_worker(world_size, init_method, h, num_heads, b, s,
                          sequence=False):
    """Refuse sizes that tp_block_worker's ranks cannot split."""
    check_heads(h, num_heads)
    check_head_split(num_heads, world_size)
    check_count(b, 'b', 1)
    check_token_split(s, world_size, sequence)


def check_mlp_sizes(d, hidden, seed):
    """Reject sizes below 1 and seeds below 0, naming the argument."""
    for name, value, least in (('d', d, 1), ('hidden', hidden, 1),
                               ('seed', seed, 0)):
        check_count(value, name, least)


def _check_mesh(dp, tp, world_size):
    """Reject a mesh whose dp x tp ranks are not the world's."""
    if dp * tp != world_size:
        raise ValueError(f'dp x tp must equal the {world_size} ranks of the '
                         f'world, got dp={dp} and tp={tp}')


def check_cost_args(num_bytes, k, alpha, beta):
    """Reject negative or infinite sizes or times, and k below 1."""
    for name, value in (('num_bytes', num_bytes), ('alpha', alpha),
                        ('beta', beta)):
        check_number(value, name)
    check_count(k, 'k (the number of processes)', 1)


def _check_world_of_two(world_size):
    """Reject a world size below 2: one process has nothing to allreduce."""
    check_count(world_size, 'world_size', 2, ' (one process sends nothing)')


def check_timings(num_bytes, seconds, k):
    """Reject timings that fit_alpha_beta cannot fit a line to, saying why."""
    check_count(k, 'k', 2, ' (one process sends nothing)')
    check(isinstance(num_bytes, (list, tuple)) and isinstance(
        seconds, (list, tuple)), lambda: 'num_bytes and seconds must be lists of '
        f'numbers, got {type(num_bytes).__name__} and '
        f'{type(seconds).__name__}')
    if len(num_bytes) != len(seconds) or len(set(num_bytes)) < 2:
        raise ValueError('num_bytes and seconds must have the same length, '
                         'and num_bytes needs at least two different sizes '
                         f'to fit a line; got {num_bytes!r} and {seconds!r}')
    for name, values in (('num_bytes', num_bytes), ('seconds', seconds)):
        for v in values:
            check_number(v, name, positive=True)


def _check_step_args(t_compute, cores, threads, accumulate, overlap):
    """Reject non-positive arguments of predict_step_time, or an overlap
    outside [0, 1]."""
    check_number(t_compute, 't_compute', positive=True)
    for name, value in (('threads', threads), ('accumulate', accumulate),
                        ('cores', 1 if cores is None else cores)):
        check_count(value, name, 1)
    check_number(overlap, 'overlap (the hidden fraction of the allreduce)')
    if overlap > 1:
        raise ValueError(f'overlap must be at most 1, got {overlap!r}')


def _check_sizes(sizes, reps):
    """Reject an empty or non-positive list of byte sizes, or reps below 1."""
    sizes = list(sizes) or [None]
    for n in sizes:
        check_count(n, 'sizes (a non-empty list of bytes of float32)', 4)
    check_count(reps, 'reps', 1)
    return sizes


def _alternating_rounds(jobs, reps, wait=lambda: None, sync=lambda: None):
    """Seconds of each function in `jobs` in `reps` alternating rounds."""
    check_count(reps, 'reps', 1)
    seconds = [[0.0] * len(jobs) for _ in range(reps)]
    for r in range(reps):
        order = range(len(jobs)) if r % 2 == 0 else range(len(jobs))[::-1]
        for i in order:
            wait()  # all processes start each timing together
            began = time.perf_counter()
            jobs[i]()
            sync()  # a GPU's work ends when it is done, not when it is queued
            seconds[r][i] = time.perf_counter() - began
    return seconds


def _slowest_medians(per_process):
    """Per job, the median over rounds of the slowest process's seconds."""
    # rounds: each process's result of _alternating_rounds
    rounds = [[max(col) for col in zip(*rows)] for rows in zip(*per_process)]
    return [statistics.median(col) for col in zip(*rounds)]


def check_ps_args(num_bytes, k, alpha, beta, servers):
    """The checks of ps_pushpull_time."""
    check_cost_args(num_bytes, k, alpha, beta)
    check_count(servers, 'servers', 1)


def check_ps_fit(k, servers):
    """The checks of fit_ps_alpha_beta."""
    check_count(k, 'k (the number of workers)', 1)
    check_count(servers, 'servers', 1)


MAX_BUCKETS = 10 ** 5  # far more than any model's parameters fill


def check_buckets(num_bytes, bucket_cap_mb, first_bucket_mb):
    """The checks of ddp_buckets: no bucket below a float32, nor too many."""
    check_cost_args(num_bytes, 1, 0, 0)
    check_number(bucket_cap_mb, 'bucket_cap_mb', positive=True)
    check_number(first_bucket_mb, 'first_bucket_mb', positive=True)
    least = 4 / 2 ** 20  # one float32
    for name, mb in (('bucket_cap_mb', bucket_cap_mb),
                     ('first_bucket_mb', first_bucket_mb)):
        check(mb >= least, lambda: f'{name}={mb!r} is under one 4-byte number; '
              f'pass at least {least:.3g} (DDP fills a bucket with whole '
              'parameters)')
    rest = max(0, num_bytes - first_bucket_mb * 2 ** 20)
    count = math.ceil(rest / (bucket_cap_mb * 2 ** 20))  # closed form
    check(count < MAX_BUCKETS, lambda: f'bucket_cap_mb={bucket_cap_mb!r} would cut '
          f'{num_bytes:g} bytes into {count} buckets, more than the '
          f'{MAX_BUCKETS} that any real run has; pass at least '
          f'{num_bytes / MAX_BUCKETS / 2 ** 20:.3g}')


def check_step_prediction(t_compute, num_bytes, k, alpha, beta, cores,
                           threads, accumulate, overlap):
    """The checks of predict_step_time."""
    check_cost_args(num_bytes, k, alpha, beta)
    _check_step_args(t_compute, cores, threads, accumulate, overlap)


def check_pipeline_prediction(t_stage, num_stages, num_microbatches,
                               message_bytes, alpha, beta):
    """The checks of predict_pipeline_time."""
    check_count(num_stages, 'num_stages', 1)
    check_cost_args(message_bytes, num_stages, alpha, beta)
    check_number(t_stage, 't_stage', positive=True)
    check_count(num_microbatches, 'num_microbatches', 1)


def check_tensor_prediction(t_compute, k, activation_bytes, alpha, beta,
                             blocks, collective=None):
    """The checks of predict_tensor_time."""
    if collective is not None:
        check_collective(collective, 'collective', 'd2l.ring_allreduce_time')
    check_cost_args(activation_bytes, k, alpha, beta)
    check_number(t_compute, 't_compute', positive=True)
    check_count(blocks, 'blocks', 1)


def check_tensor_timing(k, d, hidden, batch_size, num_steps, reps,
                        num_heads=0, seq_len=1):
    """The checks of time_tensor_parallel."""
    check_count(k, 'k', 2, ' (one process splits nothing)')
    check_count(hidden, 'hidden', k, ' (a hidden unit per process)')
    check_mlp_sizes(d, hidden, 0)
    check_count(batch_size, 'batch_size', 1)
    _check_sizes([4], reps)
    check_count(num_steps, 'num_steps', 1)
    check_count(num_heads, 'num_heads')
    check_count(seq_len, 'seq_len', 1)
    if num_heads:
        check_heads(d, num_heads)
        check_head_split(num_heads, k)
        check(seq_len % k == 0, lambda: f'seq_len={seq_len} tokens cannot be '
              f'split evenly over k={k} ranks; use a seq_len that k divides')
        check(hidden == 4 * d, lambda: f'hidden={hidden} must be 4 * d = '
              f'{4 * d}: a TransformerBlock\'s MLP is 4 times as wide')


def check_timing(num_steps, warmup, threads=1, reps=1):
    """The checks of a timing helper: steps, warm-up, threads and rounds."""
    check_count(num_steps, 'num_steps', 1)
    check_count(warmup, 'warmup')
    check_count(threads, 'threads', 1)
    check_count(reps, 'reps', 1)


# Quick mode's data: the first images of each class of each split.
QUICK_PER_CLASS = {'train': 10, 'test': 10}


def fashion_mnist_arrays(split, quick):
    """`split`'s images (float32, N x 1 x 28 x 28, in [0, 1]), int64 labels."""
    if split not in ('train', 'test'):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if split not in _FASHION_MNIST_CACHE:
        prefix = 'train' if split == 'train' else 't10k'
        images = read_idx_file(f'{prefix}-images-idx3-ubyte')
        labels = read_idx_file(f'{prefix}-labels-idx1-ubyte')
        _FASHION_MNIST_CACHE[split] = images, labels
    images, labels = _FASHION_MNIST_CACHE[split]
    per_class = QUICK_PER_CLASS if quick else subset_per_class()
    fewest = min(int((labels == c).sum()) for c in range(10)) \
        if per_class and not quick else None
    if fewest is not None and per_class[split] > fewest:
        raise ValueError(
            f'D2L_SUBSET asks for {per_class[split]} {split} images per '
            f'class, but the {split} split has {fewest}; ask for at most '
            f'that many, or unset D2L_SUBSET for all of them')
    if per_class:
        keep = balanced_subset(labels, per_class[split])
        images, labels = images[keep], labels[keep]
    images = images.reshape(-1, 1, 28, 28).astype('float32') / 255
    return images, labels.astype('int64')


def check_per_device(data, name):
    """Reject an empty list, or tensors of different shapes; name `name`."""
    if not isinstance(data, (list, tuple)):
        raise ValueError(f'{name} must be a list with one tensor per device; '
                         f'got {type(data).__name__}')
    if len(data) == 0:
        raise ValueError(f'{name} is empty; pass one tensor per device')
    if any(tuple(x.shape) != tuple(data[0].shape) for x in data):
        raise ValueError(f'{name} must hold tensors of one shape, got '
                         f'{[tuple(x.shape) for x in data]}')


def _check_zero_args(params, devices):
    """Reject an empty parameter list or device list, saying what to pass."""
    if not isinstance(params, (list, tuple)) or len(params) == 0:
        raise ValueError('params must be a non-empty list of tensors, such '
                         'as d2l.lenet_params()')
    if not isinstance(devices, (list, tuple)) or len(devices) == 0:
        raise ValueError('devices must be a non-empty list of devices, such '
                         'as d2l.try_gpus(2)')


def _check_zero_states(states, devices, stage, n):
    """Reject states that zero_init did not build for `n` parameters,
    `devices` and `stage`."""
    _check_zero_args(states, devices)
    if len(states) != len(devices):
        raise ValueError(f'states holds {len(states)} device states but '
                         f'devices names {len(devices)}; pass what zero_init '
                         f'returned for these devices')
    own = -(-n // len(devices))  # device 0's shard, the largest
    needed = (own if stage == 3 else n, own if stage >= 2 else n,
              own if stage >= 1 else n)
    held = tuple(x.shape[0] for x in states[0].values())  # zero_init's order
    if held != needed:
        raise ValueError(f'states hold {held} parameters, gradients and '
                         f'momentum on device 0, but stage {stage} needs '
                         f'{needed}; pass the stage given to zero_init')


def _use_threads(threads, set_threads):
    """On a CPU, let this process run `threads` threads on all usable cores."""
    if threads > 1:
        if hasattr(os, 'sched_setaffinity'):  # undo use_one_core's pinning
            for thread in os.listdir('/proc/self/task'):
                try:
                    os.sched_setaffinity(int(thread), range(os.cpu_count()))
                except OSError:  # a thread that ended meanwhile
                    pass
        set_threads(threads)



_ABANDONED = []  # models of failed groups, never freed (see _run_rank)


def _exit_if_abandoned():
    """End a rank that keeps a model of a failed group without running destructors."""
    if _ABANDONED:  # freeing them can deadlock in ProcessGroupGloo's destructor
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _leave_failed_rank():
    """End a rank whose error is stored without running destructors."""
    sys.stdout.flush()  # tearing down a failed Gloo group can deadlock
    sys.stderr.flush()  # (MXNet: a worker's store would wait for the others)
    os._exit(1)


def _run_rank(rank, worker, world_size, args, out_dir, parent_pid, env):
    """Body of a process of spawn_ranks: run the worker, store its outcome."""
    # PyTorch and MXNet; PaddlePaddle's side has its own
    _start_rank(rank, out_dir, parent_pid, env)
    try:
        result = worker(rank, world_size, *args)
    except BaseException:
        _record_rank_failure(rank)  # unless process_group already did
        _leave_failed_rank()
    _finish_rank(rank, out_dir, result)
    _exit_if_abandoned()


def _cost_model_lenet(nn, conv, pool):
    """The cost model's LeNet, from a framework's `nn` package and its 2-D
    convolution and max-pooling layers (Conv2d in PyTorch, Conv2D in Paddle)."""
    return nn.Sequential(
        conv(1, 6, 5, padding=2), nn.ReLU(), pool(2),
        conv(6, 16, 5), nn.ReLU(), pool(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


# The helpers below are the same in every framework side but for the
# framework they reach. Each side makes its own copies at its end, passing
# its generated module (d2l.torch, d2l.mxnet or d2l.paddle) as `d2l`, and
# `_adopt` makes them the side's functions, as if written there.

def _shared_helpers(d2l):
    """The helpers every framework side shares, made for the side of `d2l`."""
    import numpy

    def _device_names(devices, num_asked):
        """(name, is_gpu) for each of `devices`, or an error saying what fails."""
        if isinstance(devices, (str, bytes)) or not hasattr(devices, '__len__') \
                or len(devices) == 0:
            raise ValueError('devices must be a non-empty list of devices, such '
                             f'as d2l.try_gpus(2), got {devices!r}')
        if num_asked is not None:
            check_num_devices(num_asked, 'num_asked')
        named = []
        for i, device in enumerate(devices):
            try:
                named.append(d2l._device_name(device))
            except (AttributeError, TypeError, ValueError, RuntimeError):
                raise TypeError(f'devices[{i}] is not a device of this framework '
                                f'({device!r}); build the list with '
                                f'd2l.try_gpus(k)') from None
        return named

    def check_lenet_args(X, params):
        """Raise ValueError, saying what to pass, unless `X` and `params` fit LeNet."""
        shape = tuple(X.shape) if hasattr(X, 'shape') else type(X).__name__
        check(shape[1:] == (1, 28, 28), lambda: 'X must be a batch of 28 x 28 grayscale '
                 f'images, shape (examples, 1, 28, 28); got {shape}')
        n = len(params) if isinstance(params, (list, tuple)) else None
        check(n == len(d2l.LENET_SHAPES), lambda: f"params must be a list of LeNet's {len(d2l.LENET_SHAPES)}"
                 f' tensors, as lenet_params() returns; got {n or params!r:.60}')
        for i, (p, shape) in enumerate(zip(params, d2l.LENET_SHAPES)):
            check(tuple(p.shape) == shape, lambda: f'params[{i}] has shape '
                     f'{tuple(p.shape)} but LeNet needs {shape}; use lenet_params()')

    def check_zero_init(params, devices, stage):
        """Reject a ZeRO stage, or an empty parameter or device list."""
        d2l.check_stage(stage)
        d2l._check_zero_args(params, devices)

    def check_zero_step(states, devices, stage, lr, momentum):
        """Reject a rate or momentum, a ZeRO stage, or states that do not fit
        the stage and the devices."""
        check_number(lr, 'lr')
        check_number(momentum, 'momentum', below=1)
        d2l.check_stage(stage)
        _check_zero_states(states, devices, stage, sum(
            math.prod(shape) for shape in d2l.LENET_SHAPES))

    def check_pipeline_runs(runs, num_devices, X, y, depth, width):
        """Refuse bad runs or sizes for time_pipeline before anything starts."""
        check_count(num_devices, 'num_devices', 1)
        check_count(depth, 'depth', 1)
        check_count(width, 'width', 1)
        check_runs(runs)
        for schedule, m in runs:  # a schedule may have more stages than devices
            d2l.check_steps(schedule, num_devices, m)
            stages = max([num_devices] + [t[0] + 1 for t in schedule
                                          if isinstance(t[0], int)])
            d2l.split_stages(range(depth), stages)  # enough blocks for them
            d2l.check_schedule(schedule, stages, m)
            d2l.split_microbatches(X, y, m)  # enough examples

    def _stage_shapes(stages, x):
        """The shape of each stage's output for the input x."""
        shapes = []
        with d2l._no_grad():
            for layers in stages:
                for layer in layers:
                    x = layer(x)
                shapes.append(tuple(x.shape))
        return shapes

    def _tp_slice(n, allreduce):
        """The slice of `n` features that this rank keeps."""
        sizes = d2l.shard_sizes(n, allreduce.size)
        lo = sum(sizes[:allreduce.rank])
        return slice(lo, lo + sizes[allreduce.rank])

    def _check_arrangement(allreduce, kind, shape, checksum):
        """Raise on every rank unless all build one layer from one model."""
        table = numpy.zeros((allreduce.size, 4), 'float32')
        table[allreduce.rank] = [kind, *shape, checksum]
        mine = d2l._from_numpy(table)
        found = d2l._to_numpy(allreduce(mine, 'check'))
        names = {1: 'ColumnParallelLinear', 2: 'RowParallelLinear'}
        def describe(row):
            return f'{names[int(row[0])]}({int(row[1])}, {int(row[2])})'

        for rank, row in enumerate(found):
            if not numpy.array_equal(row[:3], found[0][:3]):
                raise ValueError(
                    f'rank {rank} builds {describe(row)} where rank 0 builds '
                    f'{describe(found[0])}: every rank must build the same '
                    f'layers in the same order')
            if not numpy.isclose(row[3], found[0][3], rtol=1e-5):
                raise ValueError(
                    f'rank {rank} builds {describe(row)} from other weights than '
                    f'rank 0 (weight sums {row[3]:.4f} and {found[0][3]:.4f}): '
                    f'build every rank\'s layers from the same model')

    def _tp_wrong_worker(rank, world_size, init_method, d, hidden):
        """Worker: three wrong arrangements of the MLP block; the errors raised."""
        with d2l._group(rank, world_size, init_method):
            allreduce, mlp, errors = d2l.CountingAllreduce(), d2l.block_mlp(d, hidden), []
            X, _ = d2l.mlp_data(4, d)
            mistakes = [
                lambda: d2l.ColumnParallelLinear(mlp[0], allreduce) if rank == 0
                else d2l.RowParallelLinear(mlp[2], allreduce),
                lambda: d2l.RowParallelLinear(mlp[2], allreduce)(mlp[1](mlp[0](X))),
                lambda: d2l.tp_mlp(d2l.block_mlp(d, hidden, seed=rank), allreduce)]
            for mistake in mistakes:
                try:
                    mistake()
                except ValueError as error:
                    errors.append(str(error))
            return errors

    def _tp_timing_worker(rank, world_size, init_method, d, hidden, batch_size,
                          num_steps, reps, num_heads=0, seq_len=1):
        """Worker: seconds per pass of the whole block and of its parts: the
        MLP block's, or a TransformerBlock's tensor- and sequence-parallel."""
        with d2l._group(rank, world_size, init_method):
            X, Y = d2l.mlp_data(batch_size * seq_len, d)
            if num_heads:  # batch_size sequences of seq_len tokens
                X, Y = [x.reshape((batch_size, seq_len, d)) for x in (X, Y)]
                mine = slice(rank * seq_len // world_size,
                             (rank + 1) * seq_len // world_size)
                comm = d2l.TokenExchange()  # MXNet: one store key per name
                runs = [(d2l.seeded_block(d, num_heads), X, Y)] + [
                    (d2l.tp_block(d2l.seeded_block(d, num_heads), comm, sequence),
                     X[:, mine] if sequence else X, Y[:, mine] if sequence else Y)
                    for sequence in (False, True)]
            else:
                runs = [(net, X, Y) for net in (d2l.block_mlp(d, hidden), d2l.tp_mlp(
                    d2l.block_mlp(d, hidden), d2l.CountingAllreduce()))]
            jobs = [lambda run=run: [d2l.mlp_pass(*run) for _ in range(num_steps)]
                    for run in runs]
            for job in jobs:  # untimed: the first pass sets up buffers
                job()
            seconds = _alternating_rounds(jobs, reps, d2l._tp_barrier)
            return [[s / num_steps for s in row] for row in seconds]

    def time_all_reduce(world_size, sizes, reps=3, calls=5):
        """Median seconds per all_reduce (in MXNet, per push and pull) of each
        byte size in `sizes`."""
        # each over `world_size` processes, timed over `calls` calls in a row
        sizes = _check_sizes(sizes, reps)
        check_count(calls, 'calls', 1)
        _check_world_of_two(world_size)
        return _slowest_medians(d2l.spawn_ranks(
            d2l._all_reduce_worker, world_size, d2l._timing_rendezvous(), sizes,
            reps, calls))

    def cost_model_net(model):
        """LeNet ('lenet') or the book's ResNet-18 ('resnet18') as a module
        (in MXNet, uninitialised)."""
        if model == 'lenet':
            return d2l._lenet_net()
        if model == 'resnet18':
            return d2l.resnet18(10)
        raise ValueError(f"model must be 'lenet' or 'resnet18', got {model!r}")

    return [_device_names, check_lenet_args, check_zero_init, check_zero_step,
            check_pipeline_runs, _stage_shapes, _tp_slice, _check_arrangement,
            _tp_wrong_worker, _tp_timing_worker, time_all_reduce,
            cost_model_net]


def _group_helpers(d2l, dist):
    """The helpers that the sides with process groups (PyTorch, PaddlePaddle)
    share, made for the side of `d2l`, whose distributed package is `dist`."""
    import numpy

    def _stand_down(watchdog, done, world_size):
        """Tell `watchdog` to stand down once a process group has formed or `done` is set."""
        while world_size > 1 and not dist.is_initialized() and not done.wait(0.2):
            pass
        watchdog.stdin.close()  # end of its input: the watchdog exits quietly

    def _live_grads(stages):
        """The gradients of the stages' parameters, left in place (None: none)."""
        return [p.grad for layers in stages for layer in layers
                for p in layer.parameters()]

    def _pump(box, peer, group, sending, messages, device, errors):
        """Carry `messages` ((stage, op, micro-batch), shape) to or from
        `peer` in order: from `box` when sending, into box[message] when not."""
        try:
            for key, shape in messages:
                if sending:
                    dist.send(box.get(), peer, group)
                    continue
                x = d2l.tensor(numpy.zeros(shape, numpy.float32), device)
                dist.recv(x, peer, group)
                box[key].put(x)
        except BaseException as error:
            errors.append(error)

    def _direction_groups(world_size, _made={}):
        """A group for each ordered pair of ranks (sender, receiver), made once."""
        if world_size not in _made:  # every rank makes them in the same order
            _made[world_size] = {(a, b): dist.new_group(sorted([a, b]))
                                 for a in range(world_size)
                                 for b in range(world_size) if a != b}
        return _made[world_size]

    def _p2p_link(schedule, shapes, timeout_s, device):
        """send and recv between the ranks that run `schedule`, stage s on rank
        s % world size; shapes[i][s]: stage s's output for micro-batch i.
        A thread per peer and direction carries the messages in the order the
        sender makes them; finish waits for the sends."""
        rank, p = dist.get_rank(), dist.get_world_size()
        num_stages, routes = len(shapes[0]), {}
        for s, op, i in schedule:  # the messages each step sends, in order
            to = s + 1 if op == 'F' else s - 1
            if op != 'W' and 0 <= to < num_stages:
                routes.setdefault((s % p, to % p), []).append(
                    ((to, op, i), shapes[i][min(s, to)]))
        inbox = {key: queue.Queue() for (a, b), route in routes.items()
                 for key, _ in route if b == rank}
        outbox, threads, errors = {}, [], []
        for (a, b), route in routes.items():
            if rank in (a, b) and a != b:  # one thread per peer and direction
                box = inbox
                if a == rank:
                    outbox[b] = box = queue.Queue()
                threads.append(threading.Thread(target=_pump, daemon=True, args=(
                    box, b if a == rank else a, _direction_groups(p)[a, b],
                    a == rank, route, device, errors)))
                threads[-1].start()
        def send(stage, op, i, x):
            if stage % p == rank:  # a stage of this rank: no message
                inbox[stage, op, i].put(x.detach())
            else:
                outbox[stage % p].put(x.detach())
        def recv(source, op, i):
            key = (source + 1 if op == 'F' else source - 1, op, i)
            return _next_message(inbox[key], lambda: bool(errors), timeout_s, lambda: (
                errors[0] if errors else TimeoutError(
                    f'rank {rank} waited {timeout_s:g} s for {op} of micro-batch '
                    f'{i} from stage {source}')))
        def finish():
            for thread in threads:
                thread.join(timeout_s)
            if errors or any(thread.is_alive() for thread in threads):
                raise errors[0] if errors else TimeoutError(
                    f'rank {rank}: messages unfinished after {timeout_s:g} s')
        return send, recv, finish

    def _group(rank, world_size, init_method):
        """The process group of a tensor-parallel worker (as process_group)."""
        return d2l.process_group(rank, world_size, init_method)

    def _tp_barrier():
        """Wait for every rank: all ranks start a timing together."""
        dist.barrier()

    def _all_reduce_rounds(bufs, reps, calls, sync):
        """Seconds per all_reduce of each buffer in `reps` rounds of `calls`."""
        for x in bufs:
            dist.all_reduce(x)  # untimed: the first call sets up buffers
        seconds = _alternating_rounds(
            [lambda x=x: [dist.all_reduce(x) for _ in range(calls)]
             for x in bufs], reps, dist.barrier, sync)
        return [[s / calls for s in row] for row in seconds]

    def _sgd_steps(net, optimizer, X, y, num_steps, accumulate=1, bf16=False,
                   step_end=lambda: None):
        """Take `num_steps` SGD steps of `accumulate` micro-batches (X, y) each."""
        # step_end is called after each step
        for _ in range(num_steps):
            d2l._clear_grads(optimizer)
            for i in range(accumulate):
                # DDP's no_sync skips the allreduce of all but the last one.
                skip = net.no_sync() if i < accumulate - 1 and hasattr(
                    net, 'no_sync') else contextlib.nullcontext()
                with skip:
                    d2l._step_loss(net, X, y, bf16).backward()
            optimizer.step()
            step_end()
        d2l._synchronize(X)

    def _time_runs(runs, X, y, num_steps, warmup, reps, wait=lambda: None):
        """This process's seconds per micro-batch of each run in `runs`."""
        # runs: (net, optimizer, config) triples, timed in alternating rounds
        for net, optimizer, c in runs:  # untimed: DDP also settles its buckets
            _sgd_steps(net, optimizer, X, y, warmup, c['accumulate'], c['bf16'])
        # Plain copies wait for one another after each step, as DDP's processes
        # do at its allreduce: a step lasts as long as the slowest process's.
        jobs = [lambda r=r: _sgd_steps(
                    r[0], r[1], X, y, num_steps, r[2]['accumulate'], r[2]['bf16'],
                    wait if r[2].get('ddp') is False else lambda: None)
                for r in runs]
        seconds = _alternating_rounds(jobs, reps, wait)
        return [[s / (num_steps * c['accumulate'])
                 for s, (_, _, c) in zip(row, runs)] for row in seconds]

    def _check_configs(configs):
        """Each DDP configuration with its defaults; unknown keys rejected."""
        defaults = dict(model='resnet18', accumulate=1, bucket_cap_mb=25,
                        bf16=False, compress=False, ddp=True)
        out = []
        for c in configs:
            if not isinstance(c, dict) or set(c) - set(defaults):
                raise ValueError(f'each config must be a dict with keys among '
                                 f'{sorted(defaults)}, got {c!r}')
            out.append(dict(defaults, **c))
            d2l.cost_model_net(out[-1]['model'])  # rejects an unknown model
            check_count(out[-1]['accumulate'], 'accumulate', 1)
            d2l.ddp_buckets(1, out[-1]['bucket_cap_mb'])  # rejects a size <= 0
            if not isinstance(out[-1]['ddp'], bool):
                raise ValueError(f"ddp must be True or False, got "
                                 f"{out[-1]['ddp']!r}")
            if out[-1]['compress'] and not out[-1]['ddp']:
                raise ValueError('compress=True needs ddp=True: a plain copy '
                                 'of the network sends no gradients')
        if not out:
            raise ValueError("configs is empty; give dicts such as "
                             "{'model': 'lenet'}")
        return out

    def _ddp_configs_worker(rank, world_size, init_method, configs,
                            global_batch, num_steps, warmup, reps):
        """One process of time_ddp_configs: join the group, time the configs."""
        with d2l.process_group(rank, world_size, init_method):
            return _time_configs(configs, global_batch, num_steps, warmup,
                                 reps, rank, world_size)

    def _time_configs(configs, global_batch, num_steps, warmup, reps, rank,
                      world_size):
        """This process's seconds per micro-batch of each config, alternating."""
        device = d2l.ddp_device(rank, world_size)
        share = d2l.local_batch_size(global_batch, world_size)
        X, y = (t[rank * share:(rank + 1) * share].to(device)
                for t in d2l.timing_batch(global_batch))
        runs = [(*d2l._ddp_model(c, device), c) for c in configs]
        # A single process has no group to wait for.
        wait = dist.barrier if world_size > 1 else lambda: None
        return _time_runs(runs, X, y, num_steps, warmup, reps, wait)

    return [_stand_down, _live_grads, _pump, _direction_groups, _p2p_link,
            _group, _tp_barrier, _all_reduce_rounds, _sgd_steps, _time_runs,
            _check_configs, _ddp_configs_worker, _time_configs]


def _adopt(namespace, helpers, generated):
    """Make `helpers` functions of the module whose globals are `namespace`,
    and give the `generated` module every name of it that it lacks."""
    for f in helpers:  # __module__ names the side, and pickle finds them there
        f.__module__, f.__qualname__ = namespace['__name__'], f.__name__
        namespace[f.__name__] = f
    for name in _exports(namespace):
        vars(generated).setdefault(name, namespace[name])


def _exports(namespace):
    """Every name that the module whose globals are `namespace` defines, for
    its __all__: neither the modules it imports nor the names of this one."""
    ours = globals()
    return [name for name, value in namespace.items()
            if not name.startswith('__') and not isinstance(value, types.ModuleType)
            and (namespace is ours or name not in ours or ours[name] is not value)]


__all__ = _exports(globals())
