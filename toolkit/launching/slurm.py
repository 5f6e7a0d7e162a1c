"""Slurm as the engine beyond one machine: a run submitted as a Slurm job, and ended with it.

A run whose config has a ``slurm`` section (``launch --slurm``, or the section written out) is
not queued on this machine: :func:`submit` writes its job script into the run directory
(``job.sbatch``: readable, and runnable by hand with ``sbatch``), submits it with ``sbatch``
and records the job id (``status.json``: ``slurm_job_id``). Slurm's queue is the run's queue:
while the job is pending the run reads ``queued`` with Slurm's reason
(:mod:`toolkit.runs.slurm_jobs`).

The job script asks for ``workers`` tasks (one rank each) and runs
:mod:`toolkit.launching.slurm_job` on the job's first node, which plays the supervisor's part:
it starts Horovod's Gloo rendezvous there and one rank per task with ``srun``, so every rank
runs inside a Slurm job step on its node and ``scancel`` (which :func:`cancel` calls for
``stop``) ends every rank on every node. horovodrun's ssh workers would run outside the job,
beyond ``scancel``'s reach unless the site adopts ssh sessions into jobs (``pam_slurm_adopt``).

``signal_before_end_s`` before the time limit, Slurm signals the job (``--signal=B:USR1``): the
ranks checkpoint at the next step they agree on and the job requeues itself, to resume from
that checkpoint when Slurm starts it again. The job is submitted ``--no-requeue`` and requeued
only by itself, so that a job that fails (a node lost) leaves the run failed with Slurm's words,
to be resumed by the user, rather than waiting silently for the node to come back.

:func:`preflight` checks, before anything is created or submitted, that Slurm answers, the
partition exists and the nodes and GPUs asked for fit it, and that the runs root is visible
from the nodes; each problem is a :class:`~toolkit.config.ConfigError` (the CLI's exit 2).
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from toolkit import backends
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.files import writing
from toolkit.launching.remote import PACKAGE_ROOT
from toolkit.runs import slurm_jobs
from toolkit.runs.rundir import RunDir

JOB_SCRIPT = "job.sbatch"
TIMEOUT_S = 30.0
KILL_MARGIN_S = 60
"""How much longer than a local stop's timeout ``stop`` waits for a cancelled job to end: Slurm
sends SIGKILL ``KillWait`` seconds after SIGTERM (30 by default)."""
IMMEDIATE_S = 10
"""How long pre-flight waits for a node to look at the runs root from."""


def job_shape(config: ExperimentConfig) -> list[str]:
    """The ``sbatch`` options that size and place ``config``'s job (what a sweep's cells must
    share to be one job array)."""
    slurm = config.slurm
    options = {
        "ntasks": config.workers,
        "nodes": slurm.nodes,
        "partition": slurm.partition,
        "account": slurm.account,
        "time": slurm.time,
        "gpus-per-task": slurm.gpus_per_task,
        "signal": f"B:USR1@{slurm.signal_before_end_s}",
    }
    given = [f"--{key}={value}" for key, value in options.items() if value is not None]
    return [*given, "--no-requeue", *slurm.sbatch_args]


def job_script(config: ExperimentConfig, run: RunDir) -> str:
    """The batch script of ``run``: Slurm's options, then the job's one command."""
    return _script(
        [
            f"--job-name=lbl-{run.run_id}",
            f"--output={run.stdout_path.resolve()}",
            *job_shape(config),
        ],
        [
            f"# Large-Batch Lab run {run.run_id}: submitted with `sbatch {JOB_SCRIPT}`; runnable",
            "# by hand the same way (it resumes from the run's latest checkpoint, if it has one).",
        ],
        [str(run.path.resolve())],
        backends.of_run(run.meta()),
    )


def _script(options: list[str], comment: list[str], driver_args: list[str], backend: str) -> str:
    driver = [sys.executable, "-m", "toolkit.launching.slurm_job", "drive", *driver_args]
    return "\n".join(
        [
            "#!/bin/bash",
            *comment,
            "#SBATCH --open-mode=append",
            f"#SBATCH --chdir={PACKAGE_ROOT}",
            *(f"#SBATCH {option}" for option in options),  # the user's sbatch_args last: they win
            "export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2",
            f"export KERAS_BACKEND={backend}",  # the run's: toolkit.backends.of_run
            f"export PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
            # the driver is the batch step itself: Slurm's signal reaches it, not a shell
            f"exec {shlex.join(driver)}",
            "",
        ]
    )


def submit(config: ExperimentConfig, run: RunDir) -> str:
    """Write ``run``'s job script and submit it; returns the job id. Raises :class:`OSError`
    with ``sbatch``'s words if Slurm refuses it."""
    script = run.path / JOB_SCRIPT
    with writing(script):
        script.write_text(job_script(config, run))
    return _sbatch(script)


def submit_array(
    runs: list[tuple[ExperimentConfig, RunDir]], script: Path, max_parallel: int | None
) -> list[str]:
    """Submit ``runs`` (configs of one :func:`job_shape`) as one job array, task ``i`` running
    ``runs[i]``, at most ``max_parallel`` at once; returns each run's job id (``ARRAY_i``).
    ``script`` is the array's batch script, written beside a list of the runs' directories
    (``.runs``); each run still gets its own ``job.sbatch``, to rerun it alone by hand. A
    task's output goes to its run's ``stdout.log`` (the driver sends it there)."""
    for config, run in runs:
        with writing(run.path / JOB_SCRIPT):
            (run.path / JOB_SCRIPT).write_text(job_script(config, run))
    listing = script.with_suffix(".runs")
    with writing(listing), writing(script):
        listing.write_text("".join(f"{run.path.resolve()}\n" for _, run in runs))
        limit = f"%{max_parallel}" if max_parallel else ""
        script.write_text(
            _script(
                [
                    f"--job-name=lbl-{script.stem}",
                    f"--output={script.with_suffix('')}-%A_%a.out",
                    f"--array=0-{len(runs) - 1}{limit}",
                    *job_shape(runs[0][0]),
                ],
                [
                    f"# Large-Batch Lab: {len(runs)} runs as one job array, task i running line",
                    f"# i + 1 of {listing.name} (each run's own job.sbatch reruns it alone).",
                ],
                ["--list", str(listing.resolve())],
                backends.of_run(runs[0][1].meta()),
            )
        )
    array = _sbatch(script)
    return [f"{array}_{index}" for index in range(len(runs))]


def _sbatch(script: Path) -> str:
    answer = _slurm(["sbatch", "--parsable", str(script.resolve())])
    if answer.returncode != 0:
        raise OSError(f"sbatch refused the job: {_said(answer)}")
    slurm_jobs.forget()
    return answer.stdout.strip().split(";")[0]


def cancel(job_id: str, timeout: float) -> str | None:
    """``scancel`` the job and wait up to ``timeout`` s for it to leave the running states;
    what went wrong, or ``None``."""
    answer = _slurm(["scancel", job_id])
    if answer.returncode != 0 and "Invalid job id" not in answer.stderr:
        return f"scancel {job_id}: {_said(answer)}"
    if not slurm_jobs.wait_ended(job_id, timeout):
        return f"Slurm job {job_id} still runs {timeout:.0f} s after scancel"
    return None


def requeue(job_id: str) -> None:
    """Put the job back in Slurm's queue (it was submitted ``--no-requeue``: allow it first)."""
    for argv in (
        ["scontrol", "update", f"JobId={job_id}", "Requeue=1"],
        ["scontrol", "requeue", job_id],
    ):
        answer = _slurm(argv)
        if answer.returncode != 0:
            raise OSError(f"{' '.join(argv)}: {_said(answer)}")


# --- pre-flight ------------------------------------------------------------------------------


def preflight(config: ExperimentConfig, runs_root: Path) -> None:
    """Refuse, with one line naming the problem, a Slurm run that cannot start: Slurm does not
    answer, the partition does not exist, the nodes or GPUs asked for do not fit it, or the runs
    root is not seen from its nodes (a run directory must be on a file system they share)."""
    slurm = config.slurm
    partitions = partitions_here()
    default = next((n for n, p in partitions.items() if p[2]), None)
    name = slurm.partition or default
    if name not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        raise ConfigError(
            f"slurm.partition={slurm.partition!r}: no such partition (Slurm has: {known})"
            if slurm.partition
            else "slurm.partition: Slurm has no default partition; name one"
        )
    nodes, gpus_per_node, _ = partitions[name]
    if slurm.nodes is not None and slurm.nodes > nodes:
        raise ConfigError(f"slurm.nodes={slurm.nodes}: partition {name!r} has {nodes} node(s)")
    if slurm.gpus_per_task and slurm.gpus_per_task * config.workers > gpus_per_node * nodes:
        raise ConfigError(
            f"slurm.gpus_per_task={slurm.gpus_per_task} x workers={config.workers}: partition "
            f"{name!r} has {gpus_per_node} GPU(s) on each of its {nodes} node(s)"
        )
    _check_shared(runs_root, name, config)


def partitions_here() -> dict[str, tuple[int, int, bool]]:
    """Each partition Slurm reports (``sinfo``): its nodes, GPUs per node and whether it is the
    default. Raises :class:`~toolkit.config.ConfigError` when Slurm does not answer."""
    answer = _slurm(["sinfo", "-h", "-o", "%P|%D|%G|%c"])
    if answer.returncode != 0:
        raise ConfigError(f"slurm: Slurm does not answer (sinfo: {_said(answer)})")
    partitions = {}
    for line in answer.stdout.splitlines():
        name, nodes, gres, _ = line.split("|")
        partitions[name.rstrip("*")] = (int(nodes), _gpus(gres), name.endswith("*"))
    return partitions


def _gpus(gres: str) -> int:
    """The GPUs a node has by ``sinfo``'s generic resources (``gpu:a100:4(S:0-1),...``)."""
    found = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres)
    return int(found.group(1)) if found else 0


def _check_shared(runs_root: Path, partition: str, config: ExperimentConfig) -> None:
    """A file written into ``runs_root`` here is read on a node of ``partition``."""
    runs_root.mkdir(parents=True, exist_ok=True)
    name, token = f".slurm-probe-{secrets.token_hex(4)}", secrets.token_hex(8)
    probe = runs_root.resolve() / name
    probe.write_text(token)
    account = ["--account", config.slurm.account] if config.slurm.account else []
    try:
        where = ["--partition", partition, *account, "--ntasks=1", "--time=1"]
        answer = _slurm(
            ["srun", *where, f"--immediate={IMMEDIATE_S}", "--quiet", "cat", str(probe)],
            timeout=IMMEDIATE_S + TIMEOUT_S,
        )
    finally:
        probe.unlink(missing_ok=True)
    if "Unable to allocate resources" in answer.stderr:  # every node busy: cannot look now
        print(
            f"warning: slurm: every node of {partition!r} is busy, so whether they see the "
            f"runs root {runs_root.resolve()} was not checked",
            file=sys.stderr,
        )
        return
    if answer.returncode != 0 or answer.stdout.strip() != token:
        raise ConfigError(
            f"slurm: the runs root {runs_root.resolve()} is not visible from partition "
            f"{partition!r}'s nodes (read there: {_said(answer)}); put the runs on a file "
            "system the nodes share (--runs or $LBL_RUNS)"
        )


def _slurm(argv: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """A Slurm client command; a missing command or a timeout reads as a failed answer."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]} not found: is Slurm here?")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:.0f} s")


def _said(answer: subprocess.CompletedProcess) -> str:
    text = answer.stderr.strip() or answer.stdout.strip() or f"exit {answer.returncode}"
    return text.splitlines()[-1][:300]
