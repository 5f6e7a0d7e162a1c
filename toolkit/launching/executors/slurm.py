"""Slurm: a run is a batch job (:mod:`toolkit.launching.slurm` writes its script and submits
it; :mod:`toolkit.launching.slurm_job` is its supervisor inside the job), Slurm's queue is its
queue, ``scancel`` ends it, and a sweep's runs go as job arrays whose ``%max_parallel`` Slurm
enforces. The run's status keeps its job id (``slurm_job_id``), by which readers ask Slurm
its state (:mod:`toolkit.runs.slurm_jobs`); ``meta.json`` keeps every job id it has had.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from toolkit.config import MAX_WORKERS, ConfigError, ExperimentConfig
from toolkit.flags import integer
from toolkit.launching import slurm
from toolkit.launching.executors.base import Cells, Executor
from toolkit.launching.failures import RESUME, Failure
from toolkit.runs import slurm_jobs
from toolkit.runs.rundir import RunDir, RunError
from toolkit.runs.states import State


class SlurmExecutor(Executor):
    """A run as a Slurm job, a sweep as job arrays (see the module's docstring)."""

    kind = "slurm"
    title = "Slurm"
    section = "slurm"
    job_field = "slurm_job_id"
    launcher = "srun"
    queues_here = False
    starts_sweeps_at_once = True

    @classmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        return config.slurm is not None

    def check(self, config: ExperimentConfig, root: Path) -> None:
        slurm.preflight(config, root)

    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        return f"Slurm job {job}" if job else "Slurm"

    def start(self, run: RunDir, config: ExperimentConfig, resume: bool, meta: dict) -> None:
        """Submit ``run``'s job script (a resume too: the job goes on from the run's latest
        checkpoint, if it has one)."""
        self.queued(run, config, slurm_job_id=None)
        self._submitted(run, config, slurm.submit(config, run), meta)

    def start_all(self, cells: Cells, name: str, root: Path, max_parallel: int | None):
        """One job array per job shape (:func:`toolkit.launching.slurm.job_shape`), its script
        ``<root>/.sweeps/<name>-<k>.sbatch``. A shape that Slurm refuses leaves none of its runs
        behind (:class:`~toolkit.runs.rundir.RunError`)."""
        shapes: dict[tuple, Cells] = {}
        for cell in cells:
            shapes.setdefault(tuple(slurm.job_shape(cell[0])), []).append(cell)
        started = []
        for index, group in enumerate(shapes.values()):
            runs = [(config, RunDir.create(root, run_id, config)) for config, run_id, _ in group]
            try:
                for config, run in runs:
                    self.queued(run, config, slurm_job_id=None)
                script = root / ".sweeps" / f"{name}-{index}.sbatch"
                job_ids = slurm.submit_array(runs, script, max_parallel)
            except OSError as error:
                for _, run in runs:
                    shutil.rmtree(run.path, ignore_errors=True)
                raise RunError(f"cannot submit sweep {name}'s runs to Slurm: {error}") from None
            for (config, run), job_id, (_, _, meta) in zip(runs, job_ids, group, strict=True):
                self._submitted(run, config, job_id, meta)
                started.append(run)
        return started

    def end(self, run: RunDir, status: dict, timeout: float) -> list[str]:
        """``scancel``: Slurm ends every rank on every node."""
        problem = slurm.cancel(status["slurm_job_id"], timeout + slurm.KILL_MARGIN_S)
        return [problem] if problem else []

    def _submitted(self, run: RunDir, config: ExperimentConfig, job: str, meta: dict) -> None:
        script = (run.path / slurm.JOB_SCRIPT).resolve()
        said = f"submitted to Slurm as job {job} ({script})"
        run.set_status(State.QUEUED, slurm_job_id=job, where=self.where(config, job), reason=said)
        command = ["sbatch", str(script)]
        job_ids = [*run.meta().get("slurm_job_ids", []), job]
        self.record_launch(run, config, command, {**meta, "slurm_job_ids": job_ids})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """``--slurm`` and the fields of the config's ``slurm`` section (see
        :class:`toolkit.sections.SlurmConfig`)."""
        group = parser.add_argument_group("Slurm (toolkit.launching.slurm)")
        group.add_argument("--slurm", action="store_true", help="submit to Slurm: --np ranks")
        group.add_argument("--nodes", type=integer(1, MAX_WORKERS), help="Slurm: nodes")
        group.add_argument("--partition", help="Slurm: partition (default: the cluster's)")
        group.add_argument("--time", help="Slurm: time limit, e.g. 2:00:00 (requeued past it)")
        group.add_argument("--account", help="Slurm: account")
        group.add_argument("--gpus-per-task", type=integer(1, 64), help="Slurm: GPUs per rank")
        group.add_argument(
            "--sbatch-arg", action="append", default=[], help="Slurm: another sbatch option"
        )

    @classmethod
    def fields(cls, args: argparse.Namespace) -> dict | None:
        """The ``slurm`` fields the flags give (``None``: not a Slurm launch); a Slurm flag
        without ``--slurm`` is refused, naming it."""
        given = {field: getattr(args, flag) for flag, field in FLAGS.items()}
        given = {field: value for field, value in given.items() if value not in (None, [])}
        if given and not args.slurm:
            named = ", ".join(f"--{f.replace('_', '-')}" for f, v in FLAGS.items() if v in given)
            raise ValueError(f"{named} go with --slurm (a run submitted to Slurm)")
        return given if args.slurm else None

    @classmethod
    def flags(cls, fields: dict) -> list[str]:
        return _flags(fields)

    @staticmethod
    def live_state(status: dict) -> dict | None:
        return slurm_jobs.live_state(status)

    @staticmethod
    def failure(run: RunDir, status: dict, tail: str) -> Failure | None:
        """Slurm cancelled the job (``scancel``, its time limit, a node's failure)."""
        cancelled = re.search(
            r"\*\*\* JOB (\S+) ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z][A-Z ]*[A-Z]))?", tail
        )
        if not cancelled:
            return None
        node = re.search(r"srun: error: Node failure on (\S+)", tail)
        why = (cancelled.group(2) or "by scancel").lower() + (f" on {node[1]}" if node else "")
        return Failure(f"Slurm cancelled job {cancelled.group(1)}: {why}; {RESUME}.")


FLAGS = {  # the CLI's flag: the field of the config's slurm section it sets
    "nodes": "nodes",
    "partition": "partition",
    "time": "time",
    "account": "account",
    "gpus_per_task": "gpus_per_task",
    "sbatch_arg": "sbatch_args",
}


def _flags(slurm: dict) -> list[str]:
    said = ["--slurm"]
    for field, value in slurm.items():
        if field == "sbatch_args":
            said += [f"--sbatch-arg={arg}" for arg in value]
        elif field == "signal_before_end_s":
            raise ConfigError("slurm.signal_before_end_s is set in the base config only")
        else:
            said.append(f"--{field.replace('_', '-')}={value}")
    return said
