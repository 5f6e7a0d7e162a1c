"""Every notebook in notebooks/ runs top to bottom, in its CI size (``LBL_NOTEBOOK_SMOKE=1``),
offline, in the kernel it names; runs go to a temporary ``$LBL_RUNS``.

That kernel is "Large-Batch Lab", registered by ``toolkit.launching.jupyter.install_kernel`` (what
``./lab notebook`` runs) to start this virtualenv's interpreter: a first cell that the test adds
checks it. Notebooks are stored without outputs; executing them here does not write them back.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from nbclient import NotebookClient

from toolkit.launching import jupyter
from toolkit.runs import theme
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
LIVE_VIEWS = {"01_quickstart.ipynb": 1, "04_launch_and_monitor.ipynb": 3}  # monitor.live calls
IN_JUPYTERLAB = "01_quickstart.ipynb"
"""Executed by ``test_jupyter`` in JupyterLab in Chromium, and checked there as every notebook
is here (:func:`check_executed`): not executed twice."""
SAVED_AT_MOST = 2_000_000
"""Bytes an executed notebook may weigh: its figures, not a plotly.js bundle per widget."""
EXPECTED = [
    "01_quickstart.ipynb",
    "02_optimizers_and_schedules.ipynb",
    "03_large_batch_study.ipynb",
    "04_launch_and_monitor.ipynb",
]


def test_the_overreach_check_sees_a_shape_on_a_log_axis():
    figure = {
        "data": [{"type": "scatter", "y": [300.0, 900.0]}],
        "layout": {
            "yaxis": {"type": "log"},
            "shapes": [{"type": "line", "yref": "y", "y0": 64, "y1": 64}],
        },
    }
    assert axis_overreach(figure)
    figure["layout"]["shapes"][0].update(y0=2.5, y1=2.5)  # log10(316): inside the data
    assert not axis_overreach(figure)


def test_the_notebooks_are_there_and_clean():
    assert [p.name for p in NOTEBOOKS] == EXPECTED
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, (
                    f"{path.name}: stored with outputs; clear them before committing"
                )
        assert nb.metadata.kernelspec.name == jupyter.KERNEL_NAME, path.name
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "LBL_NOTEBOOK_SMOKE" in tagged[0].source, path.name


def test_the_studys_notebook_as_shipped_builds_its_whole_grid_and_a_search_of_real_rates(
    tmp_path, monkeypatch
):
    """Notebook 03 in the mode a user gets (not smoke), up to what it would train: its grid
    cell validates every cell of the study for its ``NP`` workers (the fourth walk: the LBSGD
    cells' device batch of 128 could not be made by 2 workers of 128), and its search's
    space is the rate a trial trains at, around the grid cell's (it was scaled again: 6-640
    where 38 works). The cells that build them run here, none that train (~10 s)."""
    monkeypatch.setenv("LBL_NOTEBOOK_SMOKE", "0")
    monkeypatch.setenv("LBL_RUNS", str(tmp_path / "runs"))
    nb = nbformat.read(NOTEBOOK_DIR / "03_large_batch_study.ipynb", as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    (search_cell,) = [source for source in code if "search.from_mapping(" in source]
    until_search = search_cell.split("trials = search_runner.run")[0]
    namespace = {}
    for source in code[:4]:  # set-up, imports, the grid (its dry run's table not drawn)
        exec(source.replace("sweep_runner.dry_run(grid)", ""), namespace)
    grid, scale = namespace["grid"], namespace["Scale"]
    # the figure's cell names the largest batch, which the search's cell reads
    namespace["largest"] = max(scale.of(c.config).global_batch for c in grid.cells)
    exec(until_search, namespace)
    found = namespace["found"]
    assert not namespace["SMOKE"] and namespace["NP"] == 2
    assert {c.config.workers for c in grid.cells} == {2}
    assert {c.coordinates["method"] for c in grid.cells} >= {"lbsgd_lars", "lars", "sgd"}
    lbsgd = [c.config for c in grid.cells if c.config.optimizer.name == "lbsgd"]
    assert lbsgd and {c.batch.per_worker * c.workers for c in lbsgd} == {128}
    rates = found.spec.space["optimizer.learning_rate"]
    lars_rate = scale.of(namespace["lars"].config).learning_rate
    assert rates.low < lars_rate < rates.high
    for rate in (rates.low, rates.high):  # the rate a trial trains at is the one asked for
        trial = found.config({"optimizer.learning_rate": rate}, 0)
        assert scale.of(trial).learning_rate == pytest.approx(rate)
    (closing,) = [source for source in code if "search_runner.best(" in source]
    assert "No trial did much better than chance" in closing


@pytest.fixture(scope="session")
def kernel():
    return jupyter.install_kernel()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if p.name != IN_JUPYTERLAB], ids=lambda p: p.stem
)
def test_notebook_runs(path: Path, tmp_path, monkeypatch, subprocess_env, kernel):
    monkeypatch.setenv("LBL_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("LBL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])  # horovodrun from this environment
    monkeypatch.setenv("PYTHONPATH", subprocess_env["PYTHONPATH"])
    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell(
        "import json, sys; print(json.dumps({'prefix': sys.prefix, 'executable': sys.executable}))"
    )
    nb.cells.insert(0, probe)
    client = NotebookClient(
        nb,
        timeout=200,  # per cell
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error
    assert client.kernel_name == jupyter.KERNEL_NAME
    started = json.loads(nb.cells[0].outputs[0]["text"])
    assert started["prefix"] == sys.prefix, f"the kernel ran in {started}, not in {sys.prefix}"
    check_executed(nb, path.name, tmp_path / "runs")


def check_executed(nb: nbformat.NotebookNode, name: str, runs: Path) -> None:
    """What every executed notebook must show: no saved widget, a modest size, figures in the
    lab's look that do not overreach their axes, and each live view's final figure reaching
    its run's last event; notebook 01's calibration kept where probes read it."""
    outputs = [output for cell in nb.cells for output in cell.get("outputs", [])]
    assert not [o for o in outputs if WIDGET in o.get("data", {})], "widgets: saved, they weigh"
    assert len(nbformat.writes(nb)) < SAVED_AT_MOST, f"{name} executed is too large"
    shown = [o["data"][PLOTLY] for o in outputs if PLOTLY in o.get("data", {})]
    assert shown, f"{name} shows no figure"
    # each live view leaves its final figure; a run's last one reaches its last event
    views = [f for f in shown if "live_view" in f["layout"].get("meta", {})]
    assert len(views) == LIVE_VIEWS.get(name, 0), name
    last_views = {f["layout"]["meta"]["live_view"]: f for f in views}
    kept = {RunDir(runs / run_id): f for run_id, f in last_views.items()}
    kept = {run: f for run, f in kept.items() if run.path.exists()}
    assert len(kept) >= min(1, len(views))  # notebook 04 deletes one of its runs
    for run, figure in kept.items():
        events = read_events(run.events_path)
        last = events[events.phase == "train"].dropna(subset=["loss"]).step.max()
        (loss,) = [t for t in figure["data"] if t["name"] == "train" and t["xaxis"] == "x"]
        assert values(loss["x"])[-1] == last, (name, values(loss["x"])[-1], last)
    if name == "01_quickstart.ipynb":  # its calibration, kept where probes read it
        (calibration,) = (runs / ".calibrations").glob("*.json")
        assert calibration.name == "mnist1d5000-cnn1d-lars.json"
        texts = "".join(o.get("text", "") for o in outputs)
        assert "calibrated on this task (mnist1d5000-cnn1d-lars)" in texts
    for figure in shown:
        title = figure["layout"].get("title", {}).get("text")
        assert figure["layout"]["template"]["layout"]["colorway"] == list(theme.COLORS), title
        assert not axis_overreach(figure), (name, title, axis_overreach(figure))


def values(array) -> np.ndarray:
    """A Plotly JSON array (a list, or a typed array ``{"dtype", "bdata"}``) as floats."""
    if isinstance(array, dict):
        raw = np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"]))
        return raw.astype(float)
    return pd.to_numeric(pd.Series(array, dtype=object), errors="coerce").to_numpy(dtype=float)


def axis_overreach(figure: dict) -> list[str]:
    """The y axes whose range, as Plotly works it out from everything drawn on them (traces,
    shapes, annotations, a set range), reaches more than ten times beyond the traces' data:
    on a log axis, shapes and annotations take log10 coordinates, so a line at ``y=64`` drawn
    as a shape stretches the axis to 10^64."""
    layout, problems = figure["layout"], []
    axes = {t.get("yaxis", "y") for t in figure["data"]}
    for axis in axes:
        settings = layout.get("yaxis" + axis[1:], {})
        log = settings.get("type") == "log"
        data = np.concatenate(
            [values(t["y"]) for t in figure["data"] if t.get("yaxis", "y") == axis and "y" in t]
        )
        data = data[np.isfinite(data) & ((data > 0) if log else True)]
        if not len(data):
            continue
        placed = [
            v
            for item in (*layout.get("shapes", []), *layout.get("annotations", []))
            if item.get("yref") == axis
            for v in (item.get("y"), item.get("y0"), item.get("y1"))
            if v is not None
        ]
        placed += list(settings.get("range") or [])
        reach = 10.0 ** np.asarray(placed, dtype=float) if log else np.asarray(placed, dtype=float)
        if log:
            beyond = reach.size and (reach.max() > 10 * data.max() or reach.min() < data.min() / 10)
        else:
            beyond = reach.size and np.abs(reach).max() > 10 * np.abs(data).max()
        if beyond:
            problems.append(f"{axis}: data {data.min():.3g}..{data.max():.3g}, drawn to {reach}")
    return problems
