"""Shared fixtures: every test that takes `d2l` runs once per framework."""
import importlib
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


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """The name of the framework (tab) under test."""
    return request.param


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
