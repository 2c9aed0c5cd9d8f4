"""The claims of chapter_multi_gpu/memory.md, checked in every framework.

The page's demonstrations (the saved-tensor counter and the recomputing
forward and backward passes) are plain cells, not d2l helpers; the tests
run those cells of the framework's tab, after its imports cell, in a
namespace of their own.
"""
import numpy as np
import pytest

from conftest import ROOT, page_definitions

PAGE = ROOT / 'chapter_multi_gpu' / 'memory.md'
DEFINITIONS = ('def saved_tensors(', 'def forward_keeping(')


pytestmark = pytest.mark.usefixtures('paddle_default_device_is_the_cpu')



@pytest.fixture
def page(framework):
    """The tab's imports cell and its cells that define the demonstrations."""
    return page_definitions(PAGE, framework, DEFINITIONS)


def blocks_and_input(framework, d2l, page, num_blocks, b=2, s=8, h=16, a=2):
    blocks = [d2l.TransformerBlock(h, a) for _ in range(num_blocks)]
    if framework == 'mxnet':
        for blk in blocks:
            blk.initialize()
    X = page['tensor'](np.random.default_rng(0).standard_normal((b, s, h)))
    return blocks, X


def parameters(framework, blocks):
    if framework == 'mxnet':
        return [p.data() for blk in blocks
                for p in blk.collect_params().values()]
    return [p for blk in blocks for p in blk.parameters()]


@pytest.mark.parametrize('recompute', [(0, 1, 2), (1,), (0, 2)])
def test_recomputed_gradients_equal_the_stored_activation_gradients(
        framework, d2l, page, recompute):
    blocks, X = blocks_and_input(framework, d2l, page, 3)
    params = parameters(framework, blocks)
    runs = []
    for plan in [(), recompute]:
        page['zero_grads'](params)
        inputs, outputs = page['forward_keeping'](blocks, X, plan)
        dX = page['backward_recomputing'](blocks, inputs, outputs, plan)
        runs.append([page['to_numpy'](g).copy()
                     for g in [dX] + [p.grad for p in params]])
    assert len(runs[0]) == len(params) + 1
    for stored, recomputed in zip(*runs):
        assert np.abs(stored).max() > 0
        np.testing.assert_array_equal(recomputed, stored)


@pytest.mark.parametrize('b, s, h, a', [(2, 8, 16, 2), (3, 5, 12, 4),
                                        (1, 16, 8, 1)])
def test_measured_activation_bytes_equal_the_formula(framework, d2l, page,
                                                     b, s, h, a):
    if framework == 'mxnet':
        pytest.skip('MXNet has no hook on what its autograd keeps')
    (blk,), X = blocks_and_input(framework, d2l, page, 1, b, s, h, a)
    with d2l.saved_tensors(blk) as found:
        Y = blk(X)
    assert tuple(Y.shape) == (b, s, h)
    assert sum(found.values()) == d2l.block_activation_bytes(s, b, h, a)


def test_recomputing_every_other_block_keeps_what_the_formula_says(
        framework, d2l, page):
    if framework == 'mxnet':
        pytest.skip('MXNet has no hook on what its autograd keeps')
    b, s, h, a = 2, 8, 16, 2
    blocks, X = blocks_and_input(framework, d2l, page, 4, b, s, h, a)
    net = page['nn'].Sequential(*blocks)
    with d2l.saved_tensors(net) as found:
        inputs, _ = page['forward_keeping'](blocks, X, (1, 3))
    kept = sum(found.values()) + sum(page['nbytes'](inputs[i])
                                     for i in (1, 3))
    assert kept == 2 * d2l.block_activation_bytes(s, b, h, a) \
        + 2 * 4 * s * b * h


def test_the_block_has_12h2_plus_13h_parameters_and_refuses_odd_heads(
        framework, d2l, page):
    (blk,), X = blocks_and_input(framework, d2l, page, 1, h=16, a=4)
    blk(X)
    assert d2l.count_trainable_params(blk) == 12 * 16**2 + 13 * 16
    with pytest.raises(ValueError, match='num_heads=3 must divide h=16'):
        d2l.TransformerBlock(16, 3)
