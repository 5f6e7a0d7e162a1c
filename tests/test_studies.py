"""The studies of issue 76 are scripts under ``experiments/``, not tests: each takes minutes to an
hour. Here each runs its smallest cell, so a change that breaks a script, or the rows the study's
notes are read from, fails CI. Together about 35 s: an in-process grid, two probes under the
launcher, one 1-epoch run of two workers under horovodrun, and tables from committed rows."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
from conftest import ROOT


def script(name: str, *arguments: str) -> str:
    """Run ``experiments/<name>`` with ``arguments``; its output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / name), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_gru_critical_batch_study_runs_a_three_batch_grid_and_fits_it(tmp_path):
    """Three batches of the GRU on the Markov sequences, one rate, one seed, to a held-out loss
    just under chance (ln 10 = 2.30), past the GRU's plateau (``--stuck-updates``): every run
    reaches it, the steps fall as the batch grows and the summary fits ``B_crit`` (~12 s)."""
    output = script(
        "critical_batch.py",
        *("--dataset", "markov", "--model", "gru", "--num-samples", "2000"),
        *("--batches", "32", "64", "128", "--rates", "0.4", "--seeds", "0"),
        *("--targets", "2.28", "--max-steps", "600", "--stuck-updates", "1000"),
        *("--out", str(tmp_path)),
    )
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert list(rows.batch) == [32, 64, 128] and np.isfinite(rows.steps).all()
    assert rows.steps.is_monotonic_decreasing
    assert "| target loss | S_min | B_crit" in output


def test_the_probe_protocol_probes_the_gru_and_sets_it_against_its_study(tmp_path):
    """One 20-update probe of the GRU task, read against its committed study: a factor per
    target of ``experiments/critical_batch_gru/runs.csv`` (~10 s)."""
    output = script("probe_protocol.py", "--tasks", "gru-markov", "--smoke", "--out", str(tmp_path))
    factors = pd.read_csv(tmp_path / "factors.csv")
    study = pd.read_csv(ROOT / "experiments/critical_batch_gru/runs.csv")
    assert sorted(factors.target) == sorted(set(study.target))
    assert (factors.factor > 0).all() and "factor: median" in output


def test_the_lars_steadiness_study_runs_a_dense_cell_through_dgcs_path(tmp_path):
    """One epoch of the quickstart, two workers, every entry sent through the encoded path with
    DGC's local clipping: the run completes and its row records what the table reads (~15 s)."""
    results = tmp_path / "steady.csv"
    output = script(
        "comm_study.py",
        *("--study", "steady", "--modes", "dense, local clipping 5"),
        *("--seeds", "0", "--epochs", "1", "--results", str(results)),
    )
    (row,) = pd.read_csv(results).itertuples()
    assert row.state == "completed" and row.epochs == 1 and row.bytes_sent > 0
    assert 0.1 < row.final_accuracy <= 1 and "dense, local clipping 5 | 1 |" in output


def test_the_adaptive_runs_aim_and_hysteresis_are_the_ones_derived_from_the_noise_scale():
    """``adaptive_v3.yaml`` says its aim and hysteresis are not chosen by hand: they must be
    the values ``adaptive_aim.py`` wrote, and those must follow from its own raw columns."""
    from toolkit.launching import sweep

    choice = pd.read_csv(ROOT / "experiments/study/adaptive_v3_choice.csv")
    cells = sweep.load(ROOT / "experiments/study/adaptive_v3.yaml").cells
    adaptive, *others = [c.config.batch.adaptive for c in cells if c.config.batch.adaptive]
    assert others == [adaptive, adaptive]  # seeds 1 and 2 run the same rule
    assert adaptive.aim == choice.aim.iloc[0] == round(choice.ratio.median(), 2)
    width = (choice.smoothed_p90 - choice.smoothed_p10) / (2 * choice.smoothed_median)
    assert adaptive.hysteresis == choice.hysteresis.iloc[0] == round(min(1, 3 * width[0]), 2)


def test_the_adaptive_aim_script_probes_the_adaptive_runs_first_batch(tmp_path):
    """A 20-update probe on two workers at the adaptive run's first batch: the smoothed band
    and the two values it derives (~15 s)."""
    out = tmp_path / "choice.csv"
    script("adaptive_aim.py", "--steps", "20", "--out", str(out))
    choice = pd.read_csv(out)
    assert (choice.probe_batch == 256).all() and len(choice) == 3
    assert (choice.smoothed_p10 <= choice.smoothed_median).all()
    assert (choice.smoothed_median <= choice.smoothed_p90).all()
    assert 0 <= choice.hysteresis.iloc[0] <= 1


def test_the_adascale_tables_are_written_from_the_committed_rows(tmp_path):
    """Without runs, the tables come from the committed CSVs: the 2-worker table names the
    fewest updates and seconds of a fixed batch (~5 s)."""
    for rows in (ROOT / "experiments/study").glob("*.csv"):
        shutil.copy(rows, tmp_path)
    output = script("adascale_study.py", "--out", str(tmp_path), "--runs", str(tmp_path / "none"))
    table = (tmp_path / "adaptive_v3.md").read_text()
    assert "fewest of a fixed batch: updates" in table and "seconds" in table
    assert table.strip() in output


def test_the_adaptive_aim_script_smooths_the_reading_as_adascale_does():
    """``smoothed_band`` against AdaScale's arithmetic written out: each of ``|G|²`` and
    ``tr Σ`` averaged ``s = d·s + (1 - d)·x`` and divided by ``1 - d^t``, their ratio read over
    the second half."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from adaptive_aim import smoothed_band

    rng = np.random.default_rng(3)
    gns = pd.DataFrame(
        {"grad_sq_step": rng.gamma(2.0, 0.5, 60), "trace_sigma_step": rng.gamma(3.0, 20.0, 60)}
    )
    decay, grad, trace, ratios = 0.95, 0.0, 0.0, []
    for t, (g, s) in enumerate(zip(gns.grad_sq_step, gns.trace_sigma_step, strict=True), 1):
        grad, trace = decay * grad + (1 - decay) * g, decay * trace + (1 - decay) * s
        ratios.append((trace / (1 - decay**t)) / (grad / (1 - decay**t)))
    expected = np.percentile(ratios[30:], [10, 50, 90])
    np.testing.assert_allclose(smoothed_band(gns, decay), expected, rtol=1e-12)
