"""The experiment config's sections, one pydantic model each (the dataset, model, optimizer,
schedule, batch, scaling, logging, allreduce, sync, elastic, Slurm and checkpoint sections),
with the rules that stay inside a section; :mod:`toolkit.config` puts them together into
:class:`~toolkit.config.ExperimentConfig` and reads configs from files.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from toolkit import optimizer_rules
from toolkit.catalog import (
    DATASETS,
    MODELS,
    OPTIMIZERS,
    SCHEDULE_INPUTS,
    SCHEDULES,
    train_examples,
)
from toolkit.codecs import DENSE, ENCODED, MODES, SPARSE, VALUE_DTYPES, Codec
from toolkit.codecs import of as codec_of
from toolkit.dgc import NAMES as TECHNIQUES
from toolkit.dgc import Techniques
from toolkit.errors import ConfigError
from toolkit.registry import Registry

MAX_WORKERS = 65_536  # far beyond any cluster this lab will see; more is a typo
RUN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def run_name_problem(name: object) -> str | None:
    """Why ``name`` may not name a run (and its directory), or ``None`` if it may: it must
    match :data:`RUN_NAME` and not start with a dot, so it is never ``.``, ``..`` or a hidden
    name (staging directories are hidden)."""
    if not isinstance(name, str) or not RUN_NAME.match(name):
        return f"must match {RUN_NAME.pattern}"
    return "must not start with '.'" if name.startswith(".") else None


SLURM_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
SLURM_TIME = r"^([0-9]+-[0-9]{1,2}(:[0-9]{2}){0,2}|[0-9]+(:[0-9]{2}){0,2})$"
SBATCH_ARG = r"^--[a-z][a-z-]*(=[^\x00-\x1f]{1,512})?$"


def _check_component(
    info: ValidationInfo, registry: Registry, component: Component, reserved: tuple[str, ...]
) -> bool:
    """Check ``component``'s name against ``registry`` and its parameters against the table
    (:mod:`toolkit.catalog`, without importing the constructor). A config read back from a
    run directory (``stored``) was checked when its run was created, so readers such as the
    dashboard skip both. Returns whether the parameters were checked."""
    context = info.context or {}
    if context.get("stored"):
        return False
    registry.check_name(component.name)
    taken = sorted(set(component.params) & set(reserved))
    if taken:
        raise ValueError(f"{', '.join(map(repr, taken))} is set by the experiment, not in params")
    registry.check_params(component.name, component.params, supplied=reserved)
    return True


def _finite(value: Any, path: str = "") -> Any:
    """``value`` if no float in it (at any depth) is NaN or infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path or 'value'} must be a finite number (got {value})")
    if isinstance(value, dict):
        for key, item in value.items():
            _finite(item, f"{path}.{key}" if path else repr(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _finite(item, f"{path}[{index}]")
    return value


Params = Annotated[dict[str, Any], AfterValidator(_finite)]
"""Constructor parameters: any YAML values, but no NaN or infinity anywhere in them."""


class Section(BaseModel):
    """A config section: unknown fields, non-finite floats and booleans given for numbers (YAML's
    ``true`` would otherwise be taken as 1) are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and cls.model_fields[info.field_name].annotation not in (
            bool,
            bool | None,
        ):
            raise ValueError("Input should not be a boolean")
        return value


class Component(Section):
    """A registry entry: ``name`` and constructor ``params``."""

    name: str
    params: Params = Field(default_factory=dict)


class DatasetConfig(Component):
    name: str = "mnist1d"

    @model_validator(mode="after")
    def _known(self, info: ValidationInfo):
        _check_component(info, DATASETS, self, reserved=("seed",))
        return self

    def train_examples(self) -> int:
        """How many training examples it has, without loading it
        (:func:`toolkit.catalog.train_examples`; ``ValueError`` for a size parameter its
        loader would refuse)."""
        return train_examples(self.name, self.params)


class ModelConfig(Component):
    name: str = "cnn1d"

    @model_validator(mode="after")
    def _known(self, info: ValidationInfo):
        _check_component(info, MODELS, self, reserved=("input_shape", "num_classes", "seed"))
        return self


class OptimizerConfig(Component):
    """The optimizer; ``learning_rate`` is the base rate before scaling and scheduling."""

    name: str = "sgd"
    learning_rate: float = Field(0.1, gt=0)

    @model_validator(mode="after")
    def _buildable(self, info: ValidationInfo):
        """Its constructor would take the parameters: :func:`toolkit.optimizer_rules.check`
        says so without building it (without TensorFlow)."""
        if _check_component(info, OPTIMIZERS, self, reserved=("learning_rate",)):
            optimizer_rules.check(self.name, self.params)
        return self

    def applies_trust_ratios(self) -> bool:
        """Whether the built optimizer applies per-layer trust ratios (a run logs them)."""
        return optimizer_rules.applies_trust_ratios(self.name, self.params)

    def accumulated_batches(self) -> int | None:
        """The batches the built optimizer sums itself per update (``None``: it leaves
        accumulation to ``batch.accumulation``)."""
        return optimizer_rules.accumulated_batches(self.name, self.params)


class WarmupConfig(Section):
    """Goyal et al.'s gradual warmup in front of the schedule (0 epochs: none). It starts at
    ``initial_multiplier`` times the scaled rate or, with ``from_unscaled``, at the unscaled
    rate ``optimizer.learning_rate`` (Goyal et al.: ``initial_multiplier`` is then
    ``min(1, 1 / scaling factor)``, whatever the batch), and ramps to the scaled rate."""

    epochs: float = Field(0.0, ge=0)
    strategy: Literal["linear", "power2", "sqrt"] = "linear"
    initial_multiplier: float = Field(0.0, ge=0, le=1)
    from_unscaled: bool = Field(False, description="start at the unscaled learning rate")

    @model_validator(mode="after")
    def _one_start(self):
        if self.from_unscaled and self.initial_multiplier:
            raise ValueError(
                "give initial_multiplier or from_unscaled, not both: from_unscaled sets the "
                "multiplier to the unscaled rate's "
                f"(got initial_multiplier={self.initial_multiplier})"
            )
        return self


class ScheduleConfig(Component):
    """The learning-rate schedule: ``name`` is one of :data:`toolkit.catalog.SCHEDULES`, whose
    builder (in :mod:`toolkit.optimizers.schedules`) says what ``params`` it takes (lengths in
    epochs); the base rate is always the scaled learning rate, and ``warmup`` comes in front."""

    name: Literal[tuple(SCHEDULES)] = "constant"
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)

    @model_validator(mode="after")
    def _known(self, info: ValidationInfo):
        _check_component(info, SCHEDULES, self, reserved=SCHEDULE_INPUTS)
        return self


class AdaptiveBatchConfig(Section):
    """An adaptive global batch (:mod:`toolkit.scaling.adaptive_batch`): it starts at ``min`` and,
    at the start of every ``every_epochs``-th epoch, moves towards ``aim`` times the measured
    ``B_simple`` (the power of two nearest it, or with ``hysteresis`` only once it is well past
    the midpoint), within ``[min, max]`` and at most 2x from the last. Both are powers of two;
    each worker's batch per step stays ``batch.per_worker``, and local accumulation makes up
    the rest."""

    min: int = Field(ge=1, description="the first and smallest global batch (a power of two)")
    max: int = Field(ge=1, description="the largest global batch (a power of two)")
    every_epochs: int = Field(1, ge=1, description="epochs between two decisions")
    aim: float = Field(
        1.0,
        gt=0,
        description="the batch aims at aim x B_simple (1: the noise scale; the task's "
        "B_crit/B_simple, which calibrate prints: the critical batch)",
    )
    hysteresis: float = Field(
        0.0,
        ge=0,
        le=1,
        description="how far past the midpoint to the next power of two the aim must go "
        "before the batch moves (0: the nearest power; 1: only once it reaches it)",
    )

    @field_validator("min", "max")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"Input should be a power of two, got {value}")
        return value

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min={self.min} must be at most max={self.max}")
        return self


class BatchConfig(Section):
    """Batch sizes. ``global_size``, if set, fixes the global batch whatever the number of
    workers (``per_worker`` is then derived), so a config gives the same run on 1 or N workers.
    ``adaptive``, if set, lets the global batch follow the noise scale (then ``per_worker`` is
    the batch of a step, and the accumulation is the adaptive batch's)."""

    per_worker: int = Field(32, ge=1, description="examples per worker per step")
    accumulation: int = Field(1, ge=1, description="local steps summed before one allreduce")
    global_size: int | None = Field(None, ge=1, description="fixed global batch (optional)")
    adaptive: AdaptiveBatchConfig | None = None


class ScalingConfig(Section):
    """How the learning rate, tuned at ``base_batch``, follows the global batch. ``linear``:
    Goyal et al.'s rule, ``lr * global_batch / base_batch``; ``sqrt``:
    ``lr * sqrt(global_batch / base_batch)`` (Krizhevsky 2014; often better for LARS);
    ``adascale`` (:mod:`toolkit.scaling.adascale`): ``lr`` times a gain in ``[1, global_batch /
    base_batch]`` measured every update from the gradient noise, the schedule read on AdaScale's
    clock ``τ``; ``epochs`` are then the base run's (at ``base_batch``), and the run ends when
    ``τ`` has done them, after as many epochs of its own as the gain makes it."""

    rule: Literal["none", "linear", "sqrt", "adascale"] = "none"
    base_batch: int = Field(256, ge=1)


TRACKING_URI = re.compile(
    r"^(https?://\S+|(sqlite|postgresql|mysql|mssql)(\+\w+)?://\S*|databricks\S*)$"
)


class MlflowConfig(Section):
    """Rank 0 logs the run to MLflow as it trains (:mod:`toolkit.runs.mlflow_live`): the same
    MLflow run, names and values ``python -m toolkit export mlflow`` gives. A tracking server
    that is down neither stops nor slows training: the events stay the truth on disk, and an
    export catches MLflow up later."""

    tracking_uri: str | None = Field(
        None,
        description="an MLflow server (http://host:5000) or database URI (default: a SQLite "
        "file under the runs root, .mlflow/mlflow.db)",
    )
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="the MLflow experiment's name (default: the config's name)",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str | None) -> str | None:
        if value is not None and not TRACKING_URI.match(value):
            raise ValueError(
                "must be an MLflow server (http://host:5000, https://...) or a database URI "
                "(sqlite:///path/mlflow.db, postgresql://..., mysql://..., databricks)"
            )
        return value


class LoggingConfig(Section):
    """Event intervals. The gradient noise scale (``gns`` events) is measured every
    ``noise_scale_every_steps`` optimizer updates (0: off): in the allreduce hook with more than
    one worker (nearly free), from two halves of an extra batch with one worker (one extra
    forward and backward pass per measurement; ``noise_scale_batch`` examples, by default a
    step's). ``auto``: every 25 updates in the allreduce hook, every 100 with one worker
    (:data:`toolkit.plan.NOISE_SCALE_AUTO`)."""

    every_steps: int = Field(10, ge=1, description="train event interval")
    trust_ratio_every_steps: int = Field(50, ge=1, description="LARS/LBSGD-lars ratio interval")
    noise_scale_every_steps: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="gradient noise scale interval in updates (0: off; auto: 25 with several "
        "workers, 100 with one)",
    )
    noise_scale_smoothing: float = Field(
        0.95, ge=0, lt=1, description="EMA decay of the noise scale's |G|² and tr(Σ)"
    )
    noise_scale_batch: int | None = Field(
        None,
        ge=2,
        description="one worker: the extra batch the noise scale (and AdaScale's gain) is "
        "measured on, as two halves (default: batch.per_worker; larger: less noise, more cost)",
    )
    system_every_events: int = Field(
        5, ge=0, description="workers' CPU, memory and GPU: the first and every n-th train event"
    )
    mlflow: MlflowConfig | None = Field(
        None, description="log to MLflow as the run trains (mlflow: {} for the local default)"
    )

    @field_validator("noise_scale_every_steps", mode="before")
    @classmethod
    def _auto_or_count(cls, value: Any) -> Any:
        """One message for both kinds of value, not one per branch of the union."""
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value == "auto" or (whole and value >= 0):
            return value
        raise ValueError("Input should be 'auto' or an integer >= 0 (0: off)")


class AllreduceConfig(Section):
    """What the gradient allreduce sends (:mod:`toolkit.parallel.compression`): ``none`` (float32),
    ``fp16`` (clipped before the cast), SINGA's sparsified modes, ``topk`` (the fraction
    ``ratio`` of entries of largest magnitude; with ``topk_sample``, about that many, the cut
    estimated from a sample as DGC does) and ``threshold`` (entries with
    ``|g| >= threshold``), per bucket of ``fusion_threshold_mb``, or MXNet's ``2bit``
    (``±threshold`` or 0, two bits an entry), each with or without the ``residual`` (error
    feedback). ``fusion_threshold_mb`` is also Horovod's tensor fusion threshold
    (``HOROVOD_FUSION_THRESHOLD``, set by training before Horovod starts).

    Deep Gradient Compression's techniques, for the encoded modes: ``dgc: true`` turns on
    every one not given (``momentum_correction``, ``momentum_masking``, ``local_clipnorm``,
    ``sparsity_warmup_epochs``, ``dense_1d``); ``false``/``0`` turns one off. ``dense_norm``:
    LARS's trust ratio from the dense gradients' norms."""

    compression: Literal[MODES] = DENSE.name
    ratio: float = Field(0.01, gt=0, le=1, description="topk: fraction of entries sent")
    topk_sample: float = Field(
        0.0, ge=0, lt=1, description="topk: k-th magnitude from this sample (0: exact top-k)"
    )
    threshold: float = Field(
        1e-3, gt=0, description="threshold: smallest |g| sent; 2bit: the value sent"
    )
    residual: bool = Field(True, description="topk/threshold/2bit: keep what was not sent")
    value_dtype: Literal[VALUE_DTYPES] = Field(
        "float32", description="topk/threshold: the values' type on the wire"
    )
    fp16_clip: float | None = Field(
        None, gt=0, le=65504, description="fp16: clip before the cast (default 65504/workers)"
    )
    dgc: bool = Field(False, description="Deep Gradient Compression's techniques, all on")
    momentum_correction: bool | None = Field(
        None, description="DGC: the optimizer's momentum accumulates in the residual"
    )
    momentum_masking: bool | None = Field(
        None, description="DGC: clear the momentum of the entries sent"
    )
    local_clipnorm: float | None = Field(
        None, ge=0, description="DGC: each worker clips its gradient to this / sqrt(workers)"
    )
    sparsity_warmup_epochs: int | None = Field(
        None, ge=0, description="DGC, topk: epochs of ratio ** ((e + 1) / (W + 1))"
    )
    dense_1d: bool | None = Field(None, description="1-D variables skip the compression")
    dense_norm: bool = Field(False, description="LARS: trust ratio from the dense norm")
    fusion_threshold_mb: float = Field(64.0, gt=0, description="fusion and bucket size (MB)")

    @model_validator(mode="after")
    def _options_fit_the_mode(self):
        check_encoding(self)
        return self

    @property
    def codec(self) -> Codec:
        """What ``compression`` sends (:mod:`toolkit.codecs`)."""
        return codec_of(self.compression)


def check_encoding(allreduce: AllreduceConfig) -> None:
    """Raise :class:`~toolkit.errors.ConfigError` if the ``allreduce:`` section's options do not
    fit its mode: each
    option names the modes it serves, and the option it builds on."""
    mode, codec = allreduce.compression, codec_of(allreduce.compression)
    on = Techniques.of(allreduce)
    asked = [name for name in ("dgc", "dense_norm") if getattr(allreduce, name)]
    asked += [name for name in TECHNIQUES if getattr(on, name) and name not in asked]
    if not codec.encoded and asked:
        raise ConfigError(
            f"allreduce.{asked[0]} needs allreduce.compression one of {ENCODED} (got "
            f"{mode!r}): DGC's techniques and the dense norm act on a compressed mode"
        )
    refusals = (
        (
            allreduce.value_dtype != "float32" and not codec.sparse,
            f"allreduce.value_dtype={allreduce.value_dtype!r} needs allreduce.compression "
            f"{' or '.join(SPARSE)} (got {mode!r})",
        ),
        (
            on.sparsity_warmup_epochs and not codec.warms_up,
            "allreduce.sparsity_warmup_epochs warms topk's ratio up: it needs "
            f"allreduce.compression topk (got {mode!r})",
        ),
        (
            on.momentum_masking and not on.momentum_correction,
            "allreduce.momentum_masking clears the velocity that momentum correction keeps: it "
            "needs allreduce.momentum_correction",
        ),
        (
            on.momentum_correction and not allreduce.residual,
            "allreduce.momentum_correction accumulates the velocity in the residual: it needs "
            "allreduce.residual true",
        ),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(message)


SYNC_MODES = ("full", "partial", "local_sgd")


class SyncConfig(Section):
    """What is averaged over the workers (:mod:`toolkit.parallel.sync`): ``full``, the gradients of
    every update (allreduce); ``partial`` (SINGA), each worker updates locally and every ``period``
    updates the next partition of the parameters (``allreduce.fusion_threshold_mb`` each) is
    averaged; ``local_sgd`` (Lin et al. 2020), all parameters every ``period`` updates."""

    mode: Literal[SYNC_MODES] = "full"
    period: int = Field(1, ge=1, description="partial/local_sgd: updates between averagings")


class ElasticConfig(Section):
    """Elastic training (Horovod's ``--min-np/--max-np/--host-discovery-script``): workers may
    leave and join while the run trains, between ``min_workers`` and ``max_workers``.

    ``discovery`` is the path of a hosts file of ``host:slots`` lines, which the run re-reads
    every second (edit it to add or remove hosts), or of an executable script that prints such
    lines, as Horovod's discovery script does. The global batch stays ``batch.global_size``
    whatever the number of workers (their per-worker batch changes), so it must divide evenly
    for every world size in the range: nothing is rounded. The state (weights, optimizer, noise
    smoother, residuals, the position in the epoch) is committed in memory every
    ``commit_every_steps`` steps and at each epoch's end; a lost worker costs the steps since
    the last commit. With fewer than ``min_workers`` for ``timeout_s`` seconds the run fails,
    and can be resumed from its last checkpoint. A host whose worker failed may come back
    after ``cooldown_s`` seconds (Horovod doubles it, with jitter, at each failure; 0: never).
    A host that vanishes (a cut link, no power) resets no connection: the others learn of it
    when a collective has waited the config's ``lost_worker_after_s``."""

    min_workers: int = Field(1, ge=1, le=MAX_WORKERS, description="fewest workers to train with")
    max_workers: int = Field(2, ge=1, le=MAX_WORKERS, description="most workers to train with")
    discovery: str = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^[^\x00-\x1f]+$",
        description="hosts file (host:slots lines) or executable discovery script",
    )
    commit_every_steps: int = Field(50, ge=1, description="steps between in-memory commits")
    timeout_s: int = Field(600, ge=1, description="wait this long for min_workers, then fail")
    cooldown_s: int = Field(
        10, ge=0, le=3600, description="a failed host may rejoin after this (0: never)"
    )

    @model_validator(mode="after")
    def _range(self):
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers={self.min_workers} is above max_workers={self.max_workers}"
            )
        return self


class SlurmConfig(Section):
    """Run as a Slurm job (:mod:`toolkit.launching.slurm`): ``workers`` ranks, one Slurm task
    each, on ``nodes`` nodes (Slurm's placement when unset) of ``partition`` (the cluster's
    default when unset), under ``account``, with ``time`` as the job's limit (Slurm's formats:
    ``minutes``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) and ``gpus_per_task`` GPUs per
    rank. ``signal_before_end_s`` seconds before the limit (or a preemption), Slurm signals the
    job: the workers checkpoint where they are and the job is requeued, to go on from there.
    ``sbatch_args``: further ``sbatch`` options, written into the job script as given."""

    nodes: int | None = Field(None, ge=1, le=MAX_WORKERS, description="nodes (default: Slurm's)")
    partition: str | None = Field(None, pattern=SLURM_NAME, description="partition")
    account: str | None = Field(None, pattern=SLURM_NAME, description="account to charge")
    time: str | None = Field(None, pattern=SLURM_TIME, description="time limit, e.g. 2:00:00")
    gpus_per_task: int | None = Field(None, ge=1, le=64, description="GPUs per rank")
    signal_before_end_s: int = Field(
        120, ge=60, le=65535, description="checkpoint this long before the time limit"
    )
    sbatch_args: list[Annotated[str, Field(pattern=SBATCH_ARG)]] = Field(
        default_factory=list, description="further sbatch options, e.g. --qos=long"
    )

    @field_validator("time", mode="before")
    @classmethod
    def _quoted_time(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(
                "give the time limit as a quoted string, e.g. '4:00:00' or '90' (minutes): "
                "YAML reads an unquoted 4:00:00 or 90 as a number"
            )
        return value


class CheckpointConfig(Section):
    every_epochs: int = Field(1, ge=1)
