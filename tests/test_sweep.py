"""Sweeps (toolkit.launching.sweep): expansion and validation of sweep files, the results and their
aggregate against numpy, and one real sweep of 4 cells on 2 slots under horovodrun whose
runner is killed mid-way and run again."""

from __future__ import annotations

import itertools
import json
import math
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, dashboard, run_cli

from app.data import md_escape
from toolkit.config import ConfigError, load
from toolkit.launching import slots, sweep, sweep_results, sweep_runner
from toolkit.plan import Scale
from toolkit.runs import table
from toolkit.runs.events import EventWriter
from toolkit.runs.rundir import RunDir, list_runs
from toolkit.sections import run_name_problem

QUICK = str(ROOT / "experiments" / "quickstart.yaml")
METHODS = {
    "sgd": {"optimizer.name": "sgd", "optimizer.params": {"momentum": 0.9}},
    "lars_sqrt": {"lr_scaling.rule": "sqrt"},
}


def spec(**changes) -> dict:
    return {
        "name": "t",
        "base": QUICK,
        "grid": {"batch.global_size": [64, 256]},
        "methods": METHODS,
        "seeds": [0, 1],
        **changes,
    }


# ------------------------------------------------------------------------------- expansion


def test_cells_are_the_product_of_methods_grid_and_seeds_in_order():
    grid = sweep.from_mapping(spec())
    coordinates = [cell.coordinates for cell in grid.cells]
    expected = [
        {"method": m, "batch.global_size": b, "seed": s}
        for m, b, s in itertools.product(METHODS, [64, 256], [0, 1])
    ]
    assert coordinates == expected
    assert grid.axes() == ["method", "batch.global_size", "seed"]


def test_a_cell_is_the_base_then_its_method_then_its_coordinates_then_its_seed():
    grid = sweep.from_mapping(spec(grid={"batch.global_size": [256], "optimizer.name": ["lars"]}))
    base = load(QUICK)
    by_method = {cell.coordinates["method"]: cell.config for cell in grid.cells}
    sgd = by_method["sgd"]  # the grid's optimizer.name wins over the method's
    assert sgd.optimizer.name == "lars" and sgd.optimizer.params == {"momentum": 0.9}
    assert sgd.batch.global_size == 256 and sgd.seed in (0, 1)
    lars = by_method["lars_sqrt"]
    assert lars.lr_scaling.rule == "sqrt" and lars.optimizer.params == base.optimizer.params
    # everything else is the base's
    assert lars.model_dump(exclude={"name", "lr_scaling", "batch", "seed"}) == base.model_dump(
        exclude={"name", "lr_scaling", "batch", "seed"}
    )
    assert Scale.of(lars).learning_rate == pytest.approx(0.5 * math.sqrt(256 / 64))


def test_a_list_of_grids_is_the_union_and_method_restricts_the_methods_axis():
    grid = sweep.from_mapping(
        spec(
            grid=[
                {"method": ["sgd"], "batch.global_size": [64]},
                {"batch.global_size": [128]},
            ],
            seeds=None,
        )
    )
    assert [c.coordinates for c in grid.cells] == [
        {"method": "sgd", "batch.global_size": 64, "seed": 0},
        {"method": "sgd", "batch.global_size": 128, "seed": 0},
        {"method": "lars_sqrt", "batch.global_size": 128, "seed": 0},
    ]


def test_a_grid_path_into_a_methods_mapping_changes_that_cell_only():
    """A method's nested mapping is copied into each cell: a later grid row's path into it must
    not change the method (nor an earlier row's cells, nor the sweep's saved form)."""
    methods = {"sgd": {"optimizer": {"name": "sgd", "params": {"momentum": 0.9}}}}
    raw = spec(
        grid=[{"epochs": [1]}, {"optimizer.params.momentum": [0.5]}], methods=methods, seeds=None
    )
    grid = sweep.from_mapping(raw)
    momenta = [c.config.optimizer.params["momentum"] for c in grid.cells]
    assert momenta == [0.9, 0.5] and grid.spec.methods == methods
    again = sweep.from_mapping(yaml.safe_load(grid.to_yaml()))  # the Sweep page's round trip
    assert [c.key for c in again.cells] == [c.key for c in grid.cells]


def test_run_ids_are_valid_unique_and_labels_live_in_meta_not_the_name():
    grid = sweep.from_mapping(spec(name="a" * 32, grid={"optimizer.learning_rate": [0.1, 0.2]}))
    ids = [cell.run_id for cell in grid.cells]
    assert len(set(ids)) == len(ids) and all(run_name_problem(i) is None for i in ids)
    keys = {cell.key for cell in grid.cells}
    assert len(keys) == len(grid.cells)  # the key hashes the whole config
    cell = grid.cells[0]
    assert cell.meta() == {"sweep": "a" * 32, "cell": cell.key, "coordinates": cell.coordinates}
    again = sweep.from_mapping(spec(name="a" * 32, grid={"optimizer.learning_rate": [0.1, 0.2]}))
    assert [c.key for c in again.cells] == [c.key for c in grid.cells]  # stable across loads


def test_the_study_sweeps_expand_to_their_93_and_11_cells():
    study = sweep.load(ROOT / "experiments" / "study" / "study.yaml")
    tuning = sweep.load(ROOT / "experiments" / "study" / "tuning.yaml")
    assert (len(study.cells), len(tuning.cells)) == (93, 11)
    cells = {(c.coordinates["method"], c.coordinates["batch.global_size"]): c for c in study.cells}
    warm = cells[("sgd_linear_warmup", 1024)].config  # Goyal: from the B=32 rate to 32x it
    assert Scale.of(warm).learning_rate == pytest.approx(0.1 * 1024 / 32)
    assert Scale.of(warm).warmup_multiplier == pytest.approx(32 / 1024)
    lbsgd = cells[("lbsgd_sqrt", 4096)].config  # a device batch of 128, 32 of them per update
    assert Scale.of(lbsgd).per_worker == 128 and lbsgd.optimizer.params["batch_scale"] == 32
    assert Scale.of(lbsgd).global_batch == 4096
    root_sqrt = cells[("lars_sqrt", 1024)].config
    assert Scale.of(root_sqrt).learning_rate == pytest.approx(0.3 * math.sqrt(1024 / 32))


def test_the_second_study_task_sweep_scales_each_recipe_from_its_b32_rate():
    grid = sweep.load(ROOT / "experiments" / "study" / "scale_80k.yaml")
    assert len(grid.cells) == 51
    cells = {
        (c.coordinates["method"], c.coordinates.get("batch.global_size")): c for c in grid.cells
    }
    base = cells[("sgd", 32)].config
    assert base.dataset.params["num_samples"] == 80000 and Scale.of(base).global_batch == 32
    warm = cells[("sgd_linear_warmup", 1024)].config
    assert Scale.of(warm).learning_rate == pytest.approx(0.1 * 1024 / 32)
    assert cells[("lbsgd_lars", 4096)].config.optimizer.params["batch_scale"] == 32
    adascale = cells[("adascale_lars", 256)].config
    assert adascale.lr_scaling.rule == "adascale" and Scale.of(adascale).learning_rate == 0.3
    adaptive = cells[("adaptive_sgd", None)].config.batch.adaptive
    assert (adaptive.min, adaptive.max) == (256, 4096)


# ------------------------------------------------------------------------------ bad sweeps


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grid": {"optimizer.nme": ["sgd"]}}, "optimizer.nme: Extra inputs are not permitted"),
        ({"grid": {"dataset.params.bogus": [1]}}, "bogus"),
        ({"grid": {}}, "the grid is empty"),
        ({"grid": []}, "the grid is empty"),
        ({"grid": {"batch.global_size": []}}, "'batch.global_size' has no values"),
        ({"grid": {"seed": [1, 2]}}, "seeds go in `seeds`"),
        ({"seeds": []}, "seeds is empty"),
        ({"name": "bad name"}, "name: sweep names must match"),
        ({"base": "nowhere.yaml"}, "base: config file 'nowhere.yaml' does not exist"),
        ({"grid": {"method": ["adam"], "epochs": [1]}}, "method 'adam' is not in methods"),
        ({"grids": {}}, "grids: Extra inputs are not permitted"),
    ],
)
def test_bad_sweeps_are_refused_naming_the_field(change, message):
    with pytest.raises(ConfigError) as error:
        sweep.from_mapping(spec(**change))
    assert message in str(error.value)


def test_one_bad_value_in_one_cell_names_the_cell_and_the_field():
    with pytest.raises(ConfigError) as error:
        sweep.from_mapping(spec(grid={"batch.global_size": [64, 0]}, seeds=[3]))
    text = str(error.value)
    assert "cell (method=sgd, batch.global_size=0, seed=3)" in text
    assert "cell (method=lars_sqrt, batch.global_size=0, seed=3)" in text
    assert "batch.global_size: Input should be greater than or equal to 1" in text
    assert "global_size=64" not in text  # the good cells are not blamed


def test_the_cli_refuses_bad_sweep_files_before_anything_starts(tmp_path):
    runs = tmp_path / "runs"
    for name, body in {
        "unknown-path": spec(grid={"optimizer.foo": [1]}),
        "empty-grid": spec(grid={}),
        "one-bad-cell": spec(grid={"batch.global_size": [64, 7]}),
    }.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body))
        result = run_cli(["sweep", str(path)], runs)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert result.stderr.startswith("error: invalid sweep"), result.stderr
    assert not runs.exists() or list_runs(runs) == []


def test_dry_run_prints_each_cell_with_its_batch_rate_and_steps(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec(seeds=[0])))
    result = run_cli(["sweep", str(path), "--dry-run"], tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "sweep t: 4 cells"
    header = lines[1].split()
    assert header[:3] == ["method", "batch.global_size", "seed"]
    rows = [dict(zip(header, line.split())) for line in lines[2:-1]]  # then the cost
    lars = next(r for r in rows if r["method"] == "lars_sqrt" and r["batch.global_size"] == "256")
    # quickstart: 2 workers, 4,000 training examples, 20 epochs; sqrt scaling from base 64
    assert lars["global_batch"] == "256" and float(lars["scaled_lr"]) == pytest.approx(1.0)
    assert int(lars["total_steps"]) == 20 * (2000 // 128)
    # no run here to price them: their start-up only, and still a total
    assert {(r["estimated_s"], r["priced"]) for r in rows} == {("13", "start-up")}
    cost = lines[-1]
    assert re.match(r"estimated time: \d+ (s|min) for 4 cells, \d at a time;", cost), cost
    assert "each cell counts 13 s of start-up (no run here measured one)" in cost
    named = ", ".join(r["run_id"] for r in rows)  # each cell without a peer, named
    assert cost.endswith(
        "4 of 4 cells have no completed run of their dataset and model here: their start-up "
        f"alone is counted, their training is not priced: {named}"
    )
    assert not (tmp_path / "runs").exists()  # nothing created


def test_a_cell_no_run_like_it_measured_is_priced_from_the_nearest_of_its_model():
    """Defect 5 of the third walk: 6 of 9 calibration cells were "not counted" and no total
    was given. A cell is priced by runs like it, else by the fewest doublings away in workers
    and batch per worker of its dataset and model, else by its start-up alone."""
    grid = sweep.from_mapping(
        {"name": "t", "base": QUICK, "grid": {"batch.global_size": [64, 512]}, "seeds": [0]}
    )
    cells = sweep_runner.dry_run(grid)
    keys = [sweep_runner._speed_key(cell.config) for cell in grid.cells]  # 2 workers: 32, 256
    dataset, model, workers, _ = keys[0]
    rates = {keys[0]: 1000.0, (dataset, model, workers, 128): 4000.0, ("other",) * 4: 1.0}
    estimated = sweep_runner.estimate(grid, cells, rates, 10.0)
    assert estimated.basis.tolist() == ["measured", "nearest"]  # 256 is 1 doubling from 128
    training = cells["updates"] * cells["global_batch"] / [1000.0, 4000.0]
    assert estimated.seconds.tolist() == pytest.approx((10 + training).tolist())
    said = sweep_runner.cost(estimated, cells, 1, 10.0)
    assert said.startswith(f"estimated time: {sweep_runner.duration(estimated.seconds.sum())}")
    assert "1 of 2 priced from the nearest runs measured here of the same dataset and model" in said
    unmeasured = sweep_runner.estimate(grid, cells, {("other",) * 4: 1.0}, 10.0)
    assert unmeasured.basis.tolist() == ["start-up"] * 2 and unmeasured.seconds.tolist() == [10, 10]


# ---------------------------------------------------------------------- results, aggregate


def test_aggregate_is_the_mean_and_spread_over_seeds_of_completed_cells():
    rng = np.random.default_rng(0)
    rows = []
    for method, batch, seed in itertools.product(["a", "b"], [64, 256], [0, 1, 2]):
        state = "failed" if (method, batch, seed) == ("b", 256, 2) else "completed"
        rows.append(
            {
                "method": method,
                "batch.global_size": batch,
                "seed": seed,
                "run_id": f"{method}{batch}{seed}",
                "state": state,
                "diverged": state == "failed",
                "final_test_accuracy": rng.uniform() if state == "completed" else math.nan,
                "global_batch": batch,
            }
        )
    table = pd.DataFrame(rows)
    summary = sweep_results.aggregate(table, ("final_test_accuracy",))
    assert len(summary) == 4
    for _, row in summary.iterrows():
        values = [
            r["final_test_accuracy"]
            for r in rows
            if r["method"] == row["method"]
            and r["batch.global_size"] == row["batch.global_size"]
            and r["state"] == "completed"
        ]
        assert row["final_test_accuracy_mean"] == pytest.approx(np.mean(values))
        assert row["final_test_accuracy_std"] == pytest.approx(np.std(values, ddof=1))
        assert row["completed"] == len(values) and row["cells"] == 3
    failed = summary[(summary["method"] == "b") & (summary["batch.global_size"] == 256)]
    assert failed[["failed", "diverged"]].values.tolist() == [[1, 1]]
    figure = sweep_results.figure(
        table, "final_test_accuracy", x="batch.global_size", color="method"
    )
    assert [trace.name for trace in figure.data] == ["a", "b"]
    assert figure.layout.xaxis.type is None  # 64..256 spans less than 8x: linear
    np.testing.assert_allclose(
        figure.data[0].y, summary[summary["method"] == "a"]["final_test_accuracy_mean"]
    )


# ------------------------------------------------------------------ a real sweep, 2 slots


REAL = {
    "name": "real",
    "base": QUICK,
    "grid": {"batch.global_size": [32, 64]},
    "methods": {
        "sgd": {"optimizer.name": "sgd", "optimizer.params": {"momentum": 0.9}},
        "lars": {},
    },
    "seeds": [0],
}
SHORT = {"epochs": 1, "workers": 1, "checkpoint.every_epochs": 1, "logging.every_steps": 20}


@pytest.fixture(scope="module")
def real(tmp_path_factory, subprocess_env):
    """4 cells (quickstart, 1 epoch, 1 worker) on 2 slots. The first runner launches 3 at once
    and is killed with SIGKILL once two run and the third waits in the queue; a second
    runner adopts them, launches the missing one and waits for all."""
    root = tmp_path_factory.mktemp("sweep-runs")
    slots.set_capacity("localhost:2", root)
    path = root.parent / "real.yaml"
    body = {**REAL, "methods": {m: {**o, **SHORT} for m, o in REAL["methods"].items()}}
    path.write_text(yaml.safe_dump(body))
    command = [sys.executable, "-m", "toolkit", "--runs", str(root), "sweep", str(path)]
    first = subprocess.Popen(
        [*command, "--max-parallel", "3"], cwd=ROOT, env=subprocess_env, stdout=subprocess.PIPE
    )
    waiting, deadline = [], time.time() + 120
    while not waiting:  # until two cells hold the slots and the third waits for one
        assert first.poll() is None and time.time() < deadline
        entries = slots.entries(root)
        if len(entries) == 3 and [e["position"] for e in entries].count(None) == 2:
            waiting = [e["run_id"] for e in entries if e["position"] == 1]
        time.sleep(0.05)
    at_kill = {key: run.run_id for key, run in sweep_results.cell_runs("real", root).items()}
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = subprocess.run(
        command, cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=600
    )
    deadline = time.time() + 60  # the runner ends with the states; slots go after teardown
    while not all("released" in run.status() for run in list_runs(root)):
        assert time.time() < deadline, [run.status() for run in list_runs(root)]
        time.sleep(0.2)
    return {
        "root": root,
        "sweep": sweep.load(path),
        "at_kill": at_kill,
        "waiting": waiting[0],
        "second": second,
    }


def test_every_cell_completes_once(real):
    assert real["second"].returncode == 0, real["second"].stdout + real["second"].stderr
    runs = list_runs(real["root"])
    assert len(runs) == 4  # no cell launched twice
    assert sorted(r.meta()["cell"] for r in runs) == sorted(c.key for c in real["sweep"].cells)
    assert all(r.status()["state"] == "completed" for r in runs)


def test_the_second_runner_adopts_the_cells_in_flight_and_launches_only_the_missing(real):
    assert len(real["at_kill"]) == 3
    now = {key: run.run_id for key, run in sweep_results.cell_runs("real", real["root"]).items()}
    for key, run_id in real["at_kill"].items():
        assert now[key] == run_id  # the same run directory, not a new attempt
    first_line = real["second"].stdout.splitlines()[0]
    counts = re.fullmatch(
        r"sweep real: 4 cells, (\d) ended, (\d) in flight, 1 to launch, 2 at a time", first_line
    )
    assert counts and int(counts[1]) + int(counts[2]) == 3, first_line  # adopted, not relaunched


def test_no_more_than_two_workers_were_ever_busy(real):
    """Each run held its slots from `launched` (before horovodrun started) to `released`
    (recorded after they were given back: later than the real release)."""
    held = [RunDir(r.path).status() for r in list_runs(real["root"])]
    edges = sorted([(s["launched"], 1) for s in held] + [(s["released"], -1) for s in held])
    busy = peak = 0
    for _, change in edges:
        busy += change
        peak = max(peak, busy)
    assert peak == 2  # both slots used, never a third run
    waited = RunDir(real["root"] / real["waiting"]).status()
    # the cell that waited in the queue started only once a run had given its slots back
    assert any(s["released"] <= waited["launched"] for s in held)


def test_the_results_table_has_a_row_per_cell_with_its_coordinates(real):
    table = sweep_results.results(real["sweep"], real["root"])
    assert len(table) == 4
    got = set(zip(table["method"], table["batch.global_size"], table["seed"]))
    assert got == {(m, b, 0) for m in ("sgd", "lars") for b in (32, 64)}
    assert (table["state"] == "completed").all() and not table["diverged"].any()
    assert table["final_test_accuracy"].between(0.1, 1).all()
    assert (table["global_batch"] == table["batch.global_size"]).all()
    assert (table["updates"] == 4000 // table["global_batch"]).all()  # 1 epoch, 1 worker
    summary = sweep_results.aggregate(table)
    assert len(summary) == 4 and (summary["completed"] == 1).all()
    status = run_cli(["sweep", str(real["root"].parent / "real.yaml"), "--status"], real["root"])
    cells, over_seeds = status.stdout.split("\nover seeds:\n")
    assert status.returncode == 0 and cells.count(" completed ") == 4
    assert len(over_seeds.strip().splitlines()) == 1 + 4  # a header and a row per method x batch


# ------------------------------------------------------------------------- the Sweep page


def sweep_page(root, monkeypatch, source: str):

    monkeypatch.setenv("LBL_RUNS", str(root))
    at = dashboard(timeout=120).run()
    at.switch_page("views/sweep.py").run()
    at.radio[0].set_value(source).run()
    assert not at.exception, at.exception
    return at


def labelled(widgets, label: str):
    (found,) = [w for w in widgets if w.label == label]
    return found


def test_sweep_page_shows_a_finished_sweep_its_results_and_opens_compare(real, monkeypatch):
    at = sweep_page(real["root"], monkeypatch, "A sweep run here")
    assert labelled(at.selectbox, "Sweep").value == "real"
    states, summary = (frame.value for frame in at.dataframe)  # one table of cells: plan, state
    assert len(states) == 4 and set(states["global_batch"]) == {32, 64}
    assert states["state"].tolist() == ["completed"] * 4
    runs = list(sweep_results.cell_runs("real", real["root"]).values())
    rates = pd.DataFrame(
        {"batch": Scale.of(r.config()).per_worker, "rate": table.summary(r)["samples_per_sec"]}
        for r in runs
    )  # the runs like a cell (one dataset, model and world size here): same batch per worker
    waits = [r.status()["started"] - r.status()["launched"] for r in runs]  # start-up, each
    for cell in states.to_dict("records"):
        like = rates[rates["batch"] == cell["global_batch"] // cell["workers"]]["rate"].median()
        training = cell["updates"] * cell["global_batch"] / like
        assert cell["estimated_s"] == pytest.approx(np.median(waits) + training)
    said = f"each cell counts {np.median(waits):.0f} s of start-up (measured here)"
    assert any(md_escape(said) in caption.value for caption in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Cells"] == "4" and metrics["Workers per cell"] == str(states["workers"][0])
    seconds = states["estimated_s"].sum() / labelled(at.number_input, "Cells at a time").value
    assert metrics["Estimated time"] in (f"{seconds:.0f} s", f"{round(seconds / 60)} min")
    assert set(zip(states["method"], states["batch.global_size"])) == {
        (m, b) for m in ("sgd", "lars") for b in (32, 64)
    }
    assert len(summary) == 4 and "final_test_accuracy_mean" in summary
    (chart,) = at.get("plotly_chart")
    traces = json.loads(chart.proto.spec)["data"]
    assert sorted(t["name"] for t in traces) == ["lars", "sgd"]
    labelled(at.button, "Open these runs in Compare").click().run()
    assert sorted(at.session_state["compare_runs"]) == sorted(states["run_id"])


def test_a_big_sweep_shows_its_cost_and_launches_only_once_confirmed(tmp_path, monkeypatch):
    at = sweep_page(tmp_path, monkeypatch, "Build a grid")
    grid = "epochs: [1]\nworkers: [1]\nbatch.global_size: [32, 64, 128, 256]\n"
    labelled(at.text_area, "Grid: config path → values (YAML)").set_value(grid).run()
    cells = len(at.dataframe[0].value)
    assert cells == 4 * 2 * 3 and {m.label: m.value for m in at.metric}["Cells"] == "24"
    assert labelled(at.button, "Launch sweep").disabled
    labelled(at.checkbox, f"Yes, run all {cells} cells").check().run()
    assert not labelled(at.button, "Launch sweep").disabled


def test_sweep_page_refuses_a_bad_grid_naming_the_field(tmp_path, monkeypatch):
    at = sweep_page(tmp_path, monkeypatch, "Build a grid")
    labelled(at.text_area, "Grid: config path → values (YAML)").set_value(
        "optimizer.nme: [sgd]"
    ).run()
    shown = at.error[0].value.replace("\\", "")  # Markdown-escaped
    assert "optimizer.nme: Extra inputs are not permitted" in shown
    assert "cell (method=linear, optimizer.nme=sgd, seed=0)" in shown
    assert not [b for b in at.button if b.label == "Launch sweep"]


def test_sweep_page_builds_a_grid_dry_runs_and_launches_it(tmp_path, monkeypatch):
    at = sweep_page(tmp_path, monkeypatch, "Build a grid")
    labelled(at.text_input, "Sweep name").set_value("page")
    grid = "epochs: [1]\nworkers: [1]\nbatch.global_size: [64, 128]\n"
    labelled(at.text_area, "Grid: config path → values (YAML)").set_value(grid)
    labelled(at.text_area, "Methods: name → overrides (YAML, optional)").set_value("")
    labelled(at.text_input, "Seeds (YAML list)").set_value("[0]").run()
    assert not at.exception, at.exception
    plan = at.dataframe[0].value
    assert plan["global_batch"].tolist() == [64, 128] and plan["workers"].tolist() == [1, 1]
    assert plan["total_steps"].tolist() == [4000 // 64, 4000 // 128]
    assert plan["state"].tolist() == ["pending"] * 2 and plan["priced"].eq("start-up").all()
    assert {m.label: m.value for m in at.metric}["Estimated time"].endswith(" (start-up only)")
    labelled(at.button, "Launch sweep").click().run()
    assert "Sweep page started" in at.success[0].value
    grid = sweep.saved(tmp_path)[0]
    deadline = time.time() + 180
    while not sweep_runner.states(grid, tmp_path)["state"].isin(["completed", "failed"]).all():
        assert time.time() < deadline, (tmp_path / ".sweeps" / "page.log").read_text()
        time.sleep(1)
    assert sweep_runner.states(grid, tmp_path)["state"].tolist() == ["completed"] * 2
    at.run()
    assert at.dataframe[0].value["state"].tolist() == ["completed"] * 2
    assert at.dataframe[0].value["priced"].eq("measured").all()  # now, by these runs


def test_failed_cells_are_reported_and_rerun_only_when_asked(tmp_path):
    """Cells left by an earlier runner: one completed, one failed. Running again reports the
    failed one and launches nothing; with retry_failed it runs it again, as a new attempt
    beside the old run, and the results read the new one."""
    grid = sweep.from_mapping(
        {
            "name": "retry",
            "base": QUICK,
            "grid": {"batch.global_size": [32, 64]},
            "methods": {"short": SHORT},
        }
    )
    done, failed = grid.cells
    for cell, state in ((done, "completed"), (failed, "failed")):
        run = RunDir.create(tmp_path, cell.run_id, cell.config)
        run.update_meta(**cell.meta())
        run.finish(state, reason="killed" if state == "failed" else None)
    lines = []
    table = sweep_runner.run(grid, tmp_path, log=lines.append, poll_s=0.2)
    assert table["state"].tolist() == ["completed", "failed"]
    assert any(f"{failed.run_id}); --retry-failed reruns it" in line for line in lines), lines
    assert len(list_runs(tmp_path)) == 2  # nothing launched
    table = sweep_runner.run(grid, tmp_path, retry_failed=True, log=lines.append, poll_s=0.2)
    assert table["state"].tolist() == ["completed", "completed"]
    assert table["run_id"].tolist() == [done.run_id, f"{failed.run_id}-2"]
    assert RunDir(tmp_path / failed.run_id).status()["state"] == "failed"  # kept, not deleted
    assert len(list_runs(tmp_path)) == 3


def test_a_cell_diverged_when_its_log_holds_a_non_finite_loss_whatever_its_reason_says(tmp_path):
    """Divergence is read from the events (training logs the step whose loss became NaN or
    infinite before it stops), not from the wording of a failure's reason."""
    grid = sweep.from_mapping(
        {"name": "nan", "base": QUICK, "grid": {"batch.global_size": [32, 64, 128]}}
    )
    logged = {
        "nan": [1.5, float("nan")],
        "inf": [1.5, float("inf")],
        "finite": [1.5, 1.25],  # failed for another reason, told in words that mention NaN
    }
    for cell, (name, losses) in zip(grid.cells, logged.items(), strict=True):
        run = RunDir.create(tmp_path, cell.run_id, cell.config)
        run.update_meta(**cell.meta())
        with EventWriter(run.events_path) as writer:
            for step, loss in enumerate(losses, 1):
                writer.write({"step": step, "epoch": step / 10, "phase": "train", "loss": loss})
        reason = "NonFiniteLoss: loss became nan at step 2" if name != "finite" else None
        run.finish("failed", reason=reason or "killed; the NonFiniteLoss: loss became guard off")
    table = sweep_results.results(grid, tmp_path)
    assert table["diverged"].tolist() == [True, True, False]


def test_cells_that_could_not_launch_are_refused_before_any_starts(tmp_path):
    """Valid configs, but one cell's batch is larger than its workers' shards and another's
    workers exceed the queue's slots: the runner starts nothing and names both."""
    slots.set_capacity("localhost:2", tmp_path)
    grid = sweep.from_mapping(spec(grid={"batch.global_size": [64, 8192], "workers": [2, 4]}))
    with pytest.raises(ConfigError) as error:
        sweep_runner.run(grid, tmp_path)
    text = str(error.value)
    too_big = "cell (method=sgd, batch.global_size=8192, workers=2, seed=0): batch.per_worker=4096"
    too_wide = "batch.global_size=64, workers=4, seed=0): 4 workers on localhost can never start"
    assert too_big in text and too_wide in text
    assert list_runs(tmp_path) == [] and not (tmp_path / ".sweeps").exists()
