"""What measuring the gradient noise scale costs a training step.

    .venv/bin/python experiments/bench_noise_scale.py [--np 2] [--epochs 5] [--repeat 3]

Trains the quickstart (``experiments/quickstart.yaml``) under horovodrun with the noise scale
off (``logging.noise_scale_every_steps=0``), at its default interval and at every update,
interleaved, ``--repeat`` times. A run's speed is the median of its ``samples_per_sec`` train
events (so start-up is not counted); the table gives each setting's step time as a ratio to the
run without it in the same round, median and spread (min-max) over the rounds.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="workers")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from toolkit import config as config_lib
    from toolkit import launch, monitor
    from toolkit.events import read_events

    default = config_lib.LoggingConfig().noise_scale_every_steps
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
    print(f"\nquickstart, {args.np} workers, {args.epochs} epochs, {args.repeat} rounds")
    print("| noise scale | step time x off (median) | spread (min-max) |")
    print("| --- | --- | --- |")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
