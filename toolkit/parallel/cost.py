"""When compression pays: a model of what averaging the gradients costs an update, per mode.

An update's allreduce time is its local work plus its wire time (the model's forward and
backward pass, the same in every mode, are left out):

- **local work**: a fixed time per update (Horovod's negotiation, TensorFlow's per-variable
  ops) plus *passes*, where one pass is one ``memcpy`` of the gradients' dense float32 bytes on
  this machine (:func:`memcpy_seconds_per_byte`, timed here), a unit that carries from one
  machine to another better than milliseconds do. Both are read off a whole update as
  training runs it (encode, the collectives' copies and reductions, decode, the optimizer's
  step) on two models, ResNet-20 and ResNet-50, by ``experiments/bench_allreduce.py`` with 2
  workers on localhost, and kept in :data:`LOCAL_WORK`. They were measured with the two
  workers sharing a 2-core machine, as on the namespace cluster; workers with hosts of their
  own do less work each, and there the model overstates it.
- **wire**, Horovod's ring collectives over ``W`` workers on a link of ``bandwidth`` each way
  and ``latency`` one way: a dense allreduce of ``B`` bytes sends ``2 (W - 1) / W * B`` in
  ``2 (W - 1)`` steps; an encoded mode allgathers each worker's ``p`` bytes, ``(W - 1) * p`` in
  ``W - 1`` steps, after an allgather of the sizes (``W - 1`` more steps).

The payload ``p``: top-k sends ``ceil(ratio * n)`` (value, int32 index) pairs; a threshold's
count depends on the gradients, so it is taken as ``ratio * n`` too (say what fraction passes
it); 2bit sends a 32-bit word per 16 entries. ``experiments/cost_model_check.py`` sets the
predictions against the benchmark on the namespace cluster's shaped link.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import numpy as np

from toolkit import codecs

LOCAL_WORK = {  # mode: (fixed milliseconds, passes) per update (see the module doc)
    "dense": (2.45, 45.27),
    "fp16": (8.38, 47.23),
    "topk": (5.78, 9.20),  # sampled (topk_sample > 0), ratio 1%
    "topk, exact 1%": (0.0, 127.67),  # tf.math.top_k over every entry
    "topk, exact 0.1%": (1.85, 50.11),
    "threshold": (3.40, 6.78),
    "2bit": (5.97, 8.64),
}
"""The line through each mode's medians on ResNet-20 and ResNet-50 in
``experiments/bench_allreduce_localhost.csv`` (``tests/test_cost.py`` ties them; a negative
fixed time is read as 0)."""


@dataclasses.dataclass(frozen=True)
class Link:
    """A network link between the workers' hosts: ``gbit`` Gbit/s each way, ``latency_us``
    microseconds one way."""

    gbit: float
    latency_us: float = 50.0

    def seconds(self, nbytes: float, steps: int) -> float:
        """Time to send ``nbytes`` in ``steps`` sequential messages."""
        return nbytes * 8 / (self.gbit * 1e9) + steps * self.latency_us * 1e-6


@functools.cache
def memcpy_seconds_per_byte() -> float:
    """This machine's ``memcpy`` time per byte (the best of five copies of 64 MB)."""
    source, target = np.ones(2**24, np.float32), np.empty(2**24, np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return min(times) / source.nbytes


def payload_bytes(compression: str, entries: int, ratio: float, value_bytes: int = 4) -> int:
    """What one worker sends per update in ``compression`` mode for ``entries`` gradients
    (:meth:`toolkit.codecs.Codec.payload_bytes`)."""
    return codecs.of(compression).payload_bytes(entries, ratio, value_bytes)


def local_work(compression: str, topk_sample: float = 0.01, ratio: float = 0.01):
    """``(fixed seconds, passes)`` of an update in ``compression`` mode (:data:`LOCAL_WORK`).
    An exact top-k's grows with ``k``: log-linear in ``ratio`` through its two measured
    points."""
    codec = codecs.of(compression)
    if codec is codecs.TOPK and not topk_sample:
        (low_ms, low), (high_ms, high) = (
            LOCAL_WORK["topk, exact 0.1%"],
            LOCAL_WORK["topk, exact 1%"],
        )
        along = math.log10(ratio / 0.001)
        return (low_ms + (high_ms - low_ms) * along) / 1e3, low + (high - low) * along
    fixed_ms, passes = LOCAL_WORK[codec.work_row]
    return fixed_ms / 1e3, passes


def seconds_per_update(
    compression: str,
    entries: int,
    workers: int,
    link: Link,
    *,
    ratio: float = 0.01,
    topk_sample: float = 0.01,
    value_bytes: int = 4,
    memcpy_seconds: float | None = None,
) -> float:
    """The predicted seconds an update spends averaging ``entries`` float32 gradients over
    ``workers`` workers in ``compression`` mode (``none``, ``fp16``, ``topk``, ``threshold`` or
    ``2bit``), on ``link``. ``memcpy_seconds``: one pass (default: timed on this machine)."""
    if memcpy_seconds is None:
        memcpy_seconds = memcpy_seconds_per_byte() * 4 * entries
    fixed, passes = local_work(compression, topk_sample, ratio)
    local = fixed + passes * memcpy_seconds
    if workers < 2:
        return local
    sent = payload_bytes(compression, entries, ratio, value_bytes)
    if not codecs.of(compression).encoded:  # ring allreduce
        wire = link.seconds(2 * (workers - 1) / workers * sent, 2 * (workers - 1))
    else:  # allgather of the sizes, then of the payloads
        wire = link.seconds((workers - 1) * sent, 2 * (workers - 1))
    return local + wire
