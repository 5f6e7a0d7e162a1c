"""Time one update of each optimizer over ResNet-50's variables, against Keras SGD, on the
Keras backend ``KERAS_BACKEND`` names (TensorFlow by default; JAX and PyTorch too).

    python experiments/bench_optimizers.py [--repeats 30] [--jit] [--model tiny]
    KERAS_BACKEND=jax python experiments/bench_optimizers.py [--repeats 30]
    KERAS_BACKEND=torch python experiments/bench_optimizers.py [--repeats 30]
    KERAS_BACKEND=torch OMP_NUM_THREADS=1 python experiments/bench_optimizers.py --model mlp

Each update runs as a training loop runs it on that backend: inside a compiled ``tf.function``
on TensorFlow (XLA off by default, as under Horovod on CPU; ``--jit`` turns it on), as one
jitted ``stateless_apply`` on JAX (each optimizer on its own copy of the variables, donated so
that it updates in place, as Keras's JAX trainer does), eagerly on PyTorch (as Keras's
PyTorch trainer runs its optimizer; there the toolkit's SGD, LARS and LBSGD-lars also run their
per-variable update, ``multi_tensor=False``, which their multi-tensor one replaces).
Updates are interleaved, so machine noise hits every optimizer alike; on a GPU the clock
stops when the device has finished the update, not when it was launched. Printed for each:
the median time of ``--repeats`` updates, its ratio to ``keras.optimizers.SGD(momentum=0.9)``,
and its ratio to the toolkit's own SGD-momentum update (the median of the ratios within each
round, with their 10th-90th percentiles; lower is faster). Every repeat's time goes to
``experiments/bench_optimizers[_jit|_<backend>].csv`` (:mod:`benchmark_csv`), with the device.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import benchmark_csv  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit import optimizers  # noqa: E402

OUR_SGD = "SGD momentum=0.9"
CANDIDATES = {
    "keras SGD momentum=0.9 (reference)": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    OUR_SGD: lambda: optimizers.SGD(0.1, momentum=0.9),
    "SGD momentum=0.9 nesterov wd=5e-5": lambda: optimizers.SGD(
        0.1, momentum=0.9, nesterov=True, weight_decay=5e-5
    ),
    "LARS momentum=0.9 wd=5e-4": lambda: optimizers.LARS(1.0, momentum=0.9, weight_decay=5e-4),
    "LARS clip=True (LARC)": lambda: optimizers.LARS(1.0, weight_decay=5e-4, clip=True),
    "LBSGD linear warmup": lambda: optimizers.LBSGD(0.1, momentum=0.9, weight_decay=5e-4),
    "LBSGD lars warmup": lambda: optimizers.LBSGD(
        0.1, momentum=0.9, weight_decay=5e-4, warmup_strategy="lars"
    ),
}
PER_VARIABLE = (OUR_SGD, "LARS momentum=0.9 wd=5e-4", "LBSGD lars warmup")
"""Also timed with their per-variable update on PyTorch (``multi_tensor=False``)."""


def candidates(backend: str) -> dict:
    """The optimizers to time, by name: :data:`CANDIDATES`, and on PyTorch the
    :data:`PER_VARIABLE` ones again without their multi-tensor update."""
    chosen = dict(CANDIDATES)
    if backend == "torch":
        for name in PER_VARIABLE:
            chosen[f"{name} (per variable)"] = lambda make=CANDIDATES[name]: per_variable(make())
    return chosen


def per_variable(optimizer):
    optimizer.multi_tensor = False
    return optimizer


def update_step(optimizer, grads, variables, jit: bool):
    """One update of ``variables`` by ``optimizer`` as the backend's training loop runs it,
    finished on the device when the call returns."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        step = tf.function(lambda: optimizer.apply(grads, variables), jit_compile=jit)
        gpu = bool(tf.config.list_logical_devices("GPU"))
        return lambda: (step(), gpu and tf.test.experimental.sync_devices())
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        apply = jax.jit(
            lambda train, state: optimizer.stateless_apply(state, grads, train),
            donate_argnums=(0, 1),
        )
        values = [[jnp.array(v.value) for v in variables], [v.value for v in optimizer.variables]]

        def step():
            values[:] = apply(*values)
            jax.block_until_ready(values)

        return step
    import torch

    finish = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    return lambda: (optimizer.apply(grads, variables), finish())


def device() -> str:
    """The accelerator the backend computes on (its name), or the CPU's model."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        first = jax.devices()[0]
        if first.platform != "cpu":
            return first.device_kind
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    else:
        import tensorflow as tf

        if gpus := tf.config.list_logical_devices("GPU"):
            return gpus[0].name
    return benchmark_csv.machine()


def tiny_model() -> keras.Model:
    """Three dense layers (17k parameters): for smoke runs of this script, not for timings."""
    return keras.Sequential([keras.Input((64,)), *(keras.layers.Dense(64) for _ in range(3))])


def mlp() -> keras.Model:
    """784-1024-1024-512-10 with a batch normalisation (2.4M parameters): a CPU-sized model."""
    widths = (1024, 1024, 512)
    return keras.Sequential(
        [keras.Input((784,)), *(keras.layers.Dense(w) for w in widths)]
        + [keras.layers.BatchNormalization(), keras.layers.Dense(10)]
    )


MODELS = {
    "resnet50": lambda: keras.applications.ResNet50(weights=None),
    "mlp": mlp,
    "tiny": tiny_model,
}


def main(repeats: int, jit: bool, model_name: str = "resnet50") -> pd.DataFrame:
    backend = keras.backend.backend()
    model = MODELS[model_name]()
    rng = np.random.default_rng(0)
    grads = [
        keras.ops.convert_to_tensor(rng.standard_normal(v.shape).astype("float32") * 1e-3)
        for v in model.trainable_variables
    ]
    steps = {}
    for name, make in candidates(backend).items():
        optimizer = make()
        optimizer.build(model.trainable_variables)
        steps[name] = update_step(optimizer, grads, model.trainable_variables, jit)
        steps[name]()  # trace and warm up
    times = {name: [] for name in steps}
    for _ in range(repeats):  # interleaved, so drift affects every candidate alike
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    times = pd.DataFrame(times)
    on = device()
    variant = "jit" if jit and backend == "tensorflow" else ""
    benchmark_csv.save(
        __file__,
        [
            {"optimizer": name, "repeat": i, "seconds": seconds, "jit": jit or backend == "jax"}
            | {"backend": backend, "device": on, "model": model_name}
            for name in times
            for i, seconds in enumerate(times[name], 1)
        ],
        "_".join(
            part
            for part in (variant if backend == "tensorflow" else backend, model_name)
            if part and part not in ("resnet50", "tiny")
        ),
    )
    ours = times[OUR_SGD]
    ratios = times.div(ours, axis=0)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    table = pd.DataFrame(
        {
            "median ms": 1e3 * times.median(),
            "x keras SGD": times.median() / times.iloc[:, 0].median(),
            "x our SGD": ratios.median(),
            "p10": ratios.quantile(0.1),
            "p90": ratios.quantile(0.9),
        }
    )
    table.index.name = f"{backend} on {on}: update of {params / 1e6:.2g}M params"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--jit", action="store_true", help="TensorFlow: compile with XLA")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    args = parser.parse_args()
    print(main(args.repeats, args.jit, args.model).to_markdown(floatfmt=".2f"))
