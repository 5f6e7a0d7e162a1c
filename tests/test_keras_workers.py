"""toolkit.parallel.distributed on Keras's PyTorch and JAX backends: Horovod's PyTorch allreduce
in Keras's train step, and JAX's collectives in its step mapped over the workers, under real
``horovodrun`` with 2 Gloo workers on this machine. The worker script
(tests/workers/keras_workers.py) also runs alone, one process taking each global batch whole:
the oracle the two workers are held to. Cost: about 40 s a backend (two runs of the script)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import weights
from test_distributed import assert_all_close

from toolkit import backends


def test_the_workers_are_two_and_talk_through_their_backends_horovod(keras_workers):
    two, alone = keras_workers
    infos = [info for _, info in two]
    assert [i["size"] for i in infos] == [2, 2] and alone[0][1]["size"] == 1
    assert [i["mean_rank"] for i in infos] == [0.5, 0.5]
    assert [i["rows"] for i in infos] == [[[0, 0], [1, 10]]] * 2
    assert [i["from_rank0"] for i in infos] == ["rank 0", "rank 0"]
    horovod = backends.of(infos[0]["backend"]).horovod_module  # one Horovod per process
    assert [i["horovods_started"] for i in infos] == [[horovod]] * 2


@pytest.mark.parametrize("scenario", ["sgd", "accumulate2", "fp16", "lars", "mixed", "fit"])
def test_workers_started_with_different_seeds_end_identical(keras_workers, scenario):
    (rank0, _), (rank1, _) = keras_workers[0]
    for a, b in zip(weights(rank0, scenario), weights(rank1, scenario), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scenario", ["sgd", "accumulate2", "lars"])
def test_two_workers_of_batch_b_equal_one_worker_of_batch_2b(keras_workers, scenario):
    """Each rank reads its own half of every global batch (LARS: its trust ratios from the
    averaged gradient; accumulate2: each update averages 2 passes of each worker)."""
    (rank0, _), _ = keras_workers[0]
    ((alone, _),) = keras_workers[1]
    assert_all_close(weights(rank0, scenario), weights(alone, scenario), rtol=1e-5, atol=1e-6)


def test_without_the_averaging_the_workers_drift_apart_from_the_run(keras_workers):
    """The shards differ: the same start trained on each rank's own half, not averaged, ends
    differently on each rank and differently from the averaged run."""
    (rank0, _), (rank1, _) = keras_workers[0]
    for own in (rank0, rank1):
        assert any(
            not np.allclose(a, b, rtol=1e-3)
            for a, b in zip(weights(own, "unaveraged"), weights(rank0, "sgd"), strict=True)
        )
    assert any(
        not np.allclose(a, b, rtol=1e-3)
        for a, b in zip(weights(rank0, "unaveraged"), weights(rank1, "unaveraged"), strict=True)
    )


def test_fp16_compression_stays_close_but_is_applied(keras_workers):
    (rank0, _), _ = keras_workers[0]
    fp16, full = weights(rank0, "fp16"), weights(rank0, "sgd")
    assert_all_close(fp16, full, rtol=1e-2, atol=1e-3)
    assert any(not np.array_equal(a, b) for a, b in zip(fp16, full, strict=True))


def test_a_step_non_finite_on_one_worker_is_skipped_by_every_worker(keras_workers):
    for rank, _ in keras_workers[0]:
        initial, skipped = weights(rank, "mixed_initial"), weights(rank, "mixed_skipped")
        for a, b in zip(initial, skipped, strict=True):
            np.testing.assert_array_equal(a, b)
        assert any(
            not np.array_equal(a, b)
            for a, b in zip(initial, weights(rank, "mixed"), strict=True)
        )  # fmt: skip


def test_the_noise_meter_measures_each_workers_norm_and_the_averaged_ones(keras_workers):
    """Its norms against numpy's, from each rank's batches: the model's gradient is the mean
    of a batch's rows (tests/workers/keras_workers.py); measured every 2nd of 4 updates, so
    the last reading is the 4th update's."""
    (rank0, info0), (rank1, info1) = keras_workers[0]
    last = [weights(r, "noise_batch3")[0].astype(np.float64).mean(axis=0) for r in (rank0, rank1)]
    small = np.mean([np.sum(g**2) for g in last])
    big = np.sum(((last[0] + last[1]) / 2) ** 2)
    for info in (info0, info1):
        update, small_sq, big_sq = info["noise"]
        assert update == 4
        np.testing.assert_allclose([small_sq, big_sq], [small, big], rtol=1e-5)
        sent, dense = info["traffic"]
        assert dense == 4 * last[0].size and sent == 4 * dense  # 4 float32 allreduces


def test_fit_broadcasts_the_initial_state_and_averages_the_epoch_logs(keras_workers):
    (_, info0), (_, info1) = keras_workers[0]
    assert info0["history"] == info1["history"]
    for epoch, logs in enumerate(info0["history"]["loss"]):
        local = [info["local_logs"][epoch]["loss"] for info in (info0, info1)]
        assert local[0] != local[1]  # each rank's own shard
        np.testing.assert_allclose(logs, np.mean(local), rtol=1e-6)
