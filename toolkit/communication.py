"""What the workers exchange every update, as one object that knows which options go together.

The config gives it in two flat sections, as YAML wants: ``allreduce:`` (what a gradient
allreduce sends: float32, fp16, SINGA's sparsified modes or MXNet's 2-bit, with or without the
residual, and Deep Gradient Compression's techniques) and ``sync:`` (whether gradients are
averaged every update, or parameters now and then). :class:`Communication` holds both and
resolves them once: which of DGC's techniques are on (``dgc: true`` turns on each one not
given), what the optimizer must be able to do, and whether an elastic run can carry it across
a reset. Its rules are written here alone, and run wherever one is built: the schema builds
one for every config (:meth:`toolkit.config.ExperimentConfig.communication`), a notebook with
:func:`toolkit.config.communication`, and
:func:`~toolkit.parallel.distributed.DistributedOptimizer` takes it whole, as Horovod's
optimizer takes one ``compression=`` object. What it does to tensors is in
:mod:`toolkit.parallel.compression` and :mod:`toolkit.parallel.sync`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from toolkit import codecs, optimizer_rules
from toolkit.catalog import OPTIMIZERS
from toolkit.dgc import Techniques
from toolkit.errors import ConfigError
from toolkit.sections import AllreduceConfig, SyncConfig, check_encoding


@dataclasses.dataclass(frozen=True)
class Communication:
    """The ``allreduce:`` and ``sync:`` sections as one object: built, it has passed every
    rule of which options go together (:class:`~toolkit.errors.ConfigError` naming the field
    otherwise), and
    :attr:`techniques` holds DGC's, resolved."""

    allreduce: AllreduceConfig
    sync: SyncConfig
    techniques: Techniques = dataclasses.field(init=False)

    def __post_init__(self):
        check_encoding(self.allreduce)
        mode, compression = self.sync.mode, self.allreduce.compression
        if self.averages_parameters and self.codec is not codecs.DENSE:
            raise ConfigError(
                f"sync.mode={mode!r} averages parameters, not gradients: "
                f"allreduce.compression must be {codecs.DENSE.name!r} (got {compression!r})"
            )
        object.__setattr__(self, "techniques", Techniques.of(self.allreduce))

    @property
    def codec(self) -> codecs.Codec:
        """What the allreduce sends (:mod:`toolkit.codecs`)."""
        return codecs.of(self.allreduce.compression)

    @property
    def encoded(self) -> bool:
        """Whether each worker sends an encoding (top-k, threshold, 2-bit) that is allgathered,
        rather than a tensor Horovod can sum."""
        return self.codec.encoded

    @property
    def varying_payload(self) -> bool:
        """Whether what a worker sends varies in size from update to update: a threshold's
        count, a top-k read off a sample, or one whose ratio warms up."""
        if self.codec is not codecs.TOPK:
            return self.codec.sparse  # a threshold's count varies; the others' sizes do not
        return self.allreduce.topk_sample > 0 or self.techniques.sparsity_warmup_epochs > 0

    @property
    def backend_needs(self) -> dict[str, Any]:
        """What a backend must run to carry this exchange: its codec, whether its payload
        varies in size, its sync mode (:meth:`toolkit.backends.base.Backend.refusal`'s
        keywords, asked by the config's check and by the distributed optimizer)."""
        return {
            "codec": self.codec.name,
            "varying_payload": self.varying_payload,
            "sync_mode": self.sync.mode,
        }

    @property
    def averages_parameters(self) -> bool:
        """Whether parameters, not gradients, are averaged (``sync.mode`` partial or
        local SGD)."""
        return self.sync.mode != "full"

    @property
    def stateful(self) -> bool:
        """Whether each worker keeps state that training must save (residuals, velocities)."""
        return self.encoded and (self.allreduce.residual or self.techniques.momentum_correction)

    @property
    def survives_resets(self) -> bool:
        """Whether an elastic run can carry it across a change of its workers: gradients
        averaged every update, not in fp16 (whose clip depends on the number of workers)."""
        return not self.averages_parameters and self.codec.survives_resets

    @property
    def fusion_bytes(self) -> int:
        """``allreduce.fusion_threshold_mb`` in bytes: Horovod's tensor fusion threshold
        (``HOROVOD_FUSION_THRESHOLD``), the encoded modes' buckets and the partitions of
        partial synchronisation."""
        return int(self.allreduce.fusion_threshold_mb * 2**20)

    @property
    def norms_from_dense(self) -> bool:
        """Whether trust ratios take the dense gradients' norms: asked (``dense_norm``), or
        under momentum correction, where the update applied is a velocity about ``1 / (1 - m)``
        times the gradient, whose norm would cancel the momentum."""
        return self.allreduce.dense_norm or self.techniques.momentum_correction

    def check_optimizer(self, name: str, params: Mapping[str, Any]) -> None:
        """Check that a config's optimizer ``name`` with ``params``, not built, can do what this
        asks of it (:meth:`take_momentum`'s rules, asked of :mod:`toolkit.optimizer_rules`
        without TensorFlow). Raises :class:`~toolkit.errors.ConfigError` naming the field and
        the optimizer."""
        self._check_capable(
            name,
            applies_trust_ratios=optimizer_rules.applies_trust_ratios(name, params),
            hands_momentum_over=name in optimizer_rules.HANDS_MOMENTUM_OVER,
        )
        if not self.techniques.momentum_correction:
            return
        full = {**OPTIMIZERS.parameters(name), **params}
        why = optimizer_rules.momentum_refusals(
            full["momentum"], full.get("nesterov", False), full.get("dampening", 0.0)
        )
        if why:
            raise _momentum_refused(
                f"momentum correction needs {' and '.join(why)}",
                f"optimizer {name!r} with params {dict(params)}",
            )

    def take_momentum(self, optimizer: Any, name: str) -> Any:
        """Check that the built ``optimizer`` (called ``name``) can do what this asks of it,
        and under momentum correction take its momentum into the allreduce (returned;
        ``None`` otherwise). Momentum correction needs an optimizer that can hand its
        momentum over (the toolkit's SGD, LARS or LBSGD, with momentum, no Nesterov, no
        dampening, not built); ``dense_norm`` one that applies trust ratios. Raises
        :class:`~toolkit.errors.ConfigError` naming the field and the optimizer."""
        self._check_capable(
            name,
            applies_trust_ratios=getattr(optimizer, "applies_trust_ratios", False),
            hands_momentum_over=hasattr(optimizer, "take_momentum"),
        )
        if not self.techniques.momentum_correction:
            return None
        try:
            return optimizer.take_momentum()
        except ValueError as error:
            raise _momentum_refused(str(error), repr(name)) from None

    def _check_capable(
        self, name: str, *, applies_trust_ratios: bool, hands_momentum_over: bool
    ) -> None:
        if self.allreduce.dense_norm and not applies_trust_ratios:
            raise ConfigError(
                "allreduce.dense_norm replaces the gradient norm of trust ratios: it needs "
                f"optimizer.name {optimizer_rules.TRUST_RATIOS_WORDS} (got {name!r})"
            )
        if self.techniques.momentum_correction and not hands_momentum_over:
            raise ConfigError(
                "allreduce.momentum_correction moves the optimizer's momentum into the "
                f"allreduce: it needs optimizer.name {optimizer_rules.MOMENTUM_WORDS} (got "
                f"{name!r}), {optimizer_rules.MOMENTUM_CLASSES}"
            )

    def summary(self) -> str:
        """What goes on the wire, in a line: ``topk 1% (float16 values), DGC: momentum
        correction, masking, local clip 5, warm-up 4 epochs, 1-D dense``."""
        allreduce = self.allreduce
        words = self.codec.describe(allreduce)
        if allreduce.value_dtype != "float32":
            words += f", {allreduce.value_dtype} values"
        if self.encoded and not allreduce.residual:
            words += ", no residual"
        techniques = self.techniques.words() + ["LARS dense norm"] * allreduce.dense_norm
        return f"{words}; DGC: {', '.join(techniques)}" if techniques else words


def _momentum_refused(why: str, got: str) -> ConfigError:
    return ConfigError(f"allreduce.momentum_correction: {why} (got {got})")
