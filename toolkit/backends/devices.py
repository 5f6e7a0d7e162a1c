"""Which of its host's devices a worker takes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")
_log = logging.getLogger(__name__)


def gpu_for_worker(local_rank: int, local_size: int, gpus: Sequence[T]) -> T | None:
    """The GPU a worker uses: the one its local rank names, ``None`` without GPUs.

    A process that sees one GPU keeps it, whatever its local rank: a scheduler that binds one
    GPU to each process (Slurm's ``--gpus-per-task``) leaves each worker exactly that one. More
    workers on a host than the GPUs they see share them round-robin, with a warning: NCCL
    refuses two ranks on one GPU, so it only suits collectives that do not use it.
    """
    if not gpus:
        return None
    if local_size > len(gpus) > 1:
        _log.warning(
            "%d workers on this host share its %d GPUs; NCCL refuses two ranks on one GPU, so "
            "start one worker per GPU (the launch queue's capacity is the GPU count)",
            local_size,
            len(gpus),
        )
    return gpus[local_rank % len(gpus)]


def pin_tensorflow_gpu(local_rank: int, local_size: int) -> None:
    """Let TensorFlow see only the GPU a worker's local rank names, growing its memory as
    needed, where there are GPUs. Call it before TensorFlow touches a GPU: once it has
    initialised them the pinning cannot change and is skipped with a warning."""
    import tensorflow as tf

    gpu = gpu_for_worker(local_rank, local_size, tf.config.list_physical_devices("GPU"))
    if gpu is None:
        return
    try:
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
    except RuntimeError as error:  # TensorFlow already initialised its GPUs
        _log.warning("GPU not pinned to local rank: %s", error)
