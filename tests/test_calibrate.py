"""The calibrated critical batch: McCandlish et al.'s fit against a synthetic ``S(B)`` whose
``B_crit`` is known, steps to a target read off evaluations, a calibration kept per task and
read by the probe, and a small real calibration from the command line checked against the
fit redone here from its runs' events."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from toolkit.config import from_mapping
from toolkit.launching.probe import summarize
from toolkit.scaling import critical_batch
from toolkit.scaling.critical_batch import Calibration

S_MIN, B_CRIT = 200.0, 300.0
BATCHES = np.array([16, 64, 256, 1024, 4096])


def synthetic_runs(seeds: int, noise: float, rng) -> pd.DataFrame:
    """Steps to one target as ``S_min·(1 + B_crit/B)`` with lognormal noise per seed at the
    best rate; a rate twice as large needs 1.5x the steps, one that never reaches it none."""
    rows = []
    for batch in BATCHES:
        truth = S_MIN * (1 + B_CRIT / batch)
        for seed in range(seeds):
            steps = truth * math.exp(noise * rng.normal())
            rows += [
                {"batch": batch, "rate": 0.1, "seed": seed, "steps": steps},
                {"batch": batch, "rate": 0.2, "seed": seed, "steps": 1.5 * steps},
                {"batch": batch, "rate": 0.4, "seed": seed, "steps": math.inf},
            ]
    runs = pd.DataFrame(rows).assign(target=0.5, measurements=0, grad_sq_sum=0.0)
    return runs.assign(trace_sigma_sum=0.0)


@pytest.mark.parametrize("seeds", [1, 3])
def test_the_fit_recovers_a_known_critical_batch_with_a_band_around_it(seeds):
    rng = np.random.default_rng(seeds)
    fit = critical_batch.fit(synthetic_runs(seeds, noise=0.05, rng=rng))
    assert fit.best.rate.tolist() == [0.1] * len(BATCHES)  # the fewest steps, every seed there
    assert fit.s_min == pytest.approx(S_MIN, rel=0.1)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=0.2)
    low, high = fit.b_crit_band
    assert low < fit.b_crit < high and low < B_CRIT < high and high / low < 2
    exact = critical_batch.fit(synthetic_runs(seeds, noise=0.0, rng=rng))
    assert exact.b_crit == pytest.approx(B_CRIT) and exact.s_min == pytest.approx(S_MIN)
    assert math.isnan(exact.b_simple)  # no noise-scale measurement among the runs


def test_outside_the_grid_the_fit_says_so():
    batches = np.array([64.0, 256.0, 1024.0])
    assert critical_batch.fit_tradeoff(batches, 1000 / batches - 0.1)[1] == math.inf  # ∝ 1/B
    assert critical_batch.fit_tradeoff(batches, 50 + batches / 1000)[1] == 0.0  # rising: below
    one_batch = synthetic_runs(1, 0.0, np.random.default_rng(0))
    one_batch.loc[one_batch.batch != 16, "steps"] = math.inf
    with pytest.raises(ValueError, match="fewer than two batches reached loss 0.5"):
        critical_batch.fit(one_batch)


def test_steps_to_target_interpolate_between_the_evaluations_around_the_crossing():
    evals = pd.DataFrame({"updates": [100, 200, 300, 400], "loss": [2.0, 1.2, 0.8, 0.5]})
    assert critical_batch.steps_to_target(evals, 1.0) == pytest.approx(250)  # 1.2 → 0.8
    assert critical_batch.steps_to_target(evals, 0.5) == pytest.approx(400)
    assert critical_batch.steps_to_target(evals, 2.5) == 100  # the first is already below
    assert critical_batch.steps_to_target(evals, 0.4) == math.inf


def test_a_kept_calibration_is_read_for_its_task_only_and_the_probe_answers_with_it(tmp_path):
    config = from_mapping({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
    rng = np.random.default_rng(0)
    measured = {"measurements": 4, "grad_sq_sum": 2.0, "trace_sigma_sum": 300.0}
    runs = [synthetic_runs(2, 0.05, rng).assign(target=t, **measured) for t in (0.9, 0.5)]
    fits = [critical_batch.fit(part) for part in runs]
    assert fits[1].b_simple == 150 and fits[1].ratio == pytest.approx(fits[1].b_crit / 150)
    records = tuple(f.record() for f in fits)
    kept = Calibration(critical_batch.task_key(config), "cal-x", "2026-11-27", records)
    critical_batch.save(kept, tmp_path)
    found = critical_batch.stored(config, tmp_path)
    assert found == kept and found.headline["target"] == 0.5
    other = from_mapping({"optimizer": {"name": "lars", "learning_rate": 0.1}})
    assert critical_batch.stored(other, tmp_path) is None
    assert "0.5" in found.table() and "0.9" in found.table()

    gns = pd.DataFrame({"grad_sq_step": np.ones(40), "trace_sigma_step": np.full(40, 100.0)})
    reading = summarize(gns, "probe-x", config, 1, found).reading()
    b_crit, (low, high) = fits[1].b_crit, fits[1].b_crit_band
    assert f"B_crit ≈ {b_crit:,.0f} (10–90% band {low:,.0f}–{high:,.0f}), calibrated" in reading
    assert "on this task (mnist1d-cnn1d-sgd) on 2026-11-27" in reading
    assert "the median factor" not in reading


def _steps(losses: list[float], per_epoch: float, target: float) -> float:
    """The test's own reading of steps to a target: the first epoch at or under it, linearly
    back towards the epoch before."""
    for epoch, loss in enumerate(losses):
        if loss <= target:
            if epoch == 0:
                return per_epoch
            share = (losses[epoch - 1] - target) / (losses[epoch - 1] - loss)
            return per_epoch * (epoch + share)
    return math.inf


def test_a_small_calibration_from_the_terminal_is_kept_and_is_the_fit_of_its_runs(
    tmp_path, subprocess_env, monkeypatch, capsys
):
    """Three batches at one rate, one worker each: refused without ``--yes`` off a terminal
    (the cost printed, nothing started), then run; the kept ``B_crit`` at each target is the
    least-squares fit of relative residuals redone here from the runs' own eval events."""
    from toolkit.__main__ import main
    from toolkit.launching import sweep, sweep_results
    from toolkit.runs.events import read_events

    overrides = ["workers=1", "optimizer.name=sgd", "optimizer.params={momentum: 0.9}"]
    args = ["calibrate", "experiments/quickstart.yaml"]
    args += [arg for override in overrides for arg in ("--set", override)]
    args += ["--batches", "32", "64", "128", "--rates", "1", "--epochs", "2"]
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: nobody to ask
    assert main(["--runs", str(tmp_path), *args]) == 2
    refused = capsys.readouterr()
    assert "pass --yes to start it" in refused.err
    assert "sweep cal-quickstart: 3 cells" in refused.out and "estimated time" in refused.out
    assert not any(tmp_path.glob("cal-*"))

    result = run_cli([*args, "--yes", "--max-parallel", "2"], tmp_path, subprocess_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (kept,) = (tmp_path / ".calibrations").glob("*.json")
    assert kept.name == "mnist1d-cnn1d-sgd.json"
    record = json.loads(kept.read_text())
    assert record["sweep"] == "cal-quickstart" and "calibrated on this task" in result.stdout
    assert main(["--runs", str(tmp_path), *args, "--dry-run"]) == 0  # what is kept, said first
    assert capsys.readouterr().out.startswith("kept for this task: B_crit")

    (grid,) = sweep.saved(tmp_path)
    runs = sweep_results.cell_runs(grid, tmp_path)
    curves, noise = {}, {}
    for cell in grid.cells:
        events = read_events(runs[cell.key].events_path)
        evals = events[events.phase == "eval"].sort_values("epoch")
        batch = cell.coordinates["batch.global_size"]
        updates = 4000 // batch * math.ceil(2 * max(1, math.sqrt(batch / 32)))  # data epochs'
        interval = cell.config.steps_per_epoch  # cut into at most 40 evaluations
        assert cell.config.epochs <= 40 and 0 <= cell.config.epochs * interval - updates < interval
        assert len(evals) == cell.config.epochs
        assert cell.config.schedule.name == "constant" and cell.config.lr_scaling.rule == "none"
        curves[batch] = (evals.loss.tolist(), evals.step.iloc[0] / evals.epoch.iloc[0])
        noise[batch] = events[events.phase == "gns"]
    loosest = max(min(losses) for losses, _ in curves.values())
    targets = [loosest * f for f in (1.3, 1.15, 1.0)]
    assert [f["target"] for f in record["fits"]] == pytest.approx(targets)
    for fit, target in zip(record["fits"], targets, strict=True):
        batches = sorted(curves)
        steps = np.array([_steps(*curves[b], target) for b in batches])
        design = np.c_[np.ones(3), 1 / np.array(batches)] / steps[:, None]  # relative
        (s_min, slope), *_ = np.linalg.lstsq(design, np.ones(3), rcond=None)
        assert fit["s_min"] == pytest.approx(s_min, rel=1e-6)
        expected = math.inf if s_min <= 0 else max(0.0, slope / s_min)
        assert fit["b_crit"] == pytest.approx(expected, rel=1e-6)
        assert [row["batch"] for row in fit["best"]] == [32, 64, 128]
        near = pd.concat(  # each run's measurements over the second half of its way there
            noise[b][noise[b].step.between(s / 2, s)] for b, s in zip(batches, steps, strict=True)
        )
        assert fit["measurements"] == len(near) > 0
        grad_sq = near.grad_sq_step.sum()  # not positive: too noisy to read, no B_simple
        pooled = near.trace_sigma_step.sum() / grad_sq if grad_sq > 0 else math.nan
        assert fit["b_simple"] == pytest.approx(pooled, rel=1e-6, nan_ok=True)

    from toolkit.config import load
    from toolkit.launching.probe import probe

    config = load("experiments/quickstart.yaml", overrides)
    reading = probe(config, steps=20, runs_root=tmp_path).reading()
    assert "calibrated on this task (mnist1d-cnn1d-sgd)" in reading


def test_the_launch_page_calibrates_in_the_background_and_its_probe_answers_with_it(
    tmp_path, monkeypatch, subprocess_env
):
    """The quickstart on one worker: the panel's grid at two batches and one rate, started from
    the page, runs as a sweep of its own process; once it is kept, the page says so and the
    probe (its run hidden from the Runs page unless asked for) answers with it."""
    import time

    from conftest import ROOT
    from streamlit.testing.v1 import AppTest

    from app.data import md_escape
    from toolkit.config import load
    from toolkit.launching import sweep_runner

    monkeypatch.setenv("LBL_RUNS", str(tmp_path))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    at.switch_page("views/launch.py").run()
    at.selectbox[0].set_value("quickstart").run()
    next(n for n in at.number_input if n.label == "Workers").set_value(1).run()
    assert not [m for m in at.multiselect if m.label == "Batches"]  # behind its toggle
    next(t for t in at.toggle if t.label.startswith("Calibrate the critical batch")).set_value(
        True
    ).run()
    next(m for m in at.multiselect if m.label == "Batches").set_value([32, 64]).run()
    rates = next(m for m in at.multiselect if m.label.startswith("Rates"))
    rates.set_value([1.0])
    next(n for n in at.number_input if n.label == "Epochs at your batch").set_value(1).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (cells,) = [d.value for d in at.dataframe if "global_batch" in d.value]
    assert cells["global_batch"].tolist() == [32, 64] and len(cells) == 2
    assert any("estimated time" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Start the calibration").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any(md_escape("Calibration cal-quickstart started (pid") in s.value for s in at.success)

    config = load(ROOT / "experiments" / "quickstart.yaml", ["workers=1"])
    waited = time.monotonic()
    while critical_batch.stored(config, tmp_path) is None:
        assert time.monotonic() - waited < 240, (tmp_path / ".calibrations").read_text()
        time.sleep(2)
    while sweep_runner.runner_active("cal-quickstart", tmp_path):  # it prints, then exits
        assert time.monotonic() - waited < 260
        time.sleep(0.5)
    at.run()
    (info,) = [i.value for i in at.info if "calibrated on this task" in i.value]
    assert md_escape("(mnist1d-cnn1d-lars)") in info and "over 2 batches" in info

    next(b for b in at.button if b.label == "Probe").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Global batch"] == "32"  # 1 worker x 32
    assert float(metrics["Noise scale B_simple"].replace(",", "")) > 0
    (reading,) = [t.value for t in at.text if "B_simple ≈" in t.value]
    assert "calibrated on this task (mnist1d-cnn1d-lars)" in reading
    at.switch_page("views/runs.py").run()  # the probe run is hidden unless asked for
    assert "Show noise-scale probes (1)" == at.toggle[0].label
    shown = at.dataframe[0].value
    assert len(shown) == 2 and shown["run_id"].str.startswith("cal-quickstart-").all()


def test_a_grid_that_cannot_be_fitted_is_refused_before_any_run_starts(tmp_path, capsys):
    from toolkit.__main__ import main

    args = ["--runs", str(tmp_path), "calibrate", "experiments/quickstart.yaml", "--yes"]
    assert main([*args, "--batches", "64", "64"]) == 2
    assert "calibrate needs two batches or more to fit S(B) (got [64])" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*args, "--rates", "1", "0"])
    assert refused.value.code == 2
    assert "argument --rates: must be a number > 0 (got '0')" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
