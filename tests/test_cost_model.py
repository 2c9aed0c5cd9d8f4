"""Tests of the cost-model section (chapter_multi_gpu/cost-model.md).

They check the model's arithmetic and its fit, and that real allreduce
timings give a usable bandwidth. No test asserts a speed.
"""
import math
import random

import pytest

MB = 10 ** 6


@pytest.fixture
def page(framework, d2l):
    """The page's own (unsaved) tree and hierarchical allreduce models."""
    from conftest import ROOT, page_definitions
    return page_definitions(ROOT / 'chapter_multi_gpu' / 'cost-model.md',
                            framework, ['def tree_allreduce_time'])


@pytest.mark.parametrize('k', [1, 2, 3, 4, 8])
def test_ring_allreduce_costs_2_k_minus_1_latencies_and_chunks(d2l, k):
    n, alpha, beta = 44.7 * MB, 20e-6, 1e-9
    assert d2l.ring_allreduce_time(n, k, alpha, beta) == pytest.approx(
        2 * (k - 1) * (alpha + beta * n / k))
    assert d2l.naive_allreduce_time(n, k, alpha, beta) == pytest.approx(
        2 * (k - 1) * (alpha + beta * n))


def test_one_process_communicates_nothing(d2l):
    assert d2l.ring_allreduce_time(MB, 1, 1e-3, 1e-9) == 0
    assert d2l.naive_allreduce_time(MB, 1, 1e-3, 1e-9) == 0


@pytest.mark.parametrize('k', [1, 2, 3, 4, 8, 64])
def test_a_tree_pays_2_log_k_latencies_for_whole_messages(d2l, page, k):
    n, alpha, beta = 44.7 * MB, 20e-6, 1e-9
    levels = math.ceil(math.log2(k))
    assert page['tree_allreduce_time'](n, k, alpha, beta) == pytest.approx(
        2 * levels * (alpha + beta * n))
    if k >= 4:  # fewer latencies than the ring, more bytes
        assert page['tree_allreduce_time'](4e3, k, alpha, 0) < \
            d2l.ring_allreduce_time(4e3, k, alpha, 0)
        assert page['tree_allreduce_time'](n, k, 0, beta) > \
            d2l.ring_allreduce_time(n, k, 0, beta)


def test_a_hierarchical_allreduce_sends_a_gth_of_the_data_between_machines(
        d2l, page):
    n, inner, outer = 44.7 * MB, (10e-6, 1 / 25e9), (20e-6, 1 / 12.5e9)
    t = page['hierarchical_allreduce_time'](n, 8, 8, inner, outer)
    assert t == pytest.approx(d2l.ring_allreduce_time(n, 8, *inner) +
                              d2l.ring_allreduce_time(n / 8, 8, *outer))
    assert t < d2l.ring_allreduce_time(n, 64, *outer)
    # One machine: a ring inside it; one device per machine: a ring between.
    assert page['hierarchical_allreduce_time'](n, 1, 8, inner, outer) == \
        pytest.approx(d2l.ring_allreduce_time(n, 8, *inner))
    assert page['hierarchical_allreduce_time'](n, 8, 1, inner, outer) == \
        pytest.approx(d2l.ring_allreduce_time(n, 8, *outer))
    with pytest.raises(ValueError, match='k'):
        page['hierarchical_allreduce_time'](n, 0, 8, inner, outer)
    with pytest.raises(ValueError, match='k'):
        page['tree_allreduce_time'](n, 0, 1e-5, 1e-9)


@pytest.mark.parametrize('k', [2, 3, 4, 16])
def test_ring_beats_naive_because_every_device_sends_at_once(d2l, k):
    n, alpha, beta = 10 * MB, 1e-5, 1e-9
    assert d2l.ring_allreduce_time(n, k, alpha, beta) < \
        d2l.naive_allreduce_time(n, k, alpha, beta)
    # Same number of latencies; the ring's bandwidth term is k times smaller
    # and stays below 2 beta n however large k gets.
    assert d2l.ring_allreduce_time(n, k, alpha, 0) == \
        pytest.approx(d2l.naive_allreduce_time(n, k, alpha, 0))
    assert d2l.ring_allreduce_time(n, k, 0, beta) * k == \
        pytest.approx(d2l.naive_allreduce_time(n, k, 0, beta))
    assert d2l.ring_allreduce_time(n, k, 0, beta) < 2 * beta * n


@pytest.mark.parametrize('k, alpha, beta', [(2, 30e-6, 2e-10),
                                            (4, 50e-6, 1e-9),
                                            (8, 5e-6, 3e-11)])
def test_fit_recovers_alpha_and_beta_from_noisy_synthetic_timings(
        d2l, k, alpha, beta):
    rng = random.Random(k)
    sizes = [4000 * 10 ** (i / 2) for i in range(10)]  # 4 KB .. 126 MB
    seconds = [d2l.ring_allreduce_time(n, k, alpha, beta) *
               rng.uniform(0.95, 1.05) for n in sizes]
    alpha_fit, beta_fit = d2l.fit_alpha_beta(sizes, seconds, k)
    assert alpha_fit == pytest.approx(alpha, rel=0.1)
    assert beta_fit == pytest.approx(beta, rel=0.1)


def test_fit_is_exact_on_exact_timings(d2l):
    sizes = [4000, 4 * MB, 100 * MB]
    seconds = [d2l.ring_allreduce_time(n, 4, 1e-4, 5e-10) for n in sizes]
    alpha, beta = d2l.fit_alpha_beta(sizes, seconds, 4)
    assert alpha == pytest.approx(1e-4, rel=1e-9)
    assert beta == pytest.approx(5e-10, rel=1e-9)


def test_fit_never_reports_a_negative_latency(d2l):
    # Timings proportional to the size, with the smallest one too fast:
    # a free line would cross zero below the origin.
    sizes = [1000, 10 ** 5, 10 ** 7]
    seconds = [0.5e-6, 1e-4, 1e-2]
    alpha, beta = d2l.fit_alpha_beta(sizes, seconds, 2)
    assert alpha == 0 and beta > 0 and math.isfinite(beta)


@pytest.mark.parametrize('args, name', [
    (([1, 2], [1e-3], 2), 'same length'),
    (([5, 5], [1e-3, 2e-3], 2), 'two different sizes'),
    (([1, 2], [1e-3, -1.0], 2), 'seconds'),
    (([1, 2], [1e-3, float('nan')], 2), 'seconds'),
    (([0, 2], [1e-3, 2e-3], 2), 'num_bytes'),
    (([1, 2], [1e-3, 2e-3], 1), 'k must'),
    (([1, 2], [1e-3, 2e-3], 2.0), 'k must'),
    (([1, 2], [2e-3, 1e-3], 2), 'do not grow')])
def test_fit_rejects_unusable_timings_naming_the_problem(d2l, args, name):
    with pytest.raises(ValueError, match=name):
        d2l.fit_alpha_beta(*args)


@pytest.mark.parametrize('args, name', [
    ((-1, 2, 1e-5, 1e-9), 'num_bytes'), (('1e6', 2, 1e-5, 1e-9), 'num_bytes'),
    ((1e6, 0, 1e-5, 1e-9), 'k'), ((1e6, 2.5, 1e-5, 1e-9), 'k'),
    ((1e6, True, 1e-5, 1e-9), 'k'), ((1e6, 2, -1e-5, 1e-9), 'alpha'),
    ((1e6, 2, 1e-5, float('inf')), 'beta')])
def test_allreduce_times_reject_bad_arguments(d2l, args, name):
    for fn in (d2l.ring_allreduce_time, d2l.naive_allreduce_time):
        with pytest.raises(ValueError, match=name):
            fn(*args)


def test_ddp_buckets_cover_the_gradient_with_a_small_first_bucket(d2l):
    n = 44_700_000
    buckets = d2l.ddp_buckets(n)
    assert sum(buckets) == n
    assert buckets[0] == 2 ** 20 and max(buckets) <= 25 * 2 ** 20
    assert d2l.ddp_buckets(1000) == [1000]
    assert len(d2l.ddp_buckets(n, bucket_cap_mb=1)) == math.ceil(n / 2 ** 20)
    assert d2l.ddp_buckets(0) == []


@pytest.mark.parametrize('cap', [0, -1, float('nan')])
def test_ddp_buckets_reject_a_bucket_size_that_is_not_positive(d2l, cap):
    with pytest.raises(ValueError, match='bucket_cap_mb'):
        d2l.ddp_buckets(10 ** 6, cap)


def test_step_time_is_compute_plus_bucketed_ring_allreduces(d2l):
    n, k, alpha, beta = 44_700_000, 4, 1e-4, 1e-9
    comm = sum(d2l.ring_allreduce_time(b, k, alpha, beta)
               for b in d2l.ddp_buckets(n))
    assert d2l.predict_step_time(0.2, n, k, alpha, beta, cores=8) == \
        pytest.approx(0.2 + comm)
    # Accumulating m micro-batches pays one allreduce per m.
    assert d2l.predict_step_time(0.2, n, k, alpha, beta, cores=8,
                                 accumulate=4) == pytest.approx(0.2 + comm / 4)
    # A fully hidden allreduce costs nothing.
    assert d2l.predict_step_time(0.2, n, k, alpha, beta, cores=8,
                                 overlap=1.0) == pytest.approx(0.2)
    # One process: no communication at all.
    assert d2l.predict_step_time(0.2, n, 1, alpha, beta) == pytest.approx(0.2)
    # Without `cores`, every process has a device of its own: no sharing.
    assert d2l.predict_step_time(0.2, 1000, 16, alpha, beta) == \
        pytest.approx(0.2 + d2l.ring_allreduce_time(1000, 16, alpha, beta))


@pytest.mark.parametrize('k, threads, factor', [(1, 2, 1), (2, 1, 1),
                                                (4, 1, 2), (8, 1, 4)])
def test_computation_slows_once_processes_outnumber_the_cores(
        d2l, k, threads, factor):
    t = d2l.predict_step_time(0.1, 0, k, 0.0, 0.0, cores=2, threads=threads)
    assert t == pytest.approx(0.1 * factor)


@pytest.mark.parametrize('kwargs, name', [
    (dict(t_compute=0), 't_compute'), (dict(t_compute=float('nan')), 't_compute'),
    (dict(cores=0), 'cores'), (dict(threads=-1), 'threads'),
    (dict(accumulate=0), 'accumulate'), (dict(overlap=1.5), 'overlap'),
    (dict(k=0), 'k')])
def test_step_prediction_rejects_bad_arguments(d2l, kwargs, name):
    args = dict(t_compute=0.1, num_bytes=1e6, k=2, alpha=1e-5, beta=1e-9)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        d2l.predict_step_time(**args)


def _measuring(framework):
    if framework == 'mxnet':
        pytest.skip('MXNet has no multi-process data-parallel wrapper; the '
                    'section measures in PyTorch and PaddlePaddle')


def test_module_lenet_has_the_from_scratch_lenets_parameters(framework, d2l):
    net = d2l.cost_model_net('lenet')
    numel = sum(math.prod(s) for s in d2l.LENET_SHAPES)
    assert d2l.gradient_bytes(net) == 4 * numel


@pytest.mark.parametrize('call, name', [
    (lambda d2l: d2l.cost_model_net('vgg'), 'model'),
    (lambda d2l: d2l.time_compute('lenet', 4, reps=0), 'reps'),
    (lambda d2l: d2l.time_all_reduce(2, [], 1), 'sizes'),
    (lambda d2l: d2l.time_all_reduce(2, [4000, -8], 1), 'sizes'),
    (lambda d2l: d2l.time_all_reduce(1, [4000], 1), 'world_size'),
    (lambda d2l: d2l.time_all_reduce(2.0, [4000], 1), 'world_size'),
    (lambda d2l: d2l.time_all_reduce(2, [4000], 1, calls=0), 'calls'),
    (lambda d2l: d2l.time_ddp_configs(2, [], 4), 'configs'),  # not MXNet
    (lambda d2l: d2l.time_ddp_configs(2, [dict(model='vgg')], 4), 'model'),
    (lambda d2l: d2l.time_ddp_configs(2, [dict(accumulate=0)], 4),
     'accumulate'),
    (lambda d2l: d2l.time_ddp_configs(2, [dict(bucket_cap_mb=0)], 4),
     'bucket_cap_mb'),
    (lambda d2l: d2l.time_ddp_configs(2, [dict(speed=1)], 4), 'keys'),
    (lambda d2l: d2l.time_ddp_configs(2, [dict(ddp='no')], 4), 'ddp'),
    (lambda d2l: d2l.time_ddp_configs(
        2, [dict(ddp=False, compress=True)], 4), 'compress'),
    (lambda d2l: d2l.time_ddp_configs(2, [dict(model='lenet')], 3), '3')])
def test_measurements_reject_bad_arguments_before_starting_processes(
        framework, d2l, call, name):
    if framework == 'mxnet' and 'time_ddp_configs' in call.__code__.co_names:
        pytest.skip('MXNet has no DDP wrapper whose configurations to time')
    with pytest.raises(ValueError, match=name):
        call(d2l)


@pytest.mark.slow
def test_fitted_beta_from_real_exchange_timings_is_positive_and_finite(
        framework, d2l):
    sizes = [4_000, 400_000, 4_000_000, 16_000_000]
    seconds = d2l.time_all_reduce(2, sizes, 3)  # MXNet: push and pull
    assert len(seconds) == len(sizes) and all(t > 0 for t in seconds)
    fit = d2l.fit_ps_alpha_beta if framework == 'mxnet' else d2l.fit_alpha_beta
    alpha, beta = fit(sizes, seconds, 2)
    assert 0 < beta < math.inf and 0 <= alpha < math.inf


@pytest.mark.parametrize('k, servers, factor', [(1, 1, 1), (2, 1, 2),
                                                 (4, 2, 2), (2, 4, 1)])
def test_a_parameter_server_carries_k_over_s_gradients_per_server(
        d2l, k, servers, factor):
    alpha, beta, n = 20e-6, 1e-9, 10 ** 6
    assert d2l.ps_pushpull_time(n, k, alpha, beta, servers) == \
        pytest.approx(2 * (alpha + beta * n * factor))


@pytest.mark.parametrize('k, servers', [(2, 1), (4, 1), (4, 2)])
def test_the_server_fit_recovers_alpha_and_beta_exactly(d2l, k, servers):
    sizes = [4_000, 40_000, 400_000, 4_000_000]
    seconds = [d2l.ps_pushpull_time(n, k, 30e-6, 2e-9, servers)
               for n in sizes]
    alpha, beta = d2l.fit_ps_alpha_beta(sizes, seconds, k, servers)
    assert alpha == pytest.approx(30e-6) and beta == pytest.approx(2e-9)


@pytest.mark.slow
def test_ddp_timings_come_back_one_per_configuration(framework, d2l):
    _measuring(framework)
    configs = [dict(model='lenet', ddp=False), dict(model='lenet'),
               dict(model='lenet', accumulate=2)]
    seconds = d2l.time_ddp_configs(2, configs, 8, num_steps=1, warmup=1,
                                   reps=1)
    assert len(seconds) == 3 and all(0 < t < math.inf for t in seconds)


def test_a_plain_copy_is_the_bare_network_with_no_ddp_wrapper(framework,
                                                              d2l):
    _measuring(framework)
    config, = d2l._check_configs([dict(model='lenet', ddp=False)])
    net, _ = d2l._ddp_model(config, d2l.ddp_device(0, 1))
    assert type(net) is type(d2l.cost_model_net('lenet'))


@pytest.mark.parametrize('ddp, waits_per_round', [(False, 1 + 3), (True, 1)])
def test_plain_copies_wait_for_one_another_after_every_step(
        framework, d2l, ddp, waits_per_round):
    _measuring(framework)
    # Plain copies stand in for DDP's computation: like DDP's processes at
    # the allreduce, they must wait for the slowest after each of 3 steps.
    config, = d2l._check_configs([dict(model='lenet', ddp=ddp,
                                       accumulate=2)])
    net, optimizer = d2l._ddp_model(dict(config, ddp=False),
                                    d2l.ddp_device(0, 1))
    X, y = d2l.timing_batch(4)
    waits = []
    d2l._time_runs([(net, optimizer, config)], X, y, num_steps=3, warmup=1,
                   reps=2, wait=lambda: waits.append(1))
    assert len(waits) == 2 * waits_per_round


def test_a_pipeline_step_is_the_bubble_times_the_stage_work_plus_the_sends(
        d2l):
    # p = 4 stages, m = 8 micro-batches: 11/8 of a stage's work, and the
    # first micro-batch crosses 3 links forward and 3 backward.
    t = d2l.predict_pipeline_time(0.8, 4, 8, 10 ** 6, 1e-4, 1e-9)
    assert t == pytest.approx(11 / 8 * 0.8 + 6 * (1e-4 + 1e-3))


def test_one_stage_has_no_bubble_and_sends_nothing(d2l):
    assert d2l.predict_pipeline_time(0.5, 1, 4, 10 ** 6, 1e-3, 1e-9) == 0.5


def test_more_micro_batches_shrink_the_bubble_toward_the_stage_work(d2l):
    times = [d2l.predict_pipeline_time(1.0, 2, m, 0, 0, 0)
             for m in (1, 2, 4, 8, 1000)]
    assert times == sorted(times, reverse=True)
    assert times[0] == 2.0 and times[-1] == pytest.approx(1.0, abs=1e-3)


def test_a_tensor_parallel_pass_is_compute_over_k_plus_two_allreduces(d2l):
    n = 4 * 256 * 512  # 4bd bytes: a 256 x 512 float32 activation
    ring = 2 * (2 - 1) * (1e-4 + 1e-9 * n / 2)
    assert d2l.predict_tensor_time(0.2, 2, n, 1e-4, 1e-9) == \
        pytest.approx(0.1 + 2 * ring)
    assert d2l.predict_tensor_time(0.2, 2, n, 1e-4, 1e-9, blocks=3) == \
        pytest.approx(0.1 + 6 * ring)
    server = d2l.ps_pushpull_time(n, 2, 1e-4, 1e-9)
    assert d2l.predict_tensor_time(
        0.2, 2, n, 1e-4, 1e-9, collective=d2l.ps_pushpull_time) == \
        pytest.approx(0.1 + 2 * server)


@pytest.mark.parametrize('args, name', [
    ((0.8, 0, 4, 100, 0, 0), 'num_stages'),
    ((0.8, 2, 0, 100, 0, 0), 'num_microbatches'),
    ((0.0, 2, 4, 100, 0, 0), 't_stage'),
    ((0.8, 2, 4, -1, 0, 0), 'num_bytes'),
    ((0.8, 2, 4, 100, -1e-6, 0), 'alpha')])
def test_pipeline_prediction_rejects_bad_arguments(d2l, args, name):
    with pytest.raises(ValueError, match=name):
        d2l.predict_pipeline_time(*args)


@pytest.mark.parametrize('args, kwargs, name', [
    ((-1.0, 2, 100, 0, 0), {}, 't_compute'),
    ((1.0, 0, 100, 0, 0), {}, 'k'),
    ((1.0, 2, 100, 0, 0), dict(blocks=0), 'blocks'),
    ((1.0, 2, 100, 0, float('inf')), {}, 'beta')])
def test_tensor_prediction_rejects_bad_arguments(d2l, args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        d2l.predict_tensor_time(*args, **kwargs)


def test_a_runs_work_is_its_busiest_stage_and_its_step_the_whole_span(d2l):
    times = [(0, 'F', 0, 0.0, 1.0), (1, 'F', 0, 1.1, 2.0),
             (1, 'B', 0, 2.0, 2.5), (0, 'B', 0, 3.0, 4.0)]
    work, span = d2l.pipeline_work_and_span(times)
    assert work == pytest.approx(2.0) and span == pytest.approx(4.0)
    with pytest.raises(ValueError, match='times'):
        d2l.pipeline_work_and_span([])


@pytest.mark.parametrize('args, name', [
    ((1, 16, 64, 8), 'k'), ((2, 16, 1, 8), 'hidden'),
    ((2, 0, 64, 8), 'd'), ((2, 16, 64, 8, 0), 'num_steps'),
    ((2, 16, 64, 8, 1, 1, 3, 4), 'num_heads'),  # 3 heads for 16 features
    ((2, 16, 64, 8, 1, 1, 1, 4), 'num_heads'),  # one head for two ranks
    ((2, 16, 64, 8, 1, 1, 4, 5), 'seq_len'),  # 5 tokens for two ranks
    ((2, 16, 32, 8, 1, 1, 4, 4), 'hidden')])  # a block's MLP is 4d wide
def test_tensor_timing_rejects_bad_arguments_before_starting_processes(
        d2l, args, name):
    with pytest.raises(ValueError, match=name):
        d2l.time_tensor_parallel(*args)
