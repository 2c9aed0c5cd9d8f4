"""Tests of the claims of chapter_multi_gpu/ddp-resnet18.md (sec_ddp_resnet).

Multi-process scenarios run under the harness of tests/test_process_groups.py.
"""
import numpy as np
import pytest

from conftest import tab_cells
from test_process_groups import (  # noqa: F401  (ddp is a fixture)
    BRIEF_DATA, ROOT, ddp, run_scenario)

PAGE = ROOT / 'chapter_multi_gpu' / 'ddp-resnet18.md'


def page_deal():
    """The page's `deal`, from its cell (it is a demonstration, not in d2l)."""
    cell = next(code for code in tab_cells(PAGE, 'pytorch') if 'def deal(' in code)
    namespace = {}
    exec(cell.split('\nfor rank in', 1)[0], namespace)
    return namespace['deal']


# ---- Fast checks: no processes are started. ----

@pytest.mark.parametrize('num_examples, world_size', [(10, 3), (12, 4), (7, 2), (3, 5)])
def test_dealing_an_epoch_by_hand_equals_the_distributed_sampler(num_examples,
                                                                 world_size):
    import torch
    deal = page_deal()
    data = list(range(num_examples))
    for rank in range(world_size):
        sampler = torch.utils.data.DistributedSampler(
            data, num_replicas=world_size, rank=rank, shuffle=False)
        assert deal(num_examples, rank, world_size) == list(sampler)
    dealt = [i for r in range(world_size) for i in deal(num_examples, r, world_size)]
    assert set(dealt) == set(data)  # every example, some twice


def test_uneven_global_batch_is_rejected_with_a_suggestion(d2l):
    assert d2l.local_batch_size(512, 2) == 256
    assert d2l.local_batch_size(6, 6) == 1
    with pytest.raises(ValueError, match='multiple of 3, such as 99 or 102'):
        d2l.local_batch_size(100, 3)
    with pytest.raises(ValueError, match='multiple of 4, such as 4 or 8'):
        d2l.local_batch_size(2, 4)


def test_the_rate_warms_up_from_the_one_process_rate_then_falls(d2l):
    rates = [d2l.warmup_cosine_lr(0.2, e, 6, 1, 0.1) for e in range(6)]
    assert rates[:2] == pytest.approx([0.1, 0.2])  # linear scaling for k=2
    assert all(a > b for a, b in zip(rates[1:], rates[2:]))  # then falls
    assert rates == pytest.approx([0.1] + [d2l.cosine_lr(0.2, e, 5)
                                           for e in range(5)])
    assert d2l.warmup_cosine_lr(0.2, 3, 6) == d2l.cosine_lr(0.2, 3, 6)
    # gradual: every step of the warm-up epoch a little higher, linearly
    steps = [d2l.warmup_cosine_lr(0.2, i / 4, 6, 1, 0.1) for i in range(5)]
    assert steps == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2])
    with pytest.raises(ValueError, match='warmup must be below num_epochs'):
        d2l.warmup_cosine_lr(0.2, 0, 2, 2, 0.1)


def test_the_mxnet_sampler_deals_an_epoch_like_the_distributed_sampler(
        framework, d2l):
    if framework != 'mxnet':
        pytest.skip('PyTorch and PaddlePaddle ship their own samplers')
    deal = page_deal()
    for rank in range(3):
        sampler = d2l._DealtSampler(10, rank, 3)
        order = list(sampler)
        assert len(order) == len(sampler) == len(deal(10, rank, 3))
    dealt = [i for r in range(3) for i in d2l._DealtSampler(10, r, 3)]
    assert set(dealt) == set(range(10))  # every example, some twice
    again = d2l._DealtSampler(10, 0, 3)
    again.set_epoch(1)
    assert list(again) != list(d2l._DealtSampler(10, 0, 3))  # reshuffled


# ---- Real processes talking through Gloo on the CPU. ----

@pytest.mark.slow
def test_two_processes_train_and_every_rank_reports_one_accuracy(
        d2l, framework):
    # The page's notebook runs one process too, in every tab (quick mode).
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    ranks = run_scenario(framework, f"""
        os.environ.update({BRIEF_DATA!r})  # the ranks take this environment
        ranks = d2l.spawn_ranks(d2l.train_ddp, 2, {init}, 1, 64, 0.2)
        report([[r['test_acc'], r['train_loss'], r['world_size'],
                 len(r['epoch_s'])] for r in ranks]
               + [len(d2l.fashion_mnist_tensors('test')[1])])
        """)
    first, second, n_test = ranks
    assert n_test == 20  # two test images of each class
    assert first[2:] == second[2:] == [2, 1]
    assert first[0] == second[0]  # the counts of both ranks, summed
    for acc in first[0]:  # one accuracy per epoch, in whole images
        assert abs(acc * n_test - round(acc * n_test)) < 1e-9
    assert first[1] == second[1]  # losses averaged over ranks
    assert np.isfinite(first[1]).all()


@pytest.mark.slow
def test_paddle_ranks_keep_their_own_batch_norm_statistics(framework):
    if framework != 'paddle':
        pytest.skip('PyTorch DDP broadcasts buffers at every forward pass')
    result = run_scenario(framework, """
        ranks = d2l.spawn_ranks(d2l.batch_norm_statistics_demo, 2, 'env://',
                                3, backend='gloo')
        report([[a.tolist() for a in r] for r in ranks])
        """)
    (mean0, synced0), (mean1, synced1) = [[np.array(a) for a in r]
                                          for r in result]
    assert np.abs(mean0 - mean1).max() > 1e-4  # trained on different shards
    assert np.array_equal(synced0, synced1)  # until rank 0's are broadcast


@pytest.mark.slow
def test_a_process_with_two_threads_times_real_steps(d2l, framework):
    result = run_scenario(framework, """
        import functools
        small = functools.partial(d2l._small_mlp, 0)
        report([d2l.time_ddp(1, 16, 2, 1, small, 2)])  # the notebook: k = 2
        """)
    assert len(result) == 1 and all(0 < seconds < 30 for seconds in result)
    with pytest.raises(ValueError, match='multiple of 2'):
        d2l.time_ddp(2, 33, 1)


@pytest.mark.slow
def test_data_parallel_timing_returns_seconds_per_step(framework, d2l):
    if framework != 'pytorch':
        pytest.skip('only PyTorch ships a single-process DataParallel')
    result = run_scenario(framework, """
        import functools
        report(d2l.time_data_parallel(2, 32, 2,
                                      model_fn=functools.partial(
                                          d2l._small_mlp, 0)))
        """)
    assert 0 < result < 5
    with pytest.raises(ValueError, match='num_devices'):
        d2l.time_data_parallel(0, 32, 1)


@pytest.mark.slow
def test_every_step_of_train_ddp_gets_its_warm_up_and_cosine_rate(ddp,
                                                                  framework):
    # train_ddp's epochs are replaced by a probe that reads the schedule they
    # get, at each epoch's start and halfway; then the real epoch runs four
    # steps of a small model, setting the rate before each.
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    seen, asked, last = run_scenario(framework, f"""
        os.environ.update(PADDLE_TRAINER_ID='0', PADDLE_TRAINERS_NUM='1')
        seen, asked, real = [], [], d2l._ddp_epoch
        def probe(net, optimizer, train_iter, device, world_size, epoch,
                  lr_at):
            seen.append([lr_at(epoch), lr_at(epoch + 0.5)])
            return 0.0
        d2l._ddp_epoch = probe
        d2l.evaluate_accuracy_ddp = lambda *args: 0.0  # only the schedule
        d2l.train_ddp(0, 1, {init}, 4, 64, 0.2)
        def lr_at(epochs_done):
            asked.append(epochs_done)
            return 0.05 * (1 + len(asked))
        X, y = d2l.fashion_mnist_tensors('train')
        with d2l.process_group(0, 1, {init}) as device:
            net = d2l._small_mlp(0)
            optimizer = d2l._sgd(net, 0.1)
            real(net, optimizer, [(X[i:i + 2], y[i:i + 2])
                                  for i in range(0, 8, 2)],
                 device, 1, 2, lr_at)
            last = (optimizer.param_groups[0]['lr']
                    if hasattr(optimizer, 'param_groups')
                    else optimizer.get_lr())
        report([seen, asked, last])
        """)
    expected = [ddp.cosine_lr(0.2, e + half, 4)
                for e in range(4) for half in (0, 0.5)]
    assert sum(seen, []) == pytest.approx(expected)
    assert asked == [2, 2.25, 2.5, 2.75]  # before each of the four steps
    assert last == pytest.approx(0.05 * 5)  # the rate of the last step


def test_a_warm_up_from_half_the_rate_rises_every_step_of_its_epoch(d2l):
    # k = 2 processes: from lr / 2 to lr over one epoch, step by step
    rates = [d2l.warmup_cosine_lr(0.2, i / 8, 4, 1, 0.1) for i in range(9)]
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert rates[0] == pytest.approx(0.1) and rates[-1] == pytest.approx(0.2)
