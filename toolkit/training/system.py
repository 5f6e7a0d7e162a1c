"""What a worker's machine is doing, sampled at a low rate (as W&B's system metrics): the
worker process's CPU use and memory, its host's memory use, where it has a GPU the memory
TensorFlow holds on it, and where it sends gradients the bytes it sent per update.
:class:`toolkit.training.callbacks.SystemLogger` gathers one sample from every worker and rank 0
logs them as a ``system`` event, one column per metric and rank (``cpu_percent/rank1``), which the
dashboard and the notebooks' live view draw per worker."""

from __future__ import annotations

import numpy as np
import psutil

METRICS = (
    "cpu_percent",
    "memory_gb",
    "host_memory_percent",
    "gpu_memory_gb",
    "bytes_sent_per_update",
)
"""A sample's fields, in order: the process's CPU use since the previous sample (100 per busy
core), its resident memory, its host's memory in use, TensorFlow's memory on its GPU (absent
without one), and the bytes the worker sent per update since its previous sample (absent
where it sends none, or at its first sample)."""


class Sampler:
    """Samples this process; the first CPU reading counts from the sampler's creation."""

    def __init__(self):
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # starts the CPU clock

    def sample(self, bytes_sent_per_update: float = np.nan) -> np.ndarray:
        """One sample: :data:`METRICS` in order (``gpu_memory_gb`` is NaN without a GPU; the
        bytes are the caller's to count)."""
        gpu = _gpu_memory_gb()
        return np.array(
            [
                self.process.cpu_percent(None),
                self.process.memory_info().rss / 1e9,
                psutil.virtual_memory().percent,
                np.nan if gpu is None else gpu,
                bytes_sent_per_update,
            ]
        )


def _gpu_memory_gb() -> float | None:
    import tensorflow as tf  # loaded already by a training process

    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return None
    return tf.config.experimental.get_memory_info(gpus[0].name)["current"] / 1e9


def event_columns(samples: np.ndarray) -> dict[str, float]:
    """Every worker's sample (a row each, in rank order) as event columns ``<metric>/rank<r>``,
    leaving out what a worker could not measure (a GPU's memory on a CPU)."""
    return {
        f"{metric}/rank{rank}": float(value)
        for rank, sample in enumerate(samples)
        for metric, value in zip(METRICS, sample, strict=True)
        if np.isfinite(value)
    }
