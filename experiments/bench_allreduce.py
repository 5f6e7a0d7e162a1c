"""What each allreduce mode costs an update, on real models' gradient shapes.

    .venv/bin/python experiments/bench_allreduce.py [--np 2] [--models resnet20,resnet50]
                                                    [--repeat 5]
    .venv/bin/python experiments/bench_allreduce.py --hosts lbl-h1:1,lbl-h2:1 ...

With ``--hosts`` the workers run there, over ssh (on the namespace cluster, whose link
``python -m toolkit cluster shape --bandwidth 1gbit`` limits; the header says how it is
shaped). Without, ``--np`` workers run on localhost.

Under horovodrun (started by this script), for each model's trainable variables: one compiled
update (``DistributedOptimizer(SGD)``, plain SGD, so the update itself costs one pass) with
random gradients, for the dense float32 allreduce, fp16, topk 1% and 0.1% (with residual; 1%
also with the k-th magnitude estimated from a 1% sample, as DGC does) and
threshold (set to select about 1% of the entries, without residual), and SINGA's partial
synchronisation (no gradient sent; one partition of the parameters, up to 64 MB, averaged per
update), MXNet's 2bit (16 entries a word; its bytes do not depend on the threshold), sampled topk
with float16 values, and Deep Gradient Compression's preset on sampled topk 0.1% (momentum
correction and masking, local clipping, dense 1-D variables: the toolkit's SGD with momentum 0.9;
past its warm-up), interleaved, ``--repeat`` rounds of a block of updates.
The table gives the median time per update, its spread over rounds, and the ratio to the dense
allreduce in the same round, with the bytes a worker sent; the raw rounds go to
``bench_allreduce[_LABEL].csv`` beside this script. "selection alone" times only the
top-k (or threshold) selection over the flattened gradients, in one process: the number to set
against the dense allreduce it replaces.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import benchmark_csv  # noqa: E402  (after the path is set)
from toolkit import host_list  # noqa: E402
from toolkit.launching import cluster  # noqa: E402

SHAPES = {"resnet20": ((32, 32, 3), 10), "resnet50": ((224, 224, 3), 1000)}


def modes(threshold: float) -> dict[str, dict]:
    return {
        "dense": {},
        "fp16": {"compression": "fp16"},
        "topk 1%": {"compression": "topk", "ratio": 0.01},
        "topk 0.1%": {"compression": "topk", "ratio": 0.001},
        "topk 1%, sampled 1%": {"compression": "topk", "ratio": 0.01, "topk_sample": 0.01},
        # no residual: with the same gradient every update, the residual would grow past the
        # threshold everywhere and the selection would creep from 1% towards all entries
        "threshold ~1%": {"compression": "threshold", "threshold": threshold, "residual": False},
        "topk 0.1%, sampled 1%": {"compression": "topk", "ratio": 0.001, "topk_sample": 0.01},
        "topk 1%, sampled 1%, fp16 values": {
            "compression": "topk",
            "ratio": 0.01,
            "topk_sample": 0.01,
            "value_dtype": "float16",
        },
        "2bit": {"compression": "2bit", "threshold": threshold},
        "DGC: topk 0.1%, sampled 1%": {
            "compression": "topk",
            "ratio": 0.001,
            "topk_sample": 0.01,
            "dgc": True,
            "sparsity_warmup_epochs": 0,
            "momentum": 0.9,
        },
        "partial (64 MB)": {"sync": "partial"},
    }


def compiled(function, *args):
    """``function(*args)`` as a graph that takes no arguments (so variables stay variables)."""
    import tensorflow as tf

    return tf.function(lambda: function(*args))


def top_k(flat, k: int):
    import tensorflow as tf

    return tf.math.top_k(tf.abs(flat), k)


def sampled_top_k(flat, k: int):
    """The selection of ``topk_sample=0.01``: the k-th magnitude of every 100th entry."""
    import tensorflow as tf

    magnitude = tf.abs(flat)
    kth = tf.math.top_k(magnitude[::100], max(1, k // 100)).values[-1]
    return tf.where(magnitude >= kth)


def at_least(flat, threshold: float):
    import tensorflow as tf

    return tf.where(tf.abs(flat) >= threshold)


def timed(step) -> float:
    """Milliseconds ``step()`` takes."""
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3


def worker(names: list[str], repeat: int, block: int, where: str, label: str) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    from toolkit.optimizers import SGD
    from toolkit.parallel import distributed
    from toolkit.training import models

    distributed.init()
    rows, raw = [], []
    for name in names:
        shape, classes = SHAPES[name]
        model = models.build(name, input_shape=shape, num_classes=classes, seed=0)
        variables = model.trainable_variables
        rng = np.random.default_rng(distributed.rank())
        grads = [tf.constant(rng.normal(size=v.shape).astype("float32")) for v in variables]
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        threshold = float(np.quantile(np.abs(flat.numpy()), 0.99))  # about 1% at or above
        updates, traffic = {}, {}
        for mode, options in modes(threshold).items():
            options = dict(options)
            momentum = options.pop("momentum", None)
            sgd = SGD(0.0, momentum=momentum) if momentum else keras.optimizers.SGD(0.0)
            optimizer = distributed.DistributedOptimizer(sgd, **options)
            optimizer.build(variables)
            updates[mode] = compiled(optimizer.apply, grads, variables)
            traffic[mode] = distributed.traffic(optimizer)
        k = flat.shape[0] // 100
        selection = {
            "selection alone: topk 1%": compiled(top_k, flat, k),
            "selection alone: topk 1%, sampled 1%": compiled(sampled_top_k, flat, k),
            "selection alone: threshold": compiled(at_least, flat, threshold),
        }
        timings = {mode: [] for mode in [*updates, *selection]}
        for step in [*updates.values(), *selection.values()]:
            step()  # trace
        sent = {mode: float(t.sent.numpy()) for mode, t in traffic.items()}
        copy_dense = functools.partial(np.copyto, np.zeros(flat.shape, np.float32), flat.numpy())
        memcpy = []  # one pass over the dense bytes (toolkit.parallel.cost's unit): best of 5
        for _ in range(repeat):
            memcpy.append(min(timed(copy_dense) for _ in range(5)))
            for mode, step in {**updates, **selection}.items():
                start = time.perf_counter()
                for _ in range(block):
                    step()
                timings[mode].append((time.perf_counter() - start) / block * 1e3)
        per_update = {
            mode: (float(t.sent.numpy()) - sent[mode]) / (repeat * block)
            for mode, t in traffic.items()
        }
        dense = np.array(timings["dense"])
        for mode, values in timings.items():
            raw += [
                {"model": name, "mode": mode, "round": r, "ms": ms, "x_dense": ms / d}
                | {"mb_sent": per_update[mode] / 1e6 if mode in per_update else None}
                | {"memcpy_ms": copy, "link": where}
                for r, (ms, d, copy) in enumerate(zip(values, dense, memcpy, strict=True))
            ]
            values = np.array(values)
            rows.append(
                (
                    name,
                    f"{flat.shape[0] / 1e6:.2f}M",
                    mode,
                    f"{np.median(values):,.1f}",
                    f"{values.min():,.1f}-{values.max():,.1f}",
                    f"{np.median(values / dense):.2f}",
                    f"{per_update[mode] / 1e6:.3f}" if mode in per_update else "-",
                )
            )
    if distributed.is_rank0():
        print(f"{distributed.size()} workers (Gloo, {where}), {repeat} rounds of {block}")
        print("| model | entries | mode | ms per update (median) | spread | x dense | MB sent |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        benchmark_csv.save(__file__, raw, label)


def where(hosts: str) -> str:
    """Where the workers run, with the namespace cluster's links if they run on it."""
    on_cluster = set(host_list.parse(hosts)) <= {h.name for h in cluster.hosts()}
    return f"{hosts}, {cluster.links()}" if on_cluster else hosts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="workers on localhost")
    parser.add_argument("--hosts", help="host:slots,... (instead of --np)")
    parser.add_argument("--where", default="localhost", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="resnet20,resnet50")
    parser.add_argument("--repeat", type=int, default=5, help="rounds")
    parser.add_argument("--block", type=int, default=3, help="updates timed per round")
    parser.add_argument(
        "--label", default="", help="the raw CSV's suffix (bench_allreduce_LABEL.csv)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {sorted(SHAPES)}")
    if args.worker:
        worker(names, args.repeat, args.block, args.where, args.label)
        return 0
    hosts = args.hosts or f"localhost:{args.np}"
    horovodrun = Path(sys.executable).with_name("horovodrun")
    command = [str(horovodrun), "--gloo", "-np", str(sum(host_list.parse(hosts).values()))]
    command += ["-H", hosts, sys.executable, __file__, "--worker", "--models", args.models]
    command += ["--where", where(hosts)]
    command += ["--repeat", str(args.repeat), "--block", str(args.block), "--label", args.label]
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
