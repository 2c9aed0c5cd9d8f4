"""The claims of chapter_multi_gpu/planner.md, checked in every framework.

The planner is plain cells of the page, shared by every tab; the tests run
its definitions in each tab's namespace (its imports give the collective's
cost) and check it against the book's memory count, against arithmetic
done by hand, and on the published runs the page describes.
"""
import math

import pytest

from conftest import ROOT, page_definitions

PAGE = ROOT / 'chapter_multi_gpu' / 'planner.md'
DEFINITIONS = ('Model = collections', 'def state_bytes',
               'def activation_bytes', 'def link', 'def slot_seconds',
               'def step_seconds', 'def candidates', 'def predict(',
               'def plan', 'def gpus')


@pytest.fixture
def page(framework):
    """The planner, its models and its published runs."""
    return page_definitions(PAGE, framework, DEFINITIONS)


def one_device(page, memory=math.inf):
    """A cluster of one device computing 1e12 operations per second."""
    return page['Cluster'](1, 1, memory, 1e12, 2e12, (1e-6, 1e-9),
                           (1e-5, 1e-8))


def test_parameters_add_up_to_the_published_model_sizes(page):
    for model, size in ((page['llama'], 405e9), (page['gpt'], 1008e9)):
        attention, mlp = page['layer_params'](model)
        total = model.L * (attention + mlp) + 2 * model.V * model.h
        assert abs(total / size - 1) < 0.005


@pytest.mark.parametrize('k', [1, 2, 4])
def test_one_layer_s_activations_are_the_book_s_count_split_k_ways(page, k):
    d2l = page['d2l']
    s, b, h, a = 64, 8, 64, 4
    block = page['Model'](1, h, 4 * h, a, a, 0, s, flash=False, e=4)
    held = page['device_bytes'](block, page['Config'](1, k, 1, 1, 1, b,
                                                      False), b)
    assert held['activations'] == d2l.block_activation_bytes(s, b, h, a) / k
    assert held['state'] == 16 * 12 * h * h / k  # 4 + 4 + 8 bytes each


def test_recomputation_keeps_each_layer_s_input_and_one_layer(page):
    model = page['Model'](8, 64, 256, 4, 4, 0, 32, flash=False, e=4)
    Config = page['Config']
    full = page['device_bytes'](model, Config(1, 1, 1, 1, 1, 2, False), 2)
    kept = page['device_bytes'](model, Config(1, 1, 1, 1, 1, 2, True), 2)
    one = full['activations'] / 8
    assert kept['activations'] == 8 * 2 * 32 * 64 * 4 + one


@pytest.mark.parametrize('p, m', [(4, 2), (4, 8), (2, 16)])
def test_the_first_stage_holds_min_p_m_micro_batches(page, p, m):
    model = page['Model'](8, 64, 256, 4, 4, 0, 32)
    Config, bytes_of = page['Config'], page['device_bytes']
    one = bytes_of(model, Config(1, 1, 8, 1, 1, 1, False), 1)  # one layer
    staged = bytes_of(model, Config(1, 1, p, 1, 1, 1, False), m)
    assert staged['activations'] == min(p, m) * (8 // p) * one['activations']


def test_experts_and_their_optimizer_state_divide_by_the_expert_degree(page):
    moe = page['Model'](4, 64, 256, 4, 4, 0, 32, E=8, k=2)
    Config, bytes_of = page['Config'], page['device_bytes']
    held = {ep: bytes_of(moe, Config(8, 1, 1, 1, ep, 1, False), 8)
            for ep in (1, 2, 8)}
    for ep in (2, 8):
        assert held[ep]['experts'] * ep == held[1]['experts']
        assert held[ep]['dense'] == held[1]['dense']
    # every expert parameter's optimizer bytes are split over all 8 ranks
    expert_state = lambda ep: held[ep]['state'] - 4 * held[ep]['dense'] - (
        12 * held[ep]['dense'] / 8)
    assert expert_state(8) == pytest.approx(
        4 * held[8]['experts'] + 12 * held[1]['experts'] / 8)


def test_one_device_s_step_is_its_arithmetic_and_its_mfu_the_rate_over_peak(
        page):
    model = page['Model'](2, 64, 256, 4, 4, 100, 32)
    cluster, Config = one_device(page), page['Config']
    secs = page['step_seconds'](model, cluster, Config(1, 1, 1, 1, 1, 4,
                                                       False), 4)
    work = page['flops_per_token'](model) * 4 * 32
    assert secs['total'] == pytest.approx(work / 1e12)
    assert secs['bubble'] == secs['exchanges'] == secs['data'] == 0
    assert page['mfu'](model, cluster, 4, secs['total']) == pytest.approx(0.5)


def test_a_tensor_group_beyond_one_machine_pays_the_across_constants(page):
    model, Config = page['llama'], page['Config']
    cluster = page['gpus'](1024, 989e12, 450e9, 50e9)
    inside = page['step_seconds'](model, cluster, Config(64, 8, 16, 1, 1, 1,
                                                         False), 2048)
    across = page['step_seconds'](model, cluster, Config(32, 16, 16, 1, 1, 1,
                                                         False), 2048)
    assert across['exchanges'] > 10 * inside['exchanges']


def test_every_candidate_divides_the_devices_heads_sequence_and_batch(page):
    model = page['Model'](16, 256, 1024, 8, 4, 1000, 512, E=4, k=2)
    cluster = page['Cluster'](4, 8, math.inf, 1e14, 2e14, (1e-6, 1e-11),
                              (1e-5, 1e-10))
    found = list(page['candidates'](model, cluster, 64))
    assert len(found) == len(set(found)) > 100
    for c in found:
        assert c.dp * c.tp * c.pp * c.cp == 32
        assert c.tp <= 8 and model.g % c.tp == 0 and model.s % c.cp == 0
        assert 64 % (c.dp * c.micro) == 0 and c.dp % c.ep == 0
        assert model.E % c.ep == 0 and c.pp <= model.L
        if c.virtual > 1:  # interleaving needs stages, and groups of pp
            assert c.pp > 1 and math.ceil(model.L / c.pp) % c.virtual == 0
            assert 64 // (c.dp * c.micro) % c.pp == 0
    assert {c.ep for c in found} == {1, 2, 4}
    assert {c.virtual for c in found} == {1, 2, 4}


def test_interleaving_v_stages_divides_the_bubble_by_v(page):
    model = page['Model'](16, 64, 256, 4, 4, 0, 32)
    cluster = page['Cluster'](1, 4, math.inf, 1e12, 2e12, (0.0, 0.0),
                              (0.0, 0.0))  # free exchanges: the bubble alone
    secs = {v: page['step_seconds'](model, cluster, page['Config'](
        1, 1, 4, 1, 1, 1, False, v), 8) for v in (1, 2, 4)}
    for v in (2, 4):
        assert secs[v]['bubble'] == pytest.approx(secs[1]['bubble'] / v)
        assert secs[v]['compute'] == secs[1]['compute']
    # 8 micro-batches over 4 stages: (m + p - 1) / m of the arithmetic
    assert secs[1]['total'] == pytest.approx(secs[1]['compute'] * 11 / 8)


@pytest.mark.parametrize('v, m, ahead', [(2, 8, 11), (2, 4, 8), (4, 8, 19)])
def test_an_interleaved_first_device_holds_its_warm_up_and_one_more(
        page, v, m, ahead):
    model = page['Model'](16, 64, 256, 4, 4, 0, 32)
    Config, bytes_of = page['Config'], page['device_bytes']
    layer = bytes_of(model, Config(1, 1, 16, 1, 1, 1, False), 1)
    held = bytes_of(model, Config(1, 1, 4, 1, 1, 1, False, v), m)
    # 2(p-1) + (v-1)p forward steps of 4/v layers, and one more, at most mv
    assert held['activations'] == pytest.approx(
        min(ahead, m * v) * 4 / v * layer['activations'])


def test_the_plan_is_fastest_first_and_every_row_fits(page):
    model, cluster, batch = page['runs']['Llama 8K'][:3]
    rows = page['plan'](model, cluster, batch)
    seconds = [r[2]['total'] for r in rows]
    assert seconds == sorted(seconds)
    assert all(r[1]['total'] <= cluster.memory for r in rows)


@pytest.mark.parametrize('run', ['GPT 1T', 'Llama 8K', 'Llama 16K',
                                 'Llama 128K'])
def test_each_published_configuration_is_among_the_ones_that_fit(page, run):
    model, cluster, batch, degrees, _ = page['runs'][run]
    rows = page['plan'](model, cluster, batch)
    assert any((r[0].tp, r[0].cp, r[0].pp) == degrees for r in rows)


def test_degrees_that_do_not_multiply_to_the_devices_are_refused(page):
    model, cluster, batch = page['runs']['Llama 8K'][:3]
    with pytest.raises(ValueError, match=r'cfg: dp\*tp\*pp\*cp = 7680 must '
                       'equal the 8192 devices'):
        page['predict'](model, cluster, page['Config'](60, 8, 16, 1, 1, 1,
                                                       False), batch)
    with pytest.raises(ValueError, match='dp\\*micro must divide the batch'):
        page['predict'](model, cluster, page['Config'](64, 8, 16, 1, 1, 3,
                                                       False), batch)


def test_a_model_that_fits_nowhere_names_the_closest_and_the_shortfall(page):
    model = page['llama']
    with pytest.raises(ValueError) as error:
        page['plan'](model, page['gpus'](2, 989e12, 450e9, 50e9), 2048)
    message = str(error.value)
    assert 'fits no configuration on 80 GiB devices' in message
    assert 'the closest, dp 1 tp 8 pp 2' in message
    assert 'GiB too many' in message
    # the same model on more machines fits, so the message was about memory
    assert page['plan'](model, page['gpus'](64, 989e12, 450e9, 50e9), 2048)
