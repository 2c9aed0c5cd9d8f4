"""The few framework-specific operations the benchmarks need.

Each class wraps one framework: how to wait for the devices, how to name the
k devices the book's sections would use, and how to make a buffer. All
training code comes from the book's `d2l` package, never from here.
"""
import importlib

from bench.harness import MODULES


class Ops:
    """Operations shared by all frameworks; subclasses fill in the rest."""
    name = None
    package = None  # the framework's package, imported as self.fw

    def __init__(self):
        self.d2l = importlib.import_module(f'd2l.{MODULES[self.name]}')
        self.fw = importlib.import_module(self.package)

    def devices(self, k):
        """The devices the book's sections use for k copies of a model
        (`d2l.try_gpus`): GPUs where they exist, else the CPU k times
        (MXNet: cpu(0)..cpu(k-1))."""
        return list(self.d2l.try_gpus(k))

    def threads(self):
        """The framework's CPU thread setting, for the report."""
        import os
        return os.environ.get('OMP_NUM_THREADS', 'default')

    def first_batch(self, batch_size):
        """The first `batch_size` images and labels of Fashion-MNIST's real
        training set, as framework arrays left on the host.

        Read from the whole training file, not from the loader: quick mode's
        loader serves only 100 images, and a benchmark's global batch must
        not depend on the mode. The images are the loader's (same scaling,
        same shape); only their order differs (file order, no shuffling)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                or batch_size < 1:
            raise ValueError(f'batch_size must be a positive int, got '
                             f'{batch_size!r}')
        images, labels = self.d2l.fashion_mnist_arrays('train', quick=False)
        if batch_size > len(labels):
            raise ValueError(f'the training set holds {len(labels)} examples; '
                             f'ask for a global batch of at most that')
        return (self.from_numpy(images[:batch_size]),
                self.from_numpy(labels[:batch_size]))


class TorchOps(Ops):
    name = 'pytorch'
    package = 'torch'

    def sync(self):
        if self.fw.cuda.is_available():
            for i in range(self.fw.cuda.device_count()):
                self.fw.cuda.synchronize(i)

    def filled(self, n, device, value=0.0):
        return self.fw.full((n,), float(value), device=device)

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def from_numpy(self, a):
        return self.fw.from_numpy(a.copy())

    def threads(self):
        return self.fw.get_num_threads()


class MXNetOps(Ops):
    name = 'mxnet'
    package = 'mxnet'

    def sync(self):
        # MXNet runs asynchronously even on the CPU: without this the clock
        # would stop when work is queued, not when it is done.
        self.fw.npx.waitall()

    def filled(self, n, device, value=0.0):
        return self.fw.np.full((n,), float(value), ctx=device)

    def to_numpy(self, x):
        return x.asnumpy()

    def from_numpy(self, a):
        # As the loader gives them: mx.np arrays, labels as int32.
        if a.dtype.kind == 'i':
            a = a.astype('int32')
        return self.fw.np.array(a, dtype=a.dtype)


class PaddleOps(Ops):
    name = 'paddle'
    package = 'paddle'

    def sync(self):
        if self.fw.device.cuda.device_count() > 0:
            self.fw.device.cuda.synchronize()

    def filled(self, n, device, value=0.0):
        x = self.fw.full([n], float(value), dtype='float32')
        return x.to(device) if device is not None else x

    def to_numpy(self, x):
        return x.numpy()

    def from_numpy(self, a):
        return self.fw.to_tensor(a, place=self.fw.CPUPlace())


OPS = {'pytorch': TorchOps, 'mxnet': MXNetOps, 'paddle': PaddleOps}
