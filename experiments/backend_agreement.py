"""How closely the optimizers and AdaScale agree across Keras's backends: the same 100 updates
of the same variables by the same gradients on TensorFlow, JAX and PyTorch.

    python experiments/backend_agreement.py [--updates 100]

Each backend runs in its own process (Keras chooses its backend at import). Every optimizer
starts from the same variables (a dense 64-32-10 network's four tensors) and applies the same
random gradients, through a schedule for the rate; AdaScale takes the same noise measurements.
Printed for each, against TensorFlow: the largest difference of a final weight, relative to its
tensor's largest entry (the largest over the tensors), and AdaScale's largest relative
difference of a gain. Every row goes to ``experiments/backend_agreement.csv``. Lower is closer;
float32's resolution is about 6e-8, and 100 updates add up their round-off.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SHAPES = [(64, 32), (32,), (32, 10), (10,)]
BACKENDS = ["tensorflow", "jax", "torch"]


def candidates():
    from toolkit import optimizers
    from toolkit.optimizers.schedules import MultiFactor, Warmup

    return {
        "SGD momentum=0.9 dampening=0.1 wd=1e-4": lambda: optimizers.SGD(
            Warmup(0.1, 10), momentum=0.9, dampening=0.1, weight_decay=1e-4
        ),
        "SGD nesterov": lambda: optimizers.SGD(
            0.05, momentum=MultiFactor(0.9, [50], 0.5), nesterov=True
        ),
        "LARS momentum=0.9 wd=5e-4": lambda: optimizers.LARS(
            Warmup(1.0, 10), momentum=0.9, weight_decay=5e-4
        ),
        "LARC (clip=True)": lambda: optimizers.LARS(1.0, weight_decay=5e-4, clip=True),
        "LBSGD linear warmup, batch_scale=2": lambda: optimizers.LBSGD(
            0.1,
            momentum=0.9,
            weight_decay=5e-4,
            warmup_epochs=2,
            updates_per_epoch=10,
            batch_scale=2,
        ),
        "LBSGD lars warmup": lambda: optimizers.LBSGD(
            0.1, momentum=0.9, weight_decay=5e-4, warmup_strategy="lars"
        ),
    }


def run_here(updates: int, out: Path) -> None:
    """This process's backend: every candidate's final weights and AdaScale's gains, to ``out``."""
    import keras

    from toolkit.scaling.adascale import AdaScale

    rng = np.random.default_rng(0)
    initial = [rng.standard_normal(s).astype("float32") for s in SHAPES]
    grads = [
        [0.1 * rng.standard_normal(s).astype("float32") for s in SHAPES] for _ in range(updates)
    ]
    results = {}
    for name, make in candidates().items():
        variables = [keras.Variable(w) for w in initial]
        optimizer = make()
        for step in grads:
            optimizer.apply(step, variables)
        for i, v in enumerate(variables):
            results[f"{name}/{i}"] = keras.ops.convert_to_numpy(v)
    adascale = AdaScale(0.1, batch=256, base_batch=16, b_small=32, b_big=256, smoothing=0.9)
    big = rng.uniform(0.05, 1.0, size=updates)
    gains = []
    for s, b in zip(big + rng.uniform(-0.1, 2.0, size=updates), big, strict=True):
        adascale.observe(s, b)
        gains.append(float(adascale.gain.numpy()))
    results["AdaScale gain"] = np.array(gains)
    np.savez(out, **results)


def main(updates: int):
    import benchmark_csv
    import pandas as pd

    folder = Path(tempfile.mkdtemp())
    for backend in BACKENDS:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
        args = [__file__, "--updates", str(updates), "--here", str(folder / f"{backend}.npz")]
        subprocess.run([sys.executable, *args], env=env, check=True)
    saved = {b: np.load(folder / f"{b}.npz") for b in BACKENDS}
    reference = saved["tensorflow"]
    rows = []
    for backend in BACKENDS[1:]:
        got = saved[backend]
        for name in [*candidates(), "AdaScale gain"]:
            keys = [k for k in reference.files if k == name or k.startswith(f"{name}/")]
            deviation = max(
                float(np.abs(got[k] - reference[k]).max() / np.abs(reference[k]).max())
                for k in keys
            )
            rows.append({"backend": backend, "what": name, "max_relative_deviation": deviation})
    benchmark_csv.save(__file__, rows)
    table = pd.DataFrame(rows).pivot(
        index="what", columns="backend", values="max_relative_deviation"
    )
    table.index.name = f"against tensorflow, {updates} updates"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--here", type=Path, help=argparse.SUPPRESS)  # one backend's run
    args = parser.parse_args()
    if args.here:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        run_here(args.updates, args.here)
    else:
        print(main(args.updates).to_markdown(floatfmt=".1e"))
