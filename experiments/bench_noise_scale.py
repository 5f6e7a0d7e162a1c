"""What measuring the gradient noise scale costs a training step.

    .venv/bin/python experiments/bench_noise_scale.py [--np 2] [--epochs 5] [--repeat 3]
    .venv/bin/python experiments/bench_noise_scale.py --hook [--np 2] [--repeat 5]

Whole runs (default): trains the quickstart (``experiments/quickstart.yaml``) under horovodrun
with the noise scale off (``logging.noise_scale_every_steps=0``), at its default interval and
at every update, interleaved, ``--repeat`` times. A run's speed is the median of its
``samples_per_sec`` train events (so start-up is not counted); the table gives each setting's
step time as a ratio to the run without it in the same round, median and spread (min-max).

The hook alone (``--hook``): under horovodrun, one compiled optimizer update (allreduce
included) of the quickstart model's variables with no meter, a meter at the default interval
and a meter at every update, interleaved in blocks of 200 updates, ``--repeat`` rounds. The
extra microseconds per update are set against the quickstart's step time (measured in the same
workers: a compiled ``train_on_batch`` of 32 examples), which whole runs on a shared machine
are too noisy to resolve.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmark_csv  # noqa: E402  (beside this script)


def hook_worker(repeat: int) -> None:
    """Under horovodrun: time one update with and without the meter (see the module doc)."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from toolkit.optimizers import LARS
    from toolkit.parallel import distributed
    from toolkit.plan import NOISE_SCALE_AUTO
    from toolkit.training import data, models

    distributed.init()
    dataset = data.load("mnist1d", seed=0)
    default = NOISE_SCALE_AUTO["allreduce"]  # several workers' default
    meters = {"off": None, f"every {default}": default, "every update": 1}
    model = models.build(
        "cnn1d", input_shape=dataset.input_shape, num_classes=dataset.num_classes, seed=0
    )
    variables = model.trainable_variables
    grads = [tf.random.normal(v.shape) for v in variables]
    updates = {}
    for name, every in meters.items():
        meter = distributed.GradientNoiseMeter(every) if every else None
        optimizer = distributed.DistributedOptimizer(LARS(0.1, momentum=0.9), noise_meter=meter)
        optimizer.build(variables)
        updates[name] = tf.function(lambda o=optimizer: o.apply(grads, variables))
    model.compile(
        optimizer=distributed.DistributedOptimizer(LARS(0.1, momentum=0.9)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    x, y = dataset.x_train[:32], dataset.y_train[:32]
    timings = {name: [] for name in [*updates, "train step"]}
    steps = {**updates, "train step": lambda: model.train_on_batch(x, y)}
    for step in steps.values():
        for _ in range(50):
            step()
    for _ in range(repeat):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(200):
                step()
            timings[name].append((time.perf_counter() - start) / 200 * 1e6)
    if distributed.is_rank0():
        benchmark_csv.save(
            __file__,
            [
                {"case": name, "repeat": i, "microseconds": us}
                for name, values in timings.items()
                for i, us in enumerate(values, 1)
            ],
            "hook",
        )
        step_us = float(np.median(timings.pop("train step")))
        off = np.array(timings["off"])
        print(f"quickstart train step (32 examples per worker): {step_us:,.0f} us")
        print("| meter | update (us, median) | extra per update (us) | x step time |")
        print("| --- | --- | --- | --- |")
        for name, values in timings.items():
            extra = np.array(values) - off
            print(
                f"| {name} | {np.median(values):,.0f} | {np.median(extra):+.0f} "
                f"({extra.min():+.0f} to {extra.max():+.0f}) | "
                f"{1 + np.median(extra) / step_us:.3f} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="workers")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hook", action="store_true", help="time the allreduce hook alone")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        hook_worker(args.repeat)
        return 0
    if args.hook:
        import subprocess

        horovodrun = Path(sys.executable).with_name("horovodrun")
        command = [str(horovodrun), "--gloo", "-np", str(args.np), "-H", f"localhost:{args.np}"]
        command += [sys.executable, __file__, "--worker", "--repeat", str(args.repeat)]
        return subprocess.run(command, check=False).returncode

    from toolkit import config as config_lib
    from toolkit.launching import launch
    from toolkit.plan import NOISE_SCALE_AUTO
    from toolkit.runs import monitor
    from toolkit.runs.events import read_events

    default = NOISE_SCALE_AUTO["allreduce"]  # several workers' default ('auto')
    settings = {"off": 0, f"every {default} updates (default)": default, "every update": 1}
    ratios: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as root:
        for round_ in range(args.repeat):
            speed = {}
            for name, every in settings.items():
                config = config_lib.load(
                    ROOT / "experiments" / "quickstart.yaml",
                    [f"epochs={args.epochs}", f"logging.noise_scale_every_steps={every}"],
                )
                run = launch.launch(config, np=args.np, runs_root_dir=root)
                state = monitor.follow(run, progress=False)["state"]
                if state != "completed":
                    print(f"{run.run_id} {state}: see {run.stdout_path}", file=sys.stderr)
                    return 1
                events = read_events(run.events_path)
                speed[name] = events.loc[events.phase == "train", "samples_per_sec"].median()
            for name in settings:
                ratios[name].append(speed["off"] / speed[name])  # step time vs off
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in speed.items()))
    benchmark_csv.save(
        __file__,
        [
            {"noise_scale": name, "round": i, "step_time_x_off": ratio, "workers": args.np}
            for name, values in ratios.items()
            for i, ratio in enumerate(values, 1)
        ],
    )
    print(f"\nquickstart, {args.np} workers, {args.epochs} epochs, {args.repeat} rounds")
    print("| noise scale | step time x off (median) | spread (min-max) |")
    print("| --- | --- | --- |")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
