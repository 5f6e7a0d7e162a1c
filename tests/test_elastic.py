"""toolkit.parallel.elastic: the elastic state's save, restore and sync on one worker (this
process; on two, the shared ``horovodrun -np 2`` run of tests/workers/two_workers.py, in
test_distributed.py, whose worker builds that run once); the rule
that deals committed residuals out to a new number of workers, against numpy; and a real elastic
``horovodrun`` on two hosts of the namespace cluster that loses one host's worker mid-epoch and
ends where one process taking the same global batches ends (tests/workers/elastic_worker.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
from conftest import ROOT, run_workers

from toolkit.launching import cluster
from toolkit.optimizers import SGD
from toolkit.parallel import distributed, elastic
from toolkit.parallel.collective_errors import collective_failed
from toolkit.parallel.compression import reshard_residuals as reshard
from toolkit.scaling.noise_scale import Smoother


def residual_rows(workers: int, shapes=((3, 2), (4,)), seed=0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=s).astype("float32") for s in shapes] for _ in range(workers)]


# --- reshard ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3), (4, 1), (1, 3)])
def test_reshard_keeps_the_update_owed_when_the_world_changes(before, after):
    """What the allreduce still owes the model is the workers' mean residual; a departed
    worker's share of it is spread over the others, not dropped."""
    rows = residual_rows(before)
    dealt = reshard(rows, after)
    assert len(dealt) == after
    for i in range(2):
        owed_before = sum(r[i].astype(np.float64) for r in rows) / before
        owed_after = sum(r[i].astype(np.float64) for r in dealt) / after
        np.testing.assert_allclose(owed_after, owed_before, rtol=1e-6, atol=1e-7)
        assert all(r[i].dtype == np.float32 and r[i].shape == rows[0][i].shape for r in dealt)


def test_reshard_to_the_same_world_gives_each_rank_its_own_row():
    rows = residual_rows(3)
    dealt = reshard(rows, 3)
    for got, want in zip(dealt, rows, strict=True):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_reshard_of_nothing_committed_is_nothing():
    assert reshard([[], []], 3) == [[], [], []]
    assert reshard([], 2) == [[], []]


# --- one worker -------------------------------------------------------------------------------


def one_worker_model(seed=1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(
        optimizer=distributed.DistributedOptimizer(
            SGD(0.1, momentum=0.9), compression="topk", ratio=0.2
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model


def fit_steps(model, steps, first=0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    for step in range(first, first + steps):
        model.train_on_batch(x[8 * step : 8 * step + 8], y[8 * step : 8 * step + 8])


def values(model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in [*model.weights, *model.optimizer.variables]]


def test_one_worker_restore_undoes_everything_since_the_commit_and_replays_to_the_bit():
    model = one_worker_model()
    smoother = Smoother(decay=0.9)
    state = elastic.TrainingState(model, smoother=smoother, epoch=0, batch=0)
    fit_steps(model, 2)
    smoother.update(3.0, 4.0)
    state.epoch, state.batch = 0, 2
    state.commit()
    committed, residual = values(model), distributed.compressed_allreduce(model.optimizer).state()
    assert any(np.any(r != 0) for r in residual)  # topk left something behind
    assert [len(row) for row in state.residuals] == [len(residual)]

    fit_steps(model, 3, first=2)
    ahead = values(model)
    smoother.update(50.0, 60.0)
    state.epoch, state.batch = 1, 5
    state.restore()

    assert (state.epoch, state.batch) == (0, 2)
    committed_smoother = Smoother(decay=0.9)
    committed_smoother.update(3.0, 4.0)
    assert smoother == committed_smoother
    assert all(np.array_equal(a, b) for a, b in zip(values(model), committed, strict=True))
    restored = distributed.compressed_allreduce(model.optimizer).state()
    assert all(np.array_equal(a, b) for a, b in zip(restored, residual, strict=True))
    fit_steps(model, 3, first=2)
    assert all(np.array_equal(a, b) for a, b in zip(values(model), ahead, strict=True))


def test_one_worker_sync_is_a_commit_of_what_it_holds():
    model = one_worker_model()
    state = elastic.TrainingState(model, epoch=3)
    fit_steps(model, 1)
    state.sync()
    synced = values(model)
    fit_steps(model, 1, first=1)
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(values(model), synced, strict=True))
    assert state.epoch == 3


def test_a_state_is_built_without_collectives_and_builds_the_optimizer():
    """A worker that joins builds its state alone, while the others wait in the sync."""
    model = one_worker_model()
    assert not model.optimizer.built
    state = elastic.TrainingState(model)
    assert model.optimizer.built and state.residuals == []


@pytest.mark.parametrize(
    "message, lost",
    [
        (  # a named collective (the noise meter's) whose peer was killed: no op name says Horovod
            "Graph execution error:\n\nDetected at node LARS/cond/noise_small_sq ...\n"
            "[/tmp/pip-wheel/horovod/third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:589]"
            " Read error [10.213.0.12]:42123: Connection reset by peer\n"
            "\t [[{{node LARS/cond/noise_small_sq}}]] [Op:__inference_multi_step_on_iterator_1406]",
            True,
        ),
        (
            "{{function_node __wrapped__HorovodGroupedAllreduce_...}} Horovod has been shut down",
            True,
        ),
        ("Incompatible shapes: [32,10] vs. [64,10] [[{{node add}}]]", False),
    ],
)
def test_a_failed_collective_is_a_lost_worker_whatever_its_name(message, lost):
    """What a survivor sees when a peer dies mid-collective: every Horovod op's failure counts
    as a lost worker (the run resets and goes on), any other error is training's own."""
    assert collective_failed(message) is lost


def test_the_committer_counts_on_from_a_resumed_batch_and_commits_every_n_and_at_epoch_end():
    model = one_worker_model()
    state = elastic.TrainingState(model, epoch=2, batch=4)  # a fit resuming epoch 2 after 4 batches
    commits = []
    state.commit = lambda: commits.append((state.epoch, state.batch))  # a spy: it saves nothing
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype("float32"), rng.integers(0, 2, 32)
    model.fit(  # 8 more batches of 4: batches 5 .. 12 of the epoch
        x,
        y,
        batch_size=4,
        initial_epoch=2,
        epochs=3,
        verbose=0,
        callbacks=[elastic.Committer(state, every_steps=3)],
    )
    assert commits == [(2, 6), (2, 9), (2, 12), (3, 0)]
    assert (state.epoch, state.batch) == (3, 0)
    with pytest.raises(ValueError, match="every_steps must be >= 1"):
        elastic.Committer(state, every_steps=0)


def test_an_elastic_worker_always_reduces_even_alone(monkeypatch):
    """It may grow, so the allreduce is there with one worker, and a sparsified one averages
    over the workers there are as the step runs; the modes that depend on a fixed number of
    workers are refused, naming them."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    assert distributed.elastic() and distributed.size() == 1
    optimizer = distributed.DistributedOptimizer(SGD(0.1))
    assert distributed.traffic(optimizer) is not None  # the allreduce hook is installed
    sparse = distributed.DistributedOptimizer(SGD(0.1), compression="topk")
    assert callable(distributed.compressed_allreduce(sparse).workers)  # Horovod's, at run time
    for options in ({"compression": "fp16"}, {"sync": "local_sgd"}, {"sync": "partial"}):
        with pytest.raises(ValueError, match="an elastic run averages gradients"):
            distributed.DistributedOptimizer(SGD(0.1), **options)
    monkeypatch.delenv("HOROVOD_ELASTIC")
    assert distributed.traffic(distributed.DistributedOptimizer(SGD(0.1))) is None
    assert (
        distributed.compressed_allreduce(
            distributed.DistributedOptimizer(SGD(0.1), compression="topk")
        ).workers
        == 1
    )


# --- a world that changes, under elastic horovodrun on the namespace cluster ---------------------

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from elastic_worker import (  # noqa: E402
    COMMIT_EVERY,
    DIE_AT,
    EPOCHS,
    GROW_AT,
    SPARSE,
    SPARSE_COMMIT_EVERY,
    SPARSE_DIE_AT,
    SPARSE_STEPS,
    STEPS_PER_EPOCH,
    VANISH_AT,
)
from scenarios import GLOBAL_BATCH, WIRE_SHAPES, global_data, make_model, sgd, wire_grads  # noqa: E402
from test_distributed import simulate_workers  # noqa: E402


def elastic_run(out, env, scenario: str, first_hosts: list[str], host: str, *options: str):
    """tests/workers/elastic_worker.py SCENARIO HOST under elastic horovodrun, one slot per host,
    the hosts read from ``out/hosts`` by the discovery script (and horovodrun's ``options``);
    each rank's steps and weights."""
    (out / "hosts").write_text("".join(f"{h}:1\n" for h in first_hosts))
    discover = out / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {out / 'hosts'}\n")
    discover.chmod(0o755)
    elastic = ["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discover)]
    result = run_workers(
        "elastic_worker.py",
        out,
        env,
        *elastic,
        "--network-interfaces",
        cluster.INTERFACE,
        *options,
        workers=len(first_hosts),
        args=(scenario, host),
        timeout=300,
    )
    ranks = {}
    for path in sorted(out.glob("rank*.json")):
        with np.load(path.with_suffix(".npz")) as saved:
            final = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        ranks[int(path.stem[4:])] = (json.loads(path.read_text()), final)
    return ranks, result.stdout


@pytest.fixture(scope="module")
def lost_worker(cluster_hosts, tmp_path_factory, subprocess_env):
    """Two hosts; the worker on the second is killed mid-epoch."""
    out = tmp_path_factory.mktemp("lose")
    return elastic_run(out, subprocess_env, "lose", cluster_hosts[:2], cluster_hosts[1])


@pytest.fixture(scope="module")
def grown_worker(cluster_hosts, tmp_path_factory, subprocess_env):
    """One host; the second is added to the discovery output mid-epoch."""
    out = tmp_path_factory.mktemp("grow")
    return elastic_run(out, subprocess_env, "grow", cluster_hosts[:1], cluster_hosts[1])


@pytest.fixture(scope="module")
def vanished_host(cluster_hosts, tmp_path_factory, subprocess_env):
    """Two hosts; the second one's link is cut mid-epoch (no TCP reset reaches anyone), and
    mended once the run is over."""
    out = tmp_path_factory.mktemp("vanish")
    survivor_host, vanishing = cluster_hosts[:2]

    def cut_when_ready():
        deadline = time.monotonic() + 240
        while not (out / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["ip", "link", "set", vanishing, "down"], check=True)

    cutter = threading.Thread(target=cut_when_ready, daemon=True)
    cutter.start()
    try:
        return elastic_run(
            out, subprocess_env, "vanish", [survivor_host, vanishing], vanishing, GLOO_TIMEOUT
        )
    finally:
        cutter.join(5)
        subprocess.run(["ip", "link", "set", vanishing, "up"], check=True)


@pytest.fixture(scope="module")
def sparse_worker(cluster_hosts, tmp_path_factory, subprocess_env):
    """Two hosts sparsifying with error feedback; the worker on the second is killed."""
    out = tmp_path_factory.mktemp("sparse")
    return elastic_run(out, subprocess_env, "sparse", cluster_hosts[:2], cluster_hosts[1])


def one_process_weights() -> list[np.ndarray]:
    """Rank 0's start (the first sync gives it to every worker), trained on every global
    batch in order by one process."""
    x, y = global_data()
    model = make_model(100, sgd())
    for _ in range(EPOCHS):
        for step in range(STEPS_PER_EPOCH):
            rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
            model.train_on_batch(x[rows], y[rows])
    return model.get_weights()


def assert_weights_equal_one_process(final: list[np.ndarray]) -> None:
    want = one_process_weights()
    assert len(final) == len(want) > 0
    for got, expected in zip(final, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


EVERY_STEP = [(e, b) for e in range(EPOCHS) for b in range(STEPS_PER_EPOCH)]
GLOO_TIMEOUT = "--gloo-timeout-seconds=10"  # how long a collective waits on a silent peer


def test_a_lost_worker_does_not_end_the_run(lost_worker):
    ranks, stdout = lost_worker
    assert re.search(r"Process \d exit with status code 255", stdout)  # ssh's: it was killed
    assert list(ranks) == [0]  # the survivor, rank 0 of the world it ended in
    survivor, _ = ranks[0]
    last_commit = (DIE_AT[0], DIE_AT[1] // COMMIT_EVERY * COMMIT_EVERY)
    starts = [tuple(s) for s in survivor["starts"]]
    assert starts == [(0, 0, 2), (1, 0, 2), (*last_commit, 1), (2, 0, 1)]
    ran = [tuple(r) for r in survivor["ran"]]
    repeated = [(last_commit[0], b) for b in range(last_commit[1], DIE_AT[1])]
    assert sorted((e, b) for e, b, _ in ran) == sorted(EVERY_STEP + repeated)
    worlds = [w for _, _, w in ran]
    alone = worlds.index(1)  # two workers up to the loss, then one, from the last commit
    assert set(worlds[:alone]) == {2} and set(worlds[alone:]) == {1}
    assert ran[alone - 1][:2] == (DIE_AT[0], DIE_AT[1] - 1) and ran[alone][:2] == last_commit


def test_a_run_that_lost_a_worker_ends_as_one_process_on_the_same_global_batches(lost_worker):
    """The global batch is fixed: the survivor takes the whole batch the two shared, so the
    steps (the three replayed after the restore included) are one process's steps."""
    ranks, _ = lost_worker
    assert_weights_equal_one_process(ranks[0][1])


def test_a_host_added_to_the_discovery_joins_at_the_next_commit_and_nothing_is_lost(grown_worker):
    ranks, _ = grown_worker
    assert sorted(ranks) == [0, 1]
    (first, _), (joiner, _) = ranks[0], ranks[1]
    ran = [tuple(r) for r in first["ran"]]
    assert sorted((e, b) for e, b, _ in ran) == EVERY_STEP  # no step lost or repeated
    worlds = [w for _, _, w in ran]
    grown = worlds.index(2)
    assert set(worlds[:grown]) == {1} and set(worlds[grown:]) == {2}
    at = ran[grown][:2]
    assert at > GROW_AT and at[1] % COMMIT_EVERY == 0  # at a commit after the host was added
    assert [tuple(s) for s in joiner["starts"]][0] == (*at, 2)  # it starts where the state is
    assert [tuple(r) for r in joiner["ran"]] == ran[grown:]


def test_a_grown_run_ends_as_one_process_on_the_same_global_batches(grown_worker):
    ranks, _ = grown_worker
    for _, final in ranks.values():
        assert_weights_equal_one_process(final)


def test_sparse_residuals_survive_a_lost_worker_as_their_mean(sparse_worker):
    """The survivor goes on from the last commit with the mean of both workers' committed
    residuals, so what the departed worker had not yet sent is still owed to the model. A
    numpy simulation of the workers (tests/test_distributed.py's) gives the expected parameters
    and residual: two workers up to the commit, then one, starting from the mean residual."""
    ranks, _ = sparse_worker
    assert list(ranks) == [0]
    survivor, saved = ranks[0]
    commit = SPARSE_DIE_AT // SPARSE_COMMIT_EVERY * SPARSE_COMMIT_EVERY
    assert [tuple(s) for s in survivor["starts"]] == [(0, 2), (commit, 1)]
    assert [tuple(r) for r in survivor["ran"]] == [
        *((step, 2) for step in range(SPARSE_DIE_AT)),
        *((step, 1) for step in range(commit, SPARSE_STEPS)),
    ]

    residuals = [np.zeros(sum(int(np.prod(s)) for s in WIRE_SHAPES), "float32") for _ in "ab"]
    together = simulate_workers(SPARSE, 2, steps_run=range(commit), residuals=residuals)
    alone = [(residuals[0] + residuals[1]) / 2]  # the rule: the departed worker's is shared

    def both_halves(rank, step):
        return [(a + b) / 2 for a, b in zip(wire_grads(0, step), wire_grads(1, step))]

    after = simulate_workers(
        SPARSE, 1, steps_run=range(commit, SPARSE_STEPS), grads=both_halves, residuals=alone
    )
    parameters = [-sum(step[i] for step in together + after) for i in range(len(WIRE_SHAPES))]
    got_parameters, got_residuals = saved[: len(WIRE_SHAPES)], saved[len(WIRE_SHAPES) :]
    for got, want in zip(got_parameters, parameters, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got_flat = np.concatenate([r.ravel() for r in got_residuals])
    np.testing.assert_allclose(got_flat, alone[0], rtol=1e-5, atol=1e-5)
    assert np.abs(alone[0]).sum() > 0  # something was still owed


def test_a_host_that_vanishes_is_lost_at_the_collectives_timeout_and_the_run_goes_on(
    vanished_host,
):
    """Its link cut, the host's worker lives on but nothing reaches it, and no connection is
    reset: the survivor's collective times out (Gloo's timeout) and the run goes on alone
    from the last commit, ending with one process's weights. That needs the driver to see the
    worker's ssh session end (the cluster's ssh keepalives), or the survivor's reset waits."""
    ranks, _ = vanished_host
    assert list(ranks) == [0]
    survivor, final = ranks[0]
    ran = [tuple(r) for r in survivor["ran"]]
    worlds = [w for _, _, w in ran]
    alone = worlds.index(1)
    assert set(worlds[:alone]) == {2} and set(worlds[alone:]) == {1}
    resumed_at, lost_after = ran[alone][:2], ran[alone - 1][:2]
    assert resumed_at[1] % COMMIT_EVERY == 0  # the last commit before the link was cut
    assert (VANISH_AT[0], VANISH_AT[1] - 1) <= lost_after
    repeated = [s for s in EVERY_STEP if resumed_at <= s <= lost_after]
    assert sorted((e, b) for e, b, _ in ran) == sorted(EVERY_STEP + repeated)
    assert_weights_equal_one_process(final)
