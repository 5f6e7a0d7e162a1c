"""Building blocks of the Launch form: widgets generated from the config schema and the
registries, error slots next to fields, and the cached schedule preview."""

from __future__ import annotations

import gc
import inspect
import json
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import yaml

from app.data import md_escape
from toolkit import codecs, safe_yaml
from toolkit import config as config_lib
from toolkit.catalog import SCHEDULES
from toolkit.launching import slurm as slurm_lib
from toolkit.launching.executors import registry
from toolkit.launching.executors.hosts import HostsExecutor
from toolkit.launching.executors.local import LocalExecutor
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.optimizers import OPTIMIZERS
from toolkit.parallel import cost
from toolkit.plan import RunPlan
from toolkit.training import data as datasets
from toolkit.training.experiment import build_model, schedule_preview
from toolkit.words import counted

# Streamlit collects garbage after every rerun; TensorFlow's ~450k long-lived objects, imported
# just above (once per server process, by the first page that builds configs), made each
# collection take ~0.3 s. Freezing what exists now keeps them out of the collector's scans.
gc.freeze()

PRESETS = Path(__file__).resolve().parents[1] / "experiments"
BLANK = "(blank)"
FIRST = "quickstart"
"""The preset the Launch form opens on: a working example, as the README's first run."""
_COMMON = set.intersection(*(set(OPTIMIZERS.parameters(n)) for n in OPTIMIZERS.names()))
KERAS_BASE = _COMMON - {"learning_rate", "weight_decay"}
"""Parameters all optimizers take from Keras's base class (clipping, EMA...): under 'more'."""


@st.cache_data(show_spinner=False)
def schema() -> dict:
    return config_lib.json_schema()


def field(section: str | None, name: str) -> dict:
    """The JSON schema of one field (``section`` is a ``$defs`` name, None for the top level)."""
    node = schema()["$defs"][section] if section else schema()
    return node["properties"][name]


def choices(section: str | None, name: str) -> list[str]:
    """The allowed values of an enum field."""
    return list(field(section, name)["enum"])


def presets() -> list[str]:
    return [BLANK] + sorted(p.stem for p in PRESETS.glob("*.yaml"))


def experiment_files(top_key: str) -> list[str]:
    """The YAML files under experiments/ with ``top_key`` at their top level (``grid``: a
    sweep's, ``space``: a search's), relative to the repository."""
    found = []
    for path in sorted(PRESETS.rglob("*.yaml")):
        try:
            if top_key in (safe_yaml.load_file(path) or {}):
                found.append(str(path.relative_to(PRESETS.parent)))
        except (OSError, UnicodeDecodeError, safe_yaml.YamlError, TypeError):
            continue
    return found


def preset_mapping(name: str) -> dict:
    """The raw (unvalidated) mapping of a preset; ``{}`` for blank or an unreadable file."""
    if name == BLANK:
        return {}
    try:
        raw = safe_yaml.load_file(PRESETS / f"{name}.yaml")
    except (OSError, UnicodeDecodeError, safe_yaml.YamlError):
        return {}
    return raw if isinstance(raw, dict) else {}


def get(mapping: dict, path: str, default: Any = None) -> Any:
    """``mapping['a']['b']`` for ``path='a.b'``, else ``default``."""
    node = mapping
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


class Slots:
    """Placeholders under form fields; :meth:`show` puts each schema error in the slot of its
    field, or of the nearest enclosing section, or the general ``config`` slot."""

    def __init__(self):
        self.slots: dict[str, Any] = {}

    def add(self, path: str) -> None:
        self.slots[path] = st.empty()

    def show(self, errors: dict[str, str]) -> None:
        grouped: dict[str, list[str]] = {}
        for path, message in errors.items():
            target = path
            while target not in self.slots and "." in target:
                target = target.rsplit(".", 1)[0]
            grouped.setdefault(target if target in self.slots else "config", []).append(
                f"{path}: {message}"
            )
        for target, messages in grouped.items():
            self.slots[target].error("\n\n".join(map(md_escape, messages)), icon="⚠️")


def where_choices(*, sets: bool = False) -> list[str]:
    """Where a run can go, by each registered executor's title, this machine first
    (:mod:`toolkit.launching.executors.registry`): this machine's launch queue, named hosts
    through horovodrun, a Slurm job, and any place registered beside them; ``sets``: the places
    that take a sweep's cells (this machine, and those a config section asks for)."""
    executors = [e for e in reversed(registry.EXECUTORS) if not sets or e.section or e is LOCAL]
    return [executor.title for executor in executors]


LOCAL, HOSTS, SLURM = LocalExecutor, HostsExecutor, SlurmExecutor


def asked_place(where: str, key: str, given: dict | None) -> tuple[str, dict] | None:
    """The place chosen as ``where`` (an executor's title) as its config section and the
    fields its form gives (Slurm's own form, or a registered place's, prefilled from the
    config mapping ``given``); ``None`` for a place no section asks for (this machine, hosts).
    ``key`` prefixes the widgets' keys."""
    executor = registry.titled(where)
    preset = get(given or {}, executor.section) if executor.section else None
    if executor is SLURM:
        return SLURM.section, slurm_section(key, preset)
    if executor.section_model is not None:
        return executor.section, place_section(executor, key, preset)
    return None


def place_section(executor, key: str, given: dict | None) -> dict:
    """The fields of a registered place's section (``executor.section_model``), one widget a
    field by its type (a number, a switch, a text), prefilled from ``given``, else its default;
    ``key`` prefixes the widgets' keys."""
    given, section = given or {}, {}
    for name, field in executor.section_model.model_fields.items():
        value = given.get(name, field.default)
        label, widget_key = name.replace("_", " ").capitalize(), f"{key}:{executor.section}.{name}"
        kind = field.annotation
        if kind is bool:
            section[name] = st.checkbox(label, bool(value), key=widget_key, help=field.description)
        elif kind in (int, float):
            section[name] = st.number_input(
                label, value=kind(value), key=widget_key, help=field.description
            )
        else:
            section[name] = st.text_input(label, str(value or ""), key=widget_key)
    return section


@st.cache_data(ttl=60, show_spinner=False)
def slurm_partitions() -> dict[str, tuple[int, int, bool]]:
    """Slurm's partitions (:func:`toolkit.launching.slurm.partitions_here`), none where Slurm
    does not answer; asked again after a minute."""
    try:
        return slurm_lib.partitions_here()
    except (config_lib.ConfigError, OSError):
        return {}


def slurm_section(key: str, given: dict | None) -> dict:
    """The Slurm fields (a config's ``slurm`` section, :class:`toolkit.config.SlurmConfig`),
    prefilled from ``given``; empty fields are left to Slurm. ``key`` prefixes the widgets'
    keys."""
    given = given or {}
    cells = st.columns(3)
    partitions = slurm_partitions()
    told = ", ".join(
        f"{name}{' (default)' * default}: {counted(nodes, 'node')}, {counted(gpus, 'GPU')} each"
        for name, (nodes, gpus, default) in partitions.items()
    )
    st.caption(f"Slurm reports {told}." if told else "Slurm does not answer here (sinfo).")
    asked = given.get("partition") or ""  # a preset's partition, listed or not
    choices = list(dict.fromkeys(["", *partitions, asked]))

    def count(cell, label: str, field: str, hint: str) -> int | None:  # empty: Slurm's
        value = cell.number_input(
            label, min_value=1, value=given.get(field), key=f"{key}:slurm.{field}", help=hint
        )
        return None if value is None else int(value)

    section = {
        "nodes": count(cells[0], "Nodes", "nodes", "empty: Slurm's placement of the ranks"),
        "partition": cells[1].selectbox(
            "Partition",
            choices,
            index=choices.index(asked),
            format_func=lambda name: name or "(the cluster's default)",
            accept_new_options=True,
            key=f"{key}:slurm.partition",
            help="as sinfo lists them; empty: the cluster's default",
        ),
        "time": cells[2].text_input(
            "Time limit",
            given.get("time") or "",
            key=f"{key}:slurm.time",
            help="e.g. 2:00:00 or 1-00:00; the run checkpoints before it and is requeued",
        ),
        "account": cells[0].text_input(
            "Account", given.get("account") or "", key=f"{key}:slurm.account"
        ),
        "gpus_per_task": count(cells[1], "GPUs per rank", "gpus_per_task", "empty: none"),
    }
    extra = cells[2].text_area(
        "More sbatch options",
        "\n".join(given.get("sbatch_args") or []),
        key=f"{key}:slurm.sbatch_args",
        help="one a line, e.g. --qos=long",
        height=68,
    )
    section = {k: (v.strip() if isinstance(v, str) else v) for k, v in section.items()}
    section = {k: v for k, v in section.items() if v not in (None, "")}
    if "signal_before_end_s" in given:  # no widget: kept as the preset has it
        section["signal_before_end_s"] = given["signal_before_end_s"]
    if args := [line.strip() for line in extra.splitlines() if line.strip()]:
        section["sbatch_args"] = args
    return section


ACRONYMS = {"ema": "EMA", "lr": "LR", "fp16": "FP16", "sgd": "SGD"}


def title(name: str) -> str:
    """A parameter's name as a label in plain words, as the form's own fields are labelled:
    ``weight_decay`` -> ``Weight decay`` (the name itself is the field's help)."""
    words = [ACRONYMS.get(word, word) for word in name.split("_")]
    return " ".join(words)[:1].upper() + " ".join(words)[1:]


def schedule_help(name: str) -> str:
    """What schedule ``name`` does and the parameters it takes, with their defaults, as the
    catalog's table gives them (lengths in epochs)."""
    builder = SCHEDULES.constructor(name)
    required = SCHEDULES.required(name)
    taken = ", ".join(
        f"`{p}` ({'required' if p in required else d})"
        for p, d in SCHEDULES.parameters(name).items()
    )
    return f"{inspect.getdoc(builder)} Parameters: {taken or 'none'}."


def value_input(
    label: str, default: Any, key: str, help: str | None = None
) -> tuple[Any, str | None]:
    """A widget matching ``default``'s type; returns ``(value, local error)``. Values that are
    not bools or numbers (tuples, lists, None) are edited as YAML."""
    if isinstance(default, bool):
        return st.checkbox(label, value=default, key=key, help=help), None
    if isinstance(default, int):
        return int(st.number_input(label, value=default, step=1, key=key, help=help)), None
    if isinstance(default, float):
        return st.number_input(
            label, value=default, format="%g", step=None, key=key, help=help
        ), None
    if isinstance(default, str):
        return st.text_input(label, value=default, key=key, help=help), None
    shown = (
        "" if default is None else yaml.safe_dump(_plain(default), default_flow_style=True).strip()
    )
    typed = st.text_input(label, value=shown, key=key, help=help or "YAML; empty: not set")
    if not typed.strip():
        return None, None
    try:
        return safe_yaml.load(typed, label), None
    except safe_yaml.YamlError as error:
        return None, str(error)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def param_inputs(
    registry,
    name: str,
    given: dict,
    key: str,
    skip: tuple[str, ...] = (),
    more: set[str] = frozenset(),
) -> tuple[dict, dict[str, str]]:
    """Widgets for ``registry``'s parameters of ``name`` (defaults from the constructor,
    overridden by ``given``). Returns the params that differ from the constructor's defaults
    or were given, and local (YAML) errors by parameter; ``more`` go into an expander."""
    defaults = {p: d for p, d in registry.parameters(name).items() if p not in skip}
    params, errors = {}, {}
    main = [p for p in defaults if p not in more]
    extra = [p for p in defaults if p in more]
    for names, where in (
        (main, st.container()),
        (extra, st.expander("More parameters") if extra else None),
    ):
        if not names:
            continue
        with where:
            columns = st.columns(2)
            for i, param in enumerate(names):
                start = _plain(given.get(param, defaults[param]))
                with columns[i % 2]:
                    value, error = value_input(
                        title(param), start, key=f"{key}.{name}.{param}", help=f"`{param}`"
                    )
                if error:
                    errors[param] = error
                elif param in given or value != _plain(defaults[param]):
                    params[param] = value
    return params, errors


@st.cache_data(max_entries=16, show_spinner=False)
def num_train(name: str, seed: int, params_json: str) -> int:
    """Training-set size of a dataset (loads it once per server process)."""
    return len(datasets.load(name, seed=seed, **json.loads(params_json)).x_train)


@st.cache_data(max_entries=64, show_spinner=False)
def preview(config_yaml: str) -> tuple[pd.DataFrame, RunPlan]:
    """``schedule_preview`` of a validated config (given as its YAML) and its plan, which
    training will read too; raises ``ConfigError`` when the batch does not fit the dataset, or
    the dataset's error."""
    config = config_lib.from_yaml(config_yaml)
    dataset = config.dataset
    n = num_train(dataset.name, config.seed, json.dumps(dataset.params, sort_keys=True))
    return schedule_preview(config, n), RunPlan.of(config, n)


@st.cache_data(max_entries=16, show_spinner=False)
def trainable_entries(config_yaml: str) -> int:
    """How many gradient entries the config's model averages each update."""
    config = config_lib.from_yaml(config_yaml)
    dataset = datasets.load(config.dataset.name, seed=config.seed, **config.dataset.params)
    return sum(
        int(v.shape.num_elements()) for v in build_model(config, dataset).trainable_variables
    )


def when_it_pays(config: config_lib.ExperimentConfig, gbit: float) -> str:
    """One line: what averaging the config's gradients would cost an update on a ``gbit``
    link with its workers: dense, fp16, the config's own encoded mode (with its values' width),
    sampled top-k 1% and 2bit, from :mod:`toolkit.parallel.cost`."""
    entries = trainable_entries(config.to_yaml())
    allreduce = config.allreduce
    chosen = allreduce.compression
    modes = {"dense": (codecs.DENSE.name, {}), codecs.FP16.name: (codecs.FP16.name, {})}
    if allreduce.codec.encoded:
        share = f" {allreduce.ratio:.3g}" if allreduce.codec.sparse else ""
        label = f"{chosen}{share} (this config)"
        options = {
            "ratio": allreduce.ratio,
            "topk_sample": allreduce.topk_sample,
            "value_bytes": 2 if allreduce.value_dtype == "float16" else 4,
        }
        modes[label] = (chosen, options)
    sampled = {"ratio": 0.01, "topk_sample": 0.01}
    modes.setdefault(f"{codecs.TOPK.name} 1%, sampled", (codecs.TOPK.name, sampled))
    modes.setdefault(codecs.TWO_BIT.name, (codecs.TWO_BIT.name, {}))
    link = cost.Link(gbit)
    times = {
        label: cost.seconds_per_update(mode, entries, config.workers, link, **options)
        for label, (mode, options) in modes.items()
    }
    best = min(times, key=times.get)
    listed = " · ".join(f"{label} ≈ {t * 1e3:,.0f} ms" for label, t in times.items())
    return (
        f"On a {gbit:g} Gbit/s link with {config.workers} workers, averaging this model's "
        f"{entries / 1e6:.2f}M gradients would take {listed} an update (this machine's "
        f"memory speed and the link; the forward and backward pass come on top). "
        f"Fastest: **{best}**."
    )
