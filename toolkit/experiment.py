"""The experiment's fields: every section of a config (:mod:`toolkit.sections`) assembled, with
the rules of one field each. :class:`toolkit.config.ExperimentConfig` is this schema as a user
gives it, with the rules that span sections; those rules (:mod:`toolkit.config_rules`) and
the plan (:mod:`toolkit.plan`) read an :class:`Experiment`, so neither needs the config module
that calls them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_serializer, model_validator

from toolkit import plugins
from toolkit.communication import Communication
from toolkit.host_list import HOSTS
from toolkit.sections import (
    MAX_WORKERS,
    AllreduceConfig,
    BatchConfig,
    CheckpointConfig,
    DatasetConfig,
    ElasticConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ScalingConfig,
    ScheduleConfig,
    Section,
    SlurmConfig,
    SyncConfig,
    run_name_problem,
)

MAX_SEED = 2**32 - 1  # numpy's and Keras's seeds are unsigned 32-bit integers
MAX_EPOCHS = 100_000  # no real run meets it: over a thousand long ImageNet schedules (90 epochs)
LOST_WORKER_AFTER_S = 30  # Horovod's own default for Gloo's timeout; see ExperimentConfig


class Experiment(Section):
    """One experiment. ``workers``, ``hosts`` and the ssh fields are used by the launcher:
    ``ssh_port``, ``ssh_identity_file`` and ``network_interface`` are horovodrun's ``-p``,
    ``-i`` and ``--network-interfaces``, and pre-flight, ``stop`` and ``status`` reach the
    hosts with the same ssh options (:mod:`toolkit.launching.remote`).

    ``lost_worker_after_s`` is how long the workers wait for a silent one (Gloo's timeout,
    ``HOROVOD_GLOO_TIMEOUT_SECONDS``) before the run fails, or, elastic, goes on without it. A
    slow step never trips it: Horovod's background thread answers while the step computes. It
    bounds how long a stopped or cut-off worker holds the others, and how much later than the
    first a worker may reach the rendezvous at the start. The default is Horovod's 30 s, three
    times a cold worker's start (its TensorFlow import, about 8 s here). Below 10 s the lab may
    not tell which worker went silent: it knows by their heartbeats, every 5 s."""

    name: str = "run"
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # The registered defaults are built unchecked: checking them would import TensorFlow.
    dataset: DatasetConfig = Field(default_factory=DatasetConfig.model_construct)
    model: ModelConfig = Field(default_factory=ModelConfig.model_construct)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig.model_construct)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig.model_construct)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    lr_scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    epochs: int = Field(10, ge=1, le=MAX_EPOCHS)
    steps_per_epoch: int | None = Field(None, ge=1, description="cap (throughput runs)")
    precision: Literal["float32", "mixed_float16"] = "float32"
    allreduce: AllreduceConfig = Field(default_factory=AllreduceConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    elastic: ElasticConfig | None = None
    slurm: SlurmConfig | None = None
    places: dict[str, Any] = Field(
        default_factory=dict, description="sections of places registered beside the built-in"
    )
    workers: int = Field(1, ge=1, le=MAX_WORKERS)
    hosts: str | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535, description="the hosts' ssh port")
    ssh_identity_file: str | None = Field(
        None, min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f]+$", description="ssh key"
    )
    network_interface: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*$",
        description="interfaces the workers talk over (default: those all hosts share)",
    )
    lost_worker_after_s: int = Field(
        LOST_WORKER_AFTER_S,
        ge=1,
        le=86_400,
        description="a worker silent this long in a collective is lost (Gloo's timeout)",
    )

    @model_validator(mode="before")
    @classmethod
    def _place_sections(cls, data: Any) -> Any:
        """A top-level section a registered executor declares (:data:`toolkit.plugins.SECTIONS`)
        is read into :attr:`places`; any other unknown field is refused as before."""
        if not isinstance(data, dict) or not set(data) - set(cls.model_fields):
            return data
        plugins.load()
        declared = {key: data[key] for key in data if key in plugins.SECTIONS}
        if not declared:
            return data
        rest = {key: value for key, value in data.items() if key not in declared}
        return {**rest, "places": {**(data.get("places") or {}), **declared}}

    @field_validator("places")
    @classmethod
    def _places(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(plugins.SECTIONS))
        if unknown:
            raise ValueError(f"{unknown[0]}: no registered executor declares this section")
        return {name: plugins.SECTIONS[name].model_validate(v) for name, v in value.items()}

    @model_serializer(mode="wrap")
    def _flat_places(self, handler) -> dict[str, Any]:
        """A place's section is written at the top level, as it was given."""
        data = handler(self)
        places = data.pop("places", None) or {}
        return {**data, **places}

    def section(self, name: str) -> Any:
        """The section ``name``, built-in (``slurm``) or a registered place's; ``None``: not
        given."""
        return getattr(self, name) if name in type(self).model_fields else self.places.get(name)

    @field_validator("name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        if problem := run_name_problem(value):
            raise ValueError(f"run names {problem}")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: str | None) -> str | None:
        if value is not None and not HOSTS.match(value):
            raise ValueError("hosts must be name:slots[,name:slots...], e.g. h1:2,h2:2")
        return value

    def communication(self) -> Communication:
        """The ``allreduce`` and ``sync`` sections as the one object training takes."""
        return Communication(self.allreduce, self.sync)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def flat(self) -> dict[str, Any]:
        """Every field by its dotted path (``optimizer.params.momentum``), in the config's
        order: numbers, booleans, text and ``None`` as they are, a list as its JSON text (a
        table's cell, a TensorBoard HParam); an empty section (``params: {}``) has none."""
        fields: dict[str, Any] = {}

        def walk(value: Any, path: str) -> None:
            if isinstance(value, dict):
                for key, inner in value.items():
                    walk(inner, f"{path}.{key}" if path else key)
            else:
                fields[path] = json.dumps(value) if isinstance(value, list) else value

        walk(self.model_dump(mode="json"), "")
        return fields
