"""Synthetic run directories, for tests and the dashboard's benchmarks (a fixture, not part of
the app): a config, a status and an events file with train, eval and trust-ratio rows, written
with the toolkit's own writers."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from pathlib import Path

from toolkit.config import from_mapping
from toolkit.runs.events import EventWriter
from toolkit.runs.rundir import RunDir

LAYERS = ("conv1/kernel", "conv2/kernel", "conv3/kernel", "dense/kernel", "dense/bias")


def fake_run(
    root: str | Path,
    run_id: str,
    *,
    events: int = 1000,
    state: str = "completed",
    optimizer: str = "lars",
    epochs: int = 10,
    eval_every: int = 100,
    trust_every: int = 200,
    gns_every: int | None = None,
    system_every: int | None = None,
    bytes_per_update: float | None = None,
    seed: int = 0,
    pid: int | None = None,
    resets: Sequence[tuple[int, int]] = (),
) -> RunDir:
    """A run with ``events`` event lines (train rows, an eval row every ``eval_every`` steps,
    a trust-ratio row every ``trust_every``, a gradient-noise-scale row every ``gns_every`` and
    a system-metrics row of two workers every ``system_every`` if given) spread evenly over
    ``epochs``; with ``bytes_per_update``, train rows carry that traffic (``comm/bytes_sent``,
    against 40 kB dense). ``resets``: ``(step, workers)`` where an elastic run's world changed
    (an ``elastic`` row, and ``world_size`` on the train rows; 2 workers before the first)."""
    rng = random.Random(seed)
    run = RunDir.create(root, run_id)
    config = from_mapping(
        {
            "name": run_id[:40].strip("-") or "run",
            "optimizer": {
                "name": optimizer,
                "learning_rate": 0.1,
                "params": {"momentum": 0.9},
            },
            "batch": {"per_worker": 32},
            "epochs": epochs,
            "workers": 2,
        }
    )
    run.write_config(config)
    start = time.time() - events * 0.05
    run.update_meta(run_id=run_id, created=start, world_size=2, seed=seed)
    steps = max(1, events - events // eval_every - events // trust_every)
    per_epoch = steps / epochs
    world, changes = 2, dict(resets)
    with EventWriter(run.events_path) as writer:
        for step in range(steps):
            wall, epoch = start + step * 0.05, step / per_epoch
            decay = math.exp(-step / (steps / 3))
            if step in changes:
                reason = "a worker was lost" if changes[step] < world else "hosts were added"
                hosts = ",".join(f"h{i}" for i in range(1, changes[step] + 1))
                writer.write(
                    {"step": step, "epoch": epoch, "wall": wall, "phase": "elastic"}
                    | {"world_size": changes[step], "previous_world_size": world, "hosts": hosts}
                    | {"reason": reason, "steps_lost": 3 if changes[step] < world else 0}
                )
                world = changes[step]
            writer.write(
                {
                    "step": step,
                    "epoch": epoch,
                    "wall": wall,
                    "phase": "train",
                    "lr": 0.1 * (1 - step / steps),
                    "momentum": 0.9,
                    "loss": 2.3 * decay + 0.1 + 0.05 * rng.random(),
                    "accuracy": 0.95 - 0.85 * decay + 0.02 * rng.random(),
                    "samples_per_sec": 3000 + 200 * rng.random(),
                    "world_size": world,
                }
                | (
                    {}
                    if bytes_per_update is None
                    else {
                        "comm/bytes_sent": bytes_per_update,
                        "comm/compression_ratio": 40_000 / bytes_per_update,
                    }
                )
            )
            if step % eval_every == eval_every - 1:
                writer.write(
                    {
                        "step": step,
                        "epoch": epoch,
                        "wall": wall,
                        "phase": "eval",
                        "loss": 2.3 * decay + 0.2,
                        "accuracy": 0.9 - 0.8 * decay,
                    }
                )
            if gns_every and step % gns_every == gns_every - 1:
                b_simple = 200 + 800 * (1 - decay) + 50 * rng.random()
                writer.write(
                    {"step": step, "epoch": epoch, "wall": wall, "phase": "gns"}
                    | {"b_simple": b_simple, "grad_sq": 1 / b_simple, "trace_sigma": 1.0}
                    | {"b_small": 32, "b_big": 64}
                )
            if system_every and step % system_every == system_every - 1:
                writer.write(
                    {"step": step, "epoch": epoch, "wall": wall, "phase": "system"}
                    | {f"cpu_percent/rank{r}": 90 + 20 * rng.random() for r in (0, 1)}
                    | {f"memory_gb/rank{r}": 0.6 + 0.01 * step / steps for r in (0, 1)}
                    | (
                        {f"bytes_sent_per_update/rank{r}": bytes_per_update for r in (0, 1)}
                        if bytes_per_update
                        else {}
                    )
                )
            if step % trust_every == trust_every - 1:
                writer.write(
                    {"step": step, "epoch": epoch, "wall": wall, "phase": "trust_ratio"}
                    | {f"trust_ratio/{layer}": rng.uniform(0.001, 0.05) for layer in LAYERS}
                )
    finished = start + steps * 0.05
    if state in ("queued", "running"):
        run.set_status(state, pid=pid, started=start)
    else:
        run.set_status(
            state,
            pid=pid,
            started=start,
            finished=finished,
            exit_code=0 if state == "completed" else 1,
        )
    with open(run.stdout_path, "w") as log:
        log.write(f"[1,0]<stdout>:training {run_id}\n[1,0]<stdout>:done\n")
    return run
