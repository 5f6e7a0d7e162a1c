"""The simple gradient noise scale ``B_simple = tr(Σ) / |G|²`` (McCandlish, Kaplan, Amodei et al.
2018, "An Empirical Model of Large-Batch Training", Appendix A), which predicts the critical
batch size: below it, doubling the batch nearly halves the steps to a given loss; above it,
extra batch buys little.

A batch of ``B`` examples gives a gradient whose squared norm has expectation
``E|G_B|² = |G|² + tr(Σ)/B`` (``G``: the true gradient, ``Σ``: the per-example gradient
covariance). Measuring ``|G_B|²`` at two batch sizes ``b_small < b_big`` and solving::

    |G|²  ≈ (b_big·|G_big|² − b_small·|G_small|²) / (b_big − b_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/b_small − 1/b_big)

gives unbiased estimates of both. One step's estimates are noisy (either may be negative), so
:class:`Smoother` keeps bias-corrected exponential averages of each and reports their ratio;
the ratio of noisy numbers is never averaged. Data-parallel training measures both norms almost
for free: each worker's gradient is a ``b_small`` gradient and the allreduced one a ``b_big``
gradient (:class:`toolkit.parallel.noise_meter.GradientNoiseMeter`).

Nothing here imports Keras or TensorFlow; the probe that trains a config to measure it is
:mod:`toolkit.launching.probe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

GROWS = (
    "Which B_simple: the probe reads it at the start of training, Run detail over a run's last "
    "readings, a calibration pooled near each target loss; it tends to grow as training lowers "
    "the loss (McCandlish et al. 2018), so a later reading is usually the larger, and each also "
    "depends on the batch and rate it was read at"
)
"""Why the doors' ``B_simple`` differ: each names which it reads and ends with this."""


def estimate(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """``(|G|², tr Σ)`` from squared gradient norms measured at batch sizes ``b_small`` and
    ``b_big`` (``b_small < b_big``, checked where they are numbers, not tensors); either may
    come out negative for one step."""
    numbers = all(isinstance(b, Real) for b in (b_small, b_big))
    if numbers and not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace_sigma = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return grad_sq, trace_sigma


@dataclass
class Smoother:
    """Bias-corrected exponential moving averages of ``|G|²`` and ``tr Σ`` (Adam's correction:
    divide by ``1 − decay^n``), and ``B_simple`` as the ratio of the two averages.

    ``b_simple`` is ``None`` while the averaged ``|G|²`` is not positive or the averaged
    ``tr Σ`` is negative: a noise scale is never reported negative or infinite.
    """

    decay: float = 0.95
    count: int = 0
    _grad_sq: float = 0.0
    _trace_sigma: float = 0.0

    def __post_init__(self):
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    def update(self, grad_sq: float, trace_sigma: float) -> None:
        """Add one step's estimates (non-finite ones are skipped)."""
        if not (math.isfinite(grad_sq) and math.isfinite(trace_sigma)):
            return
        self.count += 1
        self._grad_sq = self.decay * self._grad_sq + (1 - self.decay) * grad_sq
        self._trace_sigma = self.decay * self._trace_sigma + (1 - self.decay) * trace_sigma

    @property
    def grad_sq(self) -> float | None:
        return self._grad_sq / (1 - self.decay**self.count) if self.count else None

    @property
    def trace_sigma(self) -> float | None:
        return self._trace_sigma / (1 - self.decay**self.count) if self.count else None

    @property
    def b_simple(self) -> float | None:
        grad_sq, trace_sigma = self.grad_sq, self.trace_sigma
        if grad_sq is None or grad_sq <= 0 or trace_sigma < 0:
            return None
        return trace_sigma / grad_sq
