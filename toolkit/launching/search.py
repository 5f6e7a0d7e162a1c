"""Searches: Optuna's samplers and pruners over ordinary runs. This module holds the search
file, its space and the study it keeps in the runs root; :mod:`toolkit.launching.search_runner`
runs its trials through the launch queue.

A search file::

    name: qs-tpe
    base: experiments/quickstart.yaml       # an experiment config (a path, or the mapping itself)
    space:                                  # dotted config paths -> a range or a list of choices
      optimizer.learning_rate: {low: 0.1, high: 4.0, log: true}
      optimizer.params.momentum: {low: 0.8, high: 0.99}
      schedule.warmup.epochs: {low: 0, high: 3}      # both bounds integers: an integer range
      optimizer.name: [sgd, lars]
    trials: 12
    sampler: tpe                            # tpe | gp | random | grid (Optuna's)
    pruner: asha                            # asha | hyperband | median | none
    objective: {metric: accuracy, at: last} # accuracy maximised, loss minimised; last | best
    seed: 0                                 # the sampler's; each trial trains with the base's
    seeds: 1                                # runs a trial trains: seeds base.seed, +1, ...
    retries: 1                              # times a failed trial is resumed or rerun

A range is an integer range when both bounds are integers (``type: float`` or ``type: int``
says so outright); ``log: true`` samples its logarithm uniformly (bounds above 0); ``step``
quantises it. The grid sampler takes choices only (its grid is their product). Every field is
validated before anything starts: the search's own fields by name, and each space field by
building the base config at its bounds and at every choice (a path that is not a config field,
or a bound the field refuses, is named with the config's message).

The study is Optuna's, in its journal-file storage in the runs root
(``.searches/<name>.journal``: no database server, safe on a shared file system), named after
the search. A trial is one run (``<name>-t<number>``, tagged ``search:<name>`` and
``trial:<number>``); its number and parameters are in the run's ``meta.json`` too. With
``seeds: N`` a trial is N runs (``<name>-t<number>-s<i>``, the base's seed plus ``i``, the same
values otherwise) and its objective the mean of theirs: a seed's spread can be as large as the
differences a sampler chooses between.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolkit import config as config_lib
from toolkit import files, safe_yaml
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.launching.executors.base import over
from toolkit.launching.sweep import checked_name, keep, read_base, read_yaml
from toolkit.runs.rundir import runs_root

SEARCHES_DIR = ".searches"
"""Where each search's resolved file (``<name>.yaml``), its study (``<name>.journal``), its
runner's lock and log are kept, in the runs root."""
MAX_TRIALS = 10_000
MAX_SEEDS = 10
DIRECTIONS = {"accuracy": "maximize", "loss": "minimize"}


class SearchError(ConfigError):
    """A search that cannot run; the message names every bad field."""


class Range(BaseModel):
    """A numeric space field: ``low`` to ``high``, on a log scale or not, quantised by
    ``step``; an integer range where both bounds are integers unless ``type`` says."""

    model_config = ConfigDict(extra="forbid")

    low: float
    high: float
    log: bool = False
    step: float | None = None
    type: Literal["int", "float"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("type") is None:
            bounds = [raw.get("low"), raw.get("high")]
            ints = all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
            raw = {**raw, "type": "int" if ints else "float"}
        return raw

    @model_validator(mode="after")
    def _legal(self) -> Range:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise ValueError(f"low must be below high (got low {self.low}, high {self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low})")
        if self.log and self.step is not None:
            raise ValueError("a range is on a log scale or stepped, not both")
        if self.step is not None and not 0 < self.step <= self.high - self.low:
            raise ValueError(f"step must be above 0 and at most high - low (got {self.step})")
        if self.type == "int" and not all(float(v).is_integer() for v in self._bounds()):
            raise ValueError("an int range has integer low, high and step")
        return self

    def _bounds(self) -> list[float]:
        return [self.low, self.high] + ([self.step] if self.step is not None else [])

    def distribution(self):
        """This range as Optuna's distribution."""
        import optuna

        if self.type == "int":
            step = int(self.step or 1)
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=step
            )
        return optuna.distributions.FloatDistribution(
            self.low, self.high, log=self.log, step=self.step
        )

    def edges(self) -> list[float | int]:
        """The values a trial can take at its ends (each is tried on the base config)."""
        cast = int if self.type == "int" else float
        return [cast(self.low), cast(self.high)]


class Objective(BaseModel):
    """What a trial is worth: its eval events' ``metric`` at the ``last`` evaluation or the
    ``best`` one; accuracy is maximised, loss minimised."""

    model_config = ConfigDict(extra="forbid")

    metric: Literal["accuracy", "loss"] = "accuracy"
    at: Literal["last", "best"] = "last"

    @property
    def direction(self) -> str:
        return DIRECTIONS[self.metric]

    def of(self, values: list[float]) -> float | None:
        """The objective of a run whose evaluations gave ``values`` (in order), a value that is
        not finite (a diverged run) counted as the worst there is; ``None`` if there are
        none."""
        worst = -math.inf if self.direction == "maximize" else math.inf
        values = [v if v is not None and math.isfinite(v) else worst for v in values]
        if not values:
            return None
        if self.at == "last":
            return values[-1]
        return max(values) if self.direction == "maximize" else min(values)


Choices = list[Any]


class SearchSpec(BaseModel):
    """The search file's schema (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base: str | dict[str, Any]
    space: dict[str, Range | Choices]
    trials: int = Field(ge=1, le=MAX_TRIALS)
    sampler: Literal["tpe", "gp", "random", "grid"] = "tpe"
    pruner: Literal["asha", "hyperband", "median", "none"] = "asha"
    objective: Objective = Field(default_factory=Objective)
    seed: int = 0
    seeds: int = Field(default=1, ge=1, le=MAX_SEEDS)
    retries: int = Field(default=1, ge=0, le=10)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name(value, "search", 48)

    @field_validator("objective", mode="before")
    @classmethod
    def _objective(cls, value: Any) -> Any:
        return {"metric": value} if isinstance(value, str) else value  # `objective: loss`

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, value: Any) -> Any:
        """Each field a :class:`Range` (a mapping) or a list of choices, its errors named by
        its path."""
        if not isinstance(value, dict) or not value:
            raise ValueError("give a mapping of dotted config paths to ranges or choices")
        space = {}
        for path, field in value.items():
            if path in ("name", "seed"):
                raise ValueError(f"{path} is the search's to set, not a space field")
            if isinstance(field, list):
                if not field:
                    raise ValueError(f"{path} has no choices: give at least one")
                space[path] = field
            elif isinstance(field, dict):
                try:
                    space[path] = Range.model_validate(field)
                except ValidationError as error:
                    lines = config_lib.format_errors(error, path).splitlines()[1:]
                    said = "; ".join(line.strip().removeprefix("config: ") for line in lines)
                    raise ValueError(f"{path}: {said}") from None
            else:
                raise ValueError(
                    f"{path}: give {{low, high}} (and log, step, type) or a list of choices "
                    f"(got {safe_yaml.short(field)})"
                )
        return space

    @model_validator(mode="after")
    def _grid_takes_choices(self) -> SearchSpec:
        if self.sampler == "grid":
            ranges = [p for p, f in self.space.items() if isinstance(f, Range)]
            if ranges:
                raise ValueError(
                    f"space.{ranges[0]}: the grid sampler takes lists of choices, not ranges"
                )
        return self


@dataclass(frozen=True)
class Search:
    """A validated search: its spec, the base inlined."""

    spec: SearchSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def distributions(self) -> dict[str, Any]:
        """Each space field as Optuna's distribution, by its dotted path."""
        import optuna

        return {
            path: field.distribution()
            if isinstance(field, Range)
            else optuna.distributions.CategoricalDistribution(field)
            for path, field in self.spec.space.items()
        }

    def config(self, params: dict[str, Any], number: int, seed: int = 0) -> ExperimentConfig:
        """The base with ``params`` (dotted path -> value) set, named for trial ``number``'s
        run of its ``seed``-th seed (the base's seed plus ``seed``, where a trial has several)."""
        raw = json.loads(json.dumps(self.spec.base))
        for path, value in params.items():
            config_lib.set_path(raw, path, value)
        raw["name"] = trial_run_id(self.name, number)
        if self.spec.seeds > 1:
            base_seed = raw.get("seed", config_lib.ExperimentConfig.model_fields["seed"].default)
            raw["seed"] = base_seed + seed
            raw["name"] += f"-s{seed}"
        return config_lib.from_mapping(raw)

    def edges(self) -> list[tuple[str, Any]]:
        """Each space field with each value at its edges (a range's bounds, every choice), the
        values every check of a search tries."""
        return [
            (path, value)
            for path, field in self.spec.space.items()
            for value in (field.edges() if isinstance(field, Range) else field)
        ]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.spec.model_dump(exclude_none=True), sort_keys=False)

    def space_text(self) -> str:
        """The search in words: its trials, sampler, pruner and objective, then one line per
        space field (what ``search --dry-run`` prints)."""
        spec = self.spec
        lines = [
            f"search {spec.name}: {spec.trials} trials, sampler {spec.sampler} (seed {spec.seed}),"
            f" pruner {spec.pruner}, {spec.objective.direction} {spec.objective.metric} at the "
            f"{spec.objective.at} evaluation{_of_seeds(spec.seeds)}, up to {spec.retries} "
            f"{'retry' if spec.retries == 1 else 'retries'} a trial"
        ]
        for path, field in spec.space.items():
            if isinstance(field, Range):
                scale = ", log" if field.log else f", step {field.step:g}" if field.step else ""
                lines.append(f"  {path}: {field.type} {field.low:g} to {field.high:g}{scale}")
            else:
                lines.append(f"  {path}: one of {', '.join(map(str, field))}")
        return "\n".join(lines)


def _of_seeds(seeds: int) -> str:
    return f" (the mean over {seeds} seeds)" if seeds > 1 else ""


def placed(search: Search, place: tuple[str, dict] | None) -> Search:
    """``search`` with its base given ``place``'s section and fields
    (:func:`~toolkit.launching.executors.base.over`; ``None``: unchanged): each trial then
    goes there, as any run so configured. Validated like the search file."""
    if place is None:
        return search
    raw = search.spec.model_dump(exclude_none=True)
    raw["base"] = over(raw["base"], *place)
    return from_mapping(raw)


def on_slurm(search: Search, slurm: dict | None) -> Search:
    """:func:`placed` on Slurm with the ``slurm`` section's fields ``slurm``."""
    return placed(search, None if slurm is None else ("slurm", slurm))


def trial_run_id(search: str, number: int) -> str:
    """``<search>-t<number>``: a trial's run id (a retried attempt gets ``-2``, ``-3``...)."""
    return f"{search}-t{number}"


def tags(search: str, number: int) -> list[str]:
    return [f"search:{search}", f"trial:{number}"]


def load(path: str | Path) -> Search:
    """Read and validate a search file. ``base`` is read relative to the working directory or,
    failing that, to the search file's folder."""
    path = Path(path)
    return from_mapping(read_yaml(path, "search", SearchError), folder=path.parent)


def from_mapping(raw: Any, folder: str | Path = ".") -> Search:
    """Validate a search mapping, its base and every space field's every edge (see the module
    docstring); raises :class:`SearchError` naming each bad field."""
    if not isinstance(raw, dict):
        raise SearchError("a search file is a mapping with name, base, space and trials")
    try:
        spec = SearchSpec.model_validate(raw)
    except ValidationError as error:
        raise SearchError(config_lib.format_errors(error, "search file")) from None
    if isinstance(spec.base, str):
        try:
            spec = spec.model_copy(update={"base": read_base(spec.base, Path(folder))})
        except ConfigError as error:
            raise SearchError(str(error)) from None
    search = Search(spec)
    problems = {}
    try:  # the seeds a trial trains: the base's and the next ones
        search.config({}, 0, spec.seeds - 1)
    except ConfigError as error:
        said = str(error).removeprefix("invalid experiment config:\n").strip()
        last = search.config({}, 0).seed + spec.seeds - 1
        problems["seeds"] = f"seeds: {spec.seeds} = {last}: {said}"
    for path, value in search.edges():
        try:
            search.config({path: value}, 0)
        except ConfigError as error:
            said = str(error).removeprefix("invalid experiment config:\n").strip()
            problems.setdefault(path, f"space.{path} = {safe_yaml.short(value)}: {said}")
    if problems:
        said = "\n  ".join(problems.values())  # one value is enough to name a field
        raise SearchError(f"invalid search {spec.name!r}:\n  " + said)
    return search


def folder(root: str | Path | None = None) -> Path:
    return runs_root(root) / SEARCHES_DIR


def save(search: Search, root: str | Path | None = None) -> Path:
    """Keep the resolved search (base inlined) in the runs root, for the dashboard and reruns."""
    return keep(folder(root) / f"{search.name}.yaml", search.to_yaml())


def saved(root: str | Path | None = None) -> list[Search]:
    """The searches run under this runs root (those that still validate), by name."""
    found = []
    for path in sorted(folder(root).glob("*.yaml")):
        try:
            found.append(load(path))
        except ConfigError:
            continue
    return found


def study(search: Search, root: str | Path | None = None):
    """The search's Optuna study in its journal file under the runs root (made on first use,
    continued after), with the search's pruner and its sampler for a first trial (see
    :func:`sampler`)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = folder(root) / f"{search.name}.journal"
    with files.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(path)))
    return optuna.create_study(
        study_name=search.name,
        storage=storage,
        sampler=sampler(search, 0),
        pruner=_pruner(search.spec.pruner),
        direction=search.spec.objective.direction,
        load_if_exists=True,
    )


def sampler(search: Search, asked: int):
    """The search's sampler for its trial after ``asked`` trials, seeded from the search's
    seed and ``asked`` together (numpy's ``SeedSequence``: no two searches' seeds share a
    stream). A sampler's only state is its random generator (the history is read from the
    study), so seeding it per trial makes each trial's draw depend on the seed and the history
    alone: a runner started again after one died draws what it would have, where one seeded
    once per process would draw its first trials' values again. TPE and GP start from random
    draws for a third of the trials (at most Optuna's default of 10): with Optuna's 10 a search
    of 10 trials or fewer would be a random search."""
    import optuna

    spec = search.spec
    seed = int(np.random.SeedSequence([spec.seed, asked]).generate_state(1)[0])
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler(dict(spec.space), seed=seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    kind = {"tpe": optuna.samplers.TPESampler, "gp": optuna.samplers.GPSampler}[spec.sampler]
    return kind(seed=seed, n_startup_trials=max(1, min(10, spec.trials // 3)))


def _pruner(name: str):
    """Optuna's pruner ``name``. A trial's steps are its evaluations (a few dozen at most), so
    ASHA's and Hyperband's first rung is the first evaluation from the first trial on, where
    Optuna's ``auto`` waits for a trial to complete."""
    import optuna

    pruners = optuna.pruners
    return {
        "asha": lambda: pruners.SuccessiveHalvingPruner(min_resource=1),
        "hyperband": lambda: pruners.HyperbandPruner(min_resource=1),
        "median": pruners.MedianPruner,
        "none": pruners.NopPruner,
    }[name]()
