"""Several workers on Keras's JAX backend, through JAX's own engine.

Horovod's gradient allreduce is TensorFlow's. On JAX the processes that horovodrun (or srun)
starts become one JAX program instead:

* ``jax.distributed.initialize`` joins them, its coordinator on rank 0 at an address rank 0
  picks and hands the others (Horovod's broadcast of a string: every launcher the lab has
  already gives Horovod its ranks, locally, over ssh and under Slurm);
* JAX's Gloo collectives carry them on CPUs (NCCL on GPUs);
* Keras's ``DataParallel`` over every process's devices makes the compiled step's batch the
  workers' own batches side by side (each worker still reads its own shard), so the loss and
  its gradient are means over the global batch, as Horovod's averaged allreduce makes them on
  TensorFlow, and the optimizer, replicated on every worker, applies the same update
  everywhere: trust ratios and all, from the global gradient.

Horovod still carries the run's small collectives (the workers' records, the checkpoint's
gathers, metric averages), none of them a gradient.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator

_log = logging.getLogger(__name__)


def coordinator_address() -> str:
    """``host:port`` for JAX's coordinator on this host (rank 0's): the host as the launcher
    named it (``HOROVOD_HOSTNAME``, which the other hosts reach it by), a port free now."""
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    if host == "localhost":
        host = "127.0.0.1"
    with socket.socket() as probe:
        probe.bind(("", 0))
        return f"{host}:{probe.getsockname()[1]}"


_joined = False


def joined() -> bool:
    """Whether this process joined other workers through :func:`start`."""
    return _joined


def start(rank: int, size: int, broadcast: Callable[[object], object]) -> None:
    """Join this process, worker ``rank`` of ``size``, to the others as one JAX program, and
    make Keras's distribution data parallel over all their devices. ``broadcast(value)``
    returns rank 0's ``value`` on every worker. Call it before JAX computes anything."""
    import jax
    import keras

    address = broadcast(coordinator_address() if rank == 0 else None)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # its preemption notifier takes SIGTERM, which is how a run is stopped (and Slurm's
    # requeue is the lab's own: toolkit.training.requeue)
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(address, num_processes=size, process_id=rank)
    global _joined
    _joined = True
    devices = jax.devices()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    )
    _log.info("worker %d of %d joined JAX's engine at %s: %s", rank, size, address, devices)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Run what one worker does by itself (rank 0 writing a checkpoint) outside the workers'
    distribution: under it, a variable Keras makes (the throwaway optimizer ``save_weights``
    builds) is put on every worker's devices, a collective the others are not in. (Assigning
    to the run's own variables is collective whatever the distribution, so a checkpoint is
    read by every worker.)"""
    import keras

    shared = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(shared)
