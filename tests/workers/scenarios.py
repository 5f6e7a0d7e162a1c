"""Data and models shared by the 2-worker script and the single-process references in
tests/test_distributed.py: whatever both sides build must be built the same way."""

from __future__ import annotations

import keras
import numpy as np

from toolkit.parallel import distributed

GLOBAL_BATCH = 32  # per step, over all workers
STEPS = 5
LEARNING_RATE = 0.5
VOCABULARY = 50


def global_data(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.standard_normal((n, 12)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    return x, y


def token_data(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences for the Embedding model (its gradient is ``IndexedSlices``)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, VOCABULARY, (n, 6)).astype("int32")
    y = (x[:, 0] < VOCABULARY // 2).astype("int32")
    return x, y


def make_model(
    seed: int, optimizer, embedding: bool = False, steps_per_execution: int = 1, **wrap
) -> keras.Model:
    """A small classifier compiled with ``DistributedOptimizer(optimizer, **wrap)``."""
    keras.utils.set_random_seed(seed)
    if embedding:
        layers = [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, 8),
            keras.layers.GlobalAveragePooling1D(),
        ]
    else:
        layers = [keras.Input((12,)), keras.layers.Dense(16, activation="tanh")]
    model = keras.Sequential([*layers, keras.layers.Dense(2)])
    model.compile(
        optimizer=distributed.DistributedOptimizer(optimizer, **wrap),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
        steps_per_execution=steps_per_execution,
    )
    return model


def own(rank: int) -> int:
    """What makes rank ``rank``'s start its own (its seed, its optimizer's state): the rank, so
    only the broadcast makes the ranks agree; 0 where the workers are one program (JAX), whose
    variables are created and assigned alike on every worker (JAX checks that they are)."""
    return 0 if distributed.one_program() else rank


def sgd() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(LEARNING_RATE)


# What goes on the wire (toolkit.parallel.compression): DistributedOptimizer options per scenario
# (with "momentum": the toolkit's SGD with that momentum, else Keras's SGD, both at rate 1), and the
# known gradients each rank feeds it, WIRE_STEPS times, on variables of WIRE_SHAPES. The DGC
# scenarios warm up for 3 epochs of one update, so the last steps run at the final ratio.
WIRE_SHAPES = ((6, 5), (7,), (4, 3))
WIRE_STEPS = 6
DGC = {"compression": "topk", "ratio": 0.05, "updates_per_epoch": 1}
WIRE = {
    "topk": {"compression": "topk", "ratio": 0.1},
    "topk_per_tensor": {"compression": "topk", "ratio": 0.25, "fusion_threshold_mb": 1e-4},
    "topk_sampled": {"compression": "topk", "ratio": 0.2, "topk_sample": 0.25},
    "threshold": {"compression": "threshold", "threshold": 1.0},
    "threshold_dropped": {"compression": "threshold", "threshold": 1.0, "residual": False},
    "topk_fp16_values": {"compression": "topk", "ratio": 0.2, "value_dtype": "float16"},
    "2bit": {"compression": "2bit", "threshold": 0.5},
    "2bit_dropped": {"compression": "2bit", "threshold": 0.5, "residual": False},
    "momentum_correction": {**DGC, "momentum_correction": True, "momentum": 0.9},
    "momentum_masking": {
        **DGC,
        "momentum_correction": True,
        "momentum_masking": True,
        "momentum": 0.9,
    },
    "local_clipping": {**DGC, "local_clipnorm": 2.0},
    "sparsity_warmup": {**DGC, "sparsity_warmup_epochs": 3},
    "dense_1d": {**DGC, "dense_1d": True},
    "dgc": {**DGC, "dgc": True, "sparsity_warmup_epochs": 3, "momentum": 0.9},
    "dgc_2bit": {
        "compression": "2bit",
        "threshold": 0.5,
        "dgc": True,
        "local_clipnorm": 3.0,
        "momentum": 0.9,
    },
    "fp16_saturates": {"compression": "fp16"},
    "fp16_clipped": {"compression": "fp16", "fp16_clip": 0.5},
}


def wire_scenarios(backend) -> dict[str, dict]:
    """The :data:`WIRE` scenarios ``backend`` (a :class:`toolkit.backends.base.Backend`) runs:
    those its refusal lets through."""
    from toolkit.config import communication

    def refused(options: dict) -> str | None:
        wrap = {k: v for k, v in options.items() if k not in ("momentum", "updates_per_epoch")}
        return backend.refusal(**communication(**wrap).backend_needs)

    return {name: options for name, options in WIRE.items() if refused(options) is None}


# Partial synchronisation and local SGD (toolkit.parallel.sync), on the same gradients,
# SYNC_STEPS steps.
SYNC_STEPS = 5
SYNC = {
    "partial": {"sync": "partial", "fusion_threshold_mb": 1e-4},  # one variable per partition
    "partial_every2": {"sync": "partial", "period": 2, "fusion_threshold_mb": 1e-4},
    "local_sgd": {"sync": "local_sgd", "period": 2},
}


# model.fit at several steps per execution (as toolkit.train runs it), in each mode of the
# allreduce hook: DistributedOptimizer options per scenario.
EXECUTION = {
    "dense": {},
    "accumulate2": {"backward_passes_per_step": 2},
    "topk": {"compression": "topk", "ratio": 0.1},
    "partial": {"sync": "partial", "fusion_threshold_mb": 1e-4},
    "local_sgd": {"sync": "local_sgd", "period": 3},
}


def wire_grads(rank: int, step: int) -> list[np.ndarray]:
    """Rank ``rank``'s gradients at ``step``; on rank 0 one entry overflows float16."""
    rng = np.random.default_rng(1000 * step + rank)
    grads = [rng.normal(size=shape).astype("float32") for shape in WIRE_SHAPES]
    if rank == 0:
        grads[0][2, 3] = 1e5
    return grads
