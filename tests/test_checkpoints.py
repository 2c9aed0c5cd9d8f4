"""The claims of chapter_multi_gpu/checkpoints.md, checked in every framework.

The page's own code is run, with a shorter run (12 steps, a checkpoint every
4, rank 1 killed at step 6): its cells define the data order, the sharded
save and load, the training loop and the restarts, and the ranks start with
the book's spawn_ranks (PyTorch's restarts: torchrun's agent) in a child
Python under a hard deadline.
"""
import pytest

from conftest import ROOT, page_definitions
from test_tensor_parallelism import RENDEZVOUS, child_result

PAGE = ROOT / 'chapter_multi_gpu' / 'checkpoints.md'
DEFINITIONS = ('def batch_indices', 'def make_run', 'def save',
               'def load(', 'def train_run', 'def mean_losses',
               'def with_restarts', 'def watch_steps')
STEPS, EVERY, KILL_AT = 12, 4, 6


def runs(framework, shared_results):
    """Every run the tests check, in one child Python once per test session;
    the states are compared there, and only the differences come back."""
    return shared_results(f'checkpoints-{framework}', lambda: child_result(
        framework, f'''
            page['STEPS'], page['EVERY'] = {STEPS}, {EVERY}
            folder, gap = page['folder'], page['largest_difference']
            losses = page['mean_losses']

            def go(k, name, *args):
                return d2l.spawn_ranks(page['train_run'], k,
                                       {RENDEZVOUS[framework]},
                                       folder(name), *args)

            whole = go(2, 'whole')
            out = {{'steps': sorted(whole[0]['losses']),
                    'names': sorted(whole[0]['state'])}}
            try:
                go(2, 'cut', {KILL_AT})
            except RuntimeError as error:
                out['death'] = str(error)
            out['latest'] = page['latest_step'](folder('cut'))
            again = go(2, 'cut')
            out['resumed'] = [again[0]['start'], sorted(again[0]['losses']),
                              gap(losses(whole), losses(again)),
                              gap(whole[0]['state'], again[0]['state'])]
            out['loaded'] = []
            for k in (1, 2):
                loaded = go(k, 'whole')
                out['loaded'].append(
                    [k, loaded[0]['start'], sorted(loaded[0]['state']),
                     gap(whole[0]['state'], loaded[0]['state'])])
            out['watch'] = d2l.spawn_ranks(page['watch_steps'], 2,
                                           {RENDEZVOUS[framework]}, 1.0)
            restarted = page['with_restarts'](1, folder('agent'), {KILL_AT})
            out['restarted'] = [restarted[0]['attempt'],
                                restarted[0]['start'],
                                gap(whole[0]['state'], restarted[0]['state'])]
            ''', 300, PAGE, DEFINITIONS))


@pytest.mark.slow
def test_a_killed_rank_is_named_and_its_last_complete_checkpoint_remains(
        framework, shared_results):
    result = runs(framework, shared_results)
    assert 'rank 1 of 2 died (signal SIGKILL)' in result['death']
    assert result['latest'] == 4  # the save before step 6


@pytest.mark.slow
def test_a_resumed_run_repeats_the_uninterrupted_run_to_the_last_bit(
        framework, shared_results):
    result = runs(framework, shared_results)
    start, steps, loss_gap, state_gap = result['resumed']
    assert result['steps'] == list(range(STEPS))
    assert start == 4 and steps == list(range(4, STEPS))
    assert loss_gap == 0.0 and state_gap == 0.0


@pytest.mark.slow
def test_one_and_two_ranks_load_the_two_rank_checkpoint_unchanged(
        framework, shared_results):
    result = runs(framework, shared_results)
    names = result['names']
    momenta = [n for n in names if 'momentum' in n or 'velocity' in n]
    # MXNet's momenta travel whole, in rank 0's trainer states
    assert len(momenta) == {'mxnet': 0}.get(framework, 4)
    assert len(names) == 4 + len(momenta)
    for k, start, loaded_names, difference in result['loaded']:
        assert (start, loaded_names, difference) == (STEPS, names, 0.0), k


@pytest.mark.slow
def test_after_a_killed_rank_the_restarted_run_ends_as_the_uninterrupted(
        framework, shared_results):
    attempt, start, difference = runs(framework, shared_results)['restarted']
    assert (attempt, start, difference) == (1, 4, 0.0)


def test_a_checkpoint_without_its_completion_mark_is_not_resumed(
        framework, tmp_path):
    page = page_definitions(PAGE, framework, ('def batch_indices',))
    assert page['latest_step'](str(tmp_path / 'new')) == 0
    for step, complete in ((4, True), (8, True), (12, False)):
        (tmp_path / f'step{step}').mkdir()
        if complete:
            (tmp_path / f'step{step}' / page['COMPLETE']).touch()
    assert page['latest_step'](str(tmp_path)) == 8


def test_every_rank_gets_its_share_of_each_minibatch_once_an_epoch(
        framework):
    page = page_definitions(PAGE, framework, ('def batch_indices',))
    page['N'], page['BATCH'] = 12, 4
    for k in (1, 2, 4):
        epoch = [sorted(int(i) for step in range(3) for rank in range(k)
                        for i in page['batch_indices'](step, rank, k))]
        assert epoch == [list(range(12))]
        shares = {len(page['batch_indices'](0, rank, k)) for rank in range(k)}
        assert shares == {4 // k}
    assert list(page['batch_indices'](3, 0, 1)) != \
        list(page['batch_indices'](0, 0, 1))  # a new order each epoch


@pytest.mark.slow
def test_every_rank_sees_the_same_busy_times_and_the_slow_rank_in_them(
        framework, shared_results):
    seen = runs(framework, shared_results)['watch']
    assert seen[0] == seen[1]  # one all-reduce: the same vector everywhere
    for step, (rank0, rank1) in enumerate(seen[0]):
        # rank 1 spends a second more from step 2 on (the page: 0.2 s)
        assert (rank1 - rank0 > 0.5) == (step >= 2), (step, rank0, rank1)
