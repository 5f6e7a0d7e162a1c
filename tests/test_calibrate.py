"""The calibrated critical batch: McCandlish et al.'s fit against a synthetic ``S(B)`` whose
``B_crit`` is known, steps to a target read off evaluations, a calibration kept per task and
read by the probe, and a small real calibration from the command line checked against the
fit redone here from its runs' events."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import dashboard, run_cli

from toolkit.config import from_mapping
from toolkit.launching.probe import summarize
from toolkit.scaling import critical_batch
from toolkit.scaling.critical_batch import Calibration

S_MIN, B_CRIT = 200.0, 300.0
BATCHES = np.array([16, 64, 256, 1024, 4096])


def synthetic_runs(seeds: int, noise: float, rng) -> pd.DataFrame:
    """Steps to one target as ``S_min·(1 + B_crit/B)`` with lognormal noise per seed at the
    best rate; a rate half as large needs 1.3x the steps, one twice as large 1.5x, one four
    times as large never reaches it."""
    rows = []
    for batch in BATCHES:
        truth = S_MIN * (1 + B_CRIT / batch)
        for seed in range(seeds):
            steps = truth * math.exp(noise * rng.normal())
            rows += [
                {"batch": batch, "rate": 0.05, "seed": seed, "steps": 1.3 * steps},
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


def test_a_fit_that_cannot_be_stood_behind_says_why_and_is_never_kept_or_answered(tmp_path):
    """Defect 1 of the third walk: two batches at one rate gave S_min -2 and B_crit inf, kept
    as NaN and Infinity, and the probe answered with it. Each flaw is named with what fixes
    it; a flawed fit is refused by ``save``; a file holding one (as the walk's did) is never
    read as a calibration; what is kept is strict JSON."""
    clean = synthetic_runs(1, 0.0, np.random.default_rng(0))
    assert critical_batch.fit(clean).flaws == ()
    one_rate = clean[clean.rate == 0.1]
    assert (
        "every batch's best rate is the lowest or highest" in critical_batch.fit(one_rate).flaws[0]
    )
    two = clean[clean.batch.isin([16, 64])]
    assert critical_batch.fit(two).flaws[0].startswith("only 2 batches reached the loss")
    as_inverse = clean.assign(steps=clean.steps * 0 + 1e5 / clean.batch)  # S falls as 1/B
    (flaw,) = critical_batch.fit(as_inverse).flaws
    assert "not positive" in flaw and "above its largest batch, 4,096" in flaw
    flat = clean.assign(steps=clean.steps * 0 + 500 * clean.rate / 0.1 + 0 * clean.batch)
    flat = flat.assign(steps=np.where(clean.steps.isin([math.inf]), math.inf, flat.steps))
    assert "B_crit came out 0" in critical_batch.fit(flat).flaws[0]
    early = clean.assign(at_first=clean.batch == 64)
    assert (
        "batch 64 was already there at its first evaluation" in critical_batch.fit(early).flaws[0]
    )

    config = from_mapping({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
    task = critical_batch.task_key(config)
    flawed = critical_batch.fit(one_rate).record()
    with pytest.raises(ValueError, match="fits with flaws are not kept"):
        critical_batch.save(Calibration(task, "cal-x", "2026-11-28", (flawed,)), tmp_path)
    walk = {  # the file the walk found kept, as Python's json wrote it
        "task": task,
        "sweep": "cal-quickstart",
        "date": "2026-11-27",
        "fits": [
            {
                **flawed,
                "s_min": -2.0,
                "b_crit": math.inf,
                "b_crit_band": [math.nan] * 2,
                "flaws": [],
                "best": flawed["best"][:2],
            }
        ],
    }
    path = tmp_path / ".calibrations" / f"{task}.json"
    path.parent.mkdir()
    path.write_text(json.dumps(walk))
    assert critical_batch.stored(config, tmp_path) is None
    gns = pd.DataFrame({"grad_sq_step": np.ones(40), "trace_sigma_step": np.full(40, 100.0)})
    assert "the median factor" in summarize(gns, "probe-x", config, 1, None).reading()

    unbounded = critical_batch.fit(synthetic_runs(1, 0.3, np.random.default_rng(5))).record()
    unbounded["b_crit_band"] = [unbounded["b_crit_band"][0], math.inf]
    critical_batch.save(Calibration(task, "cal-y", "2026-11-28", (unbounded,)), tmp_path)

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    json.loads(path.read_text(), parse_constant=refuse)
    assert critical_batch.stored(config, tmp_path).fits[0]["b_crit_band"][1] == math.inf


@pytest.mark.parametrize("task, fits", [("mlp", 18), ("gru", 9)])
def test_every_calibration_the_checks_measured_would_still_be_kept(task, fits):
    """The rules refuse junk, not good calibrations: the fits of the committed checks have no
    flaw: the MNIST-1D MLP's 18 (2 rules x 3 seeds x 3 targets, within 1.5x of a 70-run study
    at 16 of 18) and the GRU's 9 (3 seeds x 3 targets, 8 of 9), from
    ``experiments/calibrate_<task>/runs.csv`` (~2 s each)."""
    from conftest import ROOT

    runs = pd.read_csv(ROOT / f"experiments/calibrate_{task}/runs.csv")
    groups = runs.groupby(["rule", "calibration_seed", "target"])
    flawed = {key: critical_batch.fit(part, draws=50).flaws for key, part in groups}
    assert len(flawed) == fits and not any(flawed.values()), flawed


def test_a_calibration_with_nothing_to_stand_behind_keeps_nothing(tmp_path, monkeypatch):
    """Its flawed fits are printed with why, nothing is written, and what was kept before
    stays (the runs themselves are the sweep runner's, tested with it)."""
    from toolkit.launching import calibrate, sweep_runner

    config = from_mapping({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
    one_rate = synthetic_runs(1, 0.0, np.random.default_rng(0)).query("rate == 0.1")
    monkeypatch.setattr(sweep_runner, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(calibrate, "measure", lambda *a: ([critical_batch.fit(one_rate)], []))
    said = []
    with pytest.raises(calibrate.NotKept, match="nothing kept"):
        calibrate.calibrate(config, tmp_path, sweep=calibrate.grid(config), log=said.append)
    assert any("kept\n" in line and "no" in line for line in said)  # the table says it
    assert any(line.startswith("not kept, at loss 0.5: every batch's best rate") for line in said)
    assert not (tmp_path / ".calibrations").exists()


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
    probed = summarize(gns, "probe-x", config, 1, found)
    reading = probed.reading()
    b_crit, (low, high) = fits[1].b_crit, fits[1].b_crit_band
    assert f"B_crit ≈ {b_crit:,.0f} (10–90% band {low:,.0f}–{high:,.0f}), calibrated" in reading
    assert "on this task (mnist1d-cnn1d-sgd) on 2026-11-27" in reading
    assert "the median factor" not in reading
    # one model of the steps: the calibrated B_crit's, not B_simple's (100 here) beside it
    ratio = probed.global_batch / b_crit
    doubling = (1 + 1 / ratio) / (1 + 1 / (2 * ratio))
    assert (
        f"Steps to a given loss, taking B_noise as this task's calibrated B_crit ({b_crit:,.0f}):"
        f" your global batch {probed.global_batch} is {1 / ratio:.1f}× below it, and doubling it "
        "would divide the "
        f"steps by about {doubling:.2f}. Up to about {b_crit / 4:,.0f} each doubling"
    ) in reading
    assert f"beyond {4 * b_crit:,.0f} under 10%" in reading and "beyond 400 " not in reading
    batch = 2 ** round(math.log2(b_crit))
    assert reading.splitlines()[-1].startswith(
        f"Batch to use: {batch:,}, near this task's calibrated B_crit ({b_crit:,.0f})"
    )


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


CALIBRATE = ["calibrate", "experiments/quickstart.yaml", "--set", "workers=1"]
CALIBRATE += ["--batches", "32", "64", "128", "--rates", "0.5", "1", "2", "--epochs", "1"]
"""The quickstart on one worker, three batches at three rates, one pass: what the Launch
page's calibration test asks for in the form, so both are one sweep."""


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, subprocess_env):
    """:data:`CALIBRATE` run once from the terminal (~45 s: 9 short runs, 2 at a time):
    its runs root and the command's result."""
    root = tmp_path_factory.mktemp("calibrated")
    result = run_cli([*CALIBRATE, "--yes", "--max-parallel", "2"], root, subprocess_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return root, result


def test_a_small_calibration_from_the_terminal_is_kept_and_is_the_fit_of_its_runs(
    calibrated, tmp_path, monkeypatch, capsys
):
    """Three batches at three rates, one worker each: refused without ``--yes`` off a
    terminal (the cost printed, nothing started), then run; the kept ``B_crit`` at each target
    is the least-squares fit of relative residuals redone here from the runs' own eval events,
    at each batch's fastest rate, and a target is kept exactly where that rate is inside its
    batch's rates for some batch and S_min and B_crit are positive."""
    from toolkit.__main__ import main
    from toolkit.launching import sweep, sweep_results
    from toolkit.runs import table
    from toolkit.runs.events import read_events

    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: nobody to ask
    assert main(["--runs", str(tmp_path), *CALIBRATE]) == 2
    refused = capsys.readouterr()
    assert "pass --yes to start it" in refused.err
    assert "sweep cal-quickstart: 9 cells" in refused.out and "estimated time" in refused.out
    # defect 4 of the third walk: its "epochs" are rounds; epochs are passes over the data
    header = next(line for line in refused.out.splitlines() if "run_id" in line).split()
    assert {"rounds", "updates_per_round", "passes"} <= set(header) and "epochs" not in header
    assert not any(tmp_path.glob("cal-*"))

    root, result = calibrated
    (kept,) = (root / ".calibrations").glob("*.json")
    assert kept.name == "mnist1d-cnn1d-lars.json"
    record = json.loads(kept.read_text())
    assert record["sweep"] == "cal-quickstart" and "calibrated on this task" in result.stdout
    said = re.search(r"batch 32, rate 0.25, seed 0: (\d+) rounds of (\d+) updates", result.stdout)
    assert said and int(said[1]) * int(said[2]) >= 125  # one pass of 4,000 examples at 32
    assert result.stdout.count(" rounds of ") == 9  # each cell, in the calibration's words
    assert main(["--runs", str(root), *CALIBRATE, "--dry-run"]) == 0  # what is kept, said first
    assert capsys.readouterr().out.startswith("kept for this task: B_crit")

    (grid,) = sweep.saved(root)
    runs = sweep_results.cell_runs(grid, root)
    curves, noise = {}, {}  # by (batch, rate)
    for cell in grid.cells:
        events = read_events(runs[cell.key].events_path)
        evals = events[events.phase == "eval"].sort_values("epoch")
        batch, rate = (
            cell.coordinates["batch.global_size"],
            cell.coordinates["optimizer.learning_rate"],
        )
        updates = 4000 // batch * math.ceil(1 * max(1, math.sqrt(batch / 32)))  # data epochs'
        interval = cell.config.steps_per_epoch  # cut into at most 40 evaluations
        assert cell.config.epochs <= 40 and 0 <= cell.config.epochs * interval - updates < interval
        assert len(evals) == cell.config.epochs
        row = table.summary(runs[cell.key])
        assert table.progress_text(row) == f"{cell.config.epochs} of {cell.config.epochs} rounds"
        assert cell.config.schedule.name == "constant" and cell.config.lr_scaling.rule == "none"
        curves[batch, rate] = (evals.loss.tolist(), evals.step.iloc[0] / evals.epoch.iloc[0])
        noise[batch, rate] = events[events.phase == "gns"]
    batches = sorted({b for b, _ in curves})
    rates = {b: sorted(r for c, r in curves if c == b) for b in batches}
    assert batches == [32, 64, 128] and all(len(r) == 3 for r in rates.values())
    loosest = max(min(min(curves[b, r][0]) for r in rates[b]) for b in batches)
    targets = [loosest * f for f in (1.3, 1.15, 1.0)]
    kept = []
    for target in targets:
        steps = {key: _steps(*curve, target) for key, curve in curves.items()}
        best = {b: min(rates[b], key=lambda r, b=b: steps[b, r]) for b in batches}
        fewest = np.array([steps[b, best[b]] for b in batches])
        design = np.c_[np.ones(3), 1 / np.array(batches)] / fewest[:, None]  # relative
        (s_min, slope), *_ = np.linalg.lstsq(design, np.ones(3), rcond=None)
        first = [curves[b, best[b]][0][0] <= target for b in batches]
        inside = [rates[b][0] < best[b] < rates[b][-1] for b in batches]
        if np.isfinite(fewest).all() and s_min > 0 and slope > 0 and any(inside) and not any(first):
            kept.append((target, s_min, slope / s_min, best, fewest))
    assert kept, "no target of this calibration could be kept: the test's grid needs a look"
    assert [f["target"] for f in record["fits"]] == pytest.approx([k[0] for k in kept])
    for fit, (_, s_min, b_crit, best, fewest) in zip(record["fits"], kept, strict=True):
        assert fit["s_min"] == pytest.approx(s_min, rel=1e-6)
        assert fit["b_crit"] == pytest.approx(b_crit, rel=1e-6)
        assert [(row["batch"], row["rate"]) for row in fit["best"]] == list(best.items())
        near = pd.concat(  # each run's measurements over the second half of its way there
            noise[b, best[b]][noise[b, best[b]].step.between(s / 2, s)]
            for b, s in zip(batches, fewest, strict=True)
        )
        assert fit["measurements"] == len(near) > 0
        grad_sq = near.grad_sq_step.sum()  # not positive: too noisy to read, no B_simple
        pooled = near.trace_sigma_step.sum() / grad_sq if grad_sq > 0 else None
        assert fit["b_simple"] == pytest.approx(pooled, rel=1e-6)

    from toolkit.config import load
    from toolkit.launching.probe import probe

    config = load("experiments/quickstart.yaml", ["workers=1"])
    reading = probe(config, steps=20, runs_root=root).reading()
    assert "calibrated on this task (mnist1d-cnn1d-lars)" in reading


def test_the_launch_page_calibrates_in_the_background_and_its_probe_answers_with_it(
    calibrated, tmp_path, monkeypatch, subprocess_env
):
    """The quickstart on one worker: the walk's grid (two batches, one rate) is refused naming
    what it lacks; three batches at three rates, started from the page, run as a sweep of its
    own process; once it is kept, the page says so and the probe (its run hidden from the Runs
    page unless asked for) answers with it. The page's calibration is the terminal test's
    (:data:`CALIBRATE`), started in a copy of its runs root without what it kept: the sweep
    resumes by looking, so its runner finds its 9 cells completed and fits them, and no run
    is made twice (~15 s: the runner and a probe)."""
    from toolkit.runs.rundir import list_runs

    shutil.copytree(calibrated[0], tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / ".calibrations")
    for run in list_runs(tmp_path):  # the terminal test's probe, if it ran first
        if run.meta().get("probe"):
            shutil.rmtree(run.path)
    import time

    from conftest import ROOT

    from app.data import md_escape
    from toolkit.config import load
    from toolkit.launching import sweep_runner

    monkeypatch.setenv("LBL_RUNS", str(tmp_path))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])
    at = dashboard(timeout=300).run()
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
    next(n for n in at.number_input if n.label.startswith("Passes over the data")).set_value(
        1
    ).run()
    (refused,) = [w.value for w in at.warning if "cannot run" in w.value]
    assert md_escape("3 batches or more (got [32, 64])") in refused
    assert md_escape("3 rate factors or more (got [1.0])") in refused
    assert not [b for b in at.button if b.label == "Start the calibration"]
    next(m for m in at.multiselect if m.label == "Batches").set_value([32, 64, 128]).run()
    next(m for m in at.multiselect if m.label.startswith("Rates")).set_value([0.5, 1.0, 2.0]).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (cells,) = [d.value for d in at.dataframe if "global_batch" in d.value]
    assert sorted(set(cells["global_batch"])) == [32, 64, 128] and len(cells) == 9
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
    assert md_escape("(mnist1d-cnn1d-lars)") in info and "over 3 batches" in info

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
    assert len(shown) == 9 and shown["run_id"].str.startswith("cal-quickstart-").all()


def test_a_grid_that_cannot_be_fitted_is_refused_before_any_run_starts(tmp_path, capsys):
    from toolkit.__main__ import main

    args = ["--runs", str(tmp_path), "calibrate", "experiments/quickstart.yaml", "--yes"]
    assert (
        main([*args, "--batches", "32", "64", "--rates", "1", "--epochs", "1"]) == 2
    )  # the walk's
    said = capsys.readouterr().err
    assert "calibrate needs 3 batches or more (got [32, 64]): S(B) has two parameters" in said
    assert "3 rate factors or more (got [1.0]): a batch's fastest rate is trusted" in said
    assert main([*args, "--batches", "64", "64", "128"]) == 2
    assert "3 batches or more (got [64, 128])" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*args, "--rates", "1", "0"])
    assert refused.value.code == 2
    assert "argument --rates: must be a number > 0 (got '0')" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
