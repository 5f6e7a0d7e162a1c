"""Does a config reach the same accuracy on every Keras backend? The quickstart (MNIST-1D's
1-D CNN, LARS, 2 workers of 32, 20 epochs: 1,240 updates of 64, 79,360 examples) on TensorFlow,
JAX and PyTorch, 3 seeds each; with ``--techniques``, the quickstart under each of the lab's
communication and scaling techniques (``TECHNIQUES``) on the backends that run them.

    python experiments/backend_accuracy.py [--runs DIR] [--seeds 0 1 2] [--epochs 20]
    python experiments/backend_accuracy.py --techniques "topk 10%" dgc 2bit "local SGD H=4" \
        adascale --backends tensorflow torch --out backend_techniques.csv
    python experiments/backend_accuracy.py --techniques "topk 10%" "dgc, no warm-up" 2bit \
        "local SGD H=4" adascale "adascale, SGD" --backends jax --out backend_techniques_jax.csv

Each run is an ordinary run (``launch(config, backend=...)``) in ``--runs``; a run already
there and completed is read, not trained again. Prints, per technique and backend, the final
test accuracy and test loss over the seeds (mean ± std; accuracy: higher is better) and the
wall time, and writes every run's row to ``experiments/<--out>`` (``backend_accuracy.csv``).
The backends start from different initial weights (each draws Keras's seeded initialisers with
its own generator), so the comparison is of distributions over seeds, not of runs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from toolkit.config import load
from toolkit.launching import launch as launcher
from toolkit.runs import monitor
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir

HERE = Path(__file__).parent
BACKENDS = ("tensorflow", "jax", "torch")
TECHNIQUES = {  # name: the quickstart's overrides
    "dense": [],
    "topk 10%": ["allreduce.compression=topk", "allreduce.ratio=0.1"],
    "dgc": ["allreduce.compression=topk", "allreduce.ratio=0.01", "allreduce.dgc=true"],
    "dgc, no warm-up": [  # what a compiled JAX step carries: an encoding of fixed size
        "allreduce.compression=topk",
        "allreduce.ratio=0.01",
        "allreduce.dgc=true",
        "allreduce.sparsity_warmup_epochs=0",
    ],
    "2bit": ["allreduce.compression=2bit", "allreduce.threshold=0.01"],
    "threshold 0.01": ["allreduce.compression=threshold", "allreduce.threshold=0.01"],
    "local SGD H=4": ["sync.mode=local_sgd", "sync.period=4"],
    "adascale": ["lr_scaling={rule: adascale, base_batch: 32}"],
    "adascale, SGD": [  # AdaScale's gain is derived for SGD (the rate of notebook 04's clone)
        "optimizer.name=sgd",
        "optimizer.learning_rate=0.05",
        "optimizer.params={momentum: 0.9, weight_decay: 0.0001}",
        "lr_scaling={rule: adascale, base_batch: 32}",
    ],
}


def completed(run_id: str, root: Path, config, backend: str) -> RunDir:
    """The run ``run_id`` of ``config`` on ``backend`` in ``root``, launched if it is not
    there and waited for; raises if it did not complete."""
    run = RunDir(root / run_id)
    if not (run.path / "config.yaml").exists():
        run = launcher.launch(config, runs_root_dir=root, run_id=run_id, backend=backend)
    status = monitor.follow(run, progress=False)
    if status["state"] != "completed":
        raise RuntimeError(f"{run_id} ended {status['state']}: see {run.stdout_path}")
    return run


def row(run: RunDir, technique: str, backend: str, seed: int) -> dict:
    events = read_events(run.events_path)
    last = events[events.phase == "eval"].iloc[-1]
    wall = events.wall.max() - events.wall.min()
    return {
        "technique": technique,
        "backend": backend,
        "seed": seed,
        "run_id": run.run_id,
        "updates": int(last.step),
        "test_accuracy": float(last.accuracy),
        "test_loss": float(last.loss),
        "wall_s": round(float(wall), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs-backend-accuracy"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--techniques", nargs="+", choices=TECHNIQUES, default=["dense"])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--out", default="backend_accuracy.csv", help="under experiments/")
    args = parser.parse_args()
    rows = []
    for technique in args.techniques:
        slug = re.sub(r"[^A-Za-z0-9_.]+", "-", technique).strip("-")  # a run id's characters
        prefix = "" if technique == "dense" else f"{slug}-"
        for backend in args.backends:
            for seed in args.seeds:
                overrides = [f"seed={seed}", f"epochs={args.epochs}", *TECHNIQUES[technique]]
                config = load(HERE / "quickstart.yaml", overrides)
                run_id = f"{prefix}{backend}-seed{seed}"
                run = completed(run_id, args.runs.resolve(), config, backend)
                rows.append(row(run, technique, backend, seed))
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(HERE / args.out, index=False)
    summary = table.groupby(["technique", "backend"], sort=False).agg(
        accuracy_mean=("test_accuracy", "mean"),
        accuracy_std=("test_accuracy", "std"),
        loss_mean=("test_loss", "mean"),
        loss_std=("test_loss", "std"),
        wall_s=("wall_s", "mean"),
    )
    print(summary.round(4).to_markdown())


if __name__ == "__main__":
    main()
