"""Why a launched run failed, in one sentence that names the worker, its host and what to do.

When horovodrun (or a Slurm job's ``srun``) has exited, the supervisor reads the end of the
run's ``stdout.log``, where every line a worker wrote carries its rank (``[1]<stderr>:``), and
:func:`explain` maps what Horovod, Gloo and Slurm said there to one sentence; the raw text stays
in the log. In the order they are tried:

- Slurm cancelled the job (the time limit, a node failure, a preemption, ``scancel``);
- elastic: fewer than ``elastic.min_workers`` for ``elastic.timeout_s``;
- a host vanished: it does not answer ssh now, and the others lost its workers (a
  collective waited for them, or their ssh session ended); not in an elastic run, which goes
  on without such a worker, and fails only for another reason;
- a worker stopped answering: a collective waited ``lost_worker_after_s`` (Gloo's
  ``Timed out waiting ...ms``) for one that was stopped, hung or cut off. Which one is told by
  the heartbeats: the silent worker's last beat is about ``lost_worker_after_s`` older than
  the failure, every other's a few seconds;
- a worker that did not join at the start within ``lost_worker_after_s`` (Gloo's rendezvous
  ``Wait timeout ... for key(s): R``, naming the missing ranks);
- a worker that could not connect to a peer (``Connection refused``, ``Connect timeout``) or
  to horovodrun's rendezvous (``HTTP request failed``);
- the first worker to exit, by horovodrun (``Process name: R  Exit code: C``) or srun, with what
  its code says (a signal, ssh's 255).

A collective's failure on one worker only says that another failed (:func:`collective_failed`);
:func:`overrides` lets the sentence naming that other be the run's reason instead.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from toolkit import files
from toolkit.launching import remote
from toolkit.parallel.collective_errors import collective_failed
from toolkit.runs import placement, processes
from toolkit.runs.rundir import RunDir

TAIL_BYTES = 65536
RANK_LINE = re.compile(r"^\[(\d+)\]<std(?:out|err)>:(.*)$", re.M)
GLOO_WAITED = re.compile(r"Timed out waiting (\d+)ms for (?:recv|send) operation")
NOT_JOINED = re.compile(r"Wait timeout after (\d+) seconds for key\(s\): ([\d, ]+)")
RESUME = "resume the run to go on from its last checkpoint"


@dataclass(frozen=True)
class Failure:
    """``reason``: the sentence; ``blames_another``: it names a worker other than one whose own
    error training recorded (then it replaces that consequence in ``status.json``)."""

    reason: str
    blames_another: bool = False


def overrides(failure: Failure, said: str | None) -> bool:
    """Whether ``failure`` is the reason rather than what training ``said`` as it failed
    (``training_said`` in the status): training's own reason wins (a non-finite loss, a full
    disk) unless it said nothing or only that a collective failed, the echo of another
    worker's failure."""
    return not said or (failure.blames_another and collective_failed(said))


Reading = Callable[[RunDir, dict, str], "Failure | None"]
"""A reading of a run's output: its run, status and the tail of its log -> a failure, if it
finds its sign there."""
READINGS: dict[str, Reading] = {}
"""Each executor's reading of its own words (a scheduler cancelling a job), by its kind:
registered as each executor class is defined
(:meth:`toolkit.launching.executors.base.Executor.failure`)."""


def explain(run: RunDir, status: dict, code: int) -> Failure:
    """Why the run's launcher exited with ``code`` (see the module's docstring): its executor's
    reading of its own words first, then the common ones."""
    said = f"{placement.launcher(status)} exited with code {code}; see stdout.log"
    if code == 0:
        return Failure("training exited without finishing")
    tail = files.tail(run.stdout_path, TAIL_BYTES)
    own = READINGS.get(placement.executor(status))
    for reading in (
        *([own] if own else []),
        _too_few_elastic,
        _vanished,
        _silent,
        _not_joined,
        _not_connected,
    ):
        if found := reading(run, status, tail):
            return Failure(f"{found.reason} {said}", found.blames_another)
    return _first_exit(status, tail, said)


def _too_few_elastic(run: RunDir, status: dict, tail: str) -> Failure | None:
    elastic = run.config().elastic
    if elastic is None or not re.search(r"Timed out waiting for .* Horovod processes", tail):
        return None
    return Failure(
        f"fewer than elastic.min_workers={elastic.min_workers} workers for "
        f"elastic.timeout_s={elastic.timeout_s} s: horovodrun gave up waiting for hosts; "
        "resume the run once they are back."
    )


def _vanished(run: RunDir, status: dict, tail: str) -> Failure | None:
    """A host of a multi-host run that does not answer ssh now, where the others lost its
    workers: a collective waited for them, or their ssh session ended (ssh's code 255)."""
    config = run.config()
    lost = GLOO_WAITED.search(tail) or re.search(r"Process name: \d+\s+Exit code: 255", tail)
    if not config.hosts or not lost or config.elastic is not None:  # elastic: a reset, not this
        return None
    workers = _workers(status)
    ssh = remote.Ssh.of(config)
    for host in sorted({e["host"] for e in workers if not remote.is_local(e["host"])}):
        if not _answers(ssh, host):
            ranks = ", ".join(str(e["rank"]) for e in workers if e["host"] == host)
            return Failure(
                f"host {host} (worker ranks {ranks}) vanished: it does not answer ssh now "
                "(powered off, or its link is down); resume the run once it is back, or "
                "without it in hosts.",
                blames_another=True,
            )
    return None


def _silent(run: RunDir, status: dict, tail: str) -> Failure | None:
    match = GLOO_WAITED.search(tail)
    if not match or run.config().elastic is not None:  # an elastic run reset on it and went on
        return None
    timeout_s = int(match.group(1)) // 1000
    waited = f"the others waited lost_worker_after_s={timeout_s} s"
    failed_at = status.get("finished") or time.time()
    silent = [
        e for e in _workers(status) if _quiet_since(run, e) < failed_at - max(timeout_s - 1, 7)
    ]
    if not silent:
        return Failure(
            f"a worker stopped answering: {waited} in a collective, then gave up; every "
            f"heartbeat was fresh, so the lab cannot tell which; {RESUME}.",
            blames_another=True,
        )
    who = " and ".join(f"worker rank {e['rank']} on {e['host']}" for e in silent)
    return Failure(
        f"{who} stopped answering: {waited} for it in a collective, then gave up (a stopped "
        f"process, by SIGSTOP or a debugger, a hang, or a cut link); {RESUME}, or raise "
        "lost_worker_after_s if it pauses on purpose.",
        blames_another=True,
    )


def _answers(ssh: remote.Ssh, host: str) -> bool:
    """Whether ``host`` takes an ssh session within ssh's connect timeout."""
    try:
        return ssh.python(host, ["-c", "pass"], timeout_s=ssh.connect_timeout_s + 5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):  # no ssh here, or a half-open link
        return False


def _quiet_since(run: RunDir, worker: dict) -> float:
    """When ``worker`` last beat (infinitely recent if it has no heartbeat: it ended cleanly)."""
    try:
        return processes.heartbeat_path(run.path, worker).stat().st_mtime
    except OSError:
        return float("inf")


def _not_joined(run: RunDir, status: dict, tail: str) -> Failure | None:
    missing = NOT_JOINED.search(tail)
    if not missing:
        return None
    ranks = [int(r) for r in missing.group(2).replace(",", " ").split()]
    who = " and ".join(f"worker rank {r}{_on(status, r)}" for r in ranks)
    return Failure(
        f"{who} did not join the others within lost_worker_after_s={missing.group(1)} s of "
        "the start: it started late (a slow import or file system, a busy host) or cannot "
        "reach horovodrun's rendezvous; raise lost_worker_after_s, or see its lines.",
        blames_another=True,
    )


def _not_connected(run: RunDir, status: dict, tail: str) -> Failure | None:
    for rank, line in RANK_LINE.findall(tail):
        if "HTTP request failed" in line or "Failed to connect to" in line:
            return Failure(
                f"worker rank {rank}{_on(status, int(rank))} could not reach horovodrun's "
                "rendezvous on the launching machine: a firewall, or an interface the hosts "
                "do not share; set network_interface.",
                blames_another=True,
            )
        if ("Connect timeout" in line or "Connection refused" in line) and (
            address := re.search(r"\[([\d.:a-fA-F]+)\]", line)
        ):
            why = "refused" if "refused" in line else "timed out"
            return Failure(
                f"worker rank {rank}{_on(status, int(rank))} could not connect to a peer at "
                f"{address[1]} (connection {why}): a firewall between the hosts, or an "
                "interface they do not share; set network_interface.",
                blames_another=True,
            )
    return None


def _first_exit(status: dict, tail: str, said: str) -> Failure:
    first = re.findall(r"Process name: (\d+)\s+Exit code: (-?\d+)", tail)
    srun = re.search(r"srun: error: (\S+): task (\d+): (.+)", tail)
    if srun and not first:
        host, rank, what = srun.group(1), int(srun.group(2)), srun.group(3).strip()
        reason = f"worker rank {rank} on {host}: {what.lower()} (srun); {said}"
        return Failure(reason, blames_another=rank != 0)  # rank 0's own error is training's
    if not first:
        return Failure(said)
    rank, exit_code = int(first[-1][0]), int(first[-1][1])
    how = _how(exit_code)  # killed: nothing of its own to fix, so resume
    then = f"; {RESUME}." if how else ";"
    return Failure(
        f"worker rank {rank}{_on(status, rank)} exited with code {exit_code}{how}{then} {said}",
        blames_another=rank != 0,
    )


def _workers(status: dict) -> list[dict]:
    """The worker processes the status records (those with a rank)."""
    return [e for e in status.get("processes", []) if "rank" in e]


def _on(status: dict, rank: int) -> str:
    """`` on HOST`` for worker ``rank`` where the status records it."""
    hosts = [e["host"] for e in _workers(status) if e["rank"] == rank]
    return f" on {hosts[0]}" if hosts else ""


def _how(exit_code: int) -> str:
    """What a worker's exit code says: a signal (negative: horovodrun's own child; above 128: a
    shell's), or ssh's 255 for a remote process killed by a signal or a lost connection."""
    if exit_code == 255:
        return " (ssh's code: killed by a signal on that host, or the connection was lost)"
    signum = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else None
    try:
        name = signal.Signals(signum).name if signum else None
    except ValueError:
        return ""
    if name == "SIGKILL":
        return " (killed by SIGKILL: the kernel's out-of-memory killer, or by hand)"
    return f" (killed by {name})" if name else ""
