"""What a worker's gradient becomes on the wire, one codec per mode beyond plain float32
(SINGA's ``DistOpt`` modes, MXNet's 2-bit compression and Deep Gradient Compression's
selection); :class:`toolkit.parallel.compression.CompressedAllreduce` fuses the gradients into
buckets, keeps the residuals and applies DGC's techniques around them.

- :class:`Float16`: gradients cast to float16 for the allreduce and back. A finite value beyond
  ``clip`` is clipped to it *before* the cast, as SINGA's
  ``backward_and_update_half(clipping=True)`` does, so an overflow never reaches the wire as
  ``inf``; a gradient that is already ``inf`` or ``NaN`` stays so (a divergence stays visible).
  Horovod sums the float16 values, so the default clip (in :mod:`toolkit.parallel.distributed`) is
  65504, float16's largest, over the number of workers.
- The encoded modes, each a codec that ``CompressedAllreduce`` applies to a bucket of fused
  gradients (Horovod cannot sum an encoding: the workers' are gathered, then decoded):

  - :class:`Sparse` ``topk``: the ``ceil(ratio * n)`` entries of largest magnitude (at least
    one), as (value, index) pairs. A full top-k over millions of entries costs more than a
    dense allreduce on one machine; with ``topk_sample=s`` (DGC's sampling) the k-th largest
    magnitude is read off every ``round(1/s)``-th entry instead (deterministic, so resumes stay
    exact) and the entries at or above it are sent: about ``k`` of them;
  - :class:`Sparse` ``threshold``: the entries with ``|g| >= threshold`` (a count that varies
    per worker and step). Indices are int32 (int64 for a bucket of 2**31 entries or more);
    values are float32, or float16 (``value_dtype``: 6 bytes an entry instead of 8, finite
    values clipped to float16's range);
  - :class:`TwoBit` (MXNet's ``GradientCompression`` ``2bit``): an entry at or above
    ``+threshold`` sends ``+threshold``, one at or below ``-threshold`` sends
    ``-threshold``, any other sends 0; two bits each, 16 to a 32-bit word, 1/16 of float32.

Every codec is written in ``keras.ops`` (so it runs on every backend) and, where the toolkit's
kernel library runs, in a fused form (``encode_fused``, ``decode_mean_fused``) that does the
same float operations in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from toolkit import codecs
from toolkit.codecs import VALUE_DTYPES

FLOAT16_MAX = float(np.finfo(np.float16).max)


def elements(tensor) -> int:
    """The number of entries of a tensor of any backend (static shape)."""
    return math.prod(tensor.shape)


def itemsize(tensor) -> int:
    """Bytes of one entry of a tensor of any backend."""
    return np.dtype(keras.backend.standardize_dtype(tensor.dtype)).itemsize


def nbytes(tensors: list) -> int:
    """Bytes of ``tensors`` (of any backend) as they are (static shapes)."""
    return sum(elements(t) * itemsize(t) for t in tensors)


def split(flat, sizes: list[int]) -> list:
    """``flat`` cut into consecutive parts of ``sizes`` entries."""
    return ops.split(flat, list(np.cumsum(sizes)[:-1])) if len(sizes) > 1 else [flat]


class Float16:
    """A Horovod compressor (``compress``/``decompress``) that casts to float16 after clipping
    finite values to ``[-clip, clip]``; for TensorFlow's and PyTorch's Horovod alike."""

    def __init__(self, clip: float = FLOAT16_MAX):
        if not 0 < clip <= FLOAT16_MAX:
            raise ValueError(f"fp16 clip must be in (0, {FLOAT16_MAX:g}], got {clip!r}")
        self.clip = clip

    def compress(self, tensor) -> tuple[object, str]:
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if not keras.backend.is_float_dtype(dtype):
            return tensor, dtype
        clipped = keras.ops.clip(tensor, -self.clip, self.clip)
        kept = keras.ops.where(keras.ops.isfinite(tensor), clipped, tensor)
        return keras.ops.cast(kept, "float16"), dtype

    def decompress(self, tensor, dtype: str):
        return keras.ops.cast(tensor, dtype) if keras.backend.is_float_dtype(dtype) else tensor


class Sparse:
    """The codec of ``topk`` and ``threshold``: (value, index) pairs, summed into a dense
    buffer by index (see the module doc). ``warmup_epochs`` (topk only) needs
    ``updates_per_epoch``."""

    def __init__(
        self,
        mode: str,
        *,
        ratio: float = 0.01,
        topk_sample: float = 0.0,
        threshold: float = 1e-3,
        value_dtype: str = "float32",
        warmup_epochs: int = 0,
        updates_per_epoch: int | None = None,
    ):
        if mode not in codecs.SPARSE:
            raise ValueError(f"sparse mode must be one of {codecs.SPARSE}, got {mode!r}")
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        if not 0 <= topk_sample < 1:
            raise ValueError(f"topk_sample must be in [0, 1), got {topk_sample!r}")
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        if value_dtype not in VALUE_DTYPES:
            raise ValueError(f"value_dtype must be one of {VALUE_DTYPES}, got {value_dtype!r}")
        if warmup_epochs and (not codecs.of(mode).warms_up or not updates_per_epoch):
            raise ValueError(
                "a sparsity warm-up needs mode 'topk' and updates_per_epoch, got "
                f"mode={mode!r}, updates_per_epoch={updates_per_epoch!r}"
            )
        self.mode, self.ratio, self.threshold = mode, ratio, threshold
        self.stride = round(1 / topk_sample) if topk_sample else 1
        self.wire = value_dtype
        self.warmup_epochs, self.updates_per_epoch = warmup_epochs, updates_per_epoch

    def densities(self) -> list[float]:
        """The fraction sent in each epoch of the warm-up, then after it (the last)."""
        w = self.warmup_epochs
        return [self.ratio ** ((e + 1) / (w + 1)) for e in range(w)] + [self.ratio]

    def encode(self, flat, update, index_dtype):
        """``(payload, sent)``: what goes on the wire, and the (index, float32 value) pairs it
        decodes to, from which the residual and the masking follow."""
        index = ops.cast(self._select(flat, update), index_dtype)
        values = ops.take(flat, index)
        wire = values
        if self.wire == "float16":  # the others add the rounded values: the residual keeps
            wire, _ = Float16().compress(values)  # the rounding error
            values = ops.cast(wire, flat.dtype)
        return (wire, index), (index, values)

    def left(self, flat, sent):
        """``flat`` less what was sent: the residual."""
        index, values = sent
        return ops.scatter_update(flat, index[:, None], ops.take(flat, index) - values)

    def unsent(self, velocity, sent):
        """``velocity`` with the entries that were sent cleared (momentum factor masking)."""
        index, values = sent
        return ops.scatter_update(velocity, index[:, None], ops.zeros_like(values))

    def decode_sum(self, payload, size: int):
        """The sum over the workers of the gathered ``payload``, dense, ``size`` entries."""
        values, index = payload
        return ops.segment_sum(ops.cast(values, "float32"), index, num_segments=size)

    @staticmethod
    def nbytes(payload):
        """The bytes of one worker's ``payload``."""
        values, index = payload
        return ops.cast(ops.size(values), "int64") * (itemsize(values) + itemsize(index))

    def fuses(self, entries: int) -> bool:
        """Whether a bucket of ``entries`` is encoded by the fused kernel: a threshold, or a
        top-k read off a sample (exact top-k keeps ``top_k``)."""
        return self.mode == codecs.THRESHOLD.name or 1 < self.stride <= entries

    def encode_fused(self, library, state: dict, entries: int, update, index_dtype):
        """The payload of :meth:`encode` for the bucket ``state`` describes, from the fused
        kernel, which also updates the bucket's velocities and residuals."""
        sampled = self.mode == codecs.TOPK.name
        k = self._k(-(-entries // self.stride), update) if sampled else 0
        return tuple(
            library.sparse_encode(
                **state,
                threshold=self.threshold,
                k=k,
                stride=self.stride if sampled else 0,
                value_dtype=self.wire,
                index_dtype=index_dtype,
            )
        )

    @staticmethod
    def decode_mean_fused(library, payload, shapes: list, workers) -> list:
        """The mean over ``workers`` of the gathered ``payload``, as tensors of ``shapes``."""
        values, index = payload
        return library.sparse_decode_mean(values, index, workers, N=len(shapes), shapes=shapes)

    def _select(self, flat, update):
        """The positions of ``flat`` this worker sends."""
        magnitude = ops.abs(flat)
        if self.mode == codecs.THRESHOLD.name:
            return ops.nonzero(magnitude >= self.threshold)[0]
        if self.stride > 1 and elements(flat) >= self.stride:
            sample = magnitude[:: self.stride]
            kth = ops.top_k(sample, self._k(sample.shape[0], update), sorted=True)[0][-1]
            return ops.nonzero(magnitude >= kth)[0]
        return ops.top_k(magnitude, self._k(flat.shape[0], update), sorted=False)[1]

    def _k(self, n: int, update):
        """How many of ``n`` entries to take at ``update`` (0-based)."""
        counts = [max(1, math.ceil(d * n)) for d in self.densities()]
        if len(counts) == 1:
            return counts[0]
        epoch = ops.minimum(update // self.updates_per_epoch, len(counts) - 1)
        return ops.take(ops.convert_to_tensor(counts, "int32"), epoch)


class TwoBit:
    """The codec of MXNet's ``2bit``: each entry sends ``+t``, ``-t`` or 0 as two bits, 16 to a
    32-bit word. In MXNet's layout: byte ``j`` of a word holds entries ``4j .. 4j+3`` of its 16,
    the first in the high bits; ``11`` is ``+t``, ``10`` is ``-t``, ``00`` is 0. The entries
    are padded with zeros to a multiple of 16. The codes are bytes (one per entry) until four
    share one: where each op writes a new tensor (PyTorch's eager ops), the codec's time is
    mostly the tensors it writes, so it writes as few full-size ones as it can."""

    SHIFTS = (6, 4, 2, 0)

    def __init__(self, threshold: float):
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        self.threshold = threshold

    def encode(self, flat, update, index_dtype):
        """``(payload, sent)``: the packed words, and the values they decode to."""
        t = ops.cast(self.threshold, flat.dtype)
        up, down = flat >= t, flat <= -t
        sent = ops.where(up, t, ops.where(down, -t, 0.0))
        codes = ops.cast(up, "uint8") + ops.cast(ops.logical_or(up, down), "uint8") * 2
        return (self.pack(codes),), sent

    @classmethod
    def pack(cls, codes):
        """Two-bit codes (one per entry, any integer dtype) as int32 words, 16 codes each."""
        padding = -elements(codes) % 16
        quads = ops.reshape(ops.pad(codes, [[0, padding]]), [-1, 4])
        bytes_ = sum(quads[:, i] * (1 << shift) for i, shift in enumerate(cls.SHIFTS))
        return ops.view(ops.cast(bytes_, "uint8"), "int32")

    @classmethod
    def unpack(cls, words):
        """The codes of ``words`` (uint8, one per entry, padding included)."""
        shifts = ops.convert_to_tensor(cls.SHIFTS, "uint8")
        bytes_ = ops.view(words, "uint8")
        return ops.reshape(ops.bitwise_and(ops.right_shift(bytes_[:, None], shifts), 3), [-1])

    @staticmethod
    def left(flat, sent):
        return flat - sent

    @staticmethod
    def unsent(velocity, sent):
        return ops.where(sent != 0, ops.zeros_like(velocity), velocity)

    def decode_sum(self, payload, size: int):
        (words,) = payload
        codes = ops.reshape(self.unpack(words), [-1, math.ceil(size / 16) * 16])[:, :size]
        t = ops.convert_to_tensor(self.threshold, "float32")
        return ops.sum(ops.where(codes == 3, t, ops.where(codes == 2, -t, 0.0)), axis=0)

    @staticmethod
    def nbytes(payload):
        (words,) = payload
        return ops.cast(ops.size(words), "int64") * 4

    @staticmethod
    def fuses(entries: int) -> bool:
        """Every bucket is encoded by the fused kernel."""
        return True

    def encode_fused(self, library, state: dict, entries: int, update, index_dtype):
        return (library.two_bit_encode(**state, threshold=self.threshold),)

    def decode_mean_fused(self, library, payload, shapes: list, workers) -> list:
        (words,) = payload
        return library.two_bit_decode_mean(
            words, self.threshold, workers, N=len(shapes), shapes=shapes
        )


Codec = Sparse | TwoBit  # each: encode, left, unsent, decode_sum, nbytes, and fused forms


def _sparse(allreduce: Any, techniques: Any, updates_per_epoch: int | None) -> Sparse:
    return Sparse(
        allreduce.compression,
        ratio=allreduce.ratio,
        topk_sample=allreduce.topk_sample,
        threshold=allreduce.threshold,
        value_dtype=allreduce.value_dtype,
        warmup_epochs=techniques.sparsity_warmup_epochs,
        updates_per_epoch=updates_per_epoch,
    )


ENCODERS: dict[str, Callable[[Any, Any, int | None], Codec]] = {
    codecs.TOPK.name: _sparse,
    codecs.THRESHOLD.name: _sparse,
    codecs.TWO_BIT.name: lambda allreduce, *_: TwoBit(allreduce.threshold),
}
"""The tensor codec of each encoded mode (:data:`toolkit.codecs.ENCODED`), from a config's
``allreduce`` section, its DGC techniques and the updates an epoch."""


def encoder(allreduce: Any, techniques: Any, updates_per_epoch: int | None) -> Codec:
    """The tensor codec an encoded ``allreduce`` section asks for (:data:`ENCODERS`)."""
    return ENCODERS[allreduce.compression](allreduce, techniques, updates_per_epoch)
