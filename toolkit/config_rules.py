"""The rules that span a config's sections: which batch, scaling, optimizer, synchronisation,
elastic, Slurm and host settings go together, and which of them the chosen Keras backend runs.

The schema runs :func:`check` on every config it validates (:mod:`toolkit.config`), so a config
that breaks a rule is refused, naming the fields, before any process starts; the launcher and
``train`` run :func:`check_backend` for the backend the workers get. The arithmetic these rules
ask is the plan's (:mod:`toolkit.plan`).
"""

from __future__ import annotations

import math

from toolkit import backends, catalog, codecs, host_list, optimizer_rules, safe_yaml
from toolkit.errors import ConfigError
from toolkit.experiment import Experiment
from toolkit.plan import Scale, batches_per_update, world_sizes


def check(config: Experiment) -> None:
    """Raise ``ValueError`` (a :class:`~toolkit.errors.ConfigError`) for the first rule
    spanning sections that ``config`` breaks; its message names the fields and what they
    need. The schema runs it on every config it validates (:mod:`toolkit.config`)."""
    for rule in (
        _model_reads_the_dataset,
        _one_accumulation,
        _adaptive_fits,
        _averaging_fits,
        _global_size_divides,
        _elastic_fits,
        _slurm_fits,
        _adascale_fits,
        _noise_batch_fits,
        _enough_slots,
    ):
        rule(config)


def check_backend(config: Experiment, backend: str) -> None:
    """Raise :class:`~toolkit.errors.ConfigError`, naming the field, ``backend`` and why, where
    ``config`` needs what that backend does not run: its
    :meth:`~toolkit.backends.base.Backend.check`, which the distributed optimizer asks too.
    Checked before anything starts: by the launcher, for the backend its workers will get
    (:func:`toolkit.backends.requested`), and by ``train``."""
    backends.of(backend).check(
        **config.communication().backend_needs,
        elastic=config.elastic is not None,
        adaptive_batch=config.batch.adaptive is not None,
        adascale=config.lr_scaling.rule == "adascale",
    )


def _refuse_first(what: str, refusals) -> None:
    """Raise ``ConfigError("<what> needs <why>")`` for the first ``(refused, why)`` that is."""
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"{what} needs {why}")


def _model_reads_the_dataset(config: Experiment) -> None:
    """Token ids go to a model that embeds them, with room for every token, or one that reads
    any input flat; a model that embeds token ids takes nothing else (:mod:`toolkit.catalog`)."""
    model, dataset = config.model.name, config.dataset.name
    readers = [*catalog.TOKEN_MODELS, *catalog.FLAT_MODELS]
    if model in catalog.TOKEN_MODELS and dataset not in catalog.TOKEN_DATASETS:
        raise ConfigError(
            f"model.name={model!r} embeds token ids: it needs dataset.name one of "
            f"{list(catalog.TOKEN_DATASETS)} (got {dataset!r})"
        )
    if dataset in catalog.TOKEN_DATASETS and model not in readers:
        raise ConfigError(
            f"dataset.name={dataset!r} gives token ids: it needs model.name one of {readers} "
            f"(got {model!r})"
        )
    if model in catalog.TOKEN_MODELS:
        embeds = {**catalog.MODELS.parameters(model), **config.model.params}["tokens"]
        gives = {**catalog.DATASETS.parameters(dataset), **config.dataset.params}["tokens"]
        if embeds < gives:
            raise ConfigError(
                f"model.params.tokens={embeds} embeds fewer tokens than dataset.params.tokens="
                f"{gives} gives: it needs at least {gives}"
            )


def _noise_batch_fits(config: Experiment) -> None:
    """The extra batch is one worker's way to measure the noise; several workers measure it
    in the allreduce, between their own batches."""
    if config.logging.noise_scale_batch is None:
        return
    _refuse_first(
        "logging.noise_scale_batch",
        (
            (
                config.workers > 1 or config.elastic is not None,
                f"workers 1 and no elastic section (got workers {config.workers}): several "
                "workers measure the noise scale in the allreduce, at their own batches",
            ),
        ),
    )


def _one_accumulation(config: Experiment) -> None:
    name = config.optimizer.name
    if name in optimizer_rules.ACCUMULATES_WITH and config.batch.accumulation > 1:
        field = optimizer_rules.ACCUMULATES_WITH[name]
        raise ConfigError(f"batch.accumulation must be 1 with {name}: use optimizer.params.{field}")


def _adaptive_fits(config: Experiment) -> None:
    """An adaptive batch grows by local accumulation of ``batch.per_worker`` steps, with
    AdaScale's rate, in float32 (see :class:`~toolkit.config.AdaptiveBatchConfig`)."""
    adaptive, batch = config.batch.adaptive, config.batch
    if adaptive is None:
        return
    step_batch = batch.per_worker * config.workers
    rule = config.lr_scaling.rule
    _refuse_first(
        "batch.adaptive",
        (
            (
                rule != "adascale",
                f"lr_scaling.rule='adascale' (got {rule!r}): the learning rate follows the "
                "batch by AdaScale's gain",
            ),
            (
                batch.accumulation != 1 or batch.global_size is not None,
                f"batch.accumulation 1 and no batch.global_size (got {batch.accumulation}, "
                f"{batch.global_size}): the adaptive batch sets them, starting at "
                "batch.adaptive.min",
            ),
            (
                config.optimizer.accumulated_batches() is not None,
                f"an optimizer other than {config.optimizer.name}, whose "
                f"{optimizer_rules.ACCUMULATES_WITH.get(config.optimizer.name)} fixes the "
                "accumulation",
            ),
            (
                config.precision != "float32",
                f"precision='float32' (got {config.precision!r}): a step the loss scaler "
                "skips would leave an update short of its examples",
            ),
            (
                adaptive.min % step_batch,
                f"batch.adaptive.min={adaptive.min} to be a multiple of batch.per_worker x "
                f"workers = {step_batch}, the examples of one step",
            ),
        ),
    )


def _averaging_fits(config: Experiment) -> None:
    """The allreduce and sync options go together (:class:`~toolkit.communication.Communication`'s
    rules), and averaging parameters (``sync.mode`` partial or local SGD), which follows the
    optimizer's updates one for one, has one batch per update."""
    config.communication()
    mode = config.sync.mode
    own = config.optimizer.accumulated_batches() is not None
    if mode != "full" and (config.batch.accumulation > 1 or own):
        raise ConfigError(
            f"sync.mode={mode!r} needs one batch per update: batch.accumulation must be 1, "
            f"and the optimizer one that does not accumulate itself (got {config.optimizer.name})"
        )


def _global_size_divides(config: Experiment) -> None:
    Scale.of(config)


def _elastic_fits(config: Experiment) -> None:
    """An elastic run starts with ``workers`` in its range, keeps ``batch.global_size`` for
    every world size in it, and averages full-precision gradients every update."""
    elastic, global_size = config.elastic, config.batch.global_size
    if elastic is None:
        return
    if not elastic.min_workers <= config.workers <= elastic.max_workers:
        raise ConfigError(
            f"workers={config.workers} must lie in elastic.min_workers={elastic.min_workers} "
            f".. elastic.max_workers={elastic.max_workers}"
        )
    if global_size is None:
        raise ConfigError(
            "elastic: batch.global_size must be set, so that the global batch (and the "
            "learning rate) stay the same whatever the number of workers"
        )
    splits = {w: batches_per_update(config, w) for w in world_sizes(config)}
    if misfits := [w for w, n in splits.items() if global_size % n]:
        fits = math.lcm(*splits.values())
        raise ConfigError(
            f"elastic: batch.global_size={global_size} does not divide evenly among "
            f"{', '.join(map(str, misfits))} workers (x accumulation, "
            f"{optimizer_rules.own_accumulation_words()}); "
            f"a multiple of {fits} fits every world size from {elastic.min_workers} to "
            f"{elastic.max_workers}"
        )
    communication = config.communication()
    if config.precision != "float32" or not communication.survives_resets:
        raise ConfigError(
            "elastic: needs precision='float32', sync.mode='full' and an "
            f"allreduce.compression other than {codecs.FP16.name!r} (got "
            f"precision={config.precision!r}, sync.mode={config.sync.mode!r}, "
            f"allreduce.compression={config.allreduce.compression!r}): "
            "loss scaling, fp16 clipping per world size and local updates are not carried "
            "across a reset yet"
        )
    if config.hosts:
        raise ConfigError("elastic: give the hosts in elastic.discovery, not hosts")


SLURM_SIGNAL_SLACK_S = 60
"""How much earlier than ``--signal``'s time Slurm may send the signal (its event loop's
resolution, per ``sbatch``'s manual)."""


def _slurm_fits(config: Experiment) -> None:
    """A Slurm run's ranks go where Slurm places them: no host list, no elastic range (Slurm
    sizes the job once), and at most one node per rank."""
    slurm = config.slurm
    if slurm is None:
        return
    if config.hosts:
        raise ConfigError("slurm: Slurm places the ranks; give slurm.nodes, not hosts")
    if config.elastic is not None:
        raise ConfigError("slurm: an elastic run is not submitted to Slurm; remove elastic")
    if slurm.nodes is not None and slurm.nodes > config.workers:
        raise ConfigError(
            f"slurm.nodes={slurm.nodes} is more than workers={config.workers}: every node "
            "needs at least one rank"
        )
    lead = slurm.signal_before_end_s + SLURM_SIGNAL_SLACK_S
    if slurm.time is not None and slurm_seconds(slurm.time) <= lead:
        raise ConfigError(
            f"slurm.time={slurm.time!r} must be longer than slurm.signal_before_end_s="
            f"{slurm.signal_before_end_s} s plus {SLURM_SIGNAL_SLACK_S} s (Slurm may signal that "
            "much early): else the job is told to checkpoint as it starts"
        )


def slurm_seconds(limit: str) -> int:
    """A Slurm time limit in seconds: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S`` (``sbatch --time``'s formats, :data:`toolkit.config.SLURM_TIME`)."""
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-H[:M[:S]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:  # H:M:S
        hours, minutes, seconds = parts
    else:  # M or M:S
        hours, minutes, seconds = 0, parts[0], (parts[1:] or [0])[0]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def _adascale_fits(config: Experiment) -> None:
    """AdaScale measures the noise scale every update from the averaged gradient: it needs a
    global batch of at least its base batch, full synchronisation of dense gradients, a fixed
    number of workers and base-run epochs it can count."""
    if config.lr_scaling.rule != "adascale":
        return
    compression, mode = config.allreduce.compression, config.sync.mode
    _refuse_first(
        "lr_scaling.rule='adascale'",
        (
            (
                mode != "full",
                f"sync.mode='full' (got {mode!r}): the gain is measured on the averaged "
                "gradient of every update",
            ),
            (
                config.allreduce.codec.encoded,
                f"allreduce.compression {codecs.DENSE.name!r} or {codecs.FP16.name!r} (got "
                f"{compression!r}): measuring the "
                "noise every update would send the dense gradient anyway",
            ),
            (
                config.elastic is not None,
                "no elastic section: one worker of an elastic run has no second gradient to "
                "measure the noise with",
            ),
            (
                config.steps_per_epoch is not None,
                f"no steps_per_epoch cap (got {config.steps_per_epoch}): epochs count the base "
                "run's, at lr_scaling.base_batch",
            ),
        ),
    )
    scale = Scale.of(config)
    if scale.global_batch < config.lr_scaling.base_batch:
        raise ConfigError(
            f"lr_scaling.rule='adascale' needs the global batch ({scale.global_batch}) at least "
            f"lr_scaling.base_batch={config.lr_scaling.base_batch}: its gain is at least 1"
        )
    if config.workers == 1 and Scale.of(config, 1).per_worker < 2:
        raise ConfigError(
            "lr_scaling.rule='adascale' with one worker measures the noise from two halves "
            "of a batch: batch.per_worker must be at least 2"
        )


def _enough_slots(config: Experiment) -> None:
    hosts = config.hosts
    if hosts and sum(host_list.parse(hosts).values()) < config.workers:
        raise ConfigError(
            f"hosts {safe_yaml.short(hosts)} have fewer slots than workers={config.workers}"
        )
