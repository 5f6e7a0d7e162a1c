"""A damaged checkpoint never ends a run that an intact one can continue.

One run trains 4 epochs and keeps its last two checkpoints (epochs 3 and 4). Copies of it
have their latest checkpoint truncated, bit-flipped or missing a file, and are resumed from the
terminal (``python -m toolkit resume``, under horovodrun) and from a notebook's kernel
(``train(..., resume=True)``); each passes over the damaged checkpoint, says so in its log and
in a ``checkpoint`` event, and ends with the weights of a copy resumed from epoch 3 with the
damaged one removed (the oracle). With every checkpoint damaged, ``resume`` refuses with exit 2
and one line naming the files, and changes nothing.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_cli
from test_train import SMALL, wait

from toolkit.config import from_mapping
from toolkit.runs import checkpoints
from toolkit.runs.events import read_events
from toolkit.runs.rundir import TERMINAL, RunDir
from toolkit.runs.table import summary

pytestmark = pytest.mark.timeout(300)

CONFIG = {**SMALL, "workers": 1, "epochs": 4}
LATEST = "epoch-0004"


def truncate(checkpoint: Path) -> str:
    weights = checkpoint / "model.weights.h5"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size // 2)
    return f"model.weights.h5: {size // 2:,} bytes of {size:,}"


def flip_a_bit(checkpoint: Path) -> str:
    optimizer = checkpoint / "optimizer.npz"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0x10
    optimizer.write_bytes(bytes(data))
    return "optimizer.npz: changed (SHA-256 differs)"


def remove_a_file(checkpoint: Path) -> str:
    (checkpoint / "position.json").unlink()
    return "position.json: missing"


DAMAGE = {"truncated": truncate, "bit-flipped": flip_a_bit, "missing": remove_a_file}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> RunDir:
    """The 4-epoch run, trained in this process, ended as failed (so ``resume`` takes it)."""
    from toolkit.train import train

    run = train(from_mapping(CONFIG), tmp_path_factory.mktemp("base") / "run", verbose=0)
    run.set_status("failed", reason="a test")
    return run


def copy_of(run: RunDir, root: Path, name: str) -> RunDir:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run.path, root / name)
    return RunDir(root / name)


@pytest.fixture(scope="module")
def oracle(trained, tmp_path_factory) -> RunDir:
    """A copy resumed from epoch 3, its epoch-4 checkpoint removed: what a fallback must end as."""
    from toolkit.train import train

    run = copy_of(trained, tmp_path_factory.mktemp("oracle"), "oracle")
    shutil.rmtree(run.checkpoints_path / LATEST)
    return train(run.config(), run.path, resume=True, verbose=0)


def weights(checkpoint: Path) -> dict[str, np.ndarray]:
    found = {}
    with h5py.File(checkpoint / "model.weights.h5", "r") as h5:
        h5.visititems(
            lambda name, item: (
                found.setdefault(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    with np.load(checkpoint / "optimizer.npz") as optimizer:
        found |= {f"optimizer/{key}": optimizer[key] for key in optimizer.files}
    return found


def assert_same_end(run: RunDir, oracle: RunDir) -> None:
    got, want = weights(run.checkpoints_path / LATEST), weights(oracle.checkpoints_path / LATEST)
    assert got.keys() == want.keys() and len(got) > 4
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    a, b = read_events(run.events_path), read_events(oracle.events_path)
    for phase in ("train", "eval"):
        x, y = a[a.phase == phase], b[b.phase == phase]
        assert x.step.tolist() == y.step.tolist()  # no step twice
        np.testing.assert_array_equal(x.loss, y.loss)


def test_a_checkpoint_records_every_files_size_and_checksum(trained):
    checkpoint = trained.checkpoints_path / LATEST
    assert checkpoints.damage(checkpoint) is None
    manifest = (checkpoint / checkpoints.MANIFEST).read_text()
    for name in ("model.weights.h5", "optimizer.npz", "position.json"):
        digest = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
        assert f'"{name}"' in manifest and digest in manifest


@pytest.mark.parametrize("case", DAMAGE)
def test_each_damage_is_found_and_named(case, trained, tmp_path):
    run = copy_of(trained, tmp_path, case)
    said = DAMAGE[case](run.checkpoints_path / LATEST)
    assert checkpoints.damage(run.checkpoints_path / LATEST) == said
    intact, passed_over = checkpoints.latest_intact(run.checkpoints_path)
    assert intact.name == "epoch-0003" and [(p.name, s) for p, s in passed_over] == [(LATEST, said)]


def test_the_runs_table_tells_an_ended_run_whose_latest_checkpoint_is_damaged(trained, tmp_path):
    from toolkit.terminal import runs_table

    run = copy_of(trained, tmp_path, "damaged")
    said = truncate(run.checkpoints_path / LATEST)
    told = f"latest checkpoint {LATEST} damaged ({said}); a resume starts from epoch-0003"
    assert summary(run)["damaged_checkpoint"] == told and told in summary(run)["reason"]
    assert runs_table(tmp_path).splitlines()[-1] == f"damaged: {told}"
    flip_a_bit(run.checkpoints_path / "epoch-0003")  # sizes only, in a listing: not seen
    assert summary(run)["damaged_checkpoint"] == told


def test_a_checkpoint_from_before_manifests_still_loads(trained, tmp_path):
    run = copy_of(trained, tmp_path, "old")
    (run.checkpoints_path / LATEST / checkpoints.MANIFEST).unlink()
    assert checkpoints.latest_intact(run.checkpoints_path) == (run.checkpoints_path / LATEST, [])


def test_resume_from_the_terminal_passes_over_a_truncated_checkpoint(trained, oracle, tmp_path):
    run = copy_of(trained, tmp_path / "runs", "truncated")
    said = truncate(run.checkpoints_path / LATEST)
    result = run_cli(["resume", "truncated", "--wait"], tmp_path / "runs")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert wait(run, TERMINAL)["state"] == "completed"
    # defect 3 of the third walk: where it resumed from, said at once, and progress told from
    # there, once (it replayed the run's history twice)
    resumed = f"from checkpoint epoch-0003, passing over {LATEST} ({said})"
    assert result.stdout.splitlines()[0] == f"resumed truncated {resumed}"
    assert checkpoints.resumed_text(run.status()) == resumed  # Run detail's words
    told = [line for line in result.stdout.splitlines() if " - epoch: " in line]
    epochs = [float(line.split(" - epoch: ")[1].split(" ")[0]) for line in told]
    assert epochs == [4.0], result.stdout  # the one epoch trained again, told once
    log = run.stdout_path.read_text()
    assert f"checkpoint {LATEST} is damaged, passed over: {said}" in log
    assert "resuming from checkpoint epoch-0003 (step " in log
    events = read_events(run.events_path)
    (event,) = events[events.phase == "checkpoint"].to_dict("records")
    assert (event["checkpoint"], event["reason"], event["resumed_from"]) == (
        LATEST,
        said,
        "epoch-0003",
    )
    assert_same_end(run, oracle)


@pytest.mark.parametrize("case", ["bit-flipped", "missing"])
def test_a_notebook_resume_passes_over_a_damaged_checkpoint(case, trained, oracle, tmp_path):
    from toolkit.train import train

    run = copy_of(trained, tmp_path, case)
    DAMAGE[case](run.checkpoints_path / LATEST)
    status = run.recorded_status()  # as if it had failed an hour ago: not the run's time
    run.set_status("failed", finished=status["finished"] - 3600, started=status["started"] - 3600)
    train(run.config(), run.path, resume=True, verbose=0)
    assert run.status()["state"] == "completed"
    assert_same_end(run, oracle)
    trained_s = status["finished"] - status["started"]
    assert trained_s < summary(run)["duration_s"] < trained_s + 300


def test_with_every_checkpoint_damaged_resume_refuses_and_changes_nothing(trained, tmp_path):
    run = copy_of(trained, tmp_path / "runs", "hopeless")
    latest = truncate(run.checkpoints_path / LATEST)
    earlier = remove_a_file(run.checkpoints_path / "epoch-0003")
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    result = run_cli(["resume", "hopeless"], tmp_path / "runs")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"error: run hopeless cannot resume: no intact checkpoint in {run.checkpoints_path}: "
        f"{LATEST} ({latest}); epoch-0003 ({earlier})"
    )
    assert {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("name", ["residuals.npz", "state.npz"])
def test_the_residuals_and_adascale_state_are_covered_too(name, tmp_path):
    """A checkpoint with every worker's residuals and AdaScale's state: a changed byte in
    either file is found and named, as in the model's own files."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    saved = checkpoints.save(
        tmp_path,
        model,
        checkpoints.Position(epoch=1, step=10),
        residuals=[[np.ones(4, np.float32)], [np.zeros(4, np.float32)]],
        state=[keras.Variable(2.0)],
    )
    assert checkpoints.damage(saved) is None
    data = bytearray((saved / name).read_bytes())
    data[-30] ^= 0x01
    (saved / name).write_bytes(bytes(data))
    assert checkpoints.damage(saved) == f"{name}: changed (SHA-256 differs)"
    assert checkpoints.latest_intact(tmp_path) == (
        None,
        [(saved, f"{name}: changed (SHA-256 differs)")],
    )


def test_with_every_checkpoint_damaged_the_runs_page_refuses_and_changes_nothing(
    trained, tmp_path, monkeypatch
):
    """The app's door: the Runs page warns before anyone resumes, and its Resume button shows
    the same refusal as the CLI, starting nothing."""
    from test_app import by_label, page

    from app.data import md_escape

    monkeypatch.setenv("LBL_RUNS", str(tmp_path / "runs"))
    run = copy_of(trained, tmp_path / "runs", "hopeless")
    latest = truncate(run.checkpoints_path / LATEST)
    earlier = flip_a_bit(run.checkpoints_path / "epoch-0003")
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    at = page("runs")
    at.selectbox(key="runs_run").set_value("hopeless").run()
    warned = f"latest checkpoint {LATEST} damaged ({latest}); no intact one to resume from"
    assert [w.value for w in at.warning] == [md_escape(warned)]
    by_label(at.button, "Resume").click().run()
    (error,) = [e.value for e in at.error]
    assert error == md_escape(
        f"run hopeless cannot resume: no intact checkpoint in {run.checkpoints_path}: "
        f"{LATEST} ({latest}); epoch-0003 ({earlier})"
    )
    assert {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()} == before
