"""A run's supervisor: the process that waits for the run's slots, starts its launcher and
records how the run ended when training could not (a killed worker, a crash during start-up),
so that no run stays ``running`` after its processes are gone.

The local and hosts executors (:mod:`toolkit.launching.executors.local`) start it in a session
of its own as ``python -m toolkit.launching.supervisor RUN_DIR -- ARGV`` (ARGV: the launcher's
command line); a Slurm job's driver (:mod:`toolkit.launching.slurm_job`) is the supervisor
inside its job and records the end with :func:`record_exit` too.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from toolkit.launching import failures, slots
from toolkit.runs import placement, processes
from toolkit.runs.rundir import RunDir, RunError
from toolkit.runs.states import State


def train_argv(run: RunDir, resume: bool) -> list[str]:
    """A worker's command line: ``python -m toolkit.train`` on the run's stored config, writing
    into its directory (``--resume``: from its latest checkpoint)."""
    argv = [sys.executable, "-m", "toolkit.train", str(run.config_path.resolve())]
    argv += ["--run-dir", str(run.path.resolve())]
    return argv + ["--resume"] if resume else argv


def command(run: RunDir, argv: list[str]) -> list[str]:
    """The supervisor's own command line, for ``run`` and its launcher's ``argv``."""
    return [sys.executable, "-m", __name__, str(run.path), "--", *argv]


def supervise(run: RunDir, argv: list[str]) -> int:
    """Wait for the run's turn in the launch queue, run ``argv`` and record the final state if
    training did not, as long as the run is still this supervisor's (a stop and a resume may
    have come between). A run stopped while queued never starts."""
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
            record = processes.record(placement.launcher(status), child.pid)
            run.record_processes(record, launched=launched, slots=need)
            run.set_status(State.STARTING)  # until train.py says its workers are training
        return child
    finally:
        slots.leave_line(run)


def record_exit(run: RunDir, me: dict, code: int) -> None:
    """Record the final state unless training did, and that the slots are free (``released``),
    if the run is still this supervisor's (``me``: its process record)."""
    with run.lock(timeout=120):
        status = run.recorded_status()
        if me not in status.get("processes", []):  # resumed meanwhile: no longer this run's
            return
        finished = time.time()  # the launcher has exited: its slots are free too
        if status.get("stop_requested"):
            run.finish(State.STOPPED, exit_code=code, finished=finished, released=finished)
            return
        failure = failures.explain(run, status, code)
        said = status.get("training_said")
        reason = failure.reason if failures.overrides(failure, said) else said
        # training's own final state, if it wrote one (a stop), wins: the first final state
        run.finish(
            State.FAILED, exit_code=code, finished=finished, reason=reason, released=finished
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("run_dir")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    launcher = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(supervise(RunDir(Path(args.run_dir)), launcher))
