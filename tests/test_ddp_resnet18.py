"""Tests of the claims of chapter_multi_gpu/ddp-resnet18.md (sec_ddp_resnet).

Multi-process scenarios run under the harness of tests/test_process_groups.py.
"""
import numpy as np
import pytest

from conftest import tab_cells
from test_process_groups import (  # noqa: F401  (ddp is a fixture)
    ROOT, ddp, run_scenario)

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


def test_uneven_global_batch_is_rejected_with_a_suggestion(ddp):
    assert ddp.local_batch_size(512, 2) == 256
    assert ddp.local_batch_size(6, 6) == 1
    with pytest.raises(ValueError, match='multiple of 3, such as 99 or 102'):
        ddp.local_batch_size(100, 3)
    with pytest.raises(ValueError, match='multiple of 4, such as 4 or 8'):
        ddp.local_batch_size(2, 4)


# ---- Real processes talking through Gloo on the CPU. ----

@pytest.mark.slow
def test_every_rank_reports_the_accuracy_over_all_test_images(ddp, framework):
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    ranks = run_scenario(framework, f"""
        ranks = d2l.spawn_ranks(d2l.train_ddp, 2, {init}, 1, 64, 0.1)
        report([[r['test_acc'], r['train_loss'], r['world_size']] for r in ranks])
        """)
    (acc0, loss0, k0), (acc1, loss1, k1) = ranks
    assert (k0, k1) == (2, 2)
    assert acc0 == acc1  # the counts of both ranks, summed
    n_test = len(ddp.fashion_mnist_tensors('test')[1])
    assert abs(acc0 * n_test - round(acc0 * n_test)) < 1e-9  # whole images
    assert loss0 == loss1 and np.isfinite(loss0).all()  # averaged over ranks


@pytest.mark.slow
def test_paddle_ranks_keep_their_own_batch_norm_statistics(framework):
    if framework != 'paddle':
        pytest.skip('PyTorch DDP broadcasts buffers at every forward pass')
    result = run_scenario(framework, """
        ranks = d2l.spawn_ranks(d2l._batch_norm_statistics_demo, 2, 'env://',
                                3, backend='gloo')
        report([[a.tolist() for a in r] for r in ranks])
        """)
    (mean0, synced0), (mean1, synced1) = [[np.array(a) for a in r]
                                          for r in result]
    assert np.abs(mean0 - mean1).max() > 1e-4  # trained on different shards
    assert np.array_equal(synced0, synced1)  # until rank 0's are broadcast


@pytest.mark.slow
def test_ddp_timing_functions_return_seconds_per_step(ddp, framework):
    if framework == 'paddle':
        pytest.skip('the DataParallel-vs-DDP measurement is PyTorch only')
    result = run_scenario(framework, """
        import functools
        small = functools.partial(d2l._small_mlp, 0)
        report([d2l.time_data_parallel(2, 32, 2, model_fn=small),
                d2l.time_ddp(2, 32, 2, model_fn=small)])
        """)
    dp_s, ddp_s = result
    assert 0 < dp_s < 5 and 0 < ddp_s < 5
    with pytest.raises(ValueError, match='multiple of 2'):
        ddp.time_ddp(2, 33, 1)
    with pytest.raises(ValueError, match='num_devices'):
        ddp.time_data_parallel(0, 32, 1)


@pytest.mark.slow
def test_each_epoch_of_train_ddp_starts_at_its_cosine_learning_rate(ddp, framework):
    # One rank in this process; the epochs themselves are replaced by a probe
    # that reads the optimizer's rate, so only the schedule is exercised.
    init = ('d2l.local_init_method()' if framework == 'pytorch'
            else "'env://'")
    rates = run_scenario(framework, f"""
        os.environ.update(PADDLE_TRAINER_ID='0', PADDLE_TRAINERS_NUM='1')
        seen = []
        def probe(net, optimizer, train_iter, device, world_size, epoch):
            seen.append(optimizer.param_groups[0]['lr']
                        if hasattr(optimizer, 'param_groups')
                        else optimizer.get_lr())
            return 0.0
        d2l._ddp_epoch = probe
        d2l.train_ddp(0, 1, {init}, 4, 64, 0.2)
        report(seen)
        """)
    expected = [ddp.cosine_lr(0.2, epoch, 4) for epoch in range(4)]
    assert rates == pytest.approx(expected)
    assert rates[0] == pytest.approx(0.2) and rates[-1] < 0.03
