"""The claims of chapter_multi_gpu/pipeline-parallelism.md, checked in every framework.

Stages run as threads of the test process (every tab), and as Gloo processes
with point-to-point messages (PyTorch and PaddlePaddle), each multi-process
scenario in a process group of its own under a hard deadline (the harness of
tests/test_process_groups.py), so that a hang fails the test instead of
blocking the suite.
"""
import threading
import time

import numpy as np
import pytest

from conftest import numpy, tensor
from test_process_groups import run_scenario

TOL = 1e-6


@pytest.fixture(autouse=True)
def mxnet_numpy_interface(framework):
    """MXNet's NumPy interface, as the book's MXNet pages switch it on."""
    if framework == 'mxnet':
        from mxnet import npx
        npx.set_np()


def random_batch(framework, n, seed=0):
    """n random flat 28x28 images with labels, as framework tensors."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 784)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    return tensor(framework, X), tensor(framework, y)


def one_device(framework, layers, X, y):
    """Mean loss and flat gradient of the unsplit model, in the framework's own words."""
    if framework in ('pytorch', 'paddle'):
        import importlib
        F = importlib.import_module('torch.nn.functional' if framework ==
                                    'pytorch' else 'paddle.nn.functional')
        h = X
        for layer in layers:
            h = layer(h)
        loss = F.cross_entropy(h, y)
        loss.backward()
        grads = [p.grad.numpy() for l in layers for p in l.parameters()]
        for l in layers:
            l.zero_grad() if framework == 'pytorch' else l.clear_gradients()
    else:
        from mxnet import autograd, gluon
        with autograd.record():
            h = X
            for layer in layers:
                h = layer(h)
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(h, y).mean()
        loss.backward()
        params = [p for l in layers for p in l.collect_params().values()]
        grads = [p.grad().asnumpy() for p in params]
        for p in params:
            p.grad()[:] = 0
    return float(loss.detach()), np.concatenate([g.reshape(-1) for g in grads])


def flat(grads):
    return np.concatenate([g.reshape(-1) for g in grads])


# ---- Stages and schedules ----

def test_split_stages_cuts_consecutive_nearly_equal_groups(d2l):
    assert d2l.split_stages(range(7), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert d2l.split_stages(range(4), 4) == [[0], [1], [2], [3]]
    assert d2l.split_stages(range(3), 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match='num_stages=8 exceeds the 7 layers'):
        d2l.split_stages(range(7), 8)
    with pytest.raises(ValueError, match='num_stages must be a positive'):
        d2l.split_stages(range(7), 0)


@pytest.mark.parametrize('kind', ['gpipe', '1f1b'])
@pytest.mark.parametrize('p, m', [(1, 1), (2, 1), (2, 4), (3, 2), (4, 8)])
def test_a_schedule_runs_every_step_once_in_an_order_that_runs(d2l, kind, p, m):
    schedule = d2l.pipeline_schedule(kind, p, m)
    d2l.check_schedule(schedule, p, m)  # raises if it is wrong
    assert sorted(schedule) == sorted((s, op, i) for s in range(p)
                                      for op in 'FB' for i in range(m))
    for s in range(p):  # micro-batches held at once: GPipe m, 1F1B p - s
        held = peak = 0
        for _, op, _ in (t for t in schedule if t[0] == s):
            held += 1 if op == 'F' else -1
            peak = max(peak, held)
        assert peak == (m if kind == 'gpipe' else min(p - s, m))


def test_a_stage_that_skips_a_microbatch_is_named_before_anything_runs(
        d2l, framework):
    bad = [t for t in d2l.pipeline_schedule('1f1b', 2, 4)
           if (t[0], t[2]) != (1, 2)]
    with pytest.raises(ValueError, match=r"never runs step\(s\) "
                       r"\[\(1, 'B', 2\), \(1, 'F', 2\)\]"):
        d2l.check_schedule(bad, 2, 4)
    X, y = random_batch(framework, 8)
    stages = d2l.split_stages(d2l.pipeline_mlp(3, 8), 2)
    began = time.monotonic()
    with pytest.raises(ValueError, match='never runs'):
        d2l.run_pipeline(stages, bad, X, y, 4)
    assert time.monotonic() - began < 5


def test_repeated_misordered_and_unknown_steps_are_named(d2l):
    good = d2l.pipeline_schedule('gpipe', 2, 2)
    with pytest.raises(ValueError, match=r"step \(0, 'F', 1\) appears twice"):
        d2l.check_schedule(good + [(0, 'F', 1)], 2, 2)
    swapped = [(1, 'F', 0)] + [t for t in good if t != (1, 'F', 0)]
    with pytest.raises(ValueError, match=r"step \(1, 'F', 0\) comes before "
                       r"\(0, 'F', 0\), which it needs"):
        d2l.check_schedule(swapped, 2, 2)
    with pytest.raises(ValueError, match=r"step \(2, 'F', 0\) is not"):
        d2l.check_schedule(good + [(2, 'F', 0)], 2, 2)
    with pytest.raises(ValueError, match="kind must be 'gpipe' or '1f1b'"):
        d2l.pipeline_schedule('zero-bubble', 2, 2)


def test_interleaved_and_zero_bubble_schedules_run_every_step_once(d2l):
    inter = d2l.interleaved_schedule(2, 3, 4)  # 6 stages on 2 devices
    d2l.check_schedule(inter, 6, 4)
    assert sorted(inter) == sorted((s, op, i) for s in range(6)
                                   for op in 'FB' for i in range(4))
    zb = d2l.zero_bubble_schedule(3, 5)
    d2l.check_schedule(zb, 3, 5)
    assert sorted(zb) == sorted((s, op, i) for s in range(3)
                                for op in 'FBW' for i in range(5))
    early_w = [(0, 'W', 0)] + [t for t in zb if t != (0, 'W', 0)]
    with pytest.raises(ValueError, match=r"step \(0, 'W', 0\) comes before "
                       r"\(0, 'B', 0\), which it needs"):
        d2l.check_schedule(early_w, 3, 5)
    with pytest.raises(ValueError, match='must be a multiple of num_devices'):
        d2l.interleaved_schedule(2, 2, 5)


@pytest.mark.parametrize('p, m', [(2, 4), (4, 8), (3, 6)])
def test_replayed_equal_steps_give_each_schedule_s_bubble_formula(p, m):
    """The page's replay_idle: 1F1B (p-1)/(m+p-1), interleaved with two
    chunks (p-1)/(2m+p-1), zero bubble (p-1)/(3m+p-1)."""
    from conftest import ROOT, page_definitions
    from d2l import torch as d2l
    ns = page_definitions(ROOT / 'chapter_multi_gpu' / 'pipeline-parallelism.md',
                          'pytorch', ['def replay_idle'])
    replay = ns['replay_idle']
    assert replay(d2l.pipeline_schedule('1f1b', p, m), p) == pytest.approx(
        (p - 1) / (m + p - 1))
    assert replay(d2l.interleaved_schedule(p, 2, m), p) == pytest.approx(
        (p - 1) / (2 * m + p - 1))
    assert replay(d2l.zero_bubble_schedule(p, m), p) == pytest.approx(
        (p - 1) / (3 * m + p - 1))


def test_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(d2l):
    assert d2l.bubble_fraction(1, 5) == 0
    assert d2l.bubble_fraction(2, 1) == 0.5
    assert d2l.bubble_fraction(4, 16) == pytest.approx(3 / 19)


def test_idle_fraction_of_a_known_timeline(d2l):
    # Two stages over 4 s: stage 0 busy 0-1 and 3-4, stage 1 busy 1-3.
    times = [(0, 'F', 0, 0.0, 1.0), (1, 'F', 0, 1.0, 2.0),
             (1, 'B', 0, 2.0, 3.0), (0, 'B', 0, 3.0, 4.0)]
    assert d2l.idle_fraction(times) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="times must hold a run's steps"):
        d2l.idle_fraction([])


# ---- Equal to one device, stages as threads ----

@pytest.mark.parametrize('kind, p, m', [
    ('gpipe', 1, 1), ('1f1b', 1, 3), ('gpipe', 2, 4), ('1f1b', 2, 4),
    ('1f1b', 3, 4), ('gpipe', 3, 5)])
def test_a_pipeline_computes_the_loss_and_gradients_of_one_device(
        d2l, framework, kind, p, m):
    """Depth 5 on 3 stages is uneven (2, 2, 1); 10 examples in 4 or 5
    micro-batches are uneven too."""
    layers = d2l.pipeline_mlp(5, 16)
    X, y = random_batch(framework, 10)
    loss1, grad1 = one_device(framework, layers, X, y)
    stages = d2l.split_stages(layers, p)
    record = d2l.run_pipeline(stages, d2l.pipeline_schedule(kind, p, m),
                              X, y, m)
    assert np.abs(grad1).max() > 1e-3
    assert record['loss'] == pytest.approx(loss1, abs=TOL)
    np.testing.assert_allclose(flat(record['grads']), grad1, atol=TOL)
    assert len(record['times']) == 2 * p * m
    assert all(end >= start for *_, start, end in record['times'])


@pytest.mark.parametrize('name, p, m', [
    ('interleaved', 2, 4), ('interleaved', 3, 3), ('zero bubble', 2, 4),
    ('zero bubble', 3, 5)])
def test_interleaved_and_zero_bubble_pipelines_compute_what_one_device_does(
        d2l, framework, name, p, m):
    """Interleaved: 2 chunks per device (depth 6 on 2p stages; 3 devices
    with 6 stages of one block); zero bubble: B and W as separate steps."""
    layers = d2l.pipeline_mlp(6, 16)
    X, y = random_batch(framework, 12)
    loss1, grad1 = one_device(framework, layers, X, y)
    schedule = (d2l.interleaved_schedule(p, 2, m) if name == 'interleaved'
                else d2l.zero_bubble_schedule(p, m))
    stages = d2l.split_stages(layers, 1 + max(s for s, _, _ in schedule))
    record = d2l.run_pipeline(stages, schedule, X, y, m, num_devices=p)
    assert record['loss'] == pytest.approx(loss1, abs=TOL)
    np.testing.assert_allclose(flat(record['grads']), grad1, atol=TOL)
    assert len(record['times']) == len(schedule)
    assert len(record['peak_bytes']) == p


def test_1f1b_holds_p_microbatches_where_gpipe_holds_m(d2l, framework):
    stages = d2l.split_stages(d2l.pipeline_mlp(4, 16), 4)
    X, y = random_batch(framework, 16)
    peaks = {kind: d2l.run_pipeline(stages, d2l.pipeline_schedule(kind, 4, 8),
                                    X, y, 8)['peak_bytes']
             for kind in ('gpipe', '1f1b')}
    for s in range(4):  # equal micro-batches: bytes are proportional
        assert peaks['1f1b'][s] * 8 == pytest.approx(
            peaks['gpipe'][s] * (4 - s))


def test_a_failing_stage_stops_the_others_with_its_error(d2l, framework):
    stages = d2l.split_stages(d2l.pipeline_mlp(2, 8), 2)
    stages[1] = d2l.pipeline_mlp(2, 9)[1:]  # expects 9 inputs, gets 8
    X, y = random_batch(framework, 8)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match='device 1 failed'):
        d2l.run_pipeline(stages, d2l.pipeline_schedule('gpipe', 2, 2), X, y,
                         2, timeout_s=30)
    assert time.monotonic() - began < 10  # not stage 0's 30 s deadline


def test_a_message_that_never_comes_ends_in_a_timeout(d2l):
    send, recv = d2l._queue_link(2, 1, 0.3, threading.Event())
    began = time.monotonic()
    with pytest.raises(TimeoutError, match='stage 1 waited for F of '
                       'micro-batch 0 from stage 0'):
        recv(0, 'F', 0)
    assert time.monotonic() - began < 3


def test_microbatches_are_nearly_equal_and_refused_beyond_the_batch(
        d2l, framework):
    X, y = random_batch(framework, 10)
    Xs, ys = d2l.split_microbatches(X, y, 4)
    assert [x.shape[0] for x in Xs] == [3, 3, 2, 2]
    np.testing.assert_array_equal(numpy(framework, ys[3]),
                                  numpy(framework, y)[8:])
    with pytest.raises(ValueError, match='num_microbatches=11 exceeds'):
        d2l.split_microbatches(X, y, 11)


# ---- Stages as processes (MXNet: threads on cpu(0), cpu(1)) ----

def sample(n):
    """n random flat images and labels as NumPy arrays, the same in every process."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, 784)).astype(np.float32),
            rng.integers(0, 10, n))


def process_runs(d2l, X, y):
    """GPipe, 1F1B, zero-bubble and interleaved runs of 10 examples through
    depth 5 on two devices (stages of 3 and 2 blocks; interleaved: 4 stages),
    the last run's gradients last."""
    runs = [(d2l.pipeline_schedule('gpipe', 2, 3), 3),
            (d2l.pipeline_schedule('1f1b', 2, 4), 4),
            (d2l.zero_bubble_schedule(2, 4), 4),
            (d2l.interleaved_schedule(2, 2, 4), 4)]
    records = d2l.time_pipeline(runs, 2, X, y, depth=5, width=16)
    return ([[r['loss'], len(r['times']) / len(s), r['peak_bytes']]
             for r, (s, _) in zip(records, runs)]
            + [[g.tolist() for g in records[-1]['grads']]])


def schedule_1f1b(rank, world_size, init_method, X, y, m, depth, width):
    """A rank of torch.distributed.pipelining's Schedule1F1B, as the page
    runs it: its stage's loss average (last stage) and gradients."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from d2l import torch as d2l
    with d2l.process_group(rank, world_size, init_method) as device:
        layers = d2l.split_stages(d2l.pipeline_mlp(depth, width), world_size)
        stage = torch.nn.Sequential(*layers[rank]).to(device)
        schedule = Schedule1F1B(PipelineStage(stage, rank, world_size, device),
                                m, loss_fn=torch.nn.functional.cross_entropy)
        X, y, losses = d2l.tensor(X, device), d2l.tensor(y, device), []
        if rank == world_size - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step(*[X] if rank == 0 else [])
        return (sum(float(l.detach()) for l in losses) / m,
                [p.grad.cpu().numpy() for p in stage.parameters()])


@pytest.mark.slow  # run once (pinned environment); its page runs in NumPy 2
def test_two_stage_processes_compute_what_one_device_computes(d2l, framework):
    """Gloo processes (MXNet: threads on cpu(0), cpu(1)); the last run's
    gradients against the unsplit model. In the PyTorch scenario, also
    torch.distributed.pipelining's Schedule1F1B on the same examples."""
    X, y = (tensor(framework, a) for a in sample(10))
    if framework == 'mxnet':
        out = process_runs(d2l, X, y)
    else:
        import inspect
        api = '''
ranks = d2l.spawn_ranks(schedule_1f1b, 2, d2l.local_init_method(),
                        *sample(10), 5, 5, 16)
out.append([ranks[-1][0], [g.tolist() for r in ranks for g in r[1]]])
''' if framework == 'pytorch' else ''
        out = run_scenario(framework, inspect.getsource(sample)
                           + (inspect.getsource(schedule_1f1b)
                              if framework == 'pytorch' else '')
                           + inspect.getsource(process_runs) + '''
X, y = (d2l.tensor(a) for a in sample(10))
out = process_runs(d2l, X, y)
''' + api + 'report(out)', deadline_s=150)
    loss1, grad1 = one_device(framework, d2l.pipeline_mlp(5, 16), X, y)
    if framework == 'pytorch':  # Schedule1F1B, 5 micro-batches of 2
        loss, grads = out.pop()
        assert loss == pytest.approx(loss1, abs=TOL)
        np.testing.assert_allclose(flat([np.array(g) for g in grads]), grad1,
                                   atol=TOL)
    *runs, grads = out
    assert len(runs) == 4
    for loss, steps, peaks in runs:  # every step of the schedule, timed
        assert loss == pytest.approx(loss1, abs=TOL)
        assert steps == 1 and len(peaks) == 2 and min(peaks) > 0
    np.testing.assert_allclose(flat([np.array(g) for g in grads]), grad1,
                               atol=TOL)


def test_a_wrong_schedule_is_refused_before_any_process_starts(d2l, framework):
    X, y = random_batch(framework, 8)
    bad = d2l.pipeline_schedule('1f1b', 2, 4)[:-1]
    began = time.monotonic()
    with pytest.raises(ValueError, match=r"never runs step\(s\) "
                       r"\[\(0, 'B', 3\)\]"):
        d2l.time_pipeline([(bad, 4)], 2, X, y, 4, 8)
    with pytest.raises(ValueError, match='num_stages=5 exceeds the 4 layers'):
        d2l.time_pipeline([(d2l.pipeline_schedule('1f1b', 5, 2), 2)], 5, X,
                          y, 4, 8)
    assert time.monotonic() - began < 5
