"""Every notebook in notebooks/ runs top to bottom, in its CI size (``LBL_NOTEBOOK_SMOKE=1``),
offline, in the kernel it names; runs go to a temporary ``$LBL_RUNS``.

That kernel is "Large-Batch Lab", registered by ``toolkit.jupyter.install_kernel`` (what
``./lab notebook`` runs) to start this virtualenv's interpreter: a first cell that the test adds
checks it. Notebooks are stored without outputs; executing them here does not write them back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

from toolkit import jupyter

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"
LIVE_VIEWS = {"01_quickstart.ipynb": 1, "04_launch_and_monitor.ipynb": 3}  # monitor.live calls
EXPECTED = [
    "01_quickstart.ipynb",
    "02_optimizers_and_schedules.ipynb",
    "03_large_batch_study.ipynb",
    "04_launch_and_monitor.ipynb",
]


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


@pytest.fixture(scope="session")
def kernel():
    return jupyter.install_kernel()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
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
    views = [
        output
        for cell in nb.cells
        for output in cell.get("outputs", [])
        if WIDGET in output.get("data", {})
    ]
    # each live view is one widget: the progress line over the grid of figures
    assert len(views) == LIVE_VIEWS.get(path.name, 0), path.name
