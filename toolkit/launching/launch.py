"""Start, resume, stop and delete runs under horovodrun; used by the CLI, the app and notebooks.

:func:`launch` validates the config (a bad one raises :class:`~toolkit.config.ConfigError`
before anything is created), creates ``runs/<run_id>/`` all or nothing, puts it in the launch
queue (:mod:`toolkit.launching.slots`) and starts a small *supervisor* process in a new session. The
supervisor waits, ``queued``, until the run's workers fit the free slots, then runs::

    horovodrun --gloo -np N -H HOSTS python -m toolkit.train runs/<id>/config.yaml --run-dir ...

(horovodrun as :mod:`toolkit.launching.horovodrun` runs it: Horovod's launcher without its build
probe)

(for an elastic run ``--min-np M --max-np X --host-discovery-script ...`` in place of ``-H``)
as an argv list (never a shell string) with output to ``stdout.log``, waits for it, and records
the final state when training could not (a killed worker, a crash during start-up): so no run
stays ``running`` after its processes are gone. The supervisor, horovodrun and every worker
record themselves in ``status.json`` (:mod:`toolkit.runs.processes`), so :func:`stop` finds and ends
them all even when the supervisor itself was killed.

Every function here takes the run's lock (:meth:`~toolkit.runs.rundir.RunDir.lock`) for its whole
check-then-act, so of two racing requests exactly one wins; the other raises
:class:`~toolkit.runs.rundir.RunError` with the reason, as does any request about an invalid id, a
run outside the runs root, or a run in the wrong state.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.util
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit import advice, backends, files, plan, rates
from toolkit import config as config_lib
from toolkit.files import writing
from toolkit.launching import failures, horovodrun, preflight, remote, slots, slurm
from toolkit.launching import hosts as hosts_lib
from toolkit.plan import RunPlan
from toolkit.runs import checkpoints, processes, rundir
from toolkit.runs.rundir import LIVE, RUN_FILES, RunDir, RunError, resolve, runs_root


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
) -> RunDir:
    """Validate ``config`` (a path or an object), check its hosts
    (:mod:`toolkit.launching.preflight`), create its run directory and start it with ``np`` workers
    on ``hosts`` (``name:slots,...``, or ``auto`` in a Slurm allocation; default ``localhost:np``)
    or the hosts of a horovodrun ``hostfile`` (:mod:`toolkit.launching.hosts`). ``min_np``,
    ``max_np`` and ``discovery`` set the config's ``elastic`` section (horovodrun's ``--min-np``,
    ``--max-np`` and its hosts file or discovery script); the discovery path is stored absolute.
    ``meta``: extra fields for ``meta.json`` (e.g. ``{"probe": True}``); ``tags`` and ``notes``: the
    run's (see :meth:`~toolkit.runs.rundir.RunDir.set_tags`), checked before anything is created.
    ``slurm``: submit the run to Slurm (:mod:`toolkit.launching.slurm`): ``True``, or the fields
    of the config's ``slurm`` section to set (``{"nodes": 2, "time": "1:00:00"}``).
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
    if slurm is not None and slurm is not False and isinstance(raw, dict):
        raw["slurm"] = {**(raw.get("slurm") or {}), **(slurm if isinstance(slurm, dict) else {})}
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
    plan.check_backend(config, backends.requested())
    num_train = check_fits_dataset(config)
    findings = advice.warn(config, rates.peak_learning_rate(config, num_train), stacklevel=2)
    _check_place(config, runs_root(runs_root_dir))
    run = (
        RunDir.create(runs_root_dir, run_id, config)
        if run_id
        else RunDir.create_new(runs_root_dir, config)
    )
    try:
        with run.lock():
            _start(run, config, resume=False, meta={**(meta or {}), **labels})
    except OSError as error:  # nothing was started: leave nothing behind
        slots.leave_line(run)
        shutil.rmtree(run.path, ignore_errors=True)
        raise RunError(f"cannot start run {run.run_id}: {error}") from None
    for finding in findings:  # on the record too, where the run's output is read later
        _say_in_log(run, f"warning: {finding}")
    return run


def resume(run: RunDir | str, runs_root_dir: str | Path | None = None) -> RunDir:
    """Continue a stopped or failed run from its last checkpoint, in the same directory."""
    run = _as_run(run, runs_root_dir)
    with run.lock():
        state = run.status()["state"]
        if state not in ("stopped", "failed"):
            raise RunError(f"run {run.run_id} is {state}: only a stopped or failed run resumes")
        intact, damaged = checkpoints.latest_intact(run.checkpoints_path)
        if intact is None:
            where = checkpoints.none_intact(run.checkpoints_path, damaged)
            raise RunError(f"run {run.run_id} cannot resume: {where}")
        config = config_lib.from_mapping(run.config().model_dump(mode="json"))  # checked again
        plan.check_backend(config, backends.requested())
        _check_place(config, run.path.parent)
        run.set_status(state, paused_s=rundir.paused_s(run.recorded_status()))
        try:
            _start(run, config, resume=True)
        except OSError as error:
            raise RunError(f"cannot resume run {run.run_id}: {error}") from None
    return run


def _check_place(config: config_lib.ExperimentConfig, root: Path) -> None:
    """Pre-flight where the run will go: Slurm's (:func:`toolkit.launching.slurm.preflight`), or
    this machine's launch queue and the hosts' (:mod:`toolkit.launching.preflight`)."""
    if config.slurm is not None:
        slurm.preflight(config, root)
        return
    slots.check_fits(slots.slots_of(config), root)
    preflight.check(config, root)


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


def horovodrun_argv(config: config_lib.ExperimentConfig, run: RunDir, resume: bool) -> list[str]:
    """The horovodrun command line for ``run``: Horovod's launcher, through
    :mod:`toolkit.launching.horovodrun` (without its 6-second build probe)."""
    if importlib.util.find_spec("horovod") is None:
        raise FileNotFoundError("horovodrun not found: run scripts/setup.sh first")
    hosts = config.hosts or f"localhost:{config.workers}"
    interface = remote.network_interface(config)
    ssh = [
        *(["-p", str(config.ssh_port)] if config.ssh_port else []),
        *(["-i", config.ssh_identity_file] if config.ssh_identity_file else []),
        *(["--network-interfaces", interface] if interface else []),
    ]
    where = ["-H", hosts] if config.elastic is None else _elastic_options(config, run)
    return [
        *horovodrun.COMMAND,
        "--gloo",
        "--gloo-timeout-seconds",
        str(config.lost_worker_after_s),
        "-np",
        str(config.workers),
        *where,
        *ssh,
        *train_argv(run, resume),
    ]


def train_argv(run: RunDir, resume: bool) -> list[str]:
    """A worker's command line: ``python -m toolkit.train`` on the run's stored config, writing
    into its directory (``--resume``: from its latest checkpoint)."""
    argv = [sys.executable, "-m", "toolkit.train", str(run.config_path.resolve())]
    argv += ["--run-dir", str(run.path.resolve())]
    return argv + ["--resume"] if resume else argv


def _elastic_options(config: config_lib.ExperimentConfig, run: RunDir) -> list[str]:
    """horovodrun's elastic options for ``config.elastic``. A hosts file is read through
    ``<run>/discover.sh``, written here, which prints it: horovodrun runs it every second."""
    elastic = config.elastic
    script = Path(elastic.discovery).resolve()
    if not hosts_lib.is_script(script):
        with writing(run.discovery_path):
            run.discovery_path.write_text(f"#!/bin/sh\nexec cat -- {shlex.quote(str(script))}\n")
            run.discovery_path.chmod(0o755)
        script = run.discovery_path.resolve()
    cooldown = ["--blacklist-cooldown-range", str(elastic.cooldown_s), "3600"]
    return [
        "--min-np",
        str(elastic.min_workers),
        "--max-np",
        str(elastic.max_workers),
        "--host-discovery-script",
        str(script),
        "--elastic-timeout",
        str(elastic.timeout_s),
        *(cooldown if elastic.cooldown_s else []),
    ]


def _start(
    run: RunDir, config: config_lib.ExperimentConfig, resume: bool, meta: dict | None = None
) -> None:
    if config.slurm is not None:
        _submit(run, config, meta)
        return
    argv = horovodrun_argv(config, run, resume)
    # a resumed run holds no slots until its new supervisor takes them
    _queued_afresh(run, launched=None, released=None, slots=None)
    _record_launch(run, config, argv, meta)
    slots.enqueue(run, slots.slots_of(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(remote.PACKAGE_ROOT), env.get("PYTHONPATH")])
    )
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    with writing(run.stdout_path):
        log = os.open(run.stdout_path, flags, 0o644)
    try:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "toolkit.launching.launch",
                "supervise",
                str(run.path),
                "--",
                *argv,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    finally:
        os.close(log)
    run.record_processes(processes.record("supervisor", supervisor.pid), pid=supervisor.pid)


def _submit(run: RunDir, config: config_lib.ExperimentConfig, meta: dict | None) -> None:
    """Hand ``run`` to Slurm: its job script submitted, its job id recorded; Slurm's queue is
    its queue (the job resumes from the latest checkpoint, if the run has one)."""
    _queued_afresh(run, slurm_job_id=None)
    _submitted(run, config, slurm.submit(config, run), meta)


def _queued_afresh(run: RunDir, **fields) -> None:
    """``queued``, with nothing left of a previous attempt (a resume's): no stop asked, no exit,
    reason, end or processes; and ``fields``."""
    run.set_status(
        "queued",
        stop_requested=False,
        exit_code=None,
        reason=None,
        finished=None,
        pid=None,
        processes=[],
        **fields,
    )


def _submitted(
    run: RunDir, config: config_lib.ExperimentConfig, job_id: str, meta: dict | None
) -> None:
    run.set_status("queued", slurm_job_id=job_id, reason=f"submitted to Slurm as job {job_id}")
    command = ["sbatch", str((run.path / slurm.JOB_SCRIPT).resolve())]
    job_ids = [*run.meta().get("slurm_job_ids", []), job_id]
    _record_launch(run, config, command, {**(meta or {}), "slurm_job_ids": job_ids})


def _record_launch(
    run: RunDir, config: config_lib.ExperimentConfig, command: list[str], meta: dict | None
) -> None:
    """What ``meta.json`` says of a launch (or a resume): when, the command that started it, its
    world size and seed, and ``meta``."""
    run.update_meta(
        run_id=run.run_id,
        created=time.time(),
        command=command,
        world_size=config.workers,
        seed=config.seed,
        **(meta or {}),
    )


def launch_array(
    cells: list[tuple[config_lib.ExperimentConfig, str, dict]],
    name: str,
    runs_root_dir: str | Path | None = None,
    max_parallel: int | None = None,
) -> list[RunDir]:
    """Launch ``cells`` (each a validated config with a ``slurm`` section, its run id and its
    meta) as Slurm job arrays, one per job shape (:func:`toolkit.launching.slurm.job_shape`),
    at most ``max_parallel`` of an array at a time; the arrays' scripts are
    ``<runs root>/.sweeps/<name>-<k>.sbatch``. Pre-flight runs once, for the first cell. A
    shape that Slurm refuses leaves none of its runs behind (:class:`RunError`)."""
    root = runs_root(runs_root_dir)
    for config, _, _ in cells[:1]:
        _check_place(config, root)
    shapes: dict[tuple, list] = {}
    for config, run_id, meta in cells:
        shapes.setdefault(tuple(slurm.job_shape(config)), []).append((config, run_id, meta))
    launched = []
    for index, group in enumerate(shapes.values()):
        runs = [(config, RunDir.create(root, run_id, config)) for config, run_id, _ in group]
        try:
            for _, run in runs:
                _queued_afresh(run, slurm_job_id=None)
            script = root / ".sweeps" / f"{name}-{index}.sbatch"
            job_ids = slurm.submit_array(runs, script, max_parallel)
        except OSError as error:
            for _, run in runs:
                shutil.rmtree(run.path, ignore_errors=True)
            raise RunError(f"cannot submit sweep {name}'s runs to Slurm: {error}") from None
        for (config, run), job_id, (_, _, meta) in zip(runs, job_ids, group, strict=True):
            _submitted(run, config, job_id, meta)
            launched.append(run)
    return launched


def supervise(run: RunDir, argv: list[str]) -> int:
    """Wait for the run's turn in the launch queue, run ``argv`` and record the final state if
    training did not (the supervisor's job), as long as the run is still this supervisor's (a
    stop and a resume may have come between). A run stopped while queued never starts."""
    signal.signal(signal.SIGTERM, lambda *_: None)  # outlive the child to record the state
    me = processes.record("supervisor")
    heartbeat = processes.Heartbeat(run.path, me)
    heartbeat.start()
    child = _start_when_free(run, argv)
    if child is None:
        heartbeat.stop()
        return 0
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    try:
        record_exit(run, me, code)
    except RunError:  # deleted after a stop: nothing left to record into
        pass
    heartbeat.stop()
    return code


def _start_when_free(run: RunDir, argv: list[str]) -> subprocess.Popen | None:
    """``argv`` started once the run has its slots (recorded in its status from then on, see
    :mod:`toolkit.launching.slots`); ``None`` if it was stopped first. The start and the stop check
    hold the run's lock, so a stop either sees the child recorded (and ends it) or is seen here (and
    nothing starts)."""
    try:
        if not slots.wait_turn(run):
            return None
        with run.lock(timeout=120):
            status = run.recorded_status()
            if status.get("stop_requested"):
                return None
            launched = status.get("launched") or time.time()  # slots taken at launch, or now
            need = status.get("slots") or slots.slots_of(run.config())
            child = subprocess.Popen(argv)
            record = processes.record("horovodrun", child.pid)
            run.record_processes(record, launched=launched, slots=need)
            run.set_status("starting")  # until train.py says its workers are training
        return child
    finally:
        slots.leave_line(run)


def record_exit(run: RunDir, me: dict, code: int) -> None:
    """Record the final state unless training did, and that the slots are free (``released``),
    if the run is still this supervisor's (``me``: its process record). Used by the local
    supervisor and by a Slurm job's (:mod:`toolkit.launching.slurm_job`)."""
    with run.lock(timeout=120):
        status = run.recorded_status()
        if me not in status.get("processes", []):  # resumed meanwhile: no longer this run's
            return
        finished = time.time()  # horovodrun has exited: its slots are free too
        if status.get("stop_requested"):
            run.finish("stopped", exit_code=code, finished=finished, released=finished)
            return
        failure = failures.explain(run, status, code)
        if status.get("state") == "failed" and failures.overrides(failure, status):
            run.set_status("failed", exit_code=code, finished=finished, reason=failure.reason)
        # otherwise training's own reason, if it wrote one, wins (the first final state)
        run.finish(
            "failed", exit_code=code, finished=finished, reason=failure.reason, released=finished
        )


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
    run = _as_run(run, runs_root_dir)
    by = by or ("a notebook" if "ipykernel" in sys.modules else "Python")
    with run.lock():
        status = run.status()
        if status["state"] not in LIVE:
            return run
        run.set_status(status["state"], stop_requested=True)
        if status.get("slurm_job_id"):  # Slurm ends every rank on every node
            problem = slurm.cancel(status["slurm_job_id"], timeout + slurm.KILL_MARGIN_S)
            survivors = [problem] if problem else []
        else:
            survivors = _terminate_everywhere(run, run.process_records(status), timeout)
        if survivors:
            raise RunError(f"run {run.run_id}: {'; '.join(survivors)}; still running")
        reason = f"stopped on request from {by} by {getpass.getuser()}@{socket.gethostname()}"
        run.finish("stopped", finished=time.time(), reason=reason)
        _say_in_log(run, f"{reason}; resume it with: python -m toolkit resume {run.run_id}")
    slots.leave_line(run)
    return run


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


def _terminate_everywhere(run: RunDir, entries: list[dict], timeout: float) -> list[str]:
    """End ``entries`` on every host at once, here directly and elsewhere over ssh with the
    run's options (the supervisors and this process are spared); what survived, per host."""
    by_host: dict[str, list[dict]] = {}
    for entry in entries:
        by_host.setdefault(entry.get("host", ""), []).append(entry)
    try:
        ssh = remote.Ssh.of(run.config())
    except (ValueError, OSError):  # an unreadable config: the default options
        ssh = remote.Ssh()

    def end(host: str) -> str | None:
        mine = by_host[host]
        try:
            if processes.is_local(mine[0]):
                left = [p.pid for p in processes.terminate_records(mine, timeout)]
            else:
                left = processes.terminate_on(host, mine, timeout, ssh)
        except OSError as error:
            return str(error)
        return f"processes {', '.join(map(str, left))} on {host} survived SIGKILL" if left else None

    with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
        problems = [problem for problem in pool.map(end, by_host) if problem]
    if not problems:  # all ended: their heartbeats would read alive for a while yet
        for entry in entries:
            if entry.get("role") != "supervisor":
                processes.heartbeat_path(run.path, entry).unlink(missing_ok=True)
    return problems


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


# The supervisor: python -m toolkit.launching.launch supervise RUN_DIR -- ARGV
if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m toolkit.launching.launch")
    parser.add_argument("command", choices=["supervise"])
    parser.add_argument("run_dir")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(supervise(RunDir(Path(args.run_dir)), command))
