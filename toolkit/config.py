"""The experiment config: one pydantic schema, loaded from YAML or built in Python.

Everything a run needs is here and validated before any process starts: a bad value raises
:class:`ConfigError`, whose message names the field, the value and what is allowed. Dotted
overrides (``optimizer.params.momentum=0.95``) are applied to the raw mapping first, so they are
validated like the file. :func:`json_schema` gives the app its form.

The config is a schema: what a run means on ``W`` workers and ``n`` examples (the global
batch, the scaled rate, steps per epoch) is its plan (:mod:`toolkit.plan`), and the rules that
span sections are the plan's and the communication's (:mod:`toolkit.communication`), which the
schema runs on every config it validates.
"""

from __future__ import annotations

import copy
import difflib
import functools
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, ValidationInfo, model_validator

from toolkit import config_rules, optimizer_rules, safe_yaml
from toolkit.communication import Communication
from toolkit.errors import ConfigError
from toolkit.experiment import LOST_WORKER_AFTER_S as LOST_WORKER_AFTER_S
from toolkit.experiment import MAX_EPOCHS as MAX_EPOCHS
from toolkit.experiment import MAX_SEED as MAX_SEED
from toolkit.experiment import Experiment
from toolkit.sections import MAX_WORKERS as MAX_WORKERS
from toolkit.sections import AllreduceConfig, SyncConfig

MOVED = {  # old dotted path -> new, for configs written before the move
    "compression": "allreduce.compression",
    "elastic.lost_after_s": "lost_worker_after_s",
}


class ExperimentConfig(Experiment):
    """One experiment as a user gives it (see :class:`~toolkit.experiment.Experiment` for its
    fields): fields of earlier versions read from their old place, LBSGD's ``batch_scale:
    auto`` resolved, and the rules that span sections checked (:func:`_fits`)."""

    @model_validator(mode="before")
    @classmethod
    def _auto_batch_scale(cls, data: Any) -> Any:
        """LBSGD's ``batch_scale: auto`` is as many ``batch.per_worker`` batches per worker and
        update as make ``batch.global_size`` (so a device batch stays fixed as the global batch
        grows); it is resolved here, and the stored config holds the number."""
        try:
            optimizer, batch = data["optimizer"], data.get("batch") or {}
            field = optimizer_rules.ACCUMULATES_WITH.get(optimizer.get("name"))
            if field is None or optimizer["params"][field] != "auto":
                return data
        except (KeyError, TypeError, AttributeError):
            return data
        size, per_worker = batch.get("global_size"), batch.get("per_worker", 32)
        splits = per_worker * data.get("workers", 1) * batch.get("accumulation", 1)
        if not isinstance(size, int) or not isinstance(splits, int) or size % splits:
            raise ValueError(
                f"optimizer.params.{field}: 'auto' needs batch.global_size, a multiple of "
                f"batch.per_worker x workers (got global_size={size!r}, {splits!r} examples per "
                "step)"
            )
        params = {**optimizer["params"], field: size // splits}
        return {**data, "optimizer": {**optimizer, "params": params}}

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: Any) -> Any:
        """Fields of earlier configs (and stored runs) that live elsewhere now (:data:`MOVED`)
        are read from their old place; both places given and different is an error."""
        if not isinstance(data, dict):
            return data
        for old, new in MOVED.items():
            *section, leaf = old.split(".")
            parent = functools.reduce(lambda node, key: _get(node, key), section, data)
            if not isinstance(parent, dict) or leaf not in parent:
                continue
            data = copy.deepcopy(data)  # the caller's mapping stays as it was
            parent = functools.reduce(lambda node, key: node[key], section, data)
            value = parent.pop(leaf)
            given = functools.reduce(lambda node, key: _get(node, key), new.split("."), data)
            if given is None:
                set_path(data, new, value)
                continue
            if given != value:
                raise ValueError(
                    f"{old}={value!r} and {new}={given!r}: `{old}` moved to {new}; give it "
                    "there only"
                )
        return data

    @model_validator(mode="after")
    def _fits(self, info: ValidationInfo):
        """The rules spanning sections: which allreduce and sync options go together
        (:class:`~toolkit.communication.Communication`), which batch, scaling, elastic and
        host settings (:func:`toolkit.config_rules.check`), and what the allreduce asks of the
        optimizer (momentum to take, trust ratios)."""
        config_rules.check(self)
        if (info.context or {}).get("stored"):
            return self
        self.communication().check_optimizer(self.optimizer.name, self.optimizer.params)
        return self


def communication(*, sync: str = "full", period: int = 1, **allreduce) -> Communication:
    """The :class:`~toolkit.communication.Communication` of the ``allreduce:`` section's fields
    ``allreduce`` and the ``sync:`` section's ``sync`` (its mode) and ``period``: how Python
    says what the workers exchange (``communication(compression="topk", ratio=0.01,
    dgc=True)``), checked as a config's sections are. Raises :class:`ConfigError` naming each
    bad option."""
    try:
        return Communication(AllreduceConfig(**allreduce), SyncConfig(mode=sync, period=period))
    except ValidationError as error:
        raise ConfigError(format_errors(error, "options")) from None


def _get(node: Any, key: str) -> Any:
    """``node[key]`` where ``node`` is a mapping that has it, else ``None``."""
    return node.get(key) if isinstance(node, dict) else None


def set_dotted(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"override {safe_yaml.short(assignment)} must look like section.field=value"
        )
    name = f"override {safe_yaml.short(key.strip())}"
    try:
        value = safe_yaml.load(text, name)
    except safe_yaml.YamlLimitError as error:
        raise ConfigError(str(error)) from None
    except safe_yaml.YamlError as error:
        raise ConfigError(f"{error} (not a plain YAML value)") from None
    set_path(raw, key.strip(), value, name)


def set_path(raw: dict[str, Any], path: str, value: Any, what: str | None = None) -> None:
    """Set the dotted ``path`` (``optimizer.params.momentum``) of ``raw`` to ``value`` in place,
    making the sections on the way (a null section is made too); ``what`` names the change in
    errors."""
    *parents, leaf = path.split(".")
    node = raw
    for part in parents:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"{what or path}: {safe_yaml.short(part)} is not a section")
    node[leaf] = value


def from_mapping(
    raw: dict[str, Any], overrides: list[str] = (), *, stored: bool = False
) -> ExperimentConfig:
    """Validate a mapping (plus overrides); errors become one :class:`ConfigError`.
    ``stored``: read back from a run directory, so the registry checks are skipped."""
    raw = safe_yaml.load(yaml.safe_dump(raw or {}), "config")  # a deep copy of plain types
    for assignment in overrides:
        set_dotted(raw, assignment)
    # No check imports TensorFlow: names, parameters and values come from the catalog.
    try:
        config = ExperimentConfig.model_validate(raw, context={"stored": stored})
    except ValidationError as error:
        raise ConfigError(format_errors(error, root=ExperimentConfig)) from None
    return config


def load(path: str | Path, overrides: list[str] = (), *, stored: bool = False) -> ExperimentConfig:
    """Read a YAML experiment file and validate it with ``overrides`` applied (``stored``: as
    for :func:`from_mapping`)."""
    return from_raw(read_file(path), overrides, source=str(path), stored=stored)


def read_file(path: str | Path) -> Any:
    """The YAML document of an experiment file, not yet validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {safe_yaml.short(str(path))} does not exist")
    try:
        return safe_yaml.load_file(path)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot be read as text: {error}") from None
    except safe_yaml.YamlError as error:
        raise ConfigError(str(error)) from None


def from_yaml(
    text: str, overrides: list[str] = (), *, source: str = "config", stored: bool = False
) -> ExperimentConfig:
    """Validate a YAML document (``source`` names it in errors). A stored config (a run
    directory's) must not be empty: an empty file is a run that was never fully created, and
    reading it as the defaults would show a run that never was."""
    try:
        raw = safe_yaml.load(text, source)
    except safe_yaml.YamlError as error:
        raise ConfigError(str(error)) from None
    return from_raw(raw, overrides, source=source, stored=stored)


def from_raw(
    raw: Any, overrides: list[str] = (), *, source: str = "config", stored: bool = False
) -> ExperimentConfig:
    """Validate a loaded YAML document (see :func:`from_yaml`)."""
    if raw is None and stored:
        raise ConfigError(f"{source} is empty")
    if not isinstance(raw or {}, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return from_mapping(raw or {}, overrides, stored=stored)


def format_errors(
    error: ValidationError, what: str = "experiment config", root: type[BaseModel] | None = None
) -> str:
    """One line per bad field of ``what``: ``field.path: message (got value)``; given the
    ``root`` model, an unknown field adds the nearest known name of its section
    (``epochz: Extra inputs are not permitted (got 3); did you mean epochs?``)."""
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "config"
        message = safe_yaml.clip(item["msg"].removeprefix("Value error, ")).replace("\n", " ")
        got = item.get("input")
        shown = "" if isinstance(got, dict) else f" (got {safe_yaml.short(got)})"
        if item["type"] == "extra_forbidden" and root is not None:
            shown += _nearest(root, item["loc"])
        lines.append(f"{field}: {message}{shown}")
    return f"invalid {what}:\n  " + "\n  ".join(lines)


def _nearest(root: type[BaseModel], loc: tuple) -> str:
    """``; did you mean NAME?`` for the unknown field at ``loc``, NAME the closest field of
    its section (a model under ``root``), or nothing where none is close."""
    model = root
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        kinds = (typing.get_args(field.annotation) or (field.annotation,)) if field else ()
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if not models:
            return ""
        model = models[0]
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def field_errors(error: ConfigError) -> dict[str, str]:
    """``{field.path: message}`` from a :class:`ConfigError`, for showing next to form fields."""
    found = {}
    for line in str(error).splitlines()[1:]:
        field, _, message = line.strip().partition(": ")
        found[field] = message
    return found


def json_schema() -> dict[str, Any]:
    """The JSON schema of :class:`ExperimentConfig` (for building forms)."""
    return ExperimentConfig.model_json_schema()
