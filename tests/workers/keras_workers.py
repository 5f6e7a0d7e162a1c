"""Keras's PyTorch and JAX backends with their collectives: the checks of
tests/test_keras_workers.py. Run twice with ``KERAS_BACKEND`` set to ``torch`` or ``jax``:
under ``horovodrun -np 2`` (each rank takes its half of every global batch) and alone (one
process takes the whole batch), so the test can hold two workers to one worker of their global
batch on the same backend. (On JAX the train step runs mapped over the workers; the encoded
exchanges and parameter averaging, applied eagerly here, run on PyTorch only.)

Every scenario starts the ranks from different seeds, so only the broadcast makes them agree.
Each process writes ``<out>/rank<r>.npz`` (each scenario's weights, as ``<scenario>/<index>``)
and ``<out>/rank<r>.json`` (what it measured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np

from toolkit import backends
from toolkit.optimizers import LARS
from toolkit.parallel import distributed, noise_meter

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import GLOBAL_BATCH, STEPS, global_data, make_model, own, sgd
from two_workers import (
    average_parameters,
    fit_with_the_callbacks,
    send_on_the_wire,
    skip_a_step_not_finite_on_rank1,
    traffic_of,
    train,
)

NOISE_FEATURES = 3


def measure_the_noise(weights: dict, info: dict) -> None:
    """The noise meter in the allreduce hook, in a model's train step whose gradient is known:
    a bias-free ``Dense(1)`` under the loss ``mean(prediction)`` has, for the kernel, the mean
    of the batch's rows. Each rank's batches are kept as ``noise_batch<update>``; measured
    every 2nd of 4 updates."""
    rank, half = distributed.rank(), GLOBAL_BATCH // distributed.size()
    meter = noise_meter.GradientNoiseMeter(every=2)
    keras.utils.set_random_seed(own(rank))
    model = keras.Sequential(
        [keras.Input((NOISE_FEATURES,)), keras.layers.Dense(1, use_bias=False)]
    )
    model.compile(
        optimizer=distributed.DistributedOptimizer(sgd(), noise_meter=meter),
        loss=lambda y, prediction: keras.ops.mean(prediction),
        jit_compile=backends.current().jit_compile,
    )
    distributed.broadcast_variables(model, model.optimizer)
    distributed.train_per_worker(model)
    rng = np.random.default_rng(7)
    for update in range(4):
        batch = rng.normal(size=(GLOBAL_BATCH, NOISE_FEATURES)).astype("float32")
        mine = batch[rank * half : (rank + 1) * half]
        weights[f"noise_batch{update}"] = [mine]
        model.train_on_batch(mine, np.zeros(len(mine), "float32"))
    info["noise"] = meter.read()
    info["traffic"] = traffic_of(model.optimizer)


def main(out: Path) -> None:
    backend = backends.current()
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    x, y = global_data()
    weights: dict[str, list[np.ndarray]] = {}
    info: dict = {
        "backend": backend.name,
        "size": size,
        "mean_rank": distributed.allreduce_mean(rank),
        "rows": distributed.allgather_rows(np.array([rank, 10.0 * rank])).tolist(),
        "from_rank0": distributed.broadcast_object(f"rank {rank}"),
        "horovods_started": [  # not imported here: the last Horovod imported owns the
            name  # process sets of every Horovod in the process
            for name in ("horovod.tensorflow", "horovod.torch")
            if name in sys.modules and sys.modules[name].is_initialized()
        ],
    }

    for name, optimizer, steps, wrap in [
        ("sgd", sgd(), STEPS, {}),
        ("accumulate2", sgd(), 2 * STEPS, {"backward_passes_per_step": 2}),
        ("fp16", sgd(), STEPS, {"compression": "fp16"}),
        ("lars", LARS(0.5, 0.9, 1e-3, trust_coefficient=0.02), STEPS, {}),  # trust ratios
    ]:
        model = make_model(100 + own(rank), optimizer, **wrap)
        distributed.broadcast_variables(model, model.optimizer)
        distributed.train_per_worker(model)
        train(model, x, y, steps)
        weights[name] = model.get_weights()

    # The averaging turned off: the same start, each rank on its own half of each batch.
    model = make_model(100 + own(rank), sgd())
    distributed.broadcast_variables(model, model.optimizer)
    model.compile(optimizer=sgd(), loss=model.loss)
    distributed.train_per_worker(model)
    train(model, x, y, STEPS)
    weights["unaveraged"] = model.get_weights()

    skip_a_step_not_finite_on_rank1(weights, x, y)
    send_on_the_wire(weights, info, rank)  # the scenarios the backend runs
    average_parameters(weights, info, rank)
    measure_the_noise(weights, info)
    fit_with_the_callbacks(weights, info, x, y)

    np.savez(
        out / f"rank{rank}.npz",
        **{f"{n}/{i}": w for n, ws in weights.items() for i, w in enumerate(ws)},
    )
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
