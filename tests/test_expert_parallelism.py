"""The claims of chapter_multi_gpu/expert-parallelism.md, checked in every framework.

The page's own code is run: its cells define the routing, the mixture-of-
experts layer, the exchange and the worker, and the ranks start with the
book's spawn_ranks in a child Python under a hard deadline (the harness of
test_process_groups.py).
"""
import numpy as np
import pytest

from conftest import ROOT, numpy, page_definitions
from test_tensor_parallelism import RENDEZVOUS, child_result

PAGE = ROOT / 'chapter_multi_gpu' / 'expert-parallelism.md'
LAYER = ('def expert_capacity', 'def moe(', 'class Experts', 'def per_token',
         'def balance_loss')
DEFINITIONS = LAYER + ('class ExpertExchange', 'def experts_per_rank',
                       'def ep_worker', 'def check_ep_worker')
# (ranks, top-k, capacity factor) of every expert-parallel run the tests check
RUNS = [(2, 1, 1.0), (2, 2, 1.0), (2, 2, 2.0), (4, 2, 1.0)]


@pytest.fixture
def page(framework):
    """The page's layer, its check and its inputs, defined in this process."""
    return page_definitions(PAGE, framework, LAYER)


def test_route_fills_every_first_choice_before_any_second_and_drops_the_rest(
        page):
    probs = np.array([[.7, .2, .1], [.6, .3, .1], [.5, .1, .4],
                      [.2, .7, .1]], 'float32')
    experts, slots = page['route'](probs, 2, 2)
    assert experts.tolist() == [[0, 1], [0, 1], [0, 2], [1, 0]]
    # expert 0: first choices of tokens 0, 1, 2 (the third is dropped), then
    # token 3's second choice (dropped); expert 1: token 3's first choice,
    # then the second choices of tokens 0 and 1 (the latter dropped)
    assert slots.tolist() == [[0, 1], [1, -1], [-1, 0], [0, -1]]


@pytest.mark.parametrize('top_k', [1, 2])
@pytest.mark.parametrize('capacity_factor', [0.5, 1.0, 2.0])
def test_the_layer_gives_each_token_the_gated_outputs_of_its_kept_choices(
        framework, page, top_k, capacity_factor):
    X, probs = page['X'], page['probs']
    Y, _, slots = page['moe'](X, probs, page['experts_net'], top_k,
                              capacity_factor)
    want = page['per_token'](X, probs, page['experts_net'], top_k,
                             capacity_factor)
    np.testing.assert_allclose(numpy(framework, Y), want, atol=1e-5)
    dropped = int((slots < 0).sum())
    assert (dropped > 0) == (capacity_factor < 2)  # 64 tokens, 4 experts
    assert dropped < 64 * top_k


def test_the_balancing_loss_is_1_when_even_and_E_when_one_expert_takes_all(
        framework, d2l, page):
    E = 4
    even = d2l.tensor(np.full((8, E), 1 / E, 'float32'))
    experts = np.arange(8)[:, None] % E
    assert float(page['balance_loss'](even, experts)) == pytest.approx(1)
    one = d2l.tensor(np.eye(E, dtype='float32')[[0] * 8])
    assert float(page['balance_loss'](one, experts * 0)) == pytest.approx(E)


def test_gradients_reach_the_router_and_the_experts(framework, d2l, page):
    """moe moves rows by gathers, so autograd reaches every input."""
    if framework == 'mxnet':
        pytest.skip('MXNet records through autograd.record; the page trains '
                    'with it')
    X, logits = d2l.tensor(page['tokens'][0]), d2l.tensor(page['logits'][0])
    net = page['experts_net']
    if framework == 'pytorch':
        logits.requires_grad_()
    else:
        logits.stop_gradient = False
    Y = page['moe'](X, page['softmax'](logits), net, 1, 1.0)[0]
    (Y * Y).sum().backward()
    grads = [logits.grad, net.W1.grad, net.W2.grad]
    assert all(float(abs(g).sum()) > 0 for g in grads)


def runs(framework, shared_results):
    """Every run the tests check, in one child Python once per test session:
    {name: result}."""
    return shared_results(f'ep-{framework}', lambda: child_result(
        framework, f'''
            tokens, logits = page['tokens'], page['logits']
            out = {{}}
            for k, top_k, c in {RUNS!r}:
                ranks = d2l.spawn_ranks(page['ep_worker'], k,
                                        {RENDEZVOUS[framework]}, tokens[:k],
                                        logits[:k], top_k, c)
                alone = [page['moe'](d2l.tensor(tokens[r]),
                                     page['softmax'](d2l.tensor(logits[r])),
                                     page['experts_net'], top_k, c)
                         for r in range(k)]
                out[repr((k, top_k, c))] = {{
                    'ranks': ranks,
                    'alone': [page['to_numpy'](Y) for Y, _, _ in alone],
                    'dropped': [int((s < 0).sum()) for _, _, s in alone]}}
            import numpy
            wide = [numpy.random.default_rng(1).standard_normal(
                (2, 32, d)).astype('float32') for d in (32, 4)]  # h = 32
            out['wide'] = [d2l.spawn_ranks(
                page['ep_worker'], k, {RENDEZVOUS[framework]}, *data, 2, 4.0)
                for k, data in ((2, wide), (1, [x.reshape(1, 64, -1)
                                                for x in wide]))]
            out['refused'] = []
            for k, top_k, c, n in ((2, 5, 1.0, 2), (2, 2, 0.0, 2),
                                   (3, 2, 1.0, 3), (2, 2, 1.0, 3)):
                try:  # checked before any process starts
                    d2l.spawn_ranks(page['ep_worker'], k,
                                    {RENDEZVOUS[framework]}, tokens[:n],
                                    logits[:n], top_k, c)
                except ValueError as error:
                    out['refused'].append(str(error))
            ''', 300, PAGE, DEFINITIONS))


@pytest.mark.slow
@pytest.mark.parametrize('run', RUNS, ids=str)
def test_experts_spread_over_k_ranks_give_one_device_s_output(
        framework, run, shared_results):
    result = runs(framework, shared_results)[repr(run)]
    for rank, Y, dropped in zip(result['ranks'], result['alone'],
                                result['dropped']):
        np.testing.assert_allclose(np.asarray(rank['Y']), np.asarray(Y),
                                   atol=1e-5)
        assert rank['dropped'] == dropped


@pytest.mark.slow
def test_two_ranks_equal_the_worker_alone_which_sends_nothing(
        framework, shared_results):
    spread, (alone,) = runs(framework, shared_results)['wide']
    assert alone['sent'] == 0 and alone['dropped'] == 0  # room for all
    np.testing.assert_allclose(
        np.concatenate([np.asarray(r['Y']) for r in spread]),
        np.asarray(alone['Y']), atol=1e-5)
    assert all(r['seconds'] > 0 for r in spread + [alone])


@pytest.mark.slow
@pytest.mark.parametrize('run', [RUNS[0], RUNS[2]], ids=str)
def test_the_bytes_sent_are_the_formula_s(framework, run, shared_results):
    k, top_k, c = run
    sent = runs(framework, shared_results)[repr(run)]['ranks'][0]['sent']
    n, h, E = 64, 16, 4
    C = int(np.ceil(c * n * top_k / E))
    formula = 2 * (k - 1) * E * C * h * 4 // k  # two all-to-alls forward
    # PaddlePaddle's all-to-all is an all-gather; MXNet's sums k slots
    factor = {'paddle': k, 'mxnet': k * k // (k - 1)}.get(framework, 1)
    assert sent == factor * formula


@pytest.mark.slow
def test_a_wrong_argument_is_refused_before_any_process(framework,
                                                        shared_results):
    refused = runs(framework, shared_results)['refused']
    assert refused == [
        'top_k=5 is more than the 4 experts; use a top_k from 1 to 4',
        'capacity_factor must be a finite positive number, got 0.0',
        'num_experts=4 experts cannot be spread evenly over k=3 ranks; use '
        'a number of experts that 3 divides',
        "tokens holds 3 ranks' tokens; give one array per rank for "
        'world_size=2']
