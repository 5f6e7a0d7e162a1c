"""toolkit.parallel.distributed: under real ``horovodrun`` with 2 Gloo workers on localhost (one
run, tests/workers/two_workers.py, shared by the tests that need workers, elastic's state's
among them) and in this process (size 1, or a pretended size 2 over the real size-1 Horovod
for the hook's mechanics)."""

from __future__ import annotations

import importlib.util
import logging
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, backends_running, keras_workers_on, weights

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from scenarios import (
    EXECUTION,
    GLOBAL_BATCH,
    STEPS,
    SYNC,
    SYNC_STEPS,
    WIRE,
    WIRE_SHAPES,
    WIRE_STEPS,
    global_data,
    make_model,
    sgd,
    token_data,
    wire_grads,
    wire_scenarios,
)

from toolkit import backends
from toolkit.backends import devices
from toolkit.optimizers import LBSGD, SGD
from toolkit.parallel import distributed, noise_meter
from toolkit.scaling.noise_scale import Smoother


def reference(steps: int, rows_per_step: int, embedding: bool = False):
    """One worker taking ``rows_per_step`` rows per step; the seed rank 0 starts from."""
    x, y = token_data() if embedding else global_data()
    model = make_model(100, sgd(), embedding=embedding)
    for step in range(steps):
        rows = slice(step * rows_per_step, (step + 1) * rows_per_step)
        model.train_on_batch(x[rows], y[rows])
    return model.get_weights()


def assert_all_close(got, want, **tolerance):
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **tolerance)


# --- two workers --------------------------------------------------------------------------


def test_really_two_workers(two_workers):
    _, infos, _ = two_workers
    assert [i["size"] for i in infos] == [2, 2]
    assert [i["on_rank0"] for i in infos] == [0, None]
    assert [i["mean_rank"] for i in infos] == [0.5, 0.5]


@pytest.mark.parametrize("scenario", ["sgd", "accumulate2", "fp16", "sparse", "mixed", "fit"])
def test_workers_started_with_different_seeds_end_identical(two_workers, scenario):
    ranks, _, _ = two_workers
    for a, b in zip(weights(ranks[0], scenario), weights(ranks[1], scenario)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("embedding", [False, True], ids=["dense", "sparse"])
def test_two_workers_of_batch_b_equal_one_worker_of_batch_2b(two_workers, embedding):
    ranks, _, _ = two_workers
    expected = reference(STEPS, GLOBAL_BATCH, embedding=embedding)
    got = weights(ranks[0], "sparse" if embedding else "sgd")
    assert_all_close(got, expected, rtol=1e-5, atol=1e-6)
    untrained = make_model(100, sgd(), embedding=embedding).get_weights()
    assert not np.allclose(expected[0], untrained[0])


def test_two_workers_accumulating_two_steps_equal_one_worker_of_batch_4b(two_workers):
    """backward_passes_per_step=2: each update averages 4 half-batches (2 per worker)."""
    ranks, _, _ = two_workers
    expected = reference(STEPS, 2 * GLOBAL_BATCH)
    assert_all_close(weights(ranks[0], "accumulate2"), expected, rtol=1e-5, atol=1e-6)


def test_fp16_compression_stays_close_but_is_applied(two_workers):
    ranks, _, _ = two_workers
    fp16, full = weights(ranks[0], "fp16"), weights(ranks[0], "sgd")
    assert_all_close(fp16, full, rtol=1e-2, atol=1e-3)
    assert any(not np.array_equal(a, b) for a, b in zip(fp16, full))


def fused(options: dict, shapes=WIRE_SHAPES) -> list[list[int]]:
    """SINGA's fusion of float32 ``shapes``, in order, up to ``fusion_threshold_mb``."""
    limit = options.get("fusion_threshold_mb", 64) * 2**20
    sizes = [int(np.prod(shape)) for shape in shapes]
    buckets, current = [], []
    for i, n in enumerate(sizes):
        if current and 4 * (sum(sizes[j] for j in current) + n) > limit:
            buckets.append(current)
            current = []
        current.append(i)
    return [*buckets, current]


def simulate_sync(options: dict, workers: int = 2) -> list[list[list[np.ndarray]]]:
    """A numpy simulation of local updates (SGD, rate 1) with parameter averaging: after update
    ``n``, if ``n`` is a multiple of the period, partition ``(n / period - 1) mod P`` (SINGA's
    partial synchronisation) or all parameters (local SGD) take the workers' mean. Returns each
    step's parameters, per worker."""
    period = options.get("period", 1)
    parts = fused(options) if options["sync"] == "partial" else [list(range(len(WIRE_SHAPES)))]
    params = [[np.zeros(shape, "float32") for shape in WIRE_SHAPES] for _ in range(workers)]
    steps = []
    for step in range(SYNC_STEPS):
        for rank in range(workers):
            params[rank] = [w - g for w, g in zip(params[rank], wire_grads(rank, step))]
        done = step + 1
        if done % period == 0:
            for i in parts[(done // period - 1) % len(parts)]:
                mean = sum(params[rank][i] for rank in range(workers)) / np.float32(workers)
                for rank in range(workers):
                    params[rank][i] = mean
        steps.append([[w.copy() for w in ws] for ws in params])
    return steps


AVERAGING = backends_running(sync_mode="partial")  # and local SGD


def on_the_wire(scenarios) -> list:
    """``(backend, scenario)`` for each of ``scenarios`` (:data:`WIRE`'s names) on each Keras
    backend that runs it (:func:`wire_scenarios`), for ``workers_on`` and ``scenario``."""
    return [
        pytest.param(backend, name, id=f"{backend}-{name}")
        for backend in backends.BACKENDS
        for name in wire_scenarios(backends.of(backend))
        if name in scenarios
    ]


@pytest.fixture
def workers_on(request, tmp_path_factory, subprocess_env):
    """Each rank's ``(arrays, info)`` from two real workers on the Keras backend the test is
    parametrized with: TensorFlow's (tests/workers/two_workers.py), PyTorch's or JAX's
    (tests/workers/keras_workers.py), each run once a session."""
    if request.param == "tensorflow":
        ranks, infos, _ = request.getfixturevalue("two_workers")
        return list(zip(ranks, infos, strict=True))
    return keras_workers_on(request.param, tmp_path_factory, subprocess_env)[0]


@pytest.mark.parametrize("workers_on", AVERAGING, indirect=True)
@pytest.mark.parametrize("scenario", list(SYNC))
def test_partial_sync_and_local_sgd_match_a_simulation_of_the_workers(workers_on, scenario):
    ranks = [arrays for arrays, _ in workers_on]
    simulated = simulate_sync(SYNC[scenario])
    for step, expected in enumerate(simulated):
        for rank, npz in enumerate(ranks):
            got = weights(npz, f"sync_{scenario}_{step}")
            assert_all_close(got, expected[rank], rtol=1e-6, atol=1e-6)
    last = simulated[-1]
    assert any(not np.array_equal(a, b) for a, b in zip(*last))  # the workers drift apart


@pytest.mark.parametrize("scenario", list(EXECUTION))
def test_several_steps_per_execution_train_as_one_step_per_execution(two_workers, scenario):
    ranks, _, _ = two_workers
    initial = make_model(100, sgd()).get_weights()
    for npz in ranks:
        single = weights(npz, f"execution_{scenario}_1")
        assert any(not np.array_equal(a, b) for a, b in zip(single, initial))  # it trained
        for got, want in zip(weights(npz, f"execution_{scenario}_4"), single, strict=True):
            np.testing.assert_array_equal(got, want)


DGC_PRESET = {  # Deep Gradient Compression's techniques as `dgc: true` documents them
    "momentum_correction": True,
    "momentum_masking": True,
    "local_clipnorm": 5.0,
    "sparsity_warmup_epochs": 4,
    "dense_1d": True,
}


def mxnet_2bit_pack(codes: np.ndarray) -> np.ndarray:
    """MXNet's layout, byte by byte: entry ``i`` of a 16-entry block sets bits ``0xc0 >> 2(i%4)``
    (``+t``, code 11) or ``0x80 >> 2(i%4)`` (``-t``, code 10) of byte ``i // 4``."""
    padded = np.zeros(-(-len(codes) // 16) * 16, np.uint8)
    padded[: len(codes)] = codes
    out = np.zeros(len(padded) // 4, np.uint8)
    for i, code in enumerate(padded):
        out[i // 4] |= {3: 0xC0, 2: 0x80, 0: 0}[int(code)] >> (2 * (i % 4))
    return out.view(np.int32)


def simulate_workers(
    options: dict,
    workers: int = 2,
    traffic: list | None = None,
    steps_run=range(WIRE_STEPS),
    grads=wire_grads,
    residuals: list[np.ndarray] | None = None,
):
    """A numpy simulation of ``workers`` workers compressing their gradients. Per step, each
    worker (Deep Gradient Compression's Algorithm 1, with each technique a switch):

    1. clips its gradients to the global norm ``local_clipnorm / sqrt(workers)``;
    2. with momentum correction, ``u = m u + g`` and ``u`` is what it accumulates, else ``g``;
    3. sends 1-D variables dense (``dense_1d``); per bucket of the others (fused in order up to
       the fusion threshold), adds its residual and sends: the top ``k`` entries by magnitude
       (``k = ceil(density n)``, the density ``ratio ** ((e + 1) / (W + 1))`` in epoch
       ``e < W`` of a warm-up, then ``ratio``), or those at or above the k-th largest of every
       ``1/topk_sample``-th entry, or those ``>= threshold`` (SINGA); or MXNet's 2bit: ``+t``
       where the sum is ``>= t``, ``-t`` where it is ``<= -t``, else 0. Values may travel as
       float16 (clipped to its range);
    4. keeps what it did not send as its residual (or drops it), and with masking clears the
       velocity of what it sent.

    The reduced gradient is the sum over workers of what was sent, over ``workers``. Returns each
    step's reduced gradients; adds each worker's bytes to ``traffic[rank]``. Worker ``rank``'s
    gradients at ``step`` are ``grads(rank, step)``; ``residuals`` (flat, per worker: zeros if
    not given) are where the workers start, updated in place."""
    on = {**(DGC_PRESET if options.get("dgc") else {}), **options}
    mode, sizes = options["compression"], [int(np.prod(shape)) for shape in WIRE_SHAPES]
    offsets = np.cumsum([0, *sizes])
    dense = [i for i, s in enumerate(WIRE_SHAPES) if on.get("dense_1d") and len(s) <= 1]
    squeezed = [i for i in range(len(WIRE_SHAPES)) if i not in dense]
    buckets = [[squeezed[j] for j in b] for b in fused(options, [WIRE_SHAPES[i] for i in squeezed])]
    if residuals is None:
        residuals = [np.zeros(sum(sizes), "float32") for _ in range(workers)]
    velocities = [np.zeros(sum(sizes), "float32") for _ in range(workers)]
    momentum = options.get("momentum", 0.0) if on.get("momentum_correction") else None
    warmup = on.get("sparsity_warmup_epochs", 0)
    steps = []
    for step in steps_run:
        total = np.zeros(sum(sizes), "float32")
        for rank in range(workers):
            flat = np.concatenate([g.ravel() for g in grads(rank, step)])
            if on.get("local_clipnorm"):
                limit = np.float32(on["local_clipnorm"] / np.sqrt(workers))
                flat = flat * limit / max(np.sqrt(np.sum(flat.astype("float64") ** 2)), limit)
            if momentum is not None:
                velocities[rank] = np.float32(momentum) * velocities[rank] + flat
                flat = velocities[rank].copy()
            for i in dense:
                part = slice(offsets[i], offsets[i + 1])
                total[part] += flat[part]
                if traffic is not None:
                    traffic[rank] += 4 * sizes[i]
            for bucket in buckets:
                part = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in bucket])
                values = flat[part] + (
                    residuals[rank][part] if options.get("residual", True) else 0
                )
                sent = np.zeros_like(values)
                if mode == "2bit":
                    t = np.float32(options["threshold"])
                    sent[values >= t], sent[values <= -t] = t, -t
                    chosen = np.nonzero(sent)[0]
                    nbytes = 4 * -(-len(values) // 16)
                else:
                    chosen = select(options, values, step, warmup)
                    wire = values[chosen]
                    if options.get("value_dtype") == "float16":
                        largest = np.finfo(np.float16).max
                        wire = np.clip(wire, -largest, largest).astype("float16").astype("float32")
                    sent[chosen] = wire
                    nbytes = len(chosen) * (6 if options.get("value_dtype") == "float16" else 8)
                if traffic is not None:
                    traffic[rank] += nbytes
                total[part] += sent
                residuals[rank][part] = values - sent
                if on.get("momentum_masking"):
                    velocities[rank][part[chosen]] = 0
        mean = total / np.float32(workers)
        steps.append([mean[a:b].reshape(s) for a, b, s in zip(offsets, offsets[1:], WIRE_SHAPES)])
    return steps


def select(options: dict, values: np.ndarray, step: int, warmup: int) -> np.ndarray:
    """The positions of ``values`` that topk (with its warm-up, one update an epoch here, or
    ``updates_per_epoch``) or threshold sends."""
    if options["compression"] == "threshold":
        return np.nonzero(np.abs(values) >= options["threshold"])[0]
    epoch = step // options.get("updates_per_epoch", 1)
    density = (
        options["ratio"] ** ((epoch + 1) / (warmup + 1)) if epoch < warmup else options["ratio"]
    )
    stride = round(1 / options.get("topk_sample", 1.0))
    if stride > 1:  # DGC: a sample's k-th
        sample = np.sort(np.abs(values[::stride]))[::-1]
        kth = sample[max(1, int(np.ceil(density * len(sample)))) - 1]
        return np.nonzero(np.abs(values) >= kth)[0]
    k = max(1, int(np.ceil(density * len(values))))
    return np.argsort(-np.abs(values), kind="stable")[:k]


@pytest.mark.parametrize(
    "workers_on, scenario",
    on_the_wire([n for n, o in WIRE.items() if o["compression"] != "fp16"]),
    indirect=["workers_on"],
)
def test_compressed_allreduce_matches_a_simulation_of_the_workers(workers_on, scenario):
    ranks = [arrays for arrays, _ in workers_on]
    for step, expected in enumerate(simulate_workers(WIRE[scenario])):
        for npz in ranks:  # every worker applies the same reduced gradient
            assert_all_close(weights(npz, f"wire_{scenario}_{step}"), expected, rtol=1e-5)
    sent = [np.count_nonzero(g) for g in weights(ranks[0], f"wire_{scenario}_0")]
    assert 0 < sum(sent) < sum(int(np.prod(s)) for s in WIRE_SHAPES)  # compressed, not empty


@pytest.mark.parametrize("workers_on, scenario", on_the_wire(list(WIRE)), indirect=["workers_on"])
def test_traffic_counts_the_bytes_each_worker_sent(workers_on, scenario):
    """Per update, each worker's own bytes: a value (4 or 2 bytes) and an int32 index per
    selected entry, a 32-bit word per 16 entries (2bit), 4 bytes per dense entry, fp16 two
    bytes per entry; against a dense float32 allreduce."""
    infos = [info for _, info in workers_on]
    entries = sum(int(np.prod(s)) for s in WIRE_SHAPES)
    options = WIRE[scenario]
    if options["compression"] == "fp16":
        expected = [WIRE_STEPS * 2 * entries] * 2
    else:
        expected = [0, 0]
        simulate_workers(options, traffic=expected)
    for info, own in zip(infos, expected, strict=True):
        sent, dense = info[f"traffic_{scenario}"]
        assert sent == pytest.approx(own, rel=1e-9) and dense == 4 * entries
    if options["compression"] == "threshold":
        assert expected[0] != expected[1]  # each worker's own count, not their mean


@pytest.mark.parametrize("workers_on", AVERAGING, indirect=True)
@pytest.mark.parametrize("scenario", list(SYNC))
def test_traffic_counts_the_parameters_averaged(workers_on, scenario):
    infos = [info for _, info in workers_on]
    options = SYNC[scenario]
    period = options.get("period", 1)
    parts = fused(options) if options["sync"] == "partial" else [list(range(len(WIRE_SHAPES)))]
    sizes = [4 * int(np.prod(s)) for s in WIRE_SHAPES]
    expected = sum(
        sum(sizes[i] for i in parts[(done // period - 1) % len(parts)])
        for done in range(1, SYNC_STEPS + 1)
        if done % period == 0
    )
    for info in infos:
        assert info[f"traffic_{scenario}"] == [expected, sum(sizes)]


def test_one_worker_sparsifies_alone_without_collectives():
    optimizer = distributed.DistributedOptimizer(
        keras.optimizers.SGD(1.0), **WIRE["topk_per_tensor"]
    )
    variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
    for step, expected in enumerate(simulate_workers(WIRE["topk_per_tensor"], workers=1)):
        for v in variables:
            v.assign(np.zeros(v.shape, "float32"))
        optimizer.apply(wire_grads(0, step), variables)
        assert_all_close([-v.numpy() for v in variables], expected, rtol=1e-6)
    residuals = distributed.compressed_allreduce(optimizer).state()
    assert [r.shape for r in residuals] == list(WIRE_SHAPES) and any(r.any() for r in residuals)


def test_what_was_sent_plus_the_residual_is_every_gradient():
    """Conservation (one worker, so the update is what it sent): over the steps, the updates
    plus the final residual add up to the gradients."""
    optimizer = distributed.DistributedOptimizer(
        keras.optimizers.SGD(1.0), compression="threshold", threshold=0.8
    )
    variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
    for step in range(WIRE_STEPS):
        optimizer.apply(wire_grads(0, step), variables)
    residuals = distributed.compressed_allreduce(optimizer).state()
    for i, v in enumerate(variables):
        total = sum(wire_grads(0, step)[i] for step in range(WIRE_STEPS))
        np.testing.assert_allclose(-v.numpy() + residuals[i], total, rtol=1e-5, atol=1e-5)


def test_fp16_clips_before_the_cast_so_nothing_overflows(two_workers):
    ranks, _, _ = two_workers
    largest = float(np.finfo(np.float16).max)
    for name, clip in (("fp16_saturates", largest / 2), ("fp16_clipped", 0.5)):
        for step in range(WIRE_STEPS):
            sent = [
                [np.clip(g, -clip, clip).astype("float16") for g in wire_grads(rank, step)]
                for rank in range(2)
            ]
            expected = [(a.astype("float32") + b) / 2 for a, b in zip(*sent)]
            got = weights(ranks[0], f"wire_{name}_{step}")
            assert all(np.isfinite(g).all() for g in got), name
            assert_all_close(got, expected, rtol=2e-3, atol=1e-3)
    overflowed = weights(ranks[0], "wire_fp16_saturates_0")[0][2, 3]
    assert 16_000 < overflowed < 16_500  # (65504 / 2 + a normal draw) / 2, not inf


@pytest.mark.parametrize(
    "sparse, dense",
    [
        ("topk_all", "sgd"),
        ("threshold_all", "sgd"),
        ("sparse_topk_all", "sparse"),  # an Embedding model: IndexedSlices made dense first
        ("sparse_threshold_all", "sparse"),
        ("topk_all_accumulate2", "accumulate2"),
        ("mixed_topk_all", "mixed_plain"),
    ],
)
def test_sparse_modes_selecting_everything_are_the_dense_allreduce(two_workers, sparse, dense):
    for npz in two_workers[0]:
        assert_all_close(weights(npz, sparse), weights(npz, dense), rtol=1e-6, atol=1e-7)


def test_mixed_precision_skips_a_step_that_is_non_finite_on_one_worker(two_workers):
    ranks, infos, _ = two_workers
    for npz in ranks:
        assert_all_close(
            weights(npz, "mixed_skipped"), weights(npz, "mixed_initial"), rtol=0, atol=0
        )
    assert [i["mixed_scale_after_skip"] for i in infos] == [2.0**14, 2.0**14]
    assert_all_close(weights(ranks[0], "mixed"), weights(ranks[0], "sgd"), atol=2e-2)


def test_metric_averaging_reports_the_mean_of_the_workers(two_workers):
    _, infos, _ = two_workers
    local = [i["local_logs"] for i in infos]
    assert local[0][0]["loss"] != local[1][0]["loss"]  # different shards
    for info in infos:
        averaged = info["history"]["loss"]
        means = [(a["loss"] + b["loss"]) / 2 for a, b in zip(*local)]
        np.testing.assert_allclose(averaged, means, rtol=1e-6)
    assert infos[0]["history"] == infos[1]["history"]


@pytest.mark.parametrize(
    "scenario, passes",
    [("noise", 1), ("noise_accumulate", 2), ("noise_mixed", 1), ("noise_topk", 1)],
)
def test_noise_meter_measures_each_workers_and_the_averaged_gradient(two_workers, scenario, passes):
    """With a sparsified allreduce too: the noise scale needs the mean gradient, not the sparse
    one the update applies."""
    ranks, infos, _ = two_workers
    local = [  # each rank's gradient for the update: the mean over its accumulated passes
        np.mean(
            [
                np.concatenate([g.ravel() for g in weights(r, f"{scenario}_grads{p}")])
                for p in range(passes)
            ],
            axis=0,
        )
        for r in ranks
    ]
    small_sq = np.mean([g @ g for g in local])  # |G_small|², averaged over the workers
    big_sq = np.mean(local, axis=0) @ np.mean(local, axis=0)  # |G_big|²: the allreduced one
    for info in infos:
        update, got_small, got_big = info[scenario]
        assert update == 1
        assert got_small == pytest.approx(small_sq, rel=1e-5)
        assert got_big == pytest.approx(big_sq, rel=1e-5)
    assert small_sq > big_sq  # different gradients per worker: the average is shorter


def test_noise_meter_sees_the_unscaled_gradients_under_mixed_precision(two_workers):
    _, infos, _ = two_workers
    for info in infos:  # same gradients, loss-scaled by 2**15 in the mixed scenario
        assert info["noise_mixed"] == pytest.approx(info["noise"], rel=1e-6)


def test_model_saved_by_rank0_loads_with_the_unwrapped_optimizer(two_workers):
    ranks, _, out = two_workers
    restored = keras.models.load_model(out / "fit.keras")
    assert type(restored.optimizer) is SGD
    assert "_clip_gradients" not in vars(restored.optimizer)
    assert int(restored.optimizer.iterations) == 2 * 256 // 16
    assert_all_close(restored.get_weights(), weights(ranks[0], "fit"), rtol=0, atol=0)


# --- one process ----------------------------------------------------------------------------


def test_single_process_without_horovodrun(tmp_path):
    assert distributed.size() == 1 and distributed.rank() == 0
    assert distributed.local_rank() == 0 and distributed.is_rank0()
    assert distributed.allreduce_mean(2.5) == 2.5
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model = make_model(1, optimizer)
    assert model.optimizer is optimizer and type(optimizer) is keras.optimizers.SGD
    x, y = global_data()
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=1,
        verbose=0,
        callbacks=[
            distributed.BroadcastInitialState(),
            distributed.MetricAverageCallback(),
        ],
    )
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    assert type(restored.optimizer) is keras.optimizers.SGD
    assert int(restored.optimizer.iterations) == len(x) // 32
    assert_all_close(
        [v.numpy() for v in restored.optimizer.variables],
        [v.numpy() for v in optimizer.variables],
        rtol=0,
        atol=0,
    )


@pytest.fixture
def allreduce_executions(monkeypatch):
    """Counts executed (not traced) ``grouped_allreduce`` calls, also inside tf.function."""
    executions = []
    real = distributed._engine().grouped_allreduce

    def counting(tensors, **kwargs):
        tf.py_function(lambda: executions.append(1) or 0, [], tf.int32)
        return real(tensors, **kwargs)

    monkeypatch.setattr(distributed._engine(), "grouped_allreduce", counting)
    return executions


def test_one_process_adds_no_allreduce(allreduce_executions):
    model = make_model(1, sgd(), compression="fp16", backward_passes_per_step=2)
    x, y = global_data()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert "_clip_gradients" not in vars(model.optimizer)
    assert allreduce_executions == []


def test_accumulating_two_steps_is_one_step_on_their_mean_with_one_allreduce(
    monkeypatch, allreduce_executions
):
    """Pretending size 2 over the real size-1 Horovod installs the hook; the allreduce is then
    an identity, so this checks where it runs: once per update, after accumulation."""
    distributed.init()
    monkeypatch.setattr(distributed, "size", lambda: 2)
    model = make_model(1, sgd(), backward_passes_per_step=2)
    x, y = global_data()
    for step in range(4):
        rows = slice(step * 16, (step + 1) * 16)
        model.train_on_batch(x[rows], y[rows])
    assert len(allreduce_executions) == 2
    assert int(model.optimizer.iterations) == 2
    once = make_model(1, sgd())
    for step in range(2):
        rows = slice(step * 32, (step + 1) * 32)
        once.train_on_batch(x[rows], y[rows])
    assert_all_close(model.get_weights(), once.get_weights(), rtol=1e-5, atol=1e-6)


def test_check_model_refuses_xla_and_a_loss_scale_optimizer_outside(monkeypatch):
    distributed.init()
    monkeypatch.setattr(distributed, "size", lambda: 2)
    model = make_model(1, sgd())
    distributed.check_model(model)
    model.compile(optimizer=model.optimizer, loss="mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        distributed.check_model(model)

    keras.config.set_dtype_policy("mixed_float16")
    try:  # compile wraps the distributed optimizer in a LossScaleOptimizer itself
        model = make_model(1, sgd())
        with pytest.raises(ValueError, match="wrap the other way round"):
            distributed.check_model(model)
        model = make_model(1, keras.optimizers.LossScaleOptimizer(sgd()))
        distributed.check_model(model)
    finally:
        keras.config.set_dtype_policy("float32")


def test_argument_errors():
    with pytest.raises(ValueError, match="batch_scale"):
        distributed.DistributedOptimizer(LBSGD(batch_scale=2), backward_passes_per_step=2)
    with pytest.raises(ValueError, match="compression: Input should be"):
        distributed.DistributedOptimizer(sgd(), compression="int8")
    with pytest.raises(ValueError, match="integer >= 1"):
        distributed.DistributedOptimizer(sgd(), backward_passes_per_step=0)


def test_without_horovod_it_is_one_process(monkeypatch, caplog):
    """A copy of the module imported while ``horovod.tensorflow`` cannot be imported."""
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    spec = importlib.util.spec_from_file_location(
        "distributed_without_horovod", ROOT / "toolkit" / "parallel" / "distributed.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with caplog.at_level(logging.WARNING):
        assert (module.size(), module.rank(), module.local_rank()) == (1, 0, 0)
    assert caplog.text.count("running as a single process") == 1  # said once
    optimizer = sgd()
    assert module.DistributedOptimizer(optimizer) is optimizer
    assert module.allreduce_mean(np.array([1.0, 3.0])).tolist() == [1.0, 3.0]
    monkeypatch.setenv("HOROVOD_RANK", "1")
    with pytest.raises(RuntimeError, match="started by horovodrun"):
        module.init()


# --- GPU placement (the rule; tests/test_gpu.py runs it on GPUs) -------------------------


@pytest.mark.parametrize(
    "local_rank, local_size, gpus, expected",
    [
        (0, 1, [], None),
        (1, 2, [], None),
        (0, 4, ["g0", "g1", "g2", "g3"], "g0"),
        (3, 4, ["g0", "g1", "g2", "g3"], "g3"),
        (2, 4, ["bound"], "bound"),  # a scheduler gave each process its own GPU
        (1, 2, ["g0", "g1", "g2", "g3"], "g1"),
    ],
)
def test_each_worker_takes_the_gpu_its_local_rank_names(local_rank, local_size, gpus, expected):
    assert devices.gpu_for_worker(local_rank, local_size, gpus) == expected


def test_more_workers_than_gpus_share_them_with_a_warning(caplog):
    gpus = ["g0", "g1"]
    with caplog.at_level(logging.WARNING, logger=distributed.__name__):
        taken = [devices.gpu_for_worker(rank, 3, gpus) for rank in range(3)]
    assert taken == ["g0", "g1", "g0"]
    assert "3 workers on this host share its 2 GPUs; NCCL refuses two ranks" in caplog.text


def test_a_compressed_update_with_the_noise_meter_never_calls_back_into_python(monkeypatch):
    """Everything an update does per step is graph ops: the DGC allreduce, its state and the
    noise meter's counters and norms (read only when a callback logs them). A Python callback
    in the step would cost a host round trip on every update of a GPU."""
    distributed.init()
    monkeypatch.setattr(distributed, "size", lambda: 2)  # installs the hook over real Horovod
    meter = noise_meter.GradientNoiseMeter(every=2)
    optimizer = distributed.DistributedOptimizer(
        SGD(0.1, momentum=0.9),
        compression="topk",
        ratio=0.1,
        dgc=True,
        updates_per_epoch=4,
        noise_meter=meter,
    )
    variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
    optimizer.build(variables)
    step = tf.function(lambda grads: optimizer.apply(grads, variables))
    specs = [tf.TensorSpec(shape, tf.float32) for shape in WIRE_SHAPES]
    graph = step.get_concrete_function(specs).graph.as_graph_def()
    ops = {node.op for node in graph.node}
    ops |= {node.op for function in graph.library.function for node in function.node_def}
    hook = {"HorovodGroupedAllgather", "HorovodGroupedAllreduce", "TopKV2"}
    assert hook <= ops  # the hook is there
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


# --- elastic's state on two workers (toolkit.parallel.elastic) ---------------------------


def test_two_workers_sync_to_rank0s_state(two_workers):
    ranks, infos, _ = two_workers
    synced = [weights(r, "elastic_synced") for r in ranks]
    assert all(np.array_equal(a, b) for a, b in zip(*synced, strict=True))
    assert [i["elastic_synced"]["epoch"] for i in infos] == [0, 0]
    assert [i["elastic_synced"]["meter_updates"] for i in infos] == [0, 0]
    want = Smoother(decay=0.9)
    want.update(1.0, 2.0)  # rank 0's
    assert all(Smoother(**i["elastic_synced"]["smoother"]) == want for i in infos)


def test_two_workers_commit_gathers_every_workers_residual(two_workers):
    ranks, _, _ = two_workers
    own = [weights(r, "elastic_residual_committed") for r in ranks]
    assert not all(np.array_equal(a, b) for a, b in zip(*own, strict=True))  # per worker
    for r in ranks:  # every worker holds the same table: rank 0's row, then rank 1's
        assert all(
            np.array_equal(a, b)
            for a, b in zip(weights(r, "elastic_residual_table"), own[0] + own[1], strict=True)
        )


def test_two_workers_restore_the_commit_and_replay_to_the_bit(two_workers):
    ranks, infos, _ = two_workers
    for r, info in zip(ranks, infos, strict=True):
        committed, restored = weights(r, "elastic_committed"), weights(r, "elastic_restored")
        assert not all(np.array_equal(a, b) for a, b in zip(committed, weights(r, "elastic_ahead")))
        assert all(np.array_equal(a, b) for a, b in zip(restored, committed, strict=True))
        assert all(
            np.array_equal(a, b)
            for a, b in zip(
                weights(r, "elastic_residual_restored"),
                weights(r, "elastic_residual_committed"),
                strict=True,
            )
        )
        replayed, ahead = weights(r, "elastic_replayed"), weights(r, "elastic_ahead")
        assert all(np.array_equal(a, b) for a, b in zip(replayed, ahead, strict=True))
        assert (info["elastic_restored"]["epoch"], info["elastic_restored"]["batch"]) == (1, 2)
        assert Smoother(**info["elastic_restored"]["smoother"]).count == 1
