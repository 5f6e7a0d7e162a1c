"""A toy scheduler-backed place to run, in one module: ``toyq``, a batch queue faked by a
table of jobs in a JSON file (``<runs root>/.toyq/jobs.json``) and a job runner per job.

A config asks for it with a ``toyq:`` section (``hold_s``: how long a job waits in the queue
before it starts; ``queue``: its name). Submitting a run adds a ``PENDING`` job and starts its
job runner (``python -m toyq serve TABLE JOB``, in a session of its own): it waits out the
hold, marks the job ``RUNNING`` and is the run's supervisor, training its one worker as
``python -m toolkit.train`` and recording the end as the local supervisor does, with this
place's own reading of its log. Cancelling a job (``end``, or ``python -m toyq cancel TABLE
JOB`` from outside, as a scheduler's operator would) ends its process group and says so in the
run's log. While a job waits, a run's state is the queue's (``queued``, with the queue's
reason); once it runs, its processes tell.

Everything the lab asks of a place is declared here and registered by the last line: the
config section, the CLI flags (``--toyq``, ``--toyq-hold``), the Launch page's title and
fields, the live state, the failure reading. Loaded as a plugin (``LBL_EXECUTORS=toyq``, this
folder on ``PYTHONPATH``) by every process the lab starts.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
from pydantic import Field

from toolkit import files, plugins
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.launching import supervisor
from toolkit.launching.executors import registry
from toolkit.launching.executors.base import Executor
from toolkit.launching.failures import RESUME, Failure
from toolkit.launching.remote import PACKAGE_ROOT
from toolkit.runs import checkpoints, processes
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import State
from toolkit.sections import Section

PENDING, RUNNING, ENDED, CANCELLED = "PENDING", "RUNNING", "ENDED", "CANCELLED"


class ToyqSection(Section):
    """The ``toyq:`` section of a config."""

    queue: str = "main"
    hold_s: float = Field(0.0, ge=0, le=60, description="seconds a job waits before it starts")


@contextmanager
def jobs(table: Path):
    """The job table, locked, read and written back."""
    table.parent.mkdir(parents=True, exist_ok=True)
    with open(table.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = json.loads(table.read_text()) if table.exists() else {}
        yield found
        files.replace(table, json.dumps(found).encode())


def job_of(status: dict) -> tuple[Path, str]:
    table, job = status["toyq_job"].rsplit("#", 1)
    return Path(table), job


class ToyqExecutor(Executor):
    """A run as a toyq job (see the module docstring)."""

    kind = "toyq"
    title = "Toy queue"
    section = "toyq"
    section_model = ToyqSection
    job_field = "toyq_job"
    launcher = "toyq"
    queues_here = False

    @classmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        return config.section("toyq") is not None

    def check(self, config: ExperimentConfig, root: Path) -> None:
        if config.workers != 1:
            raise ConfigError(f"workers: toyq runs one worker (got {config.workers})")

    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        return f"toyq job {job}" if job else "toyq"

    def start(self, run: RunDir, config: ExperimentConfig, resume: bool, meta: dict) -> None:
        table = run.path.parent / ".toyq" / "jobs.json"
        with jobs(table) as found:
            job = str(len(found) + 1)
            found[job] = {"run": str(run.path), "state": PENDING, "pid": None}
        self.queued(run, config, job, toyq_job=f"{table}#{job}")
        argv = [sys.executable, "-m", __name__, "serve", str(table), job]
        self.record_launch(run, config, argv, meta)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), HERE])}
        env[plugins.ENV] = ",".join(filter(None, [os.environ.get(plugins.ENV), __name__]))
        with open(run.stdout_path, "ab") as log:
            subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    def end(self, run: RunDir, status: dict, timeout: float) -> list[str]:
        table, job = job_of(status)
        return cancel(table, job, "on request", timeout, by_the_lab=True)

    @staticmethod
    def live_state(status: dict) -> dict | None:
        table, job = job_of(status)
        with jobs(table) as found:
            state = found.get(job, {}).get("state")
        if state == PENDING:
            queue = RunDir(Path(found[job]["run"])).config().section("toyq").queue
            return {**status, "reason": f"waiting in toyq queue {queue} (job {job})"}
        return None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("toyq (tests/toyq.py)")
        group.add_argument("--toyq", action="store_true", help="submit to the toy queue")
        group.add_argument("--toyq-hold", type=float, help="toyq: seconds a job waits")

    @classmethod
    def fields(cls, args: argparse.Namespace) -> dict | None:
        if not args.toyq:
            return None
        return {} if args.toyq_hold is None else {"hold_s": args.toyq_hold}

    @classmethod
    def flags(cls, fields: dict) -> list[str]:
        return ["--toyq", *([f"--toyq-hold={fields['hold_s']}"] if "hold_s" in fields else [])]

    @staticmethod
    def failure(run: RunDir, status: dict, tail: str) -> Failure | None:
        cancelled = re.search(r"toyq: job (\S+) cancelled (.+)", tail)
        if not cancelled:
            return None
        return Failure(f"toyq cancelled job {cancelled[1]} {cancelled[2]}; {RESUME}.")


def serve(table: Path, job: str) -> int:
    """A job's runner: wait out its hold (a cancel's SIGTERM ends it there), then supervise its
    run's one worker (a cancel's SIGTERM ends the worker; the runner outlives it to record the
    end)."""
    with jobs(table) as found:
        run = RunDir(Path(found[job]["run"]))
        found[job].update(state=PENDING, pid=os.getpid())
    time.sleep(run.config().section("toyq").hold_s)
    with jobs(table) as found:
        if found[job]["state"] == CANCELLED:
            return 0
        signal.signal(signal.SIGTERM, lambda *_: None)  # from here, under the table's lock
        found[job]["state"] = RUNNING
    me = processes.record("supervisor")
    run.record_processes(me, replacing="supervisor", reason=None)
    run.set_status(State.STARTING)
    resume = checkpoints.latest(run.checkpoints_path) is not None
    worker = subprocess.Popen(supervisor.train_argv(run, resume))
    run.record_processes(processes.record("toyq", worker.pid))
    code = worker.wait()
    with jobs(table) as found:
        if found[job]["state"] == RUNNING:
            found[job]["state"] = ENDED
        by_the_lab = found[job].get("by_the_lab")
    if not by_the_lab:  # else the lab's stop, waiting for this job's end, records it
        supervisor.record_exit(run, me, code)
    return code


def cancel(table: Path, job: str, why: str, timeout: float = 10.0, by_the_lab=False) -> list[str]:
    """Cancel a job as a scheduler would: end its process group, say so in its run's log."""
    with jobs(table) as found:
        entry = found[job]
        entry.update(state=CANCELLED, by_the_lab=by_the_lab)
    with open(Path(entry["run"]) / "stdout.log", "a") as log:
        log.write(f"toyq: job {job} cancelled {why}\n")
    if entry["pid"] is None:
        return []
    for sent, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(entry["pid"], sent)
        except ProcessLookupError:
            return []
        deadline = time.time() + wait_s
        while time.time() < deadline and alive(entry["pid"]):
            time.sleep(0.1)
    return [f"toyq job {job} survived"] if alive(entry["pid"]) else []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HERE = str(Path(__file__).resolve().parent)

if __name__ == "__main__":
    command, table, job = sys.argv[1:4]
    if command == "serve":
        sys.exit(serve(Path(table), job))
    cancel(Path(table), job, " ".join(sys.argv[4:]) or "by its operator")

registry.register(ToyqExecutor)
