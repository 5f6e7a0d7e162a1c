"""Run under ``horovodrun -np 2``: the checks of tests/test_distributed.py that need workers.

Every scenario starts the ranks from different seeds, so only the broadcast makes them agree.
Each rank writes ``<out>/rank<r>.npz`` (the weights each scenario ended with, as
``<scenario>/<index>``) and ``<out>/rank<r>.json`` (epoch logs, loss scale, ...); rank 0 also
saves the ``fit`` model to ``<out>/fit.keras``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from toolkit import backends
from toolkit.optimizers import SGD
from toolkit.parallel import distributed, noise_meter
from toolkit.parallel.elastic import TrainingState
from toolkit.scaling.noise_scale import Smoother

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import (
    EXECUTION,
    GLOBAL_BATCH,
    STEPS,
    SYNC,
    SYNC_STEPS,
    WIRE_SHAPES,
    WIRE_STEPS,
    global_data,
    make_model,
    own,
    sgd,
    token_data,
    wire_grads,
    wire_scenarios,
)


class LocalLogs(keras.callbacks.Callback):
    """Epoch logs as this rank saw them before MetricAverageCallback (placed before it)."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict[str, float]] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epochs.append({k: float(v) for k, v in logs.items()})


def train(model: keras.Model, x, y, steps: int, first_step: int = 0) -> None:
    """Step s: this rank's half of global batch s (rows s*B .. (s+1)*B)."""
    rank, half = distributed.rank(), GLOBAL_BATCH // distributed.size()
    for step in range(first_step, first_step + steps):
        start = step * GLOBAL_BATCH + rank * half
        model.train_on_batch(x[start : start + half], y[start : start + half])


def compiled(optimizer, variables):
    """``optimizer.apply(grads, variables)`` as ``model.fit`` runs it: as a graph on
    TensorFlow, eagerly on PyTorch, in a step mapped over the workers on JAX's engine."""
    optimizer.build(variables)
    if distributed.one_program():
        return on_each_worker(optimizer, variables)
    apply = lambda grads: optimizer.apply(grads, variables)  # noqa: E731
    return tf.function(apply) if keras.backend.backend() == "tensorflow" else apply


def on_each_worker(optimizer, variables):
    """``optimizer.apply(grads, variables)`` with each worker's own ``grads``, as Keras's JAX
    trainer runs it in a step mapped over the workers: ``stateless_apply``, then the variables
    assigned what it returns."""
    from toolkit.backends import jax_engine

    def update(state, grads):
        return optimizer.stateless_apply(state[0], grads, state[1])

    step = jax_engine.each_worker(update)

    def apply(grads):
        state = ([v.value for v in optimizer.variables], [v.value for v in variables])
        grads = [jax_engine.side_by_side(keras.ops.convert_to_numpy(g)) for g in grads]
        values, optimizer_values = step(state, grads)
        for variable, value in zip(
            [*variables, *optimizer.variables], [*values, *optimizer_values]
        ):
            variable.assign(value)

    return apply


def traffic_of(optimizer) -> list | None:
    """``[bytes sent, dense bytes]`` of a distributed optimizer's traffic counter; ``None``
    where nothing is sent (alone with a dense mode)."""
    traffic = distributed.traffic(optimizer)
    return [float(traffic.sent.numpy()), traffic.dense_bytes] if traffic else None


def send_on_the_wire(weights: dict, info: dict, rank: int) -> None:
    """What goes on the wire: each step's reduced gradient (as ``wire_<scenario>_<step>``), read
    off variables that plain SGD (rate 1) moves from zero, and the traffic, on this process's
    backend."""
    for name, options in wire_scenarios(backends.current()).items():
        wrap = dict(options)
        momentum = wrap.pop("momentum", None)
        sgd_at_1 = SGD(1.0, momentum=momentum) if momentum else keras.optimizers.SGD(1.0)
        optimizer = distributed.DistributedOptimizer(sgd_at_1, **wrap)
        variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
        apply = compiled(optimizer, variables)
        for step in range(WIRE_STEPS):
            for v in variables:
                v.assign(np.zeros(v.shape, "float32"))
            apply([keras.ops.convert_to_tensor(g) for g in wire_grads(rank, step)])
            weights[f"wire_{name}_{step}"] = [-keras.ops.convert_to_numpy(v) for v in variables]
        info[f"traffic_{name}"] = traffic_of(optimizer)


def average_parameters(weights: dict, info: dict, rank: int) -> None:
    """Partial synchronisation and local SGD: every rank's parameters after each update (as
    ``sync_<scenario>_<step>``) and its traffic, on this process's backend."""
    for name, wrap in SYNC.items():
        optimizer = distributed.DistributedOptimizer(keras.optimizers.SGD(1.0), **wrap)
        variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
        apply = compiled(optimizer, variables)
        for step in range(SYNC_STEPS):
            apply([keras.ops.convert_to_tensor(g) for g in wire_grads(rank, step)])
            weights[f"sync_{name}_{step}"] = [keras.ops.convert_to_numpy(v) for v in variables]
        info[f"traffic_{name}"] = traffic_of(optimizer)


def state_variables(model: keras.Model) -> list:
    """What an elastic state holds of ``model``: its weights and its optimizer's variables."""
    return [*model.weights, *model.optimizer.variables]


def skip_a_step_not_finite_on_rank1(weights: dict, x, y) -> float:
    """Mixed precision: rank 1 alone gets non-finite gradients on the first step; every rank
    must skip it (global finite check) instead of one waiting in the allreduce forever. Keeps
    the weights before, after the skip and after training on as ``mixed_*``; returns the loss
    scale after the skip."""
    rank, size = distributed.rank(), distributed.size()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = make_model(100 + own(rank), keras.optimizers.LossScaleOptimizer(sgd()))
    finally:
        keras.config.set_dtype_policy("float32")
    distributed.broadcast_variables(model, model.optimizer)
    distributed.train_per_worker(model)
    weights["mixed_initial"] = model.get_weights()
    half = GLOBAL_BATCH // size
    poisoned = x[:half] if rank == 0 else np.full_like(x[:half], np.inf)
    model.train_on_batch(poisoned, y[:half])
    weights["mixed_skipped"] = model.get_weights()
    scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
    train(model, x, y, STEPS)
    weights["mixed"] = model.get_weights()
    return scale


def fit_with_the_callbacks(weights: dict, info: dict, x, y) -> keras.Model:
    """model.fit with the callbacks; rank-dependent momentum buffers, so the workers only agree
    if BroadcastInitialState broadcasts the optimizer's state too. Keeps the weights as
    ``fit``, each rank's own epoch logs and the averaged history; returns the model."""
    rank, size = distributed.rank(), distributed.size()
    model = make_model(100 + own(rank), SGD(0.1, momentum=0.9))
    model.optimizer.build(model.trainable_variables)
    for velocity in model.optimizer.velocities:
        velocity.assign(np.full(velocity.shape, 0.01 * (own(rank) + 1), "float32"))
    local = LocalLogs()
    history = model.fit(
        x[rank::size],
        y[rank::size],
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            distributed.BroadcastInitialState(),
            local,
            distributed.MetricAverageCallback(),
        ],
    )
    weights["fit"] = model.get_weights()
    info["local_logs"] = local.epochs
    info["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    return model


def main(out: Path) -> None:
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    x, y = global_data()
    weights: dict[str, list[np.ndarray]] = {}
    info: dict = {
        "size": size,
        "on_rank0": distributed.on_rank0(lambda: rank)(),
        "mean_rank": distributed.allreduce_mean(rank),
    }

    every_entry = [  # the sparse modes selecting everything: the dense allreduce's result
        ("topk_all", {"compression": "topk", "ratio": 1.0}),
        ("threshold_all", {"compression": "threshold", "threshold": float(np.finfo("f4").tiny)}),
    ]
    for name, wrap, steps in [
        ("sgd", {}, STEPS),
        ("accumulate2", {"backward_passes_per_step": 2}, 2 * STEPS),
        ("fp16", {"compression": "fp16"}, STEPS),
        *[(name, wrap, STEPS) for name, wrap in every_entry],
        ("topk_all_accumulate2", {"backward_passes_per_step": 2, **every_entry[0][1]}, 2 * STEPS),
    ]:
        model = make_model(100 + own(rank), sgd(), **wrap)
        distributed.broadcast_variables(model, model.optimizer)
        train(model, x, y, steps)
        weights[name] = model.get_weights()

    for name, wrap in [("sparse", {}), *[(f"sparse_{n}", w) for n, w in every_entry]]:
        model = make_model(100 + own(rank), sgd(), embedding=True, **wrap)
        distributed.broadcast_variables(model, model.optimizer)
        train(model, *token_data(), STEPS)
        weights[name] = model.get_weights()

    # Mixed precision with a sparse mode selecting everything: the plain run's weights.
    for name, wrap in [("mixed_plain", {}), ("mixed_topk_all", every_entry[0][1])]:
        keras.config.set_dtype_policy("mixed_float16")
        try:
            optimizer = keras.optimizers.LossScaleOptimizer(sgd())
            model = make_model(100 + own(rank), optimizer, **wrap)
        finally:
            keras.config.set_dtype_policy("float32")
        distributed.broadcast_variables(model, model.optimizer)
        train(model, x, y, STEPS)
        weights[name] = model.get_weights()

    info["mixed_scale_after_skip"] = skip_a_step_not_finite_on_rank1(weights, x, y)

    # The gradient noise scale's meter in the allreduce hook: known per-rank gradients (the
    # same in each scenario), applied once or accumulated over two passes, or loss-scaled.
    for name, optimizer, passes, wrap in [
        ("noise", sgd(), 1, {}),
        ("noise_accumulate", sgd(), 2, {"backward_passes_per_step": 2}),
        ("noise_mixed", keras.optimizers.LossScaleOptimizer(sgd()), 1, {}),
        ("noise_topk", sgd(), 1, {"compression": "topk", "ratio": 0.2}),
    ]:
        meter = noise_meter.GradientNoiseMeter(every=1)
        optimizer = distributed.DistributedOptimizer(optimizer, noise_meter=meter, **wrap)
        variables = [keras.Variable(np.zeros(shape, "float32")) for shape in ((5, 3), (3,))]
        rng = np.random.default_rng(7 + rank)
        optimizer.build(variables)
        scale = float(optimizer.dynamic_scale.numpy()) if "mixed" in name else 1.0
        for p in range(passes):
            grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
            weights[f"{name}_grads{p}"] = grads
            optimizer.apply([g * scale for g in grads], variables)
        info[name] = meter.read()

    send_on_the_wire(weights, info, rank)
    average_parameters(weights, info, rank)

    # model.fit running 4 steps per execution and 1: the collectives inside Keras's loop.
    for name, wrap in EXECUTION.items():
        for k in (1, 4):
            model = make_model(100, sgd(), steps_per_execution=k, **wrap)
            rows = slice(rank, 8 * GLOBAL_BATCH, size)  # 8 steps of this rank's half
            model.fit(x[rows], y[rows], batch_size=GLOBAL_BATCH // size, shuffle=False, verbose=0)
            weights[f"execution_{name}_{k}"] = model.get_weights()

    model = fit_with_the_callbacks(weights, info, x, y)
    distributed.on_rank0(model.save)(out / "fit.keras")

    # The elastic state (toolkit.parallel.elastic): sync from rank 0, commit, train on, restore, and
    # train the same steps again. Momentum, sparsified residuals and the noise meter's counters
    # all differ per rank before the sync, and the residuals after it.
    meter = noise_meter.GradientNoiseMeter(every=3)
    model = make_model(
        100 + own(rank), SGD(0.1, momentum=0.9), compression="topk", ratio=0.1, noise_meter=meter
    )
    model.optimizer.build(model.trainable_variables)
    for velocity in model.optimizer.velocities:
        velocity.assign(np.full(velocity.shape, 0.01 * (own(rank) + 1), "float32"))
    meter.continue_from(rank)
    smoother = Smoother(decay=0.9)
    smoother.update(1.0 + rank, 2.0 + rank)
    state = TrainingState(model, variables=meter.variables, smoother=smoother, epoch=rank, batch=7)
    state.sync()
    weights["elastic_synced"] = [keras.ops.convert_to_numpy(v) for v in state_variables(model)]
    info["elastic_synced"] = {"epoch": state.epoch, "smoother": vars(smoother).copy()}
    info["elastic_synced"]["meter_updates"] = int(meter.variables[0].numpy())
    train(model, x, y, 2)
    state.epoch, state.batch = 1, 2
    state.commit()
    weights["elastic_committed"] = [keras.ops.convert_to_numpy(v) for v in state_variables(model)]
    reducer = distributed.compressed_allreduce(model.optimizer)
    weights["elastic_residual_committed"] = reducer.state()
    weights["elastic_residual_table"] = [a for row in state.residuals for a in row]
    train(model, x, y, 2, first_step=2)
    weights["elastic_ahead"] = [keras.ops.convert_to_numpy(v) for v in state_variables(model)]
    state.epoch, state.batch = 9, 9
    smoother.update(100.0, 100.0)
    state.restore()
    weights["elastic_restored"] = [keras.ops.convert_to_numpy(v) for v in state_variables(model)]
    weights["elastic_residual_restored"] = reducer.state()
    info["elastic_restored"] = {
        "epoch": state.epoch,
        "batch": state.batch,
        "smoother": vars(smoother).copy(),
    }
    train(model, x, y, 2, first_step=2)
    weights["elastic_replayed"] = [keras.ops.convert_to_numpy(v) for v in state_variables(model)]

    np.savez(
        out / f"rank{rank}.npz",
        **{f"{n}/{i}": w for n, ws in weights.items() for i, w in enumerate(ws)},
    )
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
