"""Resumable checkpoints: model weights, optimizer state and the training position.

A checkpoint is a directory ``checkpoints/epoch-NNNN/`` (one taken in the middle of an epoch,
on a scheduler's signal: ``epoch-NNNN-step-SSSSSSSSS``) holding ``model.weights.h5`` (Keras),
``optimizer.npz`` (every optimizer variable, in ``optimizer.variables`` order: step counter,
momentum buffers, gradient accumulators), ``position.json`` (epoch and step), ``manifest.json``
(below); where an encoded allreduce keeps state per worker (its residuals, and the velocities
momentum correction moves into it), ``residuals.npz`` (every worker's, as ``rank<r>_<i>``: they
differ per worker); and where training keeps state outside the optimizer (AdaScale's clock and
averages), ``state.npz``, in the order it was given. It is written
to a temporary directory and renamed into place, so a crash mid-write leaves the previous
checkpoint as the latest; a failed write (a full disk) removes the temporary directory and
raises :class:`~toolkit.files.WriteError` naming the checkpoint.

A checkpoint proves it is whole: ``manifest.json``, written last before the rename, gives every
other file's size and SHA-256. :func:`damage` checks a checkpoint against it (a truncated, a
changed or a missing file), and :func:`latest_intact` is the newest checkpoint that passes, with
the damaged ones it passed over and why; resuming starts from it. A checkpoint from before
manifests (none in it) is taken as whole, as it always was.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.files import writing

if TYPE_CHECKING:  # Keras only where a model is saved or restored: the launcher reads these
    import keras


@dataclass(frozen=True)
class Position:
    """Where training stands: ``epoch`` epochs and ``step`` batches done."""

    epoch: int
    step: int


def save(
    directory: Path,
    model: keras.Model,
    position: Position,
    keep: int = 2,
    residuals: list[list[np.ndarray]] | None = None,
    state: list = (),
    mid_epoch: bool = False,
) -> Path:
    """Write a checkpoint of ``model`` and its optimizer at ``position`` (and each worker's
    ``residuals``, in rank order, and the variables of ``state``, if given); keep the last
    ``keep``. One taken in the middle of an epoch (``mid_epoch``) is named
    ``epoch-NNNN-step-SSSSSSSSS`` (``NNNN`` epochs and ``SSSSSSSSS`` steps done), which sorts
    between the ends of its epoch's neighbours.
    A ``directory`` that is a symlink is refused: checkpoints are written, and old ones deleted,
    only inside the run."""
    final = directory / f"epoch-{position.epoch:04d}"
    if mid_epoch:
        final = final.with_name(f"{final.name}-step-{position.step:09d}")
    tmp = directory / f".{final.name}.tmp"
    try:
        with writing(tmp, name=f"checkpoints/{final.name}"):
            if directory.is_symlink():
                raise OSError(errno.ELOOP, f"{directory} is a symlink (not followed)")
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            model.save_weights(tmp / "model.weights.h5")
            from keras import ops

            variables = model.optimizer.variables
            np.savez(tmp / "optimizer.npz", *[ops.convert_to_numpy(v) for v in variables])
            (tmp / "position.json").write_text(json.dumps(position.__dict__))
            if state:
                np.savez(tmp / "state.npz", *[ops.convert_to_numpy(v) for v in state])
            if residuals is not None:
                arrays = {
                    f"rank{r}_{i}": a for r, rs in enumerate(residuals) for i, a in enumerate(rs)
                }
                np.savez(tmp / "residuals.npz", workers=len(residuals), **arrays)
            _write_manifest(tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in _checkpoints(directory)[:-keep]:
        shutil.rmtree(old)
    return final


def latest(directory: Path) -> Path | None:
    found = _checkpoints(directory)
    return found[-1] if found else None


MANIFEST = "manifest.json"


def damage(checkpoint: Path, checksums: bool = True) -> str | None:
    """What is wrong with ``checkpoint`` by its manifest (``model.weights.h5: 34,488 bytes of
    68,976``, ``optimizer.npz: missing``, ``state.npz: changed (SHA-256 differs)``), or ``None``
    if it is whole. One without a manifest (written before them) is whole. Without
    ``checksums`` only the files' presence and sizes are checked: a stat each, for listings."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return f"{MANIFEST}: unreadable ({error})"
    problems = []
    for name, expected in sorted(manifest.items()):
        path = checkpoint / name
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{name}: missing")
            continue
        if size != expected["bytes"]:
            problems.append(f"{name}: {size:,} bytes of {expected['bytes']:,}")
        elif checksums and _sha256(path) != expected["sha256"]:
            problems.append(f"{name}: changed (SHA-256 differs)")
    return "; ".join(problems) or None


def latest_intact(
    directory: Path, checksums: bool = True
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint in ``directory`` that :func:`damage` finds whole (``None``: none
    is), and the newer, damaged ones passed over, newest first, each with what is wrong."""
    passed_over = []
    for checkpoint in reversed(_checkpoints(directory)):
        problem = damage(checkpoint, checksums)
        if problem is None:
            return checkpoint, passed_over
        passed_over.append((checkpoint, problem))
    return None, passed_over


def none_intact(directory: Path, damaged: list[tuple[Path, str]]) -> str:
    """Why nothing in ``directory`` can be resumed from: no checkpoint, or each one damaged."""
    if not damaged:
        return f"no checkpoint in {directory}"
    listed = "; ".join(f"{checkpoint.name} ({problem})" for checkpoint, problem in damaged)
    return f"no intact checkpoint in {directory}: {listed}"


def resumed_text(status: dict) -> str | None:
    """Where a run's latest resume started, as its status records it (``resumed_from``,
    ``passed_over``: :func:`toolkit.launching.launch.resume`): ``from checkpoint epoch-0003,
    passing over epoch-0004 (model.weights.h5: ...)``; ``None`` for a run never resumed."""
    if not (start := status.get("resumed_from")):
        return None
    passed = "; ".join(f"{name} ({problem})" for name, problem in status.get("passed_over", []))
    return f"from checkpoint {start}" + (f", passing over {passed}" if passed else "")


def damaged_latest(directory: Path, checksums: bool = True) -> str | None:
    """A line for a run whose newest checkpoint in ``directory`` is damaged, saying where a
    resume would start (``latest checkpoint epoch-0004 damaged (model.weights.h5: ...); a
    resume starts from epoch-0003``); ``None`` when the newest is whole or there is none."""
    intact, damaged = latest_intact(directory, checksums)
    if not damaged:
        return None
    latest, problem = damaged[0]
    start = f"a resume starts from {intact.name}" if intact else "no intact one to resume from"
    return f"latest checkpoint {latest.name} damaged ({problem}); {start}"


def _write_manifest(checkpoint: Path) -> None:
    files = sorted(p for p in checkpoint.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (checkpoint / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def restore(checkpoint: Path, model: keras.Model, state: list = ()) -> Position:
    """Load weights and optimizer state into a compiled ``model`` (and the variables of
    ``state``, as :func:`save` was given them); return the position."""
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)  # first: its state loads, no Keras warning
    model.load_weights(checkpoint / "model.weights.h5")
    _assign(optimizer.variables, checkpoint / "optimizer.npz", "optimizer variables")
    if state:
        _assign(state, checkpoint / "state.npz", "state variables (AdaScale's)")
    return Position(**json.loads((checkpoint / "position.json").read_text()))


def _assign(variables: list, path: Path, what: str) -> None:
    if not path.is_file():
        raise ValueError(f"{path.parent} holds no {what}: was the config changed?")
    with np.load(path) as saved:
        values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    if len(values) != len(variables):
        raise ValueError(
            f"{path.parent} holds {len(values)} {what}, the run has {len(variables)}: "
            "was the config changed?"
        )
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def residuals(checkpoint: Path) -> list[list[np.ndarray]] | None:
    """Every worker's residuals saved with ``checkpoint``, in rank order (``None``: none)."""
    path = checkpoint / "residuals.npz"
    if not path.is_file():
        return None
    with np.load(path) as saved:
        workers = int(saved["workers"])
        return [
            [saved[k] for k in sorted(_keys(saved, r), key=lambda k: int(k.rsplit("_", 1)[1]))]
            for r in range(workers)
        ]


def _keys(saved, rank: int) -> list[str]:
    return [k for k in saved.files if k.startswith(f"rank{rank}_")]


def _checkpoints(directory: Path) -> list[Path]:
    if directory.is_symlink() or not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("epoch-*") if p.is_dir() and not p.is_symlink())
