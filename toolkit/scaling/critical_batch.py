"""The critical batch, measured by McCandlish et al. (2018)'s own method: steps to a target loss
over a grid of batches, fitted with ``S(B) = S_min·(1 + B_crit/B)``.

Below ``B_crit`` doubling the batch nearly halves the steps to a loss; above it, the steps
approach ``S_min`` and extra batch buys little. ``B_crit = E_min/S_min``, the ratio of the
fewest examples to the fewest steps that reach the loss. The fit is linear in ``1/B``:
``S = S_min + (S_min·B_crit)·(1/B)``, least squares of the relative residuals over the grid's
batches, each at the rate that reached the target in the fewest steps (every seed having
reached it).

A fit is kept only if it can be stood behind (:attr:`TargetFit.flaws` is empty): at least
:data:`MIN_BATCHES` batches reached its target (two points fit two parameters exactly, with
nothing left to check the curve by), ``S_min`` and ``B_crit`` are finite and positive, no
best run was already there at its first evaluation (its steps only an upper bound), and at
least one batch's best rate had a slower rate on each side of it (where every best rate is the
grid's lowest or highest, a rate beyond the grid may be faster, and the steps are not the
fewest): :func:`flaws`. A calibration (:class:`Calibration`) keeps the usable fits with their
bootstrap bands and the simple noise scale ``B_simple`` measured on the same runs near each
target, so that
:mod:`toolkit.launching.probe` can answer with this task's ``B_crit`` instead of a factor
measured on another. It is kept in the runs root per task (:func:`task_key`: dataset, model,
optimizer), as strict JSON (a value that is not finite is ``null``), by :func:`save` and
:func:`stored`; :func:`stored` never returns a fit with a flaw, whoever wrote the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from toolkit import files

MIN_BATCHES = 3
"""Batches that must reach a target for its fit to be kept: one more than ``S(B)``'s two
parameters."""
MIN_RATES = 3
"""Rates per batch a calibration grid needs: with fewer, every best rate is at the grid's edge."""
CALIBRATIONS_DIR = ".calibrations"
"""Where :func:`save` keeps each task's calibration, in the runs root (``<task>.json``)."""
DRAWS = 2000


def fit_tradeoff(
    batches: np.ndarray, steps: np.ndarray, relative: bool = True
) -> tuple[float, float]:
    """``(S_min, B_crit)`` of ``S = S_min·(1 + B_crit/B)`` by least squares in ``1/B``: of the
    residuals relative to each batch's steps (``relative``, the default: seed-to-seed spread
    in steps grows with the steps, 10–30% at every batch, so plain least squares lets the
    smallest batch's noise set the slope), or of the plain residuals (the study's published
    fits). Where the steps do not fall with the batch (slope ≤ 0), ``B_crit`` is 0: below the
    grid; where the fitted ``S_min`` is not positive (the steps fall as fast as ``1/B`` across
    the grid), ``B_crit`` is infinite: above it."""
    steps = np.asarray(steps, float)
    design = np.c_[np.ones(len(steps)), 1 / np.asarray(batches, float)]
    weights = 1 / steps if relative else np.ones_like(steps)
    (intercept, slope), *_ = np.linalg.lstsq(design * weights[:, None], steps * weights, rcond=None)
    if slope <= 0:
        return float(intercept), 0.0
    if intercept <= 0:
        return float(intercept), math.inf
    return float(intercept), float(slope / intercept)


def steps_to_target(evals: pd.DataFrame, target: float) -> float:
    """The updates a run took to bring its held-out loss to ``target``: linearly interpolated
    between the evaluation before the first one at or below it and that one (the first itself,
    if the first evaluation is already there); ``inf`` if none is. ``evals`` has ``updates``
    and ``loss`` columns, in order."""
    losses, updates = evals["loss"].to_numpy(float), evals["updates"].to_numpy(float)
    below = np.flatnonzero(losses <= target)
    if not len(below):
        return math.inf
    at = below[0]
    if at == 0 or not np.isfinite(losses[at - 1]):
        return float(updates[at])
    before, after = losses[at - 1], losses[at]
    share = (before - target) / (before - after)
    return float(updates[at - 1] + share * (updates[at] - updates[at - 1]))


def best_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Per batch, the rate whose mean steps over the seeds is the fewest (every seed having
    reached the target), with those mean steps. ``runs``: one row per run at one target, with
    ``batch``, ``rate``, ``seed`` and ``steps`` (``inf``: never reached)."""
    done = runs[np.isfinite(runs.steps)]
    by_rate = done.groupby(["batch", "rate"]).agg(steps=("steps", "mean"), n=("steps", "size"))
    by_rate = by_rate[by_rate.n == runs.seed.nunique()]
    return by_rate.reset_index().sort_values("steps").groupby("batch").first().reset_index()


@dataclass(frozen=True)
class TargetFit:
    """The fit at one target loss: ``S_min`` and ``B_crit`` with the 10–90% band of refits on
    resampled data (with several seeds, each batch's steps taken from a seed drawn at random;
    with one, the batches drawn with replacement: ``nan`` with two), and ``B_simple`` near the
    target (the pooled ratio of ``tr Σ`` to ``|G|²`` over the chosen runs' measurements, ``nan``
    without any) with its band over runs drawn with replacement. ``best``: the chosen rate and
    steps per batch."""

    target: float
    s_min: float
    b_crit: float
    b_crit_band: tuple[float, float]
    b_simple: float
    b_simple_band: tuple[float, float]
    measurements: int
    runs: int
    best: pd.DataFrame = dataclasses.field(repr=False, compare=False)
    flaws: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """``B_crit / B_simple``: the factor a probe's ``B_simple`` is multiplied by."""
        return self.b_crit / self.b_simple if self.b_simple > 0 else math.nan

    def record(self) -> dict:
        """The fit as plain fields, its best rates as rows (``inf`` and ``nan`` stay floats
        here; :func:`save` writes them as ``null``)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        best = self.best[["batch", "rate", "steps"]].astype({"batch": int, "steps": float})
        bands = {name: list(fields[name]) for name in ("b_crit_band", "b_simple_band")}
        return fields | bands | {"best": best.to_dict("records"), "flaws": list(self.flaws)}


def fit(runs: pd.DataFrame, draws: int = DRAWS, relative: bool = True) -> TargetFit:
    """One target's runs (as :func:`best_rates` takes them, with ``measurements``,
    ``grad_sq_sum`` and ``trace_sigma_sum`` columns): the :class:`TargetFit` (``relative``: as
    :func:`fit_tradeoff`), with its :func:`flaws`. Raises ``ValueError`` when fewer than two
    batches reached the target."""
    best = best_rates(runs)
    if len(best) < 2:
        reached = ", ".join(map(str, best.batch)) or "none"
        raise ValueError(
            f"fewer than two batches reached loss {runs.target.iloc[0]:g} (reached: {reached})"
        )
    batches = best.batch.to_numpy(float)
    s_min, b_crit = fit_tradeoff(batches, best.steps.to_numpy(float), relative)
    chosen = runs.merge(best[["batch", "rate"]], on=["batch", "rate"])
    per_seed = chosen.pivot_table(index="batch", columns="seed", values="steps").to_numpy()
    rng = np.random.default_rng(0)
    if per_seed.shape[1] > 1:
        picks = rng.integers(0, per_seed.shape[1], size=(draws, len(batches)))
        chosen_steps = (per_seed[np.arange(len(p)), p] for p in picks)
        refits = [fit_tradeoff(batches, steps, relative)[1] for steps in chosen_steps]
    elif len(batches) > 2:
        cases = rng.integers(0, len(batches), size=(draws, len(batches)))
        cases = [c for c in cases if len(set(c)) > 1]
        refits = [fit_tradeoff(batches[c], per_seed[c, 0], relative)[1] for c in cases]
    else:  # one seed on two batches: nothing to resample
        refits = [math.nan]
    measured = chosen[chosen.measurements > 0]
    trace, grad_sq = measured.trace_sigma_sum.to_numpy(), measured.grad_sq_sum.to_numpy()
    b_simple, b_simple_band = math.nan, (math.nan, math.nan)
    if len(measured) and grad_sq.sum() > 0:
        b_simple = float(trace.sum() / grad_sq.sum())
        rows = rng.integers(0, len(measured), size=(draws, len(measured)))
        sums = grad_sq[rows].sum(1)
        boot = np.where(sums > 0, trace[rows].sum(1) / np.where(sums > 0, sums, 1), np.inf)
        b_simple_band = _band(boot)
    return TargetFit(
        target=float(runs.target.iloc[0]),
        s_min=s_min,
        b_crit=b_crit,
        b_crit_band=_band(np.array(refits)),
        b_simple=b_simple,
        b_simple_band=b_simple_band,
        measurements=int(measured.measurements.sum()),
        runs=len(measured),
        best=best,
        flaws=tuple(flaws(s_min, b_crit, best, runs)),
    )


def flaws(s_min: float, b_crit: float, best: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """Why a fit of ``best`` (per batch, its fastest rate) over ``runs`` (every batch's rates)
    cannot be kept, each reason saying what grid would fix it: too few batches reached the
    target, a parameter that is not finite and positive, a best run already there at its first
    evaluation (``at_first``: its steps are an upper bound), every best rate at its batch's
    lowest or highest rate."""
    batches, found = sorted(runs.batch.unique()), []
    if len(best) < MIN_BATCHES:
        found.append(
            f"only {len(best)} batches reached the loss: S(B) has two parameters, so "
            f"{MIN_BATCHES} or more are needed to check the curve (a batch between or beyond "
            f"{', '.join(map(str, best.batch))}, or more epochs, --epochs)"
        )
    if not (math.isfinite(s_min) and s_min > 0):
        found.append(
            f"S_min came out {s_min:,.1f}, not positive: the steps fell at least as fast as 1/B "
            f"across the grid, so B_crit is above its largest batch, {batches[-1]:,} (a larger "
            "batch, --batches)"
        )
    elif not (math.isfinite(b_crit) and b_crit > 0):
        found.append(
            "B_crit came out 0: the steps did not fall as the batch grew, so B_crit is below the "
            f"grid's smallest batch, {batches[0]:,} (a smaller batch, --batches)"
        )
    chosen = runs.merge(best[["batch", "rate"]], on=["batch", "rate"])
    if "at_first" in chosen and (early := sorted(chosen.batch[chosen.at_first].unique())):
        found.append(
            f"batch {', '.join(map(str, early))} was already there at its first evaluation, so "
            "its steps are only an upper bound (a tighter loss, --targets, or evaluations "
            "closer together)"
        )
    rates = runs.groupby("batch")["rate"].agg(["min", "max", "nunique"])
    inside = [
        row.batch
        for row in best.itertuples()
        if rates.loc[row.batch, "nunique"] >= MIN_RATES
        and rates.loc[row.batch, "min"] < row.rate < rates.loc[row.batch, "max"]
    ]
    if not inside:
        found.append(
            "every batch's best rate is the lowest or highest it was given: a rate beyond the "
            f"grid may reach the loss in fewer steps (at least {MIN_RATES} rates a batch, wider "
            "ones, --rates)"
        )
    return found


def _band(values: np.ndarray) -> tuple[float, float]:
    """The 10th and 90th percentiles, empirical (``inf`` values are ordered, not averaged);
    ``nan`` for a band there was nothing to resample for."""
    if np.isnan(values).all():
        return math.nan, math.nan
    low, high = np.percentile(values, [10, 90], method="inverted_cdf")
    return float(low), float(high)


def task_key(config) -> str:
    """The task a calibration holds for: dataset (with its size), model and optimizer."""
    samples = config.dataset.params.get("num_samples")
    dataset = f"{config.dataset.name}{samples or ''}"
    return re.sub(
        r"[^A-Za-z0-9_.-]+", "_", f"{dataset}-{config.model.name}-{config.optimizer.name}"
    )


@dataclass(frozen=True)
class Calibration:
    """A task's measured trade-off: the fit at each target loss (:meth:`TargetFit.record`),
    the sweep whose runs it read and when. :attr:`headline` is the lowest target's, the
    closest to a trained model's loss."""

    task: str
    sweep: str
    date: str
    fits: tuple[dict, ...]

    @property
    def headline(self) -> dict:
        return min(self.fits, key=lambda f: f["target"])

    def reading(self) -> str:
        """The headline in one line, with its band and where it came from."""
        fit = self.headline
        low, high = fit["b_crit_band"]
        band = f"10–90% band {_count(low)}–{_count(high)}" if math.isfinite(low) else "no band"
        return (
            f"B_crit ≈ {_count(fit['b_crit'])} ({band}), calibrated on this task ({self.task}) "
            f"on {self.date}: steps to held-out "
            f"loss {fit['target']:.3g} over {len(fit['best'])} batches (sweep {self.sweep})"
        )

    def table(self) -> str:
        """Every kept target's fit as a text table (:func:`table`)."""
        return table(self.fits)


def table(fits) -> str:
    """Fits (:meth:`TargetFit.record`) as a text table: ``S_min``, ``B_crit`` and ``B_simple``
    with their bands, and their ratio, and, where any has flaws, whether each is kept.
    ``B_simple`` is read on the runs near the target, as a run's own noise meter reads it, so
    the ratio is the ``batch.adaptive.aim`` that aims an adaptive batch at the critical batch
    (a probe's early reading needs the larger factor of
    :data:`toolkit.launching.probe.CALIBRATION`)."""

    def banded(fit: dict, name: str) -> str:
        low, high = fit[f"{name}_band"]
        band = f" ({_count(low)}-{_count(high)})" if math.isfinite(fit[name]) else ""
        return _count(fit[name]) + band

    columns = {
        "target loss": [f["target"] for f in fits],
        "S_min (updates)": [f"{f['s_min']:,.0f}" for f in fits],
        "B_crit (10-90%)": [banded(f, "b_crit") for f in fits],
        "B_simple near it, pooled (10-90%)": [banded(f, "b_simple") for f in fits],
        "B_crit/B_simple": [_ratio(f) for f in fits],
    }
    if any(f.get("flaws") for f in fits):
        columns["kept"] = ["no" if f.get("flaws") else "yes" for f in fits]
    return pd.DataFrame(columns).to_string(index=False)


def _ratio(fit: dict) -> str:
    ratio = fit["b_crit"] / fit["b_simple"] if fit["b_simple"] > 0 else math.nan
    return f"{ratio:.2f}" if math.isfinite(ratio) else "n/a"


def _count(value: float) -> str:
    """A batch size as text (``inf``; ``n/a`` for what was not measured)."""
    return f"{value:,.0f}" if math.isfinite(value) else "n/a" if math.isnan(value) else "inf"


def save(calibration: Calibration, root: Path) -> Path:
    """Write ``calibration`` as ``<root>/.calibrations/<task>.json`` (atomically), strict JSON:
    a value that is not finite is written ``null``. Raises ``ValueError`` for a fit with
    flaws: those are reported, never kept."""
    if flawed := [f["target"] for f in calibration.fits if f.get("flaws")]:
        raise ValueError(f"fits with flaws are not kept (targets {flawed})")
    path = Path(root) / CALIBRATIONS_DIR / f"{calibration.task}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(path, _strict(dataclasses.asdict(calibration)))
    return path


def stored(config, root: Path) -> Calibration | None:
    """The calibration kept for ``config``'s task under ``root`` with only its usable fits
    (``null`` read back as ``nan``), or ``None`` if it has none or there is none."""
    path = Path(root) / CALIBRATIONS_DIR / f"{task_key(config)}.json"
    try:
        raw = files.read_json(path)
        fits = tuple(_loose(f) for f in raw["fits"])
        kept = Calibration(raw["task"], raw["sweep"], raw["date"], tuple(filter(_usable, fits)))
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one this module wrote
        return None
    return kept if kept.fits else None


def _usable(fit: dict) -> bool:
    """Whether a kept fit (:meth:`TargetFit.record`) may answer a probe: no flaws recorded, and
    the checks that need only the record hold (a file written before flaws were recorded)."""
    s_min, b_crit = fit["s_min"], fit["b_crit"]
    return (
        not fit.get("flaws")
        and len(fit["best"]) >= MIN_BATCHES
        and all(math.isfinite(v) and v > 0 for v in (s_min, b_crit))
    )


def _strict(value):
    """``value`` with every float that is not finite replaced by ``None`` (JSON's ``null``)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _loose(fit: dict) -> dict:
    """A kept fit with ``null`` numbers read back: ``nan``, but ``inf`` for a band's upper
    bound above a finite lower one (resamples that were unbounded)."""
    nan = math.nan
    numbers = {name: nan if fit[name] is None else fit[name] for name in _NUMBERS}
    bands = {}
    for name in _BANDS:
        low, high = fit[name]
        bands[name] = [nan, nan] if low is None else [low, math.inf if high is None else high]
    return fit | bands | numbers


_BANDS = ("b_crit_band", "b_simple_band")
_NUMBERS = ("s_min", "b_crit", "b_simple")
