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

    def __init__(self):
        self.d2l = importlib.import_module(f'd2l.{MODULES[self.name]}')

    def devices(self, k):
        """The devices the book's sections use for k copies of a model
        (`d2l.try_gpus`): GPUs where they exist, else the CPU k times
        (MXNet: cpu(0)..cpu(k-1))."""
        return list(self.d2l.try_gpus(k))

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

    def __init__(self):
        super().__init__()
        import torch
        self.torch = torch

    def sync(self):
        if self.torch.cuda.is_available():
            for i in range(self.torch.cuda.device_count()):
                self.torch.cuda.synchronize(i)

    def filled(self, n, device, value=0.0):
        return self.torch.full((n,), float(value), device=device)

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def from_numpy(self, a):
        return self.torch.from_numpy(a.copy())

    def threads(self):
        return self.torch.get_num_threads()


class MXNetOps(Ops):
    name = 'mxnet'

    def __init__(self):
        super().__init__()
        import mxnet as mx
        self.mx = mx

    def sync(self):
        # MXNet runs asynchronously even on the CPU: without this the clock
        # would stop when work is queued, not when it is done.
        self.mx.npx.waitall()

    def filled(self, n, device, value=0.0):
        return self.mx.np.full((n,), float(value), ctx=device)

    def to_numpy(self, x):
        return x.asnumpy()

    def from_numpy(self, a):
        # As the loader gives them: mx.np arrays, labels as int32.
        if a.dtype.kind == 'i':
            a = a.astype('int32')
        return self.mx.np.array(a, dtype=a.dtype)

    def threads(self):
        import os
        return os.environ.get('OMP_NUM_THREADS', 'default')


class PaddleOps(Ops):
    name = 'paddle'

    def __init__(self):
        super().__init__()
        import paddle
        self.paddle = paddle

    def sync(self):
        if self.paddle.device.cuda.device_count() > 0:
            self.paddle.device.cuda.synchronize()

    def filled(self, n, device, value=0.0):
        x = self.paddle.full([n], float(value), dtype='float32')
        return x.to(device) if device is not None else x

    def to_numpy(self, x):
        return x.numpy()

    def from_numpy(self, a):
        return self.paddle.to_tensor(a, place=self.paddle.CPUPlace())

    def threads(self):
        import os
        return os.environ.get('OMP_NUM_THREADS', 'default')


OPS = {'pytorch': TorchOps, 'mxnet': MXNetOps, 'paddle': PaddleOps}
