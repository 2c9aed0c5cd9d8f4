"""The claims of chapter_multi_gpu/profiling.md, checked in every framework.

The FLOP count behind MFU is checked against a count by hand. The order of
backward operators and exchanges is checked in the traces of two real
processes, started as the page starts them: the page's cells run in a fresh
interpreter (no file, like a notebook), whose worker `spawn_ranks` sends to
the new processes by value.
"""
import pytest

from conftest import ROOT, page_definitions, tab_cells
from test_process_groups import run_scenario

PAGE = ROOT / 'chapter_multi_gpu' / 'profiling.md'
# The MLP of the page: 784 inputs, three hidden layers of 1024, 10 classes.
WEIGHTS = 784 * 1024 + 1024 * 1024 + 1024 * 1024 + 1024 * 10
# The cells a profiled step needs, named by what they define.
DEFINITIONS = ('def step_flops', 'def mlp', 'def load_trace', 'def timed',
               'def sgd_step', 'def exchanges_and_products',
               'def profile_worker', 'def split_trace', 'def timeline')


def test_step_flops_is_six_per_weight_and_example_by_hand():
    page = page_definitions(PAGE, 'pytorch', ['def step_flops'])
    # (3 x 5 + 5 x 2) multiply-adds per example, 2 FLOPs each, x 3, x 4
    assert page['step_flops']((3, 5, 2), 4) == 3 * 2 * (15 + 10) * 4
    assert page['step_flops'](page['WIDTHS'], 64) == 6 * WEIGHTS * 64


def test_the_models_weights_are_the_multiply_adds_counted(framework):
    page = page_definitions(PAGE, framework, ['def step_flops', 'def mlp'])
    assert page['weights'] == WEIGHTS  # one multiply-add each, per example
    assert page['step_flops'](page['WIDTHS'], 1) == 6 * page['weights']


def test_self_times_subtract_nested_events_on_the_same_thread():
    page = page_definitions(PAGE, 'pytorch', ['def self_times'])
    events = [('step', 1, 0.0, 10.0), ('mm', 1, 1.0, 4.0),
              ('add', 1, 2.0, 3.0), ('mm', 1, 5.0, 7.0),
              ('all_reduce', 2, 3.0, 9.0)]  # another thread: not nested
    totals = page['self_times'](events)
    assert totals['step'] == [5.0, 1]  # 10 - 3 - 2
    assert totals['mm'] == [4.0, 2]  # (3 - 1) + 2
    assert totals['add'] == [1.0, 1]
    assert totals['all_reduce'] == [6.0, 1]


def profiled_timelines(framework):
    """Rank by rank, setting by setting: the (start, end) of the backward
    operators and of the exchanges in one profiled step of the page."""
    cells = tab_cells(PAGE, framework)
    chosen = [cells[0]] + [c for c in cells[1:]
                           if any(d in c for d in DEFINITIONS)]
    backend = ', backend="gloo"' if framework == 'paddle' else ''
    body = '\n'.join(chosen) + (
        f'\nranks = d2l.spawn_ranks(profile_worker, 2, rendezvous(), '
        f'SETTINGS, 64, 2{backend})\n'
        'report([{s: timeline(r["trace"][s]) for s in SETTINGS} '
        'for r in ranks])\n')
    return run_scenario(framework, body)


@pytest.mark.slow
def test_the_traces_order_backward_and_exchanges_as_the_text_says(
        framework):
    for rank in profiled_timelines(framework):
        backward, exchanges = rank['after backward']
        last = max(end for _, end in backward)
        # one bucket (MXNet: a wait for the backward pass) starts after
        # every backward operator has ended
        assert exchanges and all(start >= last for start, _ in exchanges)
        backward, exchanges = rank['during backward']
        first = min(start for start, _ in exchanges)
        # small buckets (MXNet: a key per array, queued at once): the first
        # leaves while the backward pass goes on
        assert len(exchanges) > 1
        assert first < max(end for _, end in backward)
