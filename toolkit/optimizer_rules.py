"""The values each optimizer a config can name refuses, and what it can do, known without
TensorFlow: a config's optimizer is checked (:func:`check`) and asked what it can do
(:func:`applies_trust_ratios`, :func:`momentum_refusals`) before any process starts, without
building it.

The toolkit's optimizers (``toolkit/optimizers/``) refuse values by calling these functions
from their constructors and :meth:`take_momentum`, so each of their rules is written once.
Keras's own optimizers refuse values in Keras's constructors; :func:`check` restates those
refusals, and ``tests/test_catalog.py`` holds it to Keras, refusal for refusal. Values may be
schedules (callables) where a constructor is called from Python; a config gives numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from toolkit.catalog import OPTIMIZERS

RAMPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "linear": lambda progress: progress,
    "power2": lambda progress: progress**2,
    "sqrt": np.sqrt,
}
"""Goyal et al.'s warm-up ramps ``r(p)`` at progress ``p`` in [0, 1] (the schedule's ``Warmup``
and MXNet LBSGD's), in numpy; training's are Keras ops
(:func:`toolkit.optimizers.schedules.warmup_ramp`)."""
WARMUP_STRATEGIES = tuple(RAMPS)
LBSGD_STRATEGIES = (*WARMUP_STRATEGIES, "lars")
"""LBSGD's warm-ups: Goyal et al.'s three ramps (the schedule's own strategies) and LARS's
trust ratio."""
ACCUMULATES_WITH = {"lbsgd": "batch_scale"}
"""The optimizers that sum batches themselves before an update, and the parameter that says
how many (MXNet LBSGD's ``batch_scale``): their runs leave ``batch.accumulation`` at 1."""
HANDS_MOMENTUM_OVER = ("sgd", "lars", "lbsgd")
"""The optimizers that can hand their momentum to the allreduce (DGC's momentum correction):
the toolkit's, whose velocity is ``u = m * u + g``."""
MOMENTUM_WORDS = f"{', '.join(HANDS_MOMENTUM_OVER[:-1])} or {HANDS_MOMENTUM_OVER[-1]}"
MOMENTUM_CLASSES = "the toolkit's SGD, LARS or LBSGD"
"""The optimizers of :data:`HANDS_MOMENTUM_OVER`, by name in a config and by class."""
TRUST_RATIOS_WORDS = "lars, or lbsgd with warmup_strategy lars"
"""The optimizers that apply trust ratios (:func:`applies_trust_ratios`), in words."""


def non_negative(name: str, value: Any) -> Any:
    """``value`` as a float if it is a number >= 0 (as in PyTorch and SINGA); a schedule as it
    is; else ``ValueError``."""
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative float or a schedule, got {value!r}")
    return float(value)


def uses_momentum(momentum: Any) -> bool:
    """Whether a momentum (a number or a schedule) keeps a velocity: a schedule always does."""
    return callable(momentum) or momentum != 0.0


def check_sgd(momentum: Any, dampening: Any, nesterov: bool) -> None:
    """SGD's own rule (PyTorch's): Nesterov needs a momentum and no dampening."""
    if nesterov and (not uses_momentum(momentum) or dampening != 0.0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def check_lars(trust_coefficient: float, epsilon: float) -> None:
    if trust_coefficient <= 0:
        raise ValueError(f"`trust_coefficient` must be > 0, got {trust_coefficient}")
    if epsilon < 0:
        raise ValueError(f"`epsilon` must be >= 0, got {epsilon}")


def check_lbsgd(
    warmup_strategy: str,
    warmup_epochs: Any,
    updates_per_epoch: Any,
    batch_scale: Any,
    begin_epoch: Any,
    gradient_accumulation_steps: Any = None,
) -> None:
    """LBSGD's rules: a known warm-up, whole counts, and its own accumulation (``batch_scale``)
    in place of Keras's."""
    if gradient_accumulation_steps:
        raise ValueError(
            "LBSGD accumulates with `batch_scale`; do not pass `gradient_accumulation_steps`"
        )
    if warmup_strategy not in LBSGD_STRATEGIES:
        raise ValueError(
            f"`warmup_strategy` must be one of {LBSGD_STRATEGIES}, got {warmup_strategy!r}"
        )
    for arg, value, least in (
        ("warmup_epochs", warmup_epochs, 0),
        ("updates_per_epoch", updates_per_epoch, 1),
        ("batch_scale", batch_scale, 1),
        ("begin_epoch", begin_epoch, 0),
    ):
        if int(value) != value or value < least:
            raise ValueError(f"`{arg}` must be an integer >= {least}, got {value!r}")


def momentum_refusals(momentum: Any, nesterov: bool = False, dampening: Any = 0.0) -> list[str]:
    """Why a toolkit optimizer with these values cannot hand its momentum to the allreduce
    (its velocity would not be ``u = m * u + g``): each missing condition, in words."""
    refusals = (
        (not uses_momentum(momentum), "momentum > 0"),
        (nesterov, "nesterov off"),
        (dampening != 0.0, "dampening 0"),
    )
    return [reason for refused, reason in refusals if refused]


def ramp(strategy: str, progress: np.ndarray) -> np.ndarray:
    """Warm-up ramp ``strategy`` (:data:`RAMPS`) at ``progress``."""
    return RAMPS[strategy](progress)


def rate_multiplier(
    name: str, params: Mapping[str, Any], updates_per_epoch: int
) -> Callable[[np.ndarray], np.ndarray] | None:
    """The multiplier optimizer ``name`` puts on its learning rate itself, as a function of
    its 1-based update count (``None``: it puts none): MXNet LBSGD's warm-up, ``1 + (batch_scale
    - 1) r(p)`` over its ``warmup_epochs`` (its ``lars`` strategy is per layer, not one factor)."""
    if name != "lbsgd":
        return None
    p = {**OPTIMIZERS.parameters(name), "updates_per_epoch": updates_per_epoch, **params}
    total = p["warmup_epochs"] * p["updates_per_epoch"]
    if p["warmup_strategy"] == "lars":
        return np.ones_like
    if total <= 1:
        return lambda calls: np.full_like(calls, float(p["batch_scale"]))

    def multiplier(calls: np.ndarray) -> np.ndarray:
        progress = np.minimum((calls + p["begin_epoch"] * p["updates_per_epoch"]) / total, 1.0)
        return 1.0 + (p["batch_scale"] - 1.0) * ramp(p["warmup_strategy"], progress)

    return multiplier


def accumulated_batches(name: str, params: Mapping[str, Any]) -> int | None:
    """How many batches optimizer ``name`` with ``params`` sums itself per update (as the built
    optimizer's ``accumulates_batches`` says); ``None`` if it leaves that to the trainer."""
    field = ACCUMULATES_WITH.get(name)
    return None if field is None else int({**OPTIMIZERS.parameters(name), **params}[field])


def own_accumulation_words() -> str:
    """``x batch_scale for lbsgd``: the factor an optimizer's own accumulation puts on the
    batches of an update, for messages about dividing a global batch."""
    return ", ".join(f"x {field} for {name}" for name, field in ACCUMULATES_WITH.items())


def applies_trust_ratios(name: str, params: Mapping[str, Any]) -> bool:
    """Whether optimizer ``name`` with ``params`` applies per-layer trust ratios (LARS; LBSGD
    with the ``lars`` warm-up), as the built optimizer's ``applies_trust_ratios`` says."""
    full = {**OPTIMIZERS.parameters(name), **params}
    return name == "lars" or (name == "lbsgd" and full["warmup_strategy"] == "lars")


def _coupled(p: dict, *own: Callable[[dict], None]) -> None:
    for hyper in ("momentum", "weight_decay", "dampening"):
        if hyper in p:
            non_negative(hyper, p[hyper])
    for rule in own:
        rule(p)


def _keras_base(p: dict) -> None:
    """keras.optimizers.Optimizer's refusals (Keras 3.x, ``base_optimizer.py``)."""
    steps = p["gradient_accumulation_steps"]
    if steps and not steps >= 2:
        raise ValueError(f"`gradient_accumulation_steps` must be an integer >= 2, got {steps!r}")
    if p["use_ema"]:
        if not 0 <= p["ema_momentum"] <= 1:
            raise ValueError(f"`ema_momentum` must be in [0, 1], got {p['ema_momentum']!r}")
        every = p["ema_overwrite_frequency"]
        if every and (not isinstance(every, int) or every < 1):
            raise ValueError(f"`ema_overwrite_frequency` must be an integer >= 1, got {every!r}")
    clips = [k for k in ("clipnorm", "clipvalue", "global_clipnorm") if p[k] is not None]
    if len(clips) > 1:
        raise ValueError(f"only one of `clipnorm`, `clipvalue` and `global_clipnorm`, got {clips}")


def _keras_sgd(p: dict) -> None:
    if not 0 <= p["momentum"] <= 1:
        raise ValueError(f"`momentum` must be a float between [0, 1], got {p['momentum']!r}")


def _adamw(p: dict) -> None:
    if p["weight_decay"] is None:
        raise ValueError("AdamW needs a `weight_decay`, got None")


_OWN: dict[str, Callable[[dict], None]] = {
    "sgd": lambda p: _coupled(p, lambda p: check_sgd(p["momentum"], p["dampening"], p["nesterov"])),
    "lars": lambda p: _coupled(p, lambda p: check_lars(p["trust_coefficient"], p["epsilon"])),
    "lbsgd": lambda p: _coupled(
        p,
        lambda p: check_lbsgd(
            p["warmup_strategy"],
            p["warmup_epochs"],
            p["updates_per_epoch"],
            p["batch_scale"],
            p["begin_epoch"],
            p["gradient_accumulation_steps"],
        ),
    ),
    "keras_sgd": _keras_sgd,
    "adamw": _adamw,
}


def check(name: str, params: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` if optimizer ``name`` (a catalog name) would refuse ``params``
    (the rest at their defaults) when built: a value of the wrong kind, or one its constructor
    refuses. Imports nothing."""
    OPTIMIZERS.check_params(name, params)
    full = {**OPTIMIZERS.parameters(name), **params}
    try:
        _OWN.get(name, lambda p: None)(full)
        _keras_base(full)
    except TypeError as error:  # a comparison with a value of no order (None, a list)
        OPTIMIZERS.check_kinds(name, params, because=f" ({error})")
        raise ValueError(f"optimizer {name!r}: a parameter has the wrong type ({error})") from None
    OPTIMIZERS.check_kinds(name, params)  # what Keras takes now and fails on in training
