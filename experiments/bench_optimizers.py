"""Time one update of each optimizer over ResNet-50's variables, against Keras SGD.

    python experiments/bench_optimizers.py [--repeats 30] [--jit]

Every update runs inside a compiled ``tf.function`` on the TensorFlow backend (XLA off by
default, as under Horovod on CPU; ``--jit`` turns it on). Updates are interleaved, so machine
noise hits every optimizer alike; on a GPU the clock stops when the device has finished the
update (``tf.test.experimental.sync_devices``), not when it was launched. Printed for each: the
median time of ``--repeats`` updates, its ratio to ``keras.optimizers.SGD(momentum=0.9)``,
and its ratio to the toolkit's own SGD-momentum update (the median of the ratios within each
round, with their 10th-90th percentiles; lower is faster). Every repeat's time goes to
``experiments/bench_optimizers.csv`` (:mod:`benchmark_csv`).
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
import tensorflow as tf  # noqa: E402

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


def main(repeats: int, jit: bool) -> pd.DataFrame:
    model = keras.applications.ResNet50(weights=None)
    rng = np.random.default_rng(0)
    grads = [
        tf.constant(rng.standard_normal(v.shape).astype("float32") * 1e-3)
        for v in model.trainable_variables
    ]
    steps = {}
    for name, make in CANDIDATES.items():
        optimizer = make()
        optimizer.build(model.trainable_variables)
        step = tf.function(
            lambda opt=optimizer: opt.apply(grads, model.trainable_variables), jit_compile=jit
        )
        step()  # trace and warm up
        steps[name] = step
    # A GPU runs a step after the call returns: wait for it, or the time is the launch's.
    finish = tf.test.experimental.sync_devices if tf.config.list_logical_devices("GPU") else None
    times = {name: [] for name in steps}
    for _ in range(repeats):  # interleaved, so drift affects every candidate alike
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if finish:
                finish()
            times[name].append(time.perf_counter() - start)
    times = pd.DataFrame(times)
    benchmark_csv.save(
        __file__,
        [
            {"optimizer": name, "repeat": i, "seconds": seconds, "jit": jit}
            for name in times
            for i, seconds in enumerate(times[name], 1)
        ],
        "jit" if jit else "",
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
    table.index.name = f"update of {params / 1e6:.1f}M params"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--jit", action="store_true", help="compile the update with XLA")
    args = parser.parse_args()
    print(main(args.repeats, args.jit).to_markdown(floatfmt=".2f"))
