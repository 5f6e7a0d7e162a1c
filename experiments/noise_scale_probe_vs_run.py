"""Why notebook 01's probe and its run's B_simple curve disagree: the two read the gradient noise
scale over different stretches of training.

    .venv/bin/python experiments/noise_scale_probe_vs_run.py [--epochs 20] [--seed 0]

Notebook 01's config at its full size (MNIST-1D, the CNN, LARS with warm-up and cosine decay,
one worker, batch 64): first ``probe.probe`` for 200 updates, then the run itself. The table has
one row for the probe's reading (its last half's ratio of means, with its bootstrap band) and one
per ``gns`` event of the run (the exponential averages the run logs: ``b_simple`` and the
averaged ``|G|²`` and ``tr Σ`` it is the ratio of); every row goes to
``noise_scale_probe_vs_run.csv``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmark_csv  # noqa: E402
import pandas as pd  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "01_quickstart.ipynb"


def notebook_config(epochs: int, seed: int):
    """The config notebook 01 builds, read from the notebook itself, at ``epochs``."""
    from toolkit.config import from_mapping

    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "from_mapping(" in "".join(c["source"]))
    mapping = source[source.index("from_mapping(") + len("from_mapping(") : source.index("\n)")]
    mapping = mapping.replace("NUM_SAMPLES", "5000").replace("EPOCHS", str(epochs))
    return from_mapping(ast.literal_eval(mapping.strip()), [f"seed={seed}"])  # its literal


def main() -> None:
    from toolkit.launching import probe
    from toolkit.runs.events import read_events
    from toolkit.train import train

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20, help="the run's epochs (notebook: 20)")
    parser.add_argument("--seed", type=int, default=0, help="the config's seed")
    args = parser.parse_args()
    config = notebook_config(args.epochs, args.seed)
    runs = Path(tempfile.mkdtemp(prefix="lbl-gns-"))
    found = probe.probe(config, steps=200, runs_root=runs)
    rows = [
        {
            "source": "probe (last 100 of 200 updates)",
            "update": 200,
            "b_simple": found.b_simple,
            "band_low": found.band[0],
            "band_high": found.band[1],
        }
    ]
    events = read_events(train(config, runs_root=runs, verbose=0).events_path)
    for event in events[events.phase == "gns"].to_dict("records"):
        rows.append(
            {
                "source": "run (exponential average)",
                "update": int(event["step"]),
                "b_simple": event["b_simple"],
                "grad_sq": event["grad_sq"],
                "trace_sigma": event["trace_sigma"],
            }
        )
    benchmark_csv.save(__file__, [{**row, "seed": args.seed} for row in rows])
    columns = ["source", "update", "b_simple", "band_low", "band_high", "grad_sq", "trace_sigma"]
    print(pd.DataFrame(rows).reindex(columns=columns).to_string(index=False, float_format="%.3g"))


if __name__ == "__main__":
    main()
