#!/usr/bin/env python
"""The adaptive batch's ``aim`` and ``hysteresis`` chosen from the noise scale, not by hand.

The rule (:func:`toolkit.scaling.adaptive_batch.next_batch`) moves the global batch towards
``aim × B_simple``, ``B_simple`` being AdaScale's smoothed reading, and moves it only once the
aim has passed the midpoint to the next power of two by ``hysteresis / 3`` of it (up:
``(1.5 + h/2) = 1.5 (1 + h/3)``; down: ``(0.75 − h/4) = 0.75 (1 − h/3)``). So:

* **aim** is the task's ``B_crit / B_simple``, with ``B_simple`` read near each target loss as
  a run's own noise meter reads it (the ratio ``calibrate`` prints): here from the task's
  committed critical-batch study (``--study``), fitted as ``calibrate`` fits (relative least
  squares), the median over its target losses;
* **hysteresis** is three times the relative half-width of the band in which the rule's own
  reading wanders when nothing else changes: a probe (``--steps`` updates at the adaptive run's
  first batch, its rate held constant, on the sweep's workers), its per-update ``|G|²`` and
  ``tr Σ`` smoothed as AdaScale smooths them (bias-corrected EMA, the config's
  ``logging.noise_scale_smoothing``), the 10th and 90th percentiles of the smoothed
  ``B_simple`` over the probe's second half against their median. A reading whose band
  straddles a midpoint then does not move the batch.

    .venv/bin/python experiments/adaptive_aim.py        # ~30 s: one probe on 2 workers

Writes ``experiments/study/adaptive_v3_choice.csv`` (each target's ratio, the probe's band, the
two values), which ``experiments/study/adaptive_v3.yaml`` takes its ``aim`` and ``hysteresis``
from (``tests/test_studies.py`` checks that they agree).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit import config as config_lib  # noqa: E402
from toolkit.scaling.critical_batch import fit  # noqa: E402

SWEEP = ROOT / "experiments" / "study" / "adaptive_v3.yaml"
OUT = ROOT / "experiments" / "study" / "adaptive_v3_choice.csv"


def aims(study: Path) -> pd.DataFrame:
    """``B_crit / B_simple`` near each target loss of the study's runs (relative fit)."""
    runs = pd.read_csv(study)
    rows = []
    for target, part in runs.groupby("target", sort=False):
        found = fit(part)
        rows.append({"target": target, "b_crit": found.b_crit, "b_simple": found.b_simple})
    table = pd.DataFrame(rows)
    return table.assign(ratio=table.b_crit / table.b_simple)


def smoothed_band(gns: pd.DataFrame, smoothing: float) -> tuple[float, float, float]:
    """The 10th, 50th and 90th percentiles of ``B_simple`` smoothed as AdaScale smooths it
    (each of ``|G|²`` and ``tr Σ`` by a bias-corrected EMA of decay ``smoothing``) over the
    second half of ``gns``'s measurements."""
    ema = gns[["trace_sigma_step", "grad_sq_step"]].ewm(alpha=1 - smoothing, adjust=True).mean()
    b_simple = (ema.trace_sigma_step / ema.grad_sq_step).iloc[len(ema) // 2 :]
    low, middle, high = np.percentile(b_simple.to_numpy(), [10, 50, 90])
    return float(low), float(middle), float(high)


def first_config():
    """The adaptive sweep's adaptive method as a fixed run at its first batch (the probe's)."""
    from toolkit.launching import sweep

    cell = next(c for c in sweep.load(SWEEP).cells if c.config.batch.adaptive)
    adaptive = cell.config.batch.adaptive
    per_worker = cell.config.batch.per_worker
    accumulation = adaptive.min // (per_worker * cell.config.workers)
    return config_lib.from_mapping(
        cell.config.model_dump(mode="json"),
        ["batch.adaptive=null", f"batch.accumulation={accumulation}"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=ROOT / "experiments/critical_batch/runs.csv")
    parser.add_argument("--steps", type=int, default=200, help="the probe's updates")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    from toolkit.launching.probe import probe
    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import resolve

    ratios = aims(args.study)
    aim = float(ratios.ratio.median())
    config = first_config()
    with tempfile.TemporaryDirectory() as root:
        result = probe(config, steps=args.steps, np=config.workers, runs_root=root)
        events = read_events(resolve(result.run_id, root).events_path)
    gns = events[events.phase == "gns"].dropna(subset=["grad_sq_step", "trace_sigma_step"])
    low, middle, high = smoothed_band(gns, config.logging.noise_scale_smoothing)
    half_width = (high - low) / (2 * middle)
    hysteresis = min(1.0, 3 * half_width)
    choice = ratios.assign(
        probe_batch=config.batch.per_worker * config.batch.accumulation * config.workers,
        probe_b_simple=result.b_simple,
        smoothed_p10=low,
        smoothed_median=middle,
        smoothed_p90=high,
        aim=round(aim, 2),
        hysteresis=round(hysteresis, 2),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    choice.to_csv(args.out, index=False)
    print(choice.round(3).to_string(index=False))
    print(
        f"\naim {aim:.2f}: the median B_crit / B_simple of {len(ratios)} target losses; "
        f"hysteresis {hysteresis:.2f}: 3 x the smoothed reading's relative half-width "
        f"{half_width:.3f} ({low:,.0f}-{high:,.0f} around {middle:,.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
