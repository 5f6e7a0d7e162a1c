"""Start, resume and stop runs under horovodrun; used by the CLI, the app and notebooks.

:func:`launch` validates the config (a bad one raises :class:`~toolkit.config.ConfigError`
before anything is created), creates ``runs/<run_id>/`` and starts a small *supervisor* process
in a new session. The supervisor runs::

    horovodrun --gloo -np N -H HOSTS python -m toolkit.train runs/<id>/config.yaml --run-dir ...

as an argv list (never a shell string) with output to ``stdout.log``, waits for it, and records
the final state when training could not (a killed worker, a crash during start-up): so no run
stays ``running`` after its processes are gone. :func:`stop` signals the supervisor's whole
process tree and marks the run ``stopped``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from toolkit import config as config_lib
from toolkit.rundir import TERMINAL, RunDir, new_run_id, pid_alive, read_json, runs_root


def launch(
    config: config_lib.ExperimentConfig | str | Path,
    *,
    np: int | None = None,
    hosts: str | None = None,
    overrides: list[str] = (),
    runs_root_dir: str | Path | None = None,
    run_id: str | None = None,
) -> RunDir:
    """Validate ``config`` (a path or an object), create its run directory and start it with
    ``np`` workers on ``hosts`` (``name:slots,...``; default ``localhost:np``)."""
    if isinstance(config, (str, Path)):
        config = config_lib.load(config, overrides)
        overrides = ()
    changes = {k: v for k, v in (("workers", np), ("hosts", hosts)) if v is not None}
    config = config_lib.from_mapping({**config.model_dump(mode="json"), **changes}, overrides)
    check_fits_dataset(config)
    run = RunDir.create(runs_root_dir, run_id or new_run_id(config.name))
    run.write_config(config)
    _start(run, config, resume=False)
    return run


def resume(run: RunDir | str, runs_root_dir: str | Path | None = None) -> RunDir:
    """Continue a stopped or failed run from its last checkpoint, in the same directory."""
    run = _as_run(run, runs_root_dir)
    if run.status()["state"] not in TERMINAL:
        raise ValueError(f"run {run.run_id} is still {run.status()['state']}")
    if not any(run.checkpoints_path.glob("epoch-*")):
        raise ValueError(f"run {run.run_id} has no checkpoint to resume from")
    _start(run, config_lib.load(run.config_path), resume=True)  # fully checked again
    return run


def check_fits_dataset(config: config_lib.ExperimentConfig) -> None:
    """Raise :class:`~toolkit.config.ConfigError` if each worker's shard of the training set is
    smaller than one batch (checked here so it fails before any process starts)."""
    from toolkit import data
    from toolkit.experiment import steps_per_epoch

    try:
        dataset = data.load(config.dataset.name, seed=config.seed, **config.dataset.params)
    except RuntimeError as error:  # a downloadable dataset while offline: say so now
        raise config_lib.ConfigError(f"dataset: {error}") from None
    steps_per_epoch(config, len(dataset.x_train), config.workers)


def horovodrun_argv(config: config_lib.ExperimentConfig, run: RunDir, resume: bool) -> list[str]:
    """The horovodrun command line for ``run``."""
    bin_dir = Path(sys.executable).parent
    horovodrun = shutil.which("horovodrun", path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    if horovodrun is None:
        raise FileNotFoundError("horovodrun not found: run scripts/setup.sh first")
    hosts = config.hosts or f"localhost:{config.workers}"
    argv = [
        horovodrun,
        "--gloo",
        "-np",
        str(config.workers),
        "-H",
        hosts,
        sys.executable,
        "-m",
        "toolkit.train",
        str(run.config_path.resolve()),
        "--run-dir",
        str(run.path.resolve()),
    ]
    return argv + ["--resume"] if resume else argv


def _start(run: RunDir, config: config_lib.ExperimentConfig, resume: bool) -> None:
    argv = horovodrun_argv(config, run, resume)
    run.set_status("queued", stop_requested=False, exit_code=None, reason=None)
    run.update_meta(
        run_id=run.run_id,
        created=time.time(),
        command=argv,
        world_size=config.workers,
        seed=config.seed,
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_package_root()), env.get("PYTHONPATH")]))
    with open(run.stdout_path, "ab") as log:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "toolkit.launch",
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
    run.set_status("queued", pid=supervisor.pid)


def supervise(run: RunDir, argv: list[str]) -> int:
    """Run ``argv`` and record the final state if training did not (the supervisor's job)."""
    run.set_status("queued", pid=os.getpid())
    signal.signal(signal.SIGTERM, lambda *_: None)  # outlive the child to record the state
    child = subprocess.Popen(argv)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    status = read_json(run.status_path)
    if status.get("stop_requested"):
        run.set_status("stopped", exit_code=code, finished=time.time())
    elif code != 0:
        reason = status.get("reason") if status.get("state") == "failed" else None
        run.set_status(
            "failed",
            exit_code=code,
            finished=time.time(),
            reason=reason or f"horovodrun exited with code {code}; see stdout.log",
        )
    elif status.get("state") != "completed":
        run.set_status("failed", exit_code=code, reason="training exited without finishing")
    return code


def stop(
    run: RunDir | str, runs_root_dir: str | Path | None = None, timeout: float = 15.0
) -> RunDir:
    """Stop a run: SIGTERM to its process tree, SIGKILL after ``timeout`` s; mark it stopped."""
    run = _as_run(run, runs_root_dir)
    status = read_json(run.status_path)
    if status.get("state") in TERMINAL:
        return run
    run.set_status(status.get("state", "queued"), stop_requested=True)
    pid = status.get("pid")
    if pid_alive(pid):
        supervisor = psutil.Process(pid)
        tree = [supervisor, *supervisor.children(recursive=True)]
        for process in tree[1:]:  # the supervisor stays to record the final state
            _signal(process, signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=timeout)
        for process in alive:
            _signal(process, signal.SIGKILL)
    if read_json(run.status_path).get("state") not in TERMINAL:
        run.set_status("stopped", finished=time.time())
    return run


def delete(run: RunDir | str, runs_root_dir: str | Path | None = None) -> None:
    """Remove a finished run's directory (stop it first if it is live)."""
    run = _as_run(run, runs_root_dir)
    if run.status()["state"] not in TERMINAL:
        raise ValueError(f"run {run.run_id} is {run.status()['state']}: stop it before deleting")
    shutil.rmtree(run.path)


def _signal(process: psutil.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.Error:
        pass


def _as_run(run: RunDir | str, root) -> RunDir:
    if isinstance(run, RunDir):
        return run
    if not config_lib.RUN_NAME.match(run):
        raise ValueError(f"run id {run!r} must match {config_lib.RUN_NAME.pattern}")
    found = RunDir(runs_root(root) / run)
    if not found.path.is_dir():
        raise FileNotFoundError(f"no run {run!r} under {runs_root(root)}")
    return found


def _package_root() -> Path:
    return Path(__file__).resolve().parents[1]


if __name__ == "__main__":  # the supervisor: python -m toolkit.launch supervise RUN_DIR -- ARGV
    parser = argparse.ArgumentParser(prog="python -m toolkit.launch")
    parser.add_argument("command", choices=["supervise"])
    parser.add_argument("run_dir")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(supervise(RunDir(Path(args.run_dir)), command))
