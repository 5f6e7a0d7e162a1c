"""Partial synchronisation and local SGD: each worker updates its own parameters from its own
gradient every step, and parameters are averaged over the workers only now and then.

- ``partial`` (SINGA's ``DistOpt.backward_and_partial_update``): the parameters are cut, in
  variable order, into partitions of at most the fusion threshold's bytes
  (:func:`toolkit.parallel.compression.fusion_buckets`); every ``period`` updates (SINGA: every
  update) the next partition is averaged, cycling through them.
- ``local_sgd`` (Lin et al., ICLR 2020, "Don't use large mini-batches, use local SGD"): every
  ``period`` updates (their H) all parameters are averaged: the same mechanism with one
  partition.

No gradient is allreduced, and optimizer state (momentum buffers) is never averaged. Which
partition is due follows ``optimizer.iterations`` (the updates done), which checkpoints hold,
so a resumed run continues the cycle. Between two averagings the workers' parameters differ; a
checkpoint holds rank 0's, and a resume starts every worker from them.
"""

from __future__ import annotations

from collections.abc import Callable

from keras import ops

from toolkit import backends
from toolkit.parallel.compression import Traffic, fusion_buckets, nbytes
from toolkit.sections import SYNC_MODES


class ParameterAveraging:
    """Averages partitions of a model's parameters over the workers after updates (see the
    module doc). ``allreduce_mean`` averages a list of tensors over the workers (Horovod's
    ``grouped_allreduce`` with ``op=Average``, the backend's). Traced into the step on
    TensorFlow, run eagerly on PyTorch: the backend decides
    (:meth:`~toolkit.backends.base.Backend.when`)."""

    def __init__(
        self,
        allreduce_mean: Callable[[list], list],
        mode: str,
        *,
        period: int = 1,
        fusion_threshold_bytes: int = 64 * 2**20,
        traffic: Traffic | None = None,
    ):
        if mode not in SYNC_MODES[1:]:
            raise ValueError(
                f"parameter averaging mode must be one of {SYNC_MODES[1:]}, got {mode!r}"
            )
        if int(period) != period or period < 1:
            raise ValueError(f"period must be an integer >= 1, got {period!r}")
        self.allreduce_mean, self.mode, self.period = allreduce_mean, mode, int(period)
        self.fusion_threshold_bytes, self.traffic = fusion_threshold_bytes, traffic
        self._backend = backends.current()

    def partitions(self, variables: list) -> list[list[int]]:
        """Indices of ``variables`` averaged together, in the order they take turns."""
        if self.mode == "local_sgd":
            return [list(range(len(variables)))]
        sizes = [nbytes([v.value]) for v in variables]
        return fusion_buckets(sizes, self.fusion_threshold_bytes)

    def after_update(self, updates, variables: list) -> None:
        """Call on every worker after each update, with the number of updates done so far
        (``optimizer.iterations``): averages the partition due, if one is. Partition ``p`` is
        due after update ``n`` when ``n`` is a multiple of the period and
        ``(n / period - 1) mod partitions == p``."""
        parts = self.partitions(variables)
        if self.traffic is not None:
            self.traffic.count_dense([v.value for v in variables])
        updates = ops.cast(updates, "int64")
        turn = (updates // self.period - 1) % len(parts)

        def average(part: list[int]) -> Callable[[], None]:
            def run() -> None:
                values = [variables[i].value for i in part]
                if self.traffic is not None:
                    self.traffic.add(nbytes(values))
                means = self.allreduce_mean(values)
                for i, mean in zip(part, means, strict=True):
                    variables[i].assign(mean)

            return run

        due = ops.equal(updates % self.period, 0)
        for p, part in enumerate(parts):
            self._backend.when(ops.logical_and(due, ops.equal(turn, p)), average(part))
