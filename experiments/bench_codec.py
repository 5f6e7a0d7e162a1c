"""What the encoded allreduce modes' codecs cost, in passes over memory, fused and unfused.

    .venv/bin/python experiments/bench_codec.py [--models resnet50] [--repeat 5] [--workers 2]
    KERAS_BACKEND=torch .venv/bin/python experiments/bench_codec.py   # PyTorch's eager ops

In one process, on a model's gradient shapes (random normal gradients, the state warm after a
few updates): one compressed allreduce as training runs it, less the network. It encodes this
worker's gradients (momentum, residual, selection, state update), stands ``--workers`` copies of
the payload in for what the allgather would bring, and decodes their mean into the gradients'
shapes; on TensorFlow once with the fused kernels (``toolkit/parallel/codec_kernels.cc``) and
once with the TensorFlow ops they replace, on another backend with its own ops (``keras.ops``,
eagerly on PyTorch), interleaved over ``--repeat`` rounds. The unit is a *pass*: one
``memcpy`` of the gradients' dense float32 bytes (numpy's ``copyto``, one thread), timed in the
same round, so that a faster or slower machine does not move the figures. The table gives the
median passes, their spread over rounds, and the milliseconds; the raw rows go to
``bench_codec.csv`` beside this script (``bench_codec_torch.csv`` for PyTorch's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import keras  # noqa: E402  (after the path is set)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from keras import ops  # noqa: E402

from experiments import benchmark_csv  # noqa: E402
from experiments.bench_allreduce import SHAPES  # noqa: E402
from toolkit import backends  # noqa: E402
from toolkit.parallel.compression import CompressedAllreduce, Sparse, TwoBit  # noqa: E402
from toolkit.training import models  # noqa: E402


def modes(threshold: float) -> dict[str, tuple]:
    """Each mode's codec and CompressedAllreduce options, as bench_allreduce.py runs them."""
    return {
        "topk 1%, sampled 1%": (Sparse("topk", ratio=0.01, topk_sample=0.01), {}),
        "topk 1%, exact": (Sparse("topk", ratio=0.01), {}),
        "DGC: topk 0.1%, sampled 1%, momentum, masking": (
            Sparse("topk", ratio=0.001, topk_sample=0.01),
            {"momentum": 0.9, "masking": True},
        ),
        "threshold ~1%": (Sparse("threshold", threshold=threshold), {"residual": False}),
        "2bit": (TwoBit(threshold), {}),
    }


def timed(step, block: int) -> float:
    """Milliseconds per call of ``step``, over ``block`` calls."""
    start = time.perf_counter()
    for _ in range(block):
        step()
    return (time.perf_counter() - start) / block * 1e3


def measure(name: str, workers: int, repeat: int, block: int) -> list[dict]:
    shape, classes = SHAPES[name]
    model = models.build(name, input_shape=shape, num_classes=classes, seed=0)
    rng = np.random.default_rng(0)
    grads = [
        ops.convert_to_tensor(rng.normal(size=v.shape).astype("float32"))
        for v in model.trainable_variables
    ]
    entries = sum(int(np.prod(g.shape)) for g in grads)
    threshold = float(np.quantile(np.abs(rng.normal(size=10**6)), 0.99))  # ~1% at or above
    source, target = np.ones(entries, "float32"), np.zeros(entries, "float32")
    backend = backends.current()
    paths = (
        {True: "fused", False: "TensorFlow ops"}
        if backend.tensorflow_kernels
        else {False: f"{backend.name} ops"}
    )
    steps = {}
    for mode, (codec, options) in modes(threshold).items():
        for fused, path in paths.items():
            allreduce = CompressedAllreduce(
                codec,
                lambda payload: [ops.concatenate([t] * workers, 0) for t in payload],
                lambda tensors: tensors,
                workers,
                fused=fused,
                updates=keras.Variable(0, dtype="int64", trainable=False),
                **options,
            )
            step = backend.compiled(lambda a=allreduce: a(grads))
            for _ in range(3):  # trace; the residuals warm up
                step()
            steps[mode, path] = step
    rows = []
    for round_ in range(repeat):
        memcpy = timed(lambda: np.copyto(target, source), block * 5)
        for (mode, path), step in steps.items():
            ms = timed(step, block)
            rows.append(
                dict(model=name, entries=entries, workers=workers, round=round_, mode=mode)
                | dict(path=path, ms=ms, memcpy_ms=memcpy, passes=ms / memcpy)
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--workers", type=int, default=2, help="payloads decoded")
    parser.add_argument("--repeat", type=int, default=5, help="rounds")
    parser.add_argument("--block", type=int, default=3, help="allreduces timed per round")
    args = parser.parse_args()
    rows = [
        row
        for name in args.models.split(",")
        for row in measure(name, args.workers, args.repeat, args.block)
    ]
    backend = backends.current()
    benchmark_csv.save(__file__, rows, "" if backend.tensorflow_kernels else backend.name)
    frame = pd.DataFrame(rows)
    table = frame.groupby(["model", "mode", "path"], sort=False).agg(
        passes=("passes", "median"),
        low=("passes", "min"),
        high=("passes", "max"),
        ms=("ms", "median"),
        memcpy_ms=("memcpy_ms", "median"),
    )
    print(f"{benchmark_csv.machine()}; {args.workers} payloads decoded, {args.repeat} rounds")
    print("| model | mode | path | passes (median) | spread | ms | memcpy ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (model, mode, path), r in table.iterrows():
        print(
            f"| {model} | {mode} | {path} | {r.passes:.1f} | {r.low:.1f}-{r.high:.1f} "
            f"| {r.ms:.1f} | {r.memcpy_ms:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
