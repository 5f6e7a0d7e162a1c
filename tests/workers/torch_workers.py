"""Keras's PyTorch backend with Horovod's PyTorch allreduce: the checks of
tests/test_torch_workers.py. Run twice with ``KERAS_BACKEND=torch``: under ``horovodrun -np 2``
(each rank takes its half of every global batch) and alone (one process takes the whole batch),
so the test can hold two workers to one worker of their global batch on the same backend.

Every scenario starts the ranks from different seeds, so only the broadcast makes them agree.
Each process writes ``<out>/rank<r>.npz`` (each scenario's weights, as ``<scenario>/<index>``)
and ``<out>/rank<r>.json`` (what it measured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import horovod.tensorflow
import keras
import numpy as np

from toolkit.optimizers import LARS
from toolkit.parallel import distributed, noise_meter

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import STEPS, global_data, make_model, sgd
from two_workers import (
    average_parameters,
    fit_with_the_callbacks,
    send_on_the_wire,
    skip_a_step_not_finite_on_rank1,
    traffic_of,
    train,
)


def main(out: Path) -> None:
    assert keras.backend.backend() == "torch"
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    x, y = global_data()
    weights: dict[str, list[np.ndarray]] = {}
    info: dict = {
        "size": size,
        "mean_rank": distributed.allreduce_mean(rank),
        "rows": distributed.allgather_rows(np.array([rank, 10.0 * rank])).tolist(),
        "from_rank0": distributed.broadcast_object(f"rank {rank}"),
        "tensorflow_horovod_started": horovod.tensorflow.is_initialized(),
    }

    for name, optimizer, steps, wrap in [
        ("sgd", sgd(), STEPS, {}),
        ("accumulate2", sgd(), 2 * STEPS, {"backward_passes_per_step": 2}),
        ("fp16", sgd(), STEPS, {"compression": "fp16"}),
        ("lars", LARS(0.5, 0.9, 1e-3, trust_coefficient=0.02), STEPS, {}),  # trust ratios
    ]:
        model = make_model(100 + rank, optimizer, **wrap)
        distributed.broadcast_variables(model, model.optimizer)
        train(model, x, y, steps)
        weights[name] = model.get_weights()

    # The averaging turned off: the same start, each rank on its own half of each batch.
    model = make_model(100 + rank, sgd())
    distributed.broadcast_variables(model, model.optimizer)
    model.compile(optimizer=sgd(), loss=model.loss)
    train(model, x, y, STEPS)
    weights["unaveraged"] = model.get_weights()

    skip_a_step_not_finite_on_rank1(weights, x, y)
    send_on_the_wire(weights, info, rank)
    average_parameters(weights, info, rank)

    # The noise meter in the allreduce hook, on known gradients of each rank.
    meter = noise_meter.GradientNoiseMeter(every=2)
    optimizer = distributed.DistributedOptimizer(sgd(), noise_meter=meter)
    variables = [keras.Variable(np.zeros(shape, "float32")) for shape in ((5, 3), (3,))]
    optimizer.build(variables)
    rng = np.random.default_rng(7 + rank)
    for update in range(4):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        weights[f"noise_grads{update}"] = grads
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    info["noise"] = meter.read()
    info["traffic"] = traffic_of(optimizer)

    fit_with_the_callbacks(weights, info, x, y)

    np.savez(
        out / f"rank{rank}.npz",
        **{f"{n}/{i}": w for n, ws in weights.items() for i, w in enumerate(ws)},
    )
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
