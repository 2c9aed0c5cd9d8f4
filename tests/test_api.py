"""The three flavours of `d2l` are one API: shared names have the same parameters."""
import importlib
import inspect
import types

import pytest

FLAVOURS = ('torch', 'mxnet', 'paddle')
# Names that readers know from d2l; each flavour offers every one of them.
D2L_NAMES = ('Accumulator', 'Animator', 'Residual', 'Timer', 'accuracy',
             'evaluate_accuracy_gpu', 'evaluate_accuracy_gpus',
             'load_data_fashion_mnist', 'resnet18', 'sgd', 'split_batch',
             'try_all_gpus', 'try_gpu', 'allreduce')
# Where one framework needs one more parameter, and why.
EXTRA_PARAMETERS = {
    # PaddlePaddle's spawn starts its process group itself, so the parent
    # chooses the backend; in PyTorch each worker's process_group does.
    ('spawn_ranks', 'paddle'): ('backend',),
    # PyTorch's rank 0 outlives the failure it demonstrates and returns its
    # timings, under a group timeout; PaddlePaddle's and MXNet's ranks are
    # ended by it, so they write their timings into a folder first.
    ('skew_demo', 'torch'): ('timeout_s',),
    ('skew_demo', 'mxnet'): ('report_dir',),
    ('skew_demo', 'paddle'): ('report_dir',),
}
# The tests' small models stay out of the public namespace. A demonstration that new processes run is public: they import
# it from d2l, and its page shows and explains it.
NOT_PUBLIC = ('small_mlp', 'TwoDeviceMLP', 'allreduce_rebinding',
              'max_difference', 'random_arrays')


def _module(name):
    return importlib.import_module(f'd2l.{name}')


def _public_callables(module):
    """The functions and classes a flavour defines itself, by public name."""
    found = {}
    for name, obj in vars(module).items():
        if name.startswith('_') or not callable(obj):
            continue
        if getattr(obj, '__module__', None) != module.__name__:
            continue  # imported from a framework or the standard library
        found[name] = obj
    return found


def _parameters(obj):
    """(name, kind, default) per parameter; callable defaults compare by name."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = []
    for p in inspect.signature(target).parameters.values():
        # Gluon blocks pass **kwargs (prefix, params) on to nn.Block.
        if p.name == 'self' or p.kind is p.VAR_KEYWORD:
            continue
        default = p.default
        if callable(default) and not isinstance(default, type):
            default = getattr(default, '__name__', repr(default))
        params.append((p.name, p.kind, default))
    return params


@pytest.fixture(scope='module')
def flavours():
    return {name: _public_callables(_module(name)) for name in FLAVOURS}


def test_shared_names_have_the_same_parameters_in_every_flavour(flavours):
    mismatches = []
    names = set().union(*(set(f) for f in flavours.values()))
    for name in sorted(names):
        having = {f: flavours[f][name] for f in FLAVOURS if name in flavours[f]}
        if len(having) < 2:
            continue
        signatures = {f: [p for p in _parameters(obj)
                          if p[0] not in EXTRA_PARAMETERS.get((name, f), ())]
                      for f, obj in having.items()}
        if len({repr(s) for s in signatures.values()}) > 1:
            mismatches.append(f'{name}: ' + '; '.join(
                f'{f}({", ".join(p[0] for p in s)})' for f, s in signatures.items()))
    assert not mismatches, 'shared names differ:\n' + '\n'.join(mismatches)


def test_every_flavour_offers_the_names_readers_know_from_d2l(flavours):
    # its own, or the machinery's (Animator), as d2l.name
    missing = {f: [n for n in D2L_NAMES if n not in flavours[f] and not
                   callable(getattr(_module(f), n, None))] for f in FLAVOURS}
    assert not any(missing.values()), missing


def test_validators_and_test_models_are_not_public(flavours):
    leaked = {f: sorted(set(NOT_PUBLIC) & set(flavours[f])) for f in FLAVOURS}
    assert not any(leaked.values()), leaked


def test_every_public_helper_says_in_one_line_what_it_does(flavours):
    bare = []
    for f, objs in flavours.items():
        for name, obj in objs.items():
            doc = inspect.getdoc(obj) or ''
            if not doc.strip():
                bare.append(f'{f}.{name}')
    assert not bare, f'no docstring: {bare}'
