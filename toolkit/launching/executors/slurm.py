"""Slurm: a run is a batch job (:mod:`toolkit.launching.slurm` writes its script and submits
it; :mod:`toolkit.launching.slurm_job` is its supervisor inside the job), Slurm's queue is its
queue, ``scancel`` ends it, and a sweep's runs go as job arrays whose ``%max_parallel`` Slurm
enforces. The run's status keeps its job id (``slurm_job_id``), by which readers ask Slurm
its state (:mod:`toolkit.runs.slurm_jobs`); ``meta.json`` keeps every job id it has had.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.config import ExperimentConfig
from toolkit.launching import slurm
from toolkit.launching.executors.base import Cells, Executor
from toolkit.runs.rundir import RunDir, RunError
from toolkit.runs.states import State


class SlurmExecutor(Executor):
    """A run as a Slurm job, a sweep as job arrays (see the module's docstring)."""

    kind = "slurm"
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
