"""Start, resume, stop and delete runs; used by the CLI, the app, sweeps and notebooks.

:func:`launch` validates the config (a bad one raises :class:`~toolkit.config.ConfigError`
before anything is created), asks the executor registry where the run goes
(:func:`toolkit.launching.executors.registry.choose`: this machine, hosts over ssh, Slurm),
lets that executor check it can go there, creates ``runs/<run_id>/`` all or nothing and hands
the run to the executor. :func:`resume` and :func:`stop` ask the executor the run went to; this
module never asks which one it is.

Every function here takes the run's lock (:meth:`~toolkit.runs.rundir.RunDir.lock`) for its whole
check-then-act, so of two racing requests exactly one wins; the other raises
:class:`~toolkit.runs.rundir.RunError` with the reason, as does any request about an invalid id, a
run outside the runs root, or a run in the wrong state.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from toolkit import advice, backends, config_rules, files, rates
from toolkit import config as config_lib
from toolkit.launching import hosts as hosts_lib
from toolkit.launching import slots
from toolkit.launching.executors import registry
from toolkit.launching.executors.base import Cells, over
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.plan import RunPlan
from toolkit.runs import checkpoints, rundir
from toolkit.runs.rundir import LIVE, RUN_FILES, RunDir, RunError, resolve, runs_root
from toolkit.runs.states import RESUMABLE, State


def launch(
    config: config_lib.ExperimentConfig | str | Path,
    *,
    np: int | None = None,
    hosts: str | None = None,
    hostfile: str | Path | None = None,
    overrides: list[str] = (),
    runs_root_dir: str | Path | None = None,
    run_id: str | None = None,
    meta: dict | None = None,
    tags: Sequence[str] = (),
    notes: str | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    discovery: str | Path | None = None,
    slurm: dict | bool | None = None,
    place: tuple[str, dict] | None = None,
    backend: str | None = None,
) -> RunDir:
    """Validate ``config`` (a path or an object), have the executor it chooses check that it can
    go there (pre-flight), create its run directory and start it with ``np`` workers
    on ``hosts`` (``name:slots,...``, or ``auto`` in a Slurm allocation; default ``localhost:np``)
    or the hosts of a horovodrun ``hostfile`` (:mod:`toolkit.launching.hosts`). ``min_np``,
    ``max_np`` and ``discovery`` set the config's ``elastic`` section (horovodrun's ``--min-np``,
    ``--max-np`` and its hosts file or discovery script); the discovery path is stored absolute.
    ``meta``: extra fields for ``meta.json`` (e.g. ``{"probe": True}``); ``tags`` and ``notes``: the
    run's (see :meth:`~toolkit.runs.rundir.RunDir.set_tags`), checked before anything is created.
    ``slurm``: submit the run to Slurm (:mod:`toolkit.launching.slurm`): ``True``, or the fields
    of the config's ``slurm`` section to set (``{"nodes": 2, "time": "1:00:00"}``); ``place``,
    any executor's: its config section and the fields to set there
    (:func:`toolkit.launching.executors.registry.asked`).
    ``backend``: the Keras backend its workers run (default: this process's ``KERAS_BACKEND``,
    :func:`toolkit.backends.requested`), recorded in ``meta.json`` and kept on resume.
    :mod:`toolkit.advice`'s findings are issued as warnings and written to the run's log."""
    labels = {"tags": sorted({rundir.check_tag(t) for t in tags})} if tags else {}
    if notes:
        labels["notes"] = rundir.check_notes(notes)
    from_file = isinstance(config, (str, Path))
    raw = config_lib.read_file(config) if from_file else config.model_dump(mode="json")
    raw = {} if raw is None else raw  # an empty file: the defaults
    flags = {
        "workers": np,
        "hosts": hosts_lib.resolve(hosts, hostfile),
        "elastic.min_workers": min_np,
        "elastic.max_workers": max_np,
        "elastic.discovery": None if discovery is None else str(discovery),
    }
    if slurm is not None and slurm is not False:
        place = (SlurmExecutor.section, slurm)
    if place is not None and isinstance(raw, dict):
        raw = over(raw, *place)
    for path, value in flags.items():
        if value is not None and isinstance(raw, dict):  # else from_raw says what it is
            config_lib.set_path(raw, path, value)
    source = str(config) if from_file else "config"
    config = config_lib.from_raw(raw, overrides, source=source)
    if config.elastic is not None:  # stored absolute: a resume may start elsewhere
        discovery = str(Path(config.elastic.discovery).resolve())
        config = config.model_copy(
            update={"elastic": config.elastic.model_copy(update={"discovery": discovery})}
        )
    try:
        backend = backends.chosen(backend)
    except ValueError as error:
        raise config_lib.ConfigError(str(error)) from None
    config_rules.check_backend(config, backend)
    num_train = check_fits_dataset(config)
    findings = advice.warn(config, rates.peak_learning_rate(config, num_train), stacklevel=2)
    executor = registry.choose(config)
    executor.check(config, runs_root(runs_root_dir))
    run = (
        RunDir.create(runs_root_dir, run_id, config)
        if run_id
        else RunDir.create_new(runs_root_dir, config)
    )
    try:
        with run.lock():
            run.update_meta(keras_backend=backend)  # before the executor, which reads it
            executor.start(run, config, resume=False, meta={**(meta or {}), **labels})
    except OSError as error:  # nothing was started: leave nothing behind
        slots.leave_line(run)
        shutil.rmtree(run.path, ignore_errors=True)
        raise RunError(f"cannot start run {run.run_id}: {error}") from None
    for finding in findings:  # on the record too, where the run's output is read later
        _say_in_log(run, f"warning: {finding}")
    return run


def resume(run: RunDir | str, runs_root_dir: str | Path | None = None) -> RunDir:
    """Continue a stopped or failed run from its latest intact checkpoint, in the same
    directory and on the backend it was launched on, recording which (``resumed_from``) and the
    damaged ones passed over on the way (``passed_over``: name and what is wrong) in its
    status."""
    run = _as_run(run, runs_root_dir)
    with run.lock():
        state = run.status()["state"]
        if state not in RESUMABLE:
            raise RunError(f"run {run.run_id} is {state}: only a stopped or failed run resumes")
        intact, damaged = checkpoints.latest_intact(run.checkpoints_path)
        if intact is None:
            where = checkpoints.none_intact(run.checkpoints_path, damaged)
            raise RunError(f"run {run.run_id} cannot resume: {where}")
        config = config_lib.from_mapping(run.config().model_dump(mode="json"))  # checked again
        config_rules.check_backend(config, backends.of_run(run.meta()))
        executor = registry.choose(config)
        executor.check(config, run.path.parent)
        run.set_status(
            state,
            paused_s=rundir.paused_s(run.recorded_status()),
            resumed_from=intact.name,
            passed_over=[[checkpoint.name, problem] for checkpoint, problem in damaged],
            training_said=None,  # the last attempt's words are not this one's
        )
        try:
            executor.start(run, config, resume=True, meta={})
        except OSError as error:
            raise RunError(f"cannot resume run {run.run_id}: {error}") from None
    return run


def check_fits_dataset(config: config_lib.ExperimentConfig) -> int:
    """Raise :class:`~toolkit.config.ConfigError` if the run's plan cannot be made on its
    dataset: a worker's shard smaller than one batch, or AdaScale's base batch or an adaptive
    batch larger than the training set (checked here so it fails before any process starts).
    Returns the number of training examples (known without loading the dataset)."""
    try:
        num_train = config.dataset.train_examples()
    except ValueError as error:  # a size parameter its loader would refuse
        raise config_lib.ConfigError(f"dataset: {error}") from None
    RunPlan.of(config, num_train)
    return num_train


def launch_all(cells: Cells, name: str, runs_root_dir: str | Path | None = None, max_parallel=None):
    """Hand a sweep's ``cells`` (each a validated config, its run id and its meta) all at once
    to the executor their first config chooses, one that starts a sweep's runs at once
    (:attr:`~toolkit.launching.executors.base.Executor.starts_sweeps_at_once`), as sweep
    ``name``, at most ``max_parallel`` running at a time; their runs. Pre-flight runs once, for
    the first cell."""
    root = runs_root(runs_root_dir)
    if not cells:
        return []
    executor = registry.choose(cells[0][0])
    executor.check(cells[0][0], root)
    return executor.start_all(cells, name, root, max_parallel)


def stop(
    run: RunDir | str,
    runs_root_dir: str | Path | None = None,
    timeout: float = 15.0,
    by: str | None = None,
) -> RunDir:
    """Stop a queued or running run: SIGTERM to every live process it recorded and their
    children (the supervisor excepted: it records the exit code), SIGKILL after ``timeout`` s,
    and mark it ``stopped``. Processes on other hosts are ended there, over ssh, at the same
    time. This works when the supervisor itself, or horovodrun, is gone. A run trained in a
    process of its own (a notebook's kernel: role ``in-process``) is not signalled, whoever
    stops it, nor is anything that process started: it stops itself at its next check
    (:class:`~toolkit.training.callbacks.StopWhenRequested`). Raises
    :class:`~toolkit.runs.rundir.RunError` naming any process that survived; a run that has already
    ended is left as it is.

    ``by`` names the door the stop came from (``"the CLI"``, ``"the app"``; by default ``"a
    notebook"`` in a Jupyter kernel, else ``"Python"``). It goes into the run's reason and into
    a last line of ``stdout.log``, written once every process has ended, so that the log of a
    stopped run ends by saying so, after horovodrun's own complaints about the signal."""
    by = by or ("a notebook" if "ipykernel" in sys.modules else "Python")
    reason = f"stopped on request from {by} by {getpass.getuser()}@{socket.gethostname()}"
    said = f"{reason}; resume it with: python -m toolkit resume {{run_id}}"
    return _end(run, runs_root_dir, timeout, State.STOPPED, reason, said)


def prune(
    run: RunDir | str, why: str, runs_root_dir: str | Path | None = None, timeout: float = 15.0
) -> RunDir:
    """End a live run as :func:`stop` does, in state ``pruned``: a search's pruner judged it
    not worth finishing (``why``, its reason). A pruned run does not resume."""
    return _end(run, runs_root_dir, timeout, State.PRUNED, why, f"pruned: {why}")


def _end(run, runs_root_dir, timeout: float, state: State, reason: str, said: str) -> RunDir:
    """End a live run in ``state`` with ``reason``, ``said`` last in its log (``{run_id}``
    filled in); see :func:`stop`."""
    run = _as_run(run, runs_root_dir)
    with run.lock():
        status = run.status()
        if status["state"] not in LIVE:
            return run
        run.set_status(status["state"], stop_requested=True, stop_as=state, reason=reason)
        survivors = registry.of_run(run, status).end(run, status, timeout)
        if survivors:
            raise RunError(f"run {run.run_id}: {'; '.join(survivors)}; still running")
        run.finish(state, finished=time.time(), reason=reason)
        _say_in_log(run, said.format(run_id=run.run_id))
    slots.leave_line(run)
    return run


def settle(run: RunDir) -> dict:
    """``run``'s status, with an end only its readers could tell recorded where the run's other
    ends are: a live run whose processes are all gone, or whose scheduler's job ended (a Slurm
    job's driver killed with the node, or by OOM), without the run recording it, is marked so
    in ``status.json`` with the reason :meth:`~toolkit.runs.rundir.RunDir.status` derived, so
    that a script reading the file sees it too. A run whose lock is held (being launched,
    resumed or stopped) is left to its holder."""
    status = run.status()
    if status["state"] in LIVE or run.recorded_status().get("state") not in LIVE:
        return status
    try:
        with run.lock(timeout=1.0):
            status = run.status()
            if status["state"] not in LIVE and run.recorded_status().get("state") in LIVE:
                run.finish(status["state"], reason=status.get("reason"), finished=time.time())
    except RunError:  # busy: its holder records what happens
        pass
    return run.status()


def _say_in_log(run: RunDir, line: str) -> None:
    """Append ``[lab <UTC time>] line`` to the run's ``stdout.log``, if it has one (a run
    trained in a notebook's kernel has none); a log that cannot be written is left as it is."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        fd = os.open(run.stdout_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        files.append_whole(fd, f"\n[lab {stamp}] {line}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def delete(run: RunDir | str, runs_root_dir: str | Path | None = None) -> None:
    """Remove an ended run's directory (stop it first if it is live). Only a run directory is
    removed: a real directory holding run files and nothing else; symlinks inside are removed,
    never followed. It is renamed out of the listing first, so no reader sees it half gone."""
    run = _as_run(run, runs_root_dir)
    with run.lock():
        names = {entry.name for entry in os.scandir(run.path)}
        foreign = sorted(n for n in names if n not in RUN_FILES and not n.startswith("."))
        if foreign or not names & {"config.yaml", "status.json", "meta.json"}:
            shown = ", ".join(foreign) if foreign else "no config, status or meta"
            raise RunError(f"{run.path} does not look like a run directory ({shown}): not deleted")
        state = run.status()["state"]
        if state in LIVE:
            raise RunError(f"run {run.run_id} is {state}: stop it before deleting")
        doomed = run.path.with_name(f".{run.run_id}.{secrets.token_hex(4)}.deleting")
        os.rename(run.path, doomed)
    shutil.rmtree(doomed)


def _as_run(run: RunDir | str, root) -> RunDir:
    """``run`` (an id under ``root``, or a RunDir) checked by
    :func:`~toolkit.runs.rundir.resolve`."""
    if isinstance(run, RunDir):
        return resolve(run.run_id, run.path.parent)
    return resolve(run, runs_root(root))
