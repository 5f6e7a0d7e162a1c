"""What the allreduce puts on the wire, beyond plain float32 (SINGA's ``DistOpt`` modes, MXNet's
2-bit compression and Deep Gradient Compression's techniques).

- :class:`~toolkit.parallel.encodings.Float16`: gradients cast to float16 for the allreduce and
  back (what each codec does to a tensor is told in :mod:`toolkit.parallel.encodings`).
- :class:`CompressedAllreduce`: each worker sends an encoding of its gradient that Horovod
  cannot sum, so the encodings travel by ``grouped_allgather`` (one call per payload dtype, as
  Horovod itself carries ``IndexedSlices``) and every worker decodes and averages them. The
  gradients are flattened and fused in variable order into buckets of at most
  ``fusion_threshold_bytes`` (a larger tensor is a bucket of its own), as SINGA fuses them,
  and each bucket is encoded by a codec of :mod:`toolkit.parallel.encodings` (``topk``,
  ``threshold``, 2-bit).

  **Error feedback.** With ``residual=True`` (SINGA's ``corr``, MXNet's residual, DGC's
  accumulation) each worker keeps what it did not send, the encoding's error included, and
  adds it to its next gradient before encoding; with ``False`` it is dropped.

  **Deep Gradient Compression's techniques** (Lin et al., ICLR 2018, Algorithm 1), each a
  switch:

  - *momentum correction* (``momentum``): the optimizer's momentum moves here. Each worker
    keeps a velocity ``u = m * u + g`` and accumulates ``u``, not ``g``, into its residual;
    the optimizer then applies the averaged sent velocities without momentum;
  - *momentum factor masking* (``masking``): the velocity of every entry that was sent is
    cleared;
  - *local gradient clipping* (``local_clipnorm``): each worker clips its own gradient to the
    global norm ``local_clipnorm / sqrt(workers)`` before accumulating it;
  - *sparsity warm-up* (``Sparse(warmup_epochs=W)``, topk only): in epoch ``e < W`` the
    fraction sent is ``ratio ** ((e + 1) / (W + 1))``, then ``ratio`` (with ratio 0.001 and
    W = 4: 25%, 6.3%, 1.6%, 0.4%, then 0.1%, the paper's schedule).

  ``dense_1d``: variables of at most one dimension (biases, normalisation scales) skip the
  codec and are averaged dense (float32) in one ``grouped_allreduce``, as DGC's reference
  implementation does; they keep no residual, and their velocity is never masked.
  ``on_dense_norms``, if given, is called in the graph with each variable's dense gradient
  norm (of ``g``, after local clipping; not of the velocity), as ``sqrt`` of the workers' mean
  ``‖g‖²`` (one vector in the same allreduce): LARS's trust ratio under sparsity.

  **Fused kernels.** On a CPU with the toolkit's kernel library built (``codec_kernels.cc``,
  compiled by ``scripts/setup.sh``), a bucket is encoded in one pass over its gradients,
  velocities and residuals (momentum, residual add, selection, residual and mask update,
  values and indices or 2-bit words written straight out), and the gathered payloads are
  decoded in one pass into the averaged gradients, with the same float operations in the same
  order as the ``keras.ops`` written here (TensorFlow's ops on that backend), which stay the
  fallback and the tests' oracle (bit for bit). Exact top-k (no ``topk_sample``) keeps
  TensorFlow's ``top_k`` to choose its entries; its decode is fused.

  **Every backend.** The encoding, error feedback and DGC's techniques are written in
  ``keras.ops`` over Keras variables, so they run where the backend's allreduce hook sees each
  worker's gradient: traced into the step on TensorFlow, eagerly on PyTorch (where a threshold's
  varying count is an ordinary dynamic shape). The fused kernels are TensorFlow's.

  Residuals and velocities are training state, and per worker: :meth:`CompressedAllreduce.state`
  and :meth:`CompressedAllreduce.restore` carry them through a checkpoint (training gathers
  every worker's into it), and :func:`reshard_residuals` deals the workers' state out to another
  number of workers (a resume on another world, an elastic reset).

:class:`Traffic` counts the bytes a worker sends, against the dense float32 allreduce of the
same gradients.

Keras's ``clipnorm``/``clipvalue`` act after all of this, on the reduced gradient (see
:mod:`toolkit.parallel.distributed`); :class:`Float16`'s clip acts on each worker's gradient before
the cast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from toolkit import backends
from toolkit.optimizers import kernels
from toolkit.optimizers.schedules import value_at
from toolkit.parallel.encodings import (
    ENCODERS,
    FLOAT16_MAX,
    Codec,
    Float16,
    Sparse,
    TwoBit,
    elements,
    encoder,
    itemsize,
    nbytes,
    split,
)

__all__ = [  # the codecs are this module's too: what training and the tests build from
    "ENCODERS",
    "FLOAT16_MAX",
    "Codec",
    "CompressedAllreduce",
    "Float16",
    "Sparse",
    "Traffic",
    "TwoBit",
    "encoder",
    "fused_codecs",
    "fusion_buckets",
    "nbytes",
    "reshard_residuals",
]

Residuals = list[list[np.ndarray]]  # per worker, in rank order: that worker's state


def fused_codecs():
    """The fused codec kernels (``codec_kernels.cc`` in the toolkit's kernel library), or
    ``None`` where they do not run: another backend than TensorFlow, the library not built, or
    a GPU, where the gradients stay."""
    library = kernels.fused_ops()
    if library is None:
        return None
    import tensorflow as tf

    return None if tf.config.list_logical_devices("GPU") else library


class Traffic:
    """The bytes one worker sent to average gradients or parameters, counted in the training
    step: ``sent`` (a Keras variable in the backend's state dtype, cumulative since the process
    started) and ``dense_bytes``, what one dense float32 allreduce of every gradient sends
    (known once the step has run). It is this worker's own count (a threshold's varies per
    worker); for the encoded modes every payload tensor counts (values and indices, packed
    words)."""

    def __init__(self):
        dtype = backends.current().state_dtype()
        self.sent = keras.Variable(0.0, dtype=dtype, trainable=False, name="traffic_sent")
        self.dense_bytes: int | None = None

    def add(self, nbytes) -> None:
        self.sent.assign_add(ops.cast(nbytes, self.sent.dtype))

    def count_dense(self, tensors: list) -> None:
        """Record ``dense_bytes`` from the gradients (or parameters) being averaged."""
        self.dense_bytes = sum(elements(t) * 4 for t in tensors)


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


class CompressedAllreduce:
    """Average gradients over ``workers`` workers by sending each worker's encoding of them
    (``codec``), with error feedback and DGC's techniques (see the module doc).

    ``allgather`` concatenates a list of tensors over the workers (Horovod's
    ``grouped_allgather``), ``allreduce_mean`` averages one (``grouped_allreduce``); with one
    worker, both are the identity. ``workers`` is a number, or a function that gives it as the
    step runs (Horovod's ``size_op``, in an elastic run whose workers come and go). ``updates``
    is the number of updates done (the optimizer's ``iterations``), read by the sparsity
    warm-up and a ``momentum`` schedule. ``fused=False`` keeps to the TensorFlow ops where the
    fused kernels would run (the oracle they are checked against). Call it with this worker's
    gradients, in the same order every step; its state is created by :meth:`build`."""

    def __init__(
        self,
        codec: Codec,
        allgather: Callable[[list], list],
        allreduce_mean: Callable[[list], list],
        workers: int | Callable[[], Any],
        *,
        residual: bool = True,
        momentum=None,
        masking: bool = False,
        local_clipnorm: float | None = None,
        dense_1d: bool = False,
        updates: keras.Variable | None = None,
        fusion_threshold_bytes: int = 64 * 2**20,
        traffic: Traffic | None = None,
        on_dense_norms: Callable[[list], None] | None = None,
        fused: bool = True,
    ):
        if fusion_threshold_bytes < 1:
            raise ValueError(f"fusion threshold must be >= 1 byte, got {fusion_threshold_bytes}")
        if momentum is not None and not residual:
            raise ValueError("momentum correction accumulates the velocity: it needs residual")
        if masking and momentum is None:
            raise ValueError("momentum factor masking clears the velocity: it needs momentum")
        if local_clipnorm is not None and not local_clipnorm > 0:
            raise ValueError(f"local_clipnorm must be > 0, got {local_clipnorm!r}")
        self.codec, self.allgather, self.allreduce_mean = codec, allgather, allreduce_mean
        self.workers, self.updates = workers, updates
        self.residual, self.momentum, self.masking = residual, momentum, masking
        self.local_clipnorm, self.dense_1d = local_clipnorm, dense_1d
        self.fusion_threshold_bytes = fusion_threshold_bytes
        self.traffic, self.on_dense_norms, self.fused = traffic, on_dense_norms, fused
        self.residuals: list[keras.Variable] | None = None
        self.velocities: list[keras.Variable] = []
        self._restored: list[np.ndarray] | None = None

    @property
    def stateful(self) -> bool:
        """Whether each worker keeps state (residuals, velocities) that training must save."""
        return self.residual or self.momentum is not None

    def __call__(self, grads: list) -> list:
        self.build(grads)
        workers = self.workers() if callable(self.workers) else self.workers
        update = self.updates if self.updates is not None else 0
        grads = self._clipped(grads, workers)
        dense = [i for i, g in enumerate(grads) if self.dense_1d and len(g.shape) <= 1]
        groups = self._buckets(grads, [i for i in range(len(grads)) if i not in dense])
        library = fused_codecs() if self.fused else None
        entries = [sum(elements(grads[i]) for i in g) for g in groups]
        fused = [
            library is not None
            and self.codec.fuses(n)
            and all(itemsize(grads[i]) == 4 for i in group)  # float32, the kernels' type
            for group, n in zip(groups, entries, strict=True)
        ]
        by_kernel = {i for group, f in zip(groups, fused, strict=True) if f for i in group}
        inputs = self._with_momentum(grads, update, skip=by_kernel)
        reduced = dict(zip(dense, self._dense_mean(inputs, dense, grads), strict=True))
        index_dtype = "int32" if max(entries, default=0) < 2**31 else "int64"  # one allgather
        payloads = [
            self._encode_fused(library, grads, group, n, update, index_dtype)
            if f
            else self._encode(inputs, group, update, index_dtype)
            for group, n, f in zip(groups, entries, fused, strict=True)
        ]
        gathered = [self.allgather(list(slot)) for slot in zip(*payloads, strict=True)]
        if self.traffic is not None:
            self.traffic.count_dense(grads)
            own = [self.codec.nbytes(p) for p in payloads]
            dense_entries = sum(elements(grads[i]) for i in dense)
            norms = len(grads) if self.on_dense_norms is not None else 0
            self.traffic.add(sum(own, start=4 * (dense_entries + norms)))
        for group, payload in zip(groups, zip(*gathered, strict=True), strict=True):
            means = self._decode_mean(library, payload, grads, group, workers)
            reduced.update(zip(group, means, strict=True))
        return [reduced[i] for i in range(len(grads))]

    def state(self) -> list[np.ndarray]:
        """This worker's residuals, then its velocities (with momentum correction), in gradient
        order (none before the first step)."""
        return [ops.convert_to_numpy(v) for v in self.variables]

    def restore(self, state: list[np.ndarray]) -> None:
        """Continue from ``state`` (a :meth:`state`, this worker's own), now or once built."""
        if self.residuals is None:
            self._restored = [np.asarray(a) for a in state] or None
            return
        backend = backends.current()
        for variable, value in zip(self.variables, state, strict=True):
            backend.assign_own(variable, value)

    @property
    def variables(self) -> list[keras.Variable]:
        """Its state: the residuals, then the velocities (none before :meth:`build`)."""
        return [*(self.residuals or []), *self.velocities]

    def build(self, like: list) -> None:
        """Create the state, one tensor of each kind per gradient, shaped and typed as the
        gradients ``like`` (or their variables), once: the distributed optimizer builds it
        with the optimizer, outside any step; else the first call does."""
        if self.residuals is not None:
            return
        copies = int(self.residual) + int(self.momentum is not None)  # residuals, velocities
        dtypes = [keras.backend.standardize_dtype(g.dtype) for g in like]
        fresh = [np.zeros(g.shape, d) for g, d in zip(like, dtypes, strict=True)] * copies
        start = self._restored or fresh
        if [a.shape for a in start] != [a.shape for a in fresh]:
            raise ValueError("the restored state does not match the gradients' shapes")
        with backends.current().outside_step():  # created once, outside a traced step
            variables = [keras.Variable(a, trainable=False, name="codec_state") for a in start]
        self.residuals = variables[: len(like)] if self.residual else []
        self.velocities = variables[len(like) :] if self.momentum is not None else []

    def _buckets(self, grads, indices: list[int]) -> list[list[int]]:
        """``indices`` of ``grads`` fused into buckets, in order."""
        sizes = [nbytes([grads[i]]) for i in indices]
        return [[indices[j] for j in b] for b in fusion_buckets(sizes, self.fusion_threshold_bytes)]

    def _clipped(self, grads, workers) -> list:
        """This worker's gradients, clipped to ``local_clipnorm / sqrt(workers)`` if set: each
        scaled by ``limit * min(1 / norm, 1 / limit)``, as ``tf.clip_by_global_norm`` does."""
        if self.local_clipnorm is None:
            return list(grads)
        limit = self.local_clipnorm / ops.sqrt(ops.cast(workers, "float32"))
        norm = ops.sqrt(ops.cast(backends.current().squared_norm(grads), "float32"))
        scale = limit * ops.minimum(1.0 / norm, 1.0 / limit)
        return [g * ops.cast(scale, g.dtype) for g in grads]

    def _with_momentum(self, grads, update, skip: set[int]) -> list:
        """What each gradient contributes to this update: itself, or under momentum correction
        the new velocity ``u = m * u + g`` (except at ``skip``, where a fused kernel keeps the
        velocity)."""
        if self.momentum is None:
            return grads
        m = value_at(self.momentum, update)
        inputs = list(grads)
        for i, (velocity, g) in enumerate(zip(self.velocities, grads, strict=True)):
            if i not in skip:
                inputs[i] = ops.cast(m, g.dtype) * velocity + g
                velocity.assign(inputs[i])
        return inputs

    def _dense_mean(self, inputs, dense: list[int], grads) -> list:
        """The workers' mean of the dense variables' contributions; with ``on_dense_norms``,
        every gradient's norm, averaged in the same call (the gradient's, not the velocity's:
        a velocity is about ``1 / (1 - m)`` times longer, and a trust ratio taken from it would
        cancel the momentum)."""
        tensors = [inputs[i] for i in dense]
        if self.on_dense_norms is not None:
            tensors.append(ops.stack([ops.sum(ops.square(g)) for g in grads]))
        if not tensors:
            return []
        means = self.allreduce_mean(tensors)
        if self.on_dense_norms is not None:
            self.on_dense_norms(list(ops.unstack(ops.sqrt(means.pop()))))
        return means

    def _encode(self, inputs, group: list[int], update, index_dtype):
        """One bucket's payload; keeps its residual and masks its velocities."""
        flat = self._flat([inputs[i] for i in group])
        if self.residual:
            flat += self._flat([self.residuals[i] for i in group])
        payload, encoded = self.codec.encode(flat, update, index_dtype)
        if self.residual:
            self._assign_flat([self.residuals[i] for i in group], self.codec.left(flat, encoded))
        if self.masking:
            velocity = self._flat([inputs[i] for i in group])
            self._assign_flat(
                [self.velocities[i] for i in group], self.codec.unsent(velocity, encoded)
            )
        return payload

    def _encode_fused(self, library, grads, group: list[int], entries: int, update, index_dtype):
        """:meth:`_encode`, with the momentum step, by the fused kernel."""
        momentum = 0.0 if self.momentum is None else value_at(self.momentum, update)
        state = {
            "grads": [grads[i] for i in group],
            "velocities": [self.velocities[i].handle for i in group] if self.velocities else [],
            "residuals": [self.residuals[i].handle for i in group] if self.residual else [],
            "momentum": ops.cast(momentum, "float32"),
            "masking": self.masking,
        }
        return self.codec.encode_fused(library, state, entries, update, index_dtype)

    def _decode_mean(self, library, payload, grads, group: list[int], workers) -> list:
        """The workers' mean of one bucket's gathered ``payload``, one tensor a gradient."""
        shapes = [grads[i].shape for i in group]
        if library is not None:
            return self.codec.decode_mean_fused(
                library, payload, shapes, ops.cast(workers, "int32")
            )
        sizes = [math.prod(s) for s in shapes]
        total = self.codec.decode_sum(payload, sum(sizes))
        mean = total / ops.cast(workers, total.dtype)
        return [ops.reshape(p, s) for p, s in zip(split(mean, sizes), shapes, strict=True)]

    @staticmethod
    def _flat(tensors: list):
        """``tensors`` flattened and concatenated, in order."""
        return ops.concatenate([ops.reshape(t, [-1]) for t in tensors], 0)

    @staticmethod
    def _assign_flat(variables: list[keras.Variable], flat) -> None:
        sizes = [elements(v) for v in variables]
        for variable, part in zip(variables, split(flat, sizes), strict=True):
            variable.assign(ops.reshape(part, variable.shape))


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
