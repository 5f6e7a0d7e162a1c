"""Several workers on Keras's JAX backend, through JAX's own engine.

Horovod's gradient allreduce is TensorFlow's. On JAX the processes that horovodrun (or srun)
starts become one JAX program instead:

* ``jax.distributed.initialize`` joins them, its coordinator on rank 0 at an address rank 0
  picks and hands the others (Horovod's broadcast of a string: every launcher the lab has
  already gives Horovod its ranks, locally, over ssh and under Slurm);
* JAX's Gloo collectives carry them on CPUs (NCCL on GPUs);
* Keras's ``DataParallel`` over every process's devices makes the compiled step's batch the
  workers' own batches side by side (each worker still reads its own shard);
* :func:`per_worker` maps the train step over the workers (``jax.shard_map``): each runs it
  on its own batch, so its gradient is its own, as on TensorFlow and PyTorch, until the
  optimizer's allreduce hook (:mod:`toolkit.parallel.distributed`) averages it with
  :func:`mean` (or gathers an encoding with :func:`gather`), JAX's collectives compiled into
  the step. The update is then the same on every worker; what stays a worker's own (its
  loss and metrics, batch norm's statistics, a traffic counter) stays so, as on the others.

Evaluation stays one program over the global batch. Horovod still carries the run's small
collectives (the workers' records, the checkpoint's gathers, metric averages).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


KEPT_COMPILE_S = 0.2
"""Programs that take longer than this to compile are kept: the train and test steps, not the
small programs whose reading back would cost what compiling them does."""
KEPT_BYTES = 2**30
"""The most the kept programs may weigh; the least recently used go first. A limit also makes
JAX lock the folder around each read and write (``filelock``), so a worker never reads a
program another worker is still writing."""


def keep_compiled(folder: Path) -> None:
    """Keep compiled programs in ``folder`` (JAX's persistent compilation cache), unless one
    was named (``JAX_COMPILATION_CACHE_DIR``): a run whose steps an earlier run compiled reads
    them back (on 2 CPU cores, a 1-epoch quickstart of 2 workers: about 2 s of its 13 s)."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", KEPT_COMPILE_S)
        jax.config.update("jax_compilation_cache_max_size", KEPT_BYTES)


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


def per_worker(model: Any) -> None:
    """Map ``model``'s train step over the workers (:func:`each_worker`). Idempotent."""
    if not getattr(model.train_step, "per_worker", False):
        model.train_step = each_worker(model.train_step)
        model.make_train_function(force=True)


def each_worker(step: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``step(state, data)`` run by every worker (:func:`start` first) on its own block of
    ``data`` (global arrays whose first axis is the workers' blocks side by side, as Keras
    makes a batch), compiled, its collectives :func:`mean` and :func:`gather`. What it returns
    is the same on every worker where its collectives make it so (the model's and optimizer's
    variables), each worker's own elsewhere (metrics, batch norm's statistics)."""
    import jax
    import keras
    from jax.sharding import PartitionSpec

    distribution = keras.distribution.distribution()
    mapped = jax.jit(  # compiled even where Keras would not (jit_compile=False): traced
        jax.shard_map(  # again at every call, a mapped step costs seconds
            step,
            mesh=distribution.device_mesh.backend_mesh,
            in_specs=(PartitionSpec(), PartitionSpec(distribution.batch_dim_name)),
            out_specs=PartitionSpec(),
            check_vma=False,  # a worker's own state is returned as it is, not checked equal
        )
    )

    @functools.wraps(step)
    def on_each_worker(state, data):
        return mapped(state, data)

    on_each_worker.per_worker = True
    return on_each_worker


def side_by_side(local: Any) -> Any:
    """This worker's array as its block of a global array whose first axis holds every
    worker's, in rank order (what :func:`each_worker`'s ``data`` takes)."""
    import jax
    import keras

    distribution = keras.distribution.distribution()
    sharding = jax.sharding.NamedSharding(
        distribution.device_mesh.backend_mesh,
        jax.sharding.PartitionSpec(distribution.batch_dim_name),
    )
    return jax.make_array_from_process_local_data(sharding, local)


def own(value: Any, sharding: Any) -> Any:
    """A global array of ``sharding`` whose every device on this worker holds ``value``, this
    worker's own, unchecked against the other workers' (unlike ``jax.device_put``)."""
    import jax
    import numpy as np

    value = np.asarray(value)
    local = [jax.device_put(value, device) for device in sharding.addressable_devices]
    return jax.make_array_from_single_device_arrays(value.shape, sharding, local)


def _axis() -> str:
    """The mesh axis the workers lie along (Keras's data-parallel batch axis)."""
    import keras

    return keras.distribution.distribution().batch_dim_name


def mean(tensors: list) -> list:
    """The workers' mean of each of ``tensors``, inside :func:`per_worker`'s step."""
    import jax

    return jax.lax.pmean(list(tensors), _axis())


def gather(tensors: list) -> list:
    """Each of ``tensors`` concatenated over the workers along its first axis, in rank order,
    inside :func:`per_worker`'s step."""
    import jax

    return [jax.lax.all_gather(t, _axis(), tiled=True) for t in tensors]


def minimum(tensor: Any) -> Any:
    """The workers' minimum of ``tensor``, inside :func:`per_worker`'s step."""
    import jax

    return jax.lax.pmin(tensor, _axis())
