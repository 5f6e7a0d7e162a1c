"""What a gradient allreduce can send, one object per mode (``allreduce.compression``).

A :class:`Codec` carries what the rest of the toolkit asks of a mode: its name in a config,
whether each worker's encoding is allgathered rather than summed by Horovod (:attr:`encoded`),
the bytes a worker sends per update (:meth:`payload_bytes`, the cost model's payload), the row
of the cost model's measured local work it is read from (:attr:`measured_as`), a line saying
what goes on the wire (:meth:`words`) and the rules that tie other options to it. The
communication object, the cost model, the Launch form, the plan's rules and the advice ask a
codec; what a mode does to tensors is in :mod:`toolkit.parallel.compression`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

VALUE_DTYPES = ("float32", "float16")
"""The types a sparse mode's values may travel in (``allreduce.value_dtype``)."""


@dataclasses.dataclass(frozen=True)
class Codec:
    """One ``allreduce.compression`` mode (see the module's docstring)."""

    name: str
    describe: Callable[[Any], str] = dataclasses.field(repr=False, compare=False)
    """What goes on the wire, in a few words, given an ``allreduce`` section's values."""
    encoded: bool = False
    """Each worker's encoding is allgathered (with error feedback and DGC's techniques),
    rather than a tensor Horovod sums."""
    element_bytes: float = 4
    """Bytes per gradient entry on the wire: a dense element, a 2-bit code's share of its
    32-bit word, or a sparse pair's value and int32 index (at float32 values)."""
    sparse: bool = False
    """Sends a chosen share (``allreduce.ratio``) of the entries as (value, index) pairs; its
    values may go in float16 (``allreduce.value_dtype``)."""
    warms_up: bool = False
    """Its share can be warmed up (``allreduce.sparsity_warmup_epochs``, DGC's)."""
    survives_resets: bool = True
    """An elastic run can carry it across a change of its workers (fp16's clip is per world
    size)."""
    measured_as: str | None = None
    """Its row of :data:`toolkit.parallel.cost.LOCAL_WORK`, if not its name."""

    @property
    def work_row(self) -> str:
        """Its row of :data:`toolkit.parallel.cost.LOCAL_WORK`."""
        return self.measured_as or self.name

    def payload_bytes(self, entries: int, ratio: float = 0.01, value_bytes: int = 4) -> int:
        """What one worker sends per update for ``entries`` gradient entries: a sparse mode
        ``ceil(ratio * entries)`` (value, index) pairs (``value_bytes`` a value)."""
        if self.sparse:
            return max(1, math.ceil(ratio * entries)) * (value_bytes + 4)
        if self.element_bytes < 1:  # codes packed into 32-bit words
            per_word = round(4 / self.element_bytes)
            return 4 * math.ceil(entries / per_word)
        return int(self.element_bytes * entries)


def _topk_words(allreduce: Any) -> str:
    sample = allreduce.topk_sample
    return f"topk {100 * allreduce.ratio:g}%" + (
        f" (k-th from a {100 * sample:g}% sample)" if sample else ""
    )


DENSE = Codec("none", lambda _: "dense float32", measured_as="dense")
FP16 = Codec("fp16", lambda _: "dense float16", element_bytes=2, survives_resets=False)
TOPK = Codec("topk", _topk_words, encoded=True, element_bytes=8, sparse=True, warms_up=True)
THRESHOLD = Codec(
    "threshold", lambda a: f"threshold {a.threshold:g}", encoded=True, element_bytes=8, sparse=True
)
TWO_BIT = Codec("2bit", lambda a: f"2bit at ±{a.threshold:g}", encoded=True, element_bytes=0.25)
CODECS = {codec.name: codec for codec in (DENSE, FP16, TOPK, THRESHOLD, TWO_BIT)}
MODES = tuple(CODECS)
"""Every ``allreduce.compression`` a config can give."""
ENCODED = tuple(name for name, codec in CODECS.items() if codec.encoded)
SPARSE = tuple(name for name, codec in CODECS.items() if codec.sparse)


def of(name: str) -> Codec:
    """The codec called ``name``; ``ValueError`` naming the allowed ones otherwise."""
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"compression must be one of {MODES}, got {name!r}") from None
