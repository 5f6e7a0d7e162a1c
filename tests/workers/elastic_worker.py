"""Run under ``horovodrun --min-np 1 --max-np 2`` with one slot on each of two hosts: an elastic
fit that loses a worker (the one started on host ``DOOMED`` kills itself, as a preempted
machine would, before batch ``DIE_AT``) and goes on alone at the same global batch.

Step ``s`` of an epoch is global rows ``s*B .. (s+1)*B`` (``B = GLOBAL_BATCH``), split evenly
over the workers there are, so the run sees the same global batches as one process taking
them whole. The survivor writes ``<out>/survivor.json`` (every step it ran, with the world
size, and where each ``fit`` call started) and ``<out>/survivor.npz`` (the final weights).

    python elastic_worker.py OUT DOOMED
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import keras
import numpy as np

from toolkit import distributed, elastic

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import GLOBAL_BATCH, global_data, make_model, sgd

EPOCHS, COMMIT_EVERY = 3, 5
DIE_AT = (1, 8)  # (epoch, batch): three batches after the commit at batch 5
X, Y = global_data()
STEPS_PER_EPOCH = len(X) // GLOBAL_BATCH


class Steps(keras.callbacks.Callback):
    """Records ``(epoch, batch, workers)`` of every step; a doomed worker dies before
    ``DIE_AT``."""

    def __init__(self, state: elastic.TrainingState, ran: list, doomed: bool):
        super().__init__()
        self.state, self.ran, self.doomed = state, ran, doomed

    def on_train_batch_begin(self, batch, logs=None):
        if self.doomed and (self.state.epoch, self.state.batch) == DIE_AT:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):  # after the Committer: the batch is counted
        self.ran.append((self.state.epoch, self.state.batch - 1, distributed.size()))


def main(out: Path, doomed_host: str) -> None:
    distributed.init()
    doomed = os.environ["HOROVOD_HOSTNAME"] == doomed_host
    model = make_model(100 + distributed.rank(), sgd())  # different until the first sync
    state = elastic.TrainingState(model, epoch=0, batch=0)
    ran, starts = [], []

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
                callbacks=[elastic.Committer(state, COMMIT_EVERY), Steps(state, ran, doomed)],
            )

    fit(state)
    (out / "survivor.json").write_text(json.dumps({"ran": ran, "starts": starts}))
    np.savez(out / "survivor.npz", *model.get_weights())


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
