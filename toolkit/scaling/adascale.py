"""AdaScale SGD (Johnson, Agrawal, Gu, Guestrin, ICML 2020): a learning rate that scales itself
with the batch, from the gradient noise scale.

A run at global batch ``B`` whose learning rate and schedule were tuned at ``B0`` (scale
``S = B / B0``) multiplies the base rate by the *gain*

    r = (tr Σ / B0 + |G|²) / (tr Σ / B + |G|²) = (1 + B_simple / B0) / (1 + B_simple / B)

(``Σ``: the per-example gradient covariance, ``G``: the true gradient, ``B_simple = tr Σ / |G|²``;
the paper writes it with the base batch's variance ``σ² = tr Σ / B0``). ``r`` lies in
``[1, S]``: ``S`` where the gradient is all noise (the large batch is worth ``S`` small steps),
1 where it is all signal (it is worth one). A scale-invariant clock ``τ`` advances by ``r`` each
update, the base schedule is read at ``τ``, and training ends when ``τ`` reaches the base run's
number of updates. So the rate of update ``t`` is ``r_t · base(τ_t)`` with ``τ_{t+1} = τ_t + r_t``.

``|G|²`` and ``tr Σ`` are the noise meter's estimates (:func:`toolkit.scaling.noise_scale.estimate`)
from two squared gradient norms measured at batch sizes ``b_small < b_big``, averaged with the
bias-corrected EMA of :class:`toolkit.scaling.noise_scale.Smoother`: here in the graph, every
update, right before the update reads its rate. A negative average ``tr Σ`` counts as 0 (gain 1), a
non-positive ``|G|²`` as pure noise (gain ``S``).

Written with ``keras.ops``, so it computes the same on every Keras backend. Its state is in
float64, except on JAX without ``jax_enable_x64``, which has no float64: there it is float32
(:func:`state_dtype`).
"""

from __future__ import annotations

import keras
from keras import ops

from toolkit import backends
from toolkit.optimizers.schedules import Wrapper, value_at
from toolkit.scaling.noise_scale import estimate


@keras.saving.register_keras_serializable(package="toolkit")
class AdaScale(Wrapper):
    """The AdaScale rate: ``schedule`` (the base run's, in its updates) read at ``τ`` and
    multiplied by the gain; the run is :meth:`done` once ``τ`` reaches ``total`` (the base
    run's updates). :meth:`observe` takes each update's two squared norms, in the graph,
    before the optimizer reads its rate; calling the schedule gives that update's rate, the gain
    times ``schedule`` at the clock the update started from (the step Keras passes is not used:
    ``τ`` is the clock). It is evaluated where the optimizer asks for it, as any schedule is,
    so at a gain of 1 the rate is the base schedule's to the bit. Its state (the averages,
    ``τ``, the latest gain and the clock it read) is in :attr:`variables`, which checkpoints
    keep."""

    def __init__(
        self,
        schedule,
        *,
        batch: int,
        base_batch: int,
        b_small: float,
        b_big: float,
        smoothing: float = 0.95,
        total: int | None = None,
    ):
        if not 1 <= base_batch <= batch:
            raise ValueError(f"AdaScale needs 1 <= base_batch <= batch, got {base_batch}, {batch}")
        if not 0 < b_small < b_big:
            raise ValueError(f"AdaScale needs 0 < b_small < b_big, got {b_small}, {b_big}")
        if not 0 <= smoothing < 1:
            raise ValueError(f"AdaScale smoothing must be in [0, 1), got {smoothing}")
        self.schedule = schedule
        self.batch, self.base_batch = int(batch), int(base_batch)
        self.b_small, self.b_big, self.smoothing = float(b_small), float(b_big), float(smoothing)
        self.total = total

        def variable(name, value=0.0):
            return keras.Variable(
                value, dtype=state_dtype(), trainable=False, name=f"adascale_{name}"
            )

        self.count = variable("count")  # measurements averaged
        self.grad_sq_sum = variable("grad_sq_sum")  # the EMAs, not yet bias-corrected
        self.trace_sigma_sum = variable("trace_sigma_sum")
        self.tau = variable("tau")  # base-run updates done
        self.gain = variable("gain")  # the latest update's
        self.read_at = variable("read_at")  # the clock the latest update read the schedule at
        # now: an adaptive batch changes them (rescale)
        self.batches = variable("batches", [float(batch), self.b_small, self.b_big])

    @property
    def scale(self) -> float:
        """``S = batch / base_batch``, at the batch now."""
        return float(self.batches.numpy()[0]) / self.base_batch

    def rescale(self, batch: int, b_small: int, b_big: int) -> None:
        """From the next update on, the global batch is ``batch`` and the noise is measured at
        ``b_small`` and ``b_big`` (an adaptive batch's change). The averages go on: they
        estimate ``|G|²`` and ``tr Σ``, which do not depend on the batch."""
        if not (self.base_batch <= batch and 0 < b_small < b_big):
            raise ValueError(f"AdaScale cannot rescale to {batch}, {b_small}, {b_big}")
        self.batches.assign([batch, b_small, b_big])

    def b_simple(self) -> float:
        """The averaged ``B_simple = tr Σ / |G|²`` (NaN before the first measurement or
        while the averaged ``|G|²`` is not positive)."""
        grad_sq, trace = float(self.grad_sq_sum.numpy()), float(self.trace_sigma_sum.numpy())
        return trace / grad_sq if grad_sq > 0 else float("nan")

    def done(self) -> bool:
        """Whether the clock has done the base run's ``total`` updates (never, without one)."""
        return self.total is not None and float(self.tau.numpy()) >= self.total

    @property
    def variables(self) -> list[keras.Variable]:
        return [
            self.count,
            self.grad_sq_sum,
            self.trace_sigma_sum,
            self.tau,
            self.gain,
            self.read_at,
            self.batches,
        ]

    def observe(self, small_sq, big_sq) -> None:
        """One update's squared gradient norms at ``b_small`` and ``b_big``: average them in,
        set the gain, keep the clock this update reads the schedule at, advance ``τ``."""
        decay = self.smoothing  # variables' values below: Keras's Variable arithmetic with a
        # Python float rounds the float to float32 on PyTorch
        batch, b_small, b_big = ops.unstack(self.batches.value, 3)
        grad_sq, trace_sigma = estimate(_state(small_sq), _state(big_sq), b_small, b_big)
        self.count.assign_add(1)
        correction = 1 - ops.power(_state(decay), self.count.value)
        grad_sq = decay * self.grad_sq_sum.value + (1 - decay) * grad_sq
        trace = decay * self.trace_sigma_sum.value + (1 - decay) * trace_sigma
        gain = gain_of(grad_sq / correction, trace / correction, self.base_batch, batch)
        self.grad_sq_sum.assign(grad_sq)
        self.trace_sigma_sum.assign(trace)
        self.read_at.assign(self.tau.value)
        self.gain.assign(gain)
        self.tau.assign(self.read_at.value + gain)

    def __call__(self, step):
        gain, clock = ops.cast(self.gain.value, "float32"), ops.cast(self.read_at.value, "float32")
        return gain * value_at(self.schedule, clock)

    def arguments(self):
        return {
            "batch": self.batch,
            "base_batch": self.base_batch,
            "b_small": self.b_small,
            "b_big": self.b_big,
            "smoothing": self.smoothing,
            "total": self.total,
        }


def gain_of(grad_sq, trace_sigma, base_batch: int, batch):
    """AdaScale's gain ``(tr Σ / B0 + |G|²) / (tr Σ / B + |G|²)`` clipped to ``[1, B / B0]``
    (tensors in, a tensor of :func:`state_dtype` out): a negative ``tr Σ`` counts as 0, and a
    non-positive ``|G|²`` with a positive ``tr Σ`` as pure noise."""
    grad_sq, trace_sigma, batch = _state(grad_sq), _state(trace_sigma), _state(batch)
    # Keras 3.15's ops.maximum, and a Python number mixed in, give float32 on PyTorch: avoided.
    zero, one = _state(0.0), _state(1.0)
    trace_sigma = ops.where(trace_sigma > 0, trace_sigma, zero)
    scale = batch / base_batch
    below = trace_sigma / batch + grad_sq
    ratio = (trace_sigma / base_batch + grad_sq) / ops.where(below > 0, below, one)
    return ops.where(below > 0, ops.clip(ratio, one, scale), scale)


def state_dtype() -> str:
    """The dtype AdaScale computes and keeps its state in: the backend's higher precision,
    ``float64`` (``float32`` on JAX without ``jax_enable_x64``, which has no float64)."""
    return backends.current().state_dtype()


def _state(value):
    """``value`` as a tensor of :func:`state_dtype` (a Python float never passes through
    float32 where there is float64)."""
    return ops.cast(ops.convert_to_tensor(value, dtype=state_dtype()), state_dtype())
