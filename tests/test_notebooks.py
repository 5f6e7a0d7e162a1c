"""Every notebook in notebooks/ runs top to bottom, in its CI size (``LBL_NOTEBOOK_SMOKE=1``),
offline, in a kernel of this interpreter's environment; runs go to a temporary ``$LBL_RUNS``.

The kernel is ``python3``: jupyter_client starts a kernelspec whose command is ``python`` with
``sys.executable``, so the kernel runs in this virtualenv (checked by a first cell that the
test adds). Notebooks are stored without outputs; executing them here does not write them back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
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
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "LBL_NOTEBOOK_SMOKE" in tagged[0].source, path.name


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path, monkeypatch, subprocess_env):
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
        kernel_name="python3",
        timeout=200,  # per cell
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error
    kernel = json.loads(nb.cells[0].outputs[0]["text"])
    assert kernel["prefix"] == sys.prefix, f"the kernel ran in {kernel}, not in {sys.prefix}"
