"""Run under ``horovodrun --min-np 1 --max-np 2`` with one slot per host, hosts from the
discovery script: an elastic fit at a fixed global batch whose world changes mid-run.

- ``lose HOST``: two hosts; the worker on ``HOST`` kills itself (SIGKILL, as a preempted
  machine would) before batch ``DIE_AT``, and the other goes on alone.
- ``grow HOST``: one host at first; before batch ``GROW_AT`` rank 0 appends ``HOST:1`` to
  ``OUT/hosts`` (what the discovery script prints), and a worker started there joins at a
  commit. Steps are slowed to ``SLOW_STEP_S`` so that training is still going when it does.
- ``vanish HOST``: two hosts; steps are slowed to ``SLOW_STEP_S``, and before batch
  ``VANISH_AT`` the workers write ``OUT/ready``, for the test to cut ``HOST``'s link: its
  worker lives on, unreachable, and the other learns of it by a collective's timeout.
- ``sparse HOST``: two hosts, a top-k allreduce with error feedback applying known gradients
  with SGD (rate 1) to zeros, for ``SPARSE_STEPS`` steps; the worker on ``HOST`` dies before
  step ``SPARSE_DIE_AT``. A worker's gradient is its share of the two halves of
  ``wire_grads(0, step)`` and ``wire_grads(1, step)``: its own half with two workers, their
  mean alone. The survivor also saves its residuals, so the test can follow them through the
  reset.

Step ``s`` of an epoch is global rows ``s*B .. (s+1)*B`` (``B = GLOBAL_BATCH``), split evenly
over the workers there are, so the run sees the same global batches as one process taking
them whole. At the end each worker writes ``OUT/rank<r>.json`` (every step it ran, with the
world size, and where each ``fit`` call started) and ``OUT/rank<r>.npz`` (its final weights).

    python elastic_worker.py OUT lose|grow|vanish|sparse HOST
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from toolkit.parallel import distributed, elastic

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import GLOBAL_BATCH, WIRE_SHAPES, global_data, make_model, sgd, wire_grads

EPOCHS, COMMIT_EVERY = 3, 5
DIE_AT = (1, 8)  # (epoch, batch): three batches after the commit at batch 5
GROW_AT, SLOW_STEP_S, VANISH_AT = (0, 6), 0.1, (1, 2)
SPARSE, SPARSE_STEPS, SPARSE_COMMIT_EVERY, SPARSE_DIE_AT = (
    {"compression": "topk", "ratio": 0.1},
    12,
    4,
    10,
)
X, Y = global_data()
STEPS_PER_EPOCH = len(X) // GLOBAL_BATCH


class Scenario(keras.callbacks.Callback):
    """Records ``(epoch, batch, workers)`` of every step, and acts the scenario out."""

    def __init__(self, state: elastic.TrainingState, ran: list, scenario: str, host: str):
        super().__init__()
        self.state, self.ran = state, ran
        self.scenario, self.host, self.grown = scenario, host, False

    def on_train_batch_begin(self, batch, logs=None):
        here, on_host = (self.state.epoch, self.state.batch), os.environ["HOROVOD_HOSTNAME"]
        if self.scenario == "lose" and here == DIE_AT and on_host == self.host:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.scenario == "vanish":
            time.sleep(SLOW_STEP_S)
            if here == VANISH_AT and distributed.size() == 2:
                (OUT / "ready").write_text(on_host)
        if self.scenario == "grow":
            time.sleep(SLOW_STEP_S)
            if here == GROW_AT and distributed.rank() == 0 and not self.grown:
                self.grown = True
                with (OUT / "hosts").open("a") as hosts:
                    hosts.write(f"{self.host}:1\n")

    def on_train_batch_end(self, batch, logs=None):  # before the Committer counts the batch
        self.ran.append((self.state.epoch, self.state.batch, distributed.size()))


class Parameters(keras.Model):
    """Zero-initialised variables of ``WIRE_SHAPES``, to apply known gradients to."""

    def __init__(self):
        super().__init__()
        self.parts = [self.add_weight(shape=s, initializer="zeros") for s in WIRE_SHAPES]


def sparse(host: str) -> None:
    distributed.init()
    model = Parameters()
    model.compile(optimizer=distributed.DistributedOptimizer(keras.optimizers.SGD(1.0), **SPARSE))
    apply = tf.function(lambda grads: model.optimizer.apply(grads, model.trainable_variables))
    state = elastic.TrainingState(model, batch=0)
    ran, starts = [], []

    @elastic.run
    def fit(state: elastic.TrainingState) -> None:
        world, rank = distributed.size(), distributed.rank()
        starts.append((state.batch, world))
        while state.batch < SPARSE_STEPS:
            if state.batch == SPARSE_DIE_AT and os.environ["HOROVOD_HOSTNAME"] == host:
                os.kill(os.getpid(), signal.SIGKILL)
            halves = [wire_grads(half, state.batch) for half in range(2)]
            mine = halves[rank] if world == 2 else [(a + b) / 2 for a, b in zip(*halves)]
            apply(mine)
            ran.append((state.batch, world))
            state.batch += 1
            if state.batch % SPARSE_COMMIT_EVERY == 0:
                state.commit()

    fit(state)
    rank = distributed.rank()
    (OUT / f"rank{rank}.json").write_text(json.dumps({"ran": ran, "starts": starts}))
    residuals = distributed.compressed_allreduce(model.optimizer).state()
    np.savez(OUT / f"rank{rank}.npz", *[v.numpy() for v in model.parts], *residuals)


def main(scenario: str, host: str) -> None:
    if scenario == "sparse":
        sparse(host)
        return
    distributed.init()
    model = make_model(100 + distributed.rank(), sgd())  # different until the first sync
    state = elastic.TrainingState(model, epoch=0, batch=0)
    ran, starts = [], []
    # the Committer last: a commit that finds the hosts changed ends the step's callbacks
    hooks = [Scenario(state, ran, scenario, host), elastic.Committer(state, COMMIT_EVERY)]

    @elastic.run
    def fit(state: elastic.TrainingState) -> None:
        world, rank = distributed.size(), distributed.rank()
        per_worker = GLOBAL_BATCH // world
        while state.epoch < EPOCHS:
            starts.append((state.epoch, state.batch, world))
            rows = np.concatenate(
                [
                    np.arange(per_worker) + step * GLOBAL_BATCH + rank * per_worker
                    for step in range(state.batch, STEPS_PER_EPOCH)
                ]
            )
            model.fit(
                X[rows],
                Y[rows],
                batch_size=per_worker,
                initial_epoch=state.epoch,
                epochs=state.epoch + 1,
                shuffle=False,
                verbose=0,
                callbacks=hooks,
            )

    fit(state)
    rank = distributed.rank()
    (OUT / f"rank{rank}.json").write_text(json.dumps({"ran": ran, "starts": starts}))
    np.savez(OUT / f"rank{rank}.npz", *model.get_weights())


if __name__ == "__main__":
    OUT = Path(sys.argv[1])
    main(*sys.argv[2:])
