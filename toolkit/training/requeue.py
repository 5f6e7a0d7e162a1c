"""Checkpoint where training is when the scheduler is about to end its job, and requeue: the
whole protocol, in the order it runs.

1. **Who receives the signal.** Slurm sends ``SIGUSR1`` to a job's batch step, its driver
   (:mod:`toolkit.launching.slurm_job`), ``slurm.signal_before_end_s`` seconds before the time
   limit or a preemption. The driver passes it on to the ranks through ``srun``
   (:func:`pass_on`), again every :data:`RESIGNAL_S` seconds, since a rank still starting
   ignores it (each rank ignores it from its exec until it listens).
2. **Each rank listens** (:func:`listen`) from the first line of ``train`` where the driver
   asked for it (:data:`ENV`), so an early signal is noted rather than fatal.
3. **How the ranks agree.** The checkpointer asks :meth:`OnSignal.due` every ``event_every``
   steps where an update begins (an accumulation's first batch): one allreduce of whether any
   rank has seen the signal, so all of them stop at the same step.
4. **What is saved.** The checkpointer saves that step (in the middle of an epoch:
   ``epoch-NNNN-step-SSSSSSSSS``, :mod:`toolkit.runs.checkpoints`), with residuals and state as
   at an epoch's end; then :meth:`OnSignal.stop` records the step in the run's status (rank 0:
   ``requeue_step``), waits for every rank, and raises :class:`Requeue`, which ``train`` ends
   with exit code 0, so that ``srun`` ends no other rank as failed.
5. **Who requeues.** The driver, once ``srun`` has ended, finds ``requeue_step`` recorded
   (:func:`checkpointed`), marks the run queued and has Slurm requeue the job, which resumes
   from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

ENV = "LBL_CHECKPOINT_ON_USR1"
"""Set (to ``1``) by a Slurm job's driver for its ranks: step 2 on."""
RESIGNAL_S = 30.0

_signalled = threading.Event()


class Requeue(Exception):
    """Training checkpointed at ``step`` on the scheduler's signal and ends, so that its job
    requeues and resumes from there."""

    def __init__(self, step: int):
        super().__init__(
            f"checkpointed at step {step} on Slurm's signal ahead of the job's end; the job "
            "requeues to go on from there"
        )
        self.step = step


def pass_on(step: subprocess.Popen, signalled: threading.Event) -> int:
    """Step 1, the driver's: wait for ``step`` (srun) to end, sending it ``SIGUSR1`` once
    ``signalled`` is set and again every :data:`RESIGNAL_S` s; its exit code."""
    passed = -float("inf")
    while step.poll() is None:
        if signalled.is_set() and time.monotonic() - passed > RESIGNAL_S:
            step.send_signal(signal.SIGUSR1)
            passed = time.monotonic()
        time.sleep(0.5)
    return step.returncode


def asked() -> bool:
    """Whether this worker is a rank of a job whose driver passes the signal on."""
    return os.environ.get(ENV) == "1"


def listen() -> None:
    """Step 2: from now on a ``SIGUSR1`` to this process is noted (instead of ending it)."""
    signal.signal(signal.SIGUSR1, lambda *_: _signalled.set())


@dataclasses.dataclass(frozen=True)
class OnSignal:
    """Steps 3 and 4 for a checkpointer: it looks every ``look_every`` steps where
    ``starts_update`` says an update begins; ``record`` (rank 0's; ``None`` elsewhere) writes
    the step into the run's status."""

    look_every: int
    starts_update: Callable[[int], bool]
    record: Callable[[Requeue], None] | None

    def due(self, step: int) -> bool:
        """Whether every rank stops at ``step`` to checkpoint (a collective where it looks)."""
        if step % self.look_every or not self.starts_update(step):
            return False
        from toolkit.parallel.distributed import allreduce_mean

        return allreduce_mean(float(_signalled.is_set())) > 0

    def stop(self, step: int) -> None:
        """After ``step``'s checkpoint: record it, wait for every rank, raise :class:`Requeue`."""
        from toolkit.parallel.distributed import allreduce_mean

        requeue = Requeue(step)
        if self.record is not None:
            self.record(requeue)
        allreduce_mean(0.0)  # every rank waits for rank 0's checkpoint and record
        raise requeue


def checkpointed(status: dict) -> bool:
    """Step 5, the driver's: whether the ranks checkpointed on the signal (a step recorded)."""
    return status.get("requeue_step") is not None
