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
        """The k devices a section asks for: GPUs 0..k-1 where they exist,
        otherwise the sections' CPU fallback (`d2l.try_gpu(i)`)."""
        return [self.d2l.try_gpu(i) for i in range(k)]

    def first_batch(self, batch_size):
        """One real Fashion-MNIST training minibatch, left on the host."""
        train_iter, _ = self.d2l.load_data_fashion_mnist(batch_size)
        X, y = next(iter(train_iter))
        if X.shape[0] < batch_size:
            raise ValueError(f'the training set holds only {X.shape[0]} '
                             f'examples; ask for a global batch of at most that')
        return X, y


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
        self.mx.nd.waitall()

    def filled(self, n, device, value=0.0):
        return self.mx.nd.full((n,), float(value), ctx=device)

    def to_numpy(self, x):
        return x.asnumpy()

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

    def threads(self):
        import os
        return os.environ.get('OMP_NUM_THREADS', 'default')


OPS = {'pytorch': TorchOps, 'mxnet': MXNetOps, 'paddle': PaddleOps}
