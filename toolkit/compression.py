"""What the allreduce puts on the wire, beyond plain float32 (SINGA's ``DistOpt`` modes).

- :class:`Float16`: gradients cast to float16 for the allreduce and back. A finite value beyond
  ``clip`` is clipped to it *before* the cast, as SINGA's
  ``backward_and_update_half(clipping=True)`` does, so an overflow never reaches the wire as
  ``inf``; a gradient that is already ``inf`` or ``NaN`` stays so (a divergence stays visible).
  Horovod sums the float16 values, so the default clip (in :mod:`toolkit.distributed`) is
  65504, float16's largest, over the number of workers.
- :class:`SparseAllreduce`: each worker sends only part of its gradient, as (values, indices),
  and the workers' parts are summed into a dense gradient and averaged. The gradients are
  flattened and fused in variable order into buckets of at most ``fusion_threshold_bytes``
  (a larger tensor is a bucket of its own), as SINGA fuses them; selection is per bucket:

  - ``topk``: the ``ceil(ratio * n)`` entries of largest magnitude (at least one). A full
    top-k over millions of entries costs more than a dense allreduce on one machine; with
    ``topk_sample=s`` (Deep Gradient Compression's sampling) the k-th largest magnitude is
    read off every ``round(1/s)``-th entry instead (deterministic, so resumes stay exact)
    and the entries at or above it are sent: about ``k`` of them;
  - ``threshold``: the entries with ``|g| >= threshold`` (a count that varies per worker and
    step).

  Indices are int32 (int64 for a bucket of 2**31 entries or more). Horovod's allreduce
  cannot add index sets that differ between workers, so (values, indices)
  travel by ``grouped_allgather`` (two calls: one for the values, one for the indices), as
  Horovod itself carries ``IndexedSlices``.
  With ``residual=True`` (SINGA's ``corr``, the error feedback of Deep Gradient Compression)
  each worker keeps what it did not send and adds it to its next gradient before selecting;
  with ``False`` it is dropped. The residual is training state, and per worker:
  :meth:`SparseAllreduce.state` and :meth:`SparseAllreduce.restore` carry it through a
  checkpoint (training gathers every worker's into it), and :func:`reshard_residuals` deals
  the workers' residuals out to another number of workers (a resume on another world, an
  elastic reset).

:class:`Traffic` counts the bytes a worker sends, against the dense float32 allreduce of the
same gradients.

Keras's ``clipnorm``/``clipvalue`` act after all of this, on the reduced gradient (see
:mod:`toolkit.distributed`); :class:`Float16`'s clip acts on each worker's gradient before the
cast.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

FLOAT16_MAX = float(np.finfo(np.float16).max)
SPARSE = ("topk", "threshold")
Residuals = list[list[np.ndarray]]  # per worker, in rank order: that worker's, per gradient


class Traffic:
    """The bytes one worker sent to average gradients or parameters, counted in the training
    graph: ``sent`` (a float64 variable, cumulative since the process started) and
    ``dense_bytes``, what one dense float32 allreduce of every gradient sends (known once the
    step has been traced). For the sparse modes, ``sent`` is the mean over the workers (the
    threshold's count varies per worker); values and indices both count."""

    def __init__(self):
        self.sent = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.dense_bytes: int | None = None

    def add(self, nbytes) -> None:
        self.sent.assign_add(tf.cast(nbytes, tf.float64))

    def count_dense(self, tensors: list) -> None:
        """Record ``dense_bytes`` from the gradients (or parameters) being averaged."""
        self.dense_bytes = sum(t.shape.num_elements() * 4 for t in tensors)


def nbytes(tensors: list) -> int:
    """Bytes of ``tensors`` as they are (static shapes)."""
    return sum(t.shape.num_elements() * t.dtype.size for t in tensors)


def fusion_buckets(sizes: list[int], threshold: int) -> list[list[int]]:
    """Indices of consecutive tensors of ``sizes`` bytes fused together, in order: a bucket
    takes tensors while its bytes stay within ``threshold`` (a larger tensor is a bucket of its
    own). SINGA's fusion, and its partial synchronisation's partitions."""
    groups, current, size = [], [], 0
    for i, n in enumerate(sizes):
        if current and size + n > threshold:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    return groups + [current] if current else groups


class Float16:
    """A Horovod compressor (``compress``/``decompress``) that casts to float16 after clipping
    finite values to ``[-clip, clip]``."""

    def __init__(self, clip: float = FLOAT16_MAX):
        if not 0 < clip <= FLOAT16_MAX:
            raise ValueError(f"fp16 clip must be in (0, {FLOAT16_MAX:g}], got {clip!r}")
        self.clip = clip

    def compress(self, tensor: tf.Tensor) -> tuple[tf.Tensor, tf.DType]:
        if not tensor.dtype.is_floating:
            return tensor, tensor.dtype
        clipped = tf.clip_by_value(tensor, -self.clip, self.clip)
        kept = tf.where(tf.math.is_finite(tensor), clipped, tensor)
        return tf.cast(kept, tf.float16), tensor.dtype

    def decompress(self, tensor: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        return tf.cast(tensor, dtype) if dtype.is_floating else tensor


class SparseAllreduce:
    """Average gradients over ``workers`` workers by sending each worker's selected entries
    only (see the module doc). ``allgather`` concatenates a list of tensors over the workers
    (Horovod's ``grouped_allgather``; with one worker, the identity). ``workers`` is a number,
    or a function that gives it as the step runs (Horovod's ``size_op``, in an elastic run
    whose workers come and go). Call it with this worker's gradients, in the same order every
    step. The residuals are created on the first call."""

    def __init__(
        self,
        allgather: Callable[[list[tf.Tensor]], list[tf.Tensor]],
        workers: int | Callable[[], tf.Tensor],
        mode: str,
        *,
        ratio: float = 0.01,
        topk_sample: float = 0.0,
        threshold: float = 1e-3,
        residual: bool = True,
        fusion_threshold_bytes: int = 64 * 2**20,
        traffic: Traffic | None = None,
    ):
        if mode not in SPARSE:
            raise ValueError(f"sparse mode must be one of {SPARSE}, got {mode!r}")
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        if not 0 <= topk_sample < 1:
            raise ValueError(f"topk_sample must be in [0, 1), got {topk_sample!r}")
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        if fusion_threshold_bytes < 1:
            raise ValueError(f"fusion threshold must be >= 1 byte, got {fusion_threshold_bytes}")
        self.allgather, self.workers = allgather, workers
        self.mode, self.ratio, self.threshold = mode, ratio, threshold
        self.stride = round(1 / topk_sample) if topk_sample else 1
        self.fusion_threshold_bytes = fusion_threshold_bytes
        self.residual, self.traffic = residual, traffic
        self.residuals: list[tf.Variable] | None = None
        self._restored: list[np.ndarray] | None = None

    def __call__(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        if self.residual and self.residuals is None:
            start = self._restored or [np.zeros(g.shape, g.dtype.as_numpy_dtype) for g in grads]
            if [tuple(a.shape) for a in start] != [tuple(g.shape) for g in grads]:
                raise ValueError("the restored residuals do not match the gradients' shapes")
            with tf.init_scope():  # created once, outside the traced step
                self.residuals = [tf.Variable(a, trainable=False) for a in start]
        groups = fusion_buckets([nbytes([g]) for g in grads], self.fusion_threshold_bytes)
        largest = max(sum(grads[i].shape.num_elements() for i in group) for group in groups)
        index_dtype = tf.int32 if largest < 2**31 else tf.int64  # one dtype: one allgather
        flats, sent, positions = [], [], []
        for group in groups:
            flat = tf.concat([tf.reshape(grads[i], [-1]) for i in group], 0)
            if self.residual:
                flat += tf.concat([tf.reshape(self.residuals[i], [-1]) for i in group], 0)
            index = tf.cast(self._select(flat), index_dtype)
            values = tf.gather(flat, index)
            if self.residual:
                left = tf.tensor_scatter_nd_update(flat, index[:, None], tf.zeros_like(values))
                self._keep(group, left)
            flats.append(flat)
            sent.append(values)
            positions.append(index)
        all_sent = self.allgather(sent)  # one call per dtype: a group shares one
        all_positions = self.allgather(positions)
        workers = self.workers() if callable(self.workers) else self.workers
        if self.traffic is not None:
            self.traffic.count_dense(grads)
            entries = tf.add_n([tf.size(v, tf.int64) for v in all_sent])
            per_entry = grads[0].dtype.size + index_dtype.size  # a value and its index
            self.traffic.add(
                tf.cast(entries * per_entry, tf.float64) / tf.cast(workers, tf.float64)
            )
        reduced = []
        for group, flat, values, index in zip(groups, flats, all_sent, all_positions, strict=True):
            total = tf.math.unsorted_segment_sum(values, index, tf.size(flat, index_dtype))
            mean = total / tf.cast(workers, total.dtype)
            sizes = [grads[i].shape.num_elements() for i in group]
            for i, part in zip(group, tf.split(mean, sizes), strict=True):
                reduced.append(tf.reshape(part, grads[i].shape))
        return reduced

    def state(self) -> list[np.ndarray]:
        """This worker's residuals, in gradient order (none before the first step)."""
        return [v.numpy() for v in self.residuals or []]

    def restore(self, residuals: list[np.ndarray]) -> None:
        """Continue from ``residuals`` (a :meth:`state`), now or at the first step."""
        if self.residuals is None:
            self._restored = [np.asarray(a) for a in residuals] or None
            return
        for variable, value in zip(self.residuals, residuals, strict=True):
            variable.assign(value)

    def _select(self, flat: tf.Tensor) -> tf.Tensor:
        """The positions of ``flat`` this worker sends."""
        magnitude = tf.abs(flat)
        if self.mode == "threshold":
            return tf.where(magnitude >= self.threshold)[:, 0]
        if self.stride > 1 and flat.shape.num_elements() >= self.stride:
            sample = magnitude[:: self.stride]
            k = max(1, math.ceil(self.ratio * sample.shape.num_elements()))
            kth = tf.math.top_k(sample, k, sorted=True).values[-1]
            return tf.where(magnitude >= kth)[:, 0]
        k = max(1, math.ceil(self.ratio * flat.shape.num_elements()))
        return tf.math.top_k(magnitude, k, sorted=False).indices

    def _keep(self, group: list[int], left: tf.Tensor) -> None:
        sizes = [self.residuals[i].shape.num_elements() for i in group]
        for i, part in zip(group, tf.split(left, sizes), strict=True):
            self.residuals[i].assign(tf.reshape(part, self.residuals[i].shape))


def reshard_residuals(residuals: Residuals, world: int) -> Residuals:
    """Deal the committed residuals of ``len(residuals)`` workers out to ``world`` workers.

    The same number of workers: rank ``r`` takes row ``r``. Another number: every worker takes
    their mean. The rule keeps what the residuals are for exact: the update still owed to the
    model is the average of the residuals over the workers (what the allreduce would deliver if
    each sent its whole residual), and ``world`` copies of the mean have the same average. A
    departed worker's residual is therefore not lost but shared. Rows left empty (no step taken
    yet) stay empty."""
    if len(residuals) == world:
        return [list(row) for row in residuals]
    if not residuals or not residuals[0]:
        return [[] for _ in range(world)]
    mean = [
        np.mean(arrays, axis=0, dtype=np.float64).astype(arrays[0].dtype)
        for arrays in zip(*residuals, strict=True)
    ]
    return [[a.copy() for a in mean] for _ in range(world)]
