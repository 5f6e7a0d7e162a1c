"""Sweeps: a grid of runs as one object. This module holds the sweep file, its cells and
where a sweep is kept; :mod:`toolkit.launching.sweep_runner` runs them through the launch queue
(resumable), and :mod:`toolkit.launching.sweep_results` reads them back.

A sweep file::

    name: lb-study
    base: experiments/quickstart.yaml      # an experiment config (a path, or the mapping itself)
    grid:                                  # dotted config paths -> values (cartesian product)
      batch.global_size: [32, 256, 1024]
      optimizer.name: [sgd, lars]
    methods:                               # optional: named bundles of overrides, one axis
      goyal: {lr_scaling.rule: linear, schedule.warmup.epochs: 3}
      lars_sqrt: {optimizer.name: lars, lr_scaling.rule: sqrt}
    seeds: [0, 1, 2]                       # optional (default: the base config's seed)
    retries: 0                             # times a cell whose run fails is resumed or rerun

``grid`` may also be a list of such mappings: the cells are the union of their products, in
order (scikit-learn's ``ParameterGrid``). Inside a grid mapping, the key ``method`` restricts
the ``methods`` axis to the named ones; without it, every method is crossed with that grid.

A cell's config is the base, then its method's overrides, then its grid coordinates, then its
seed (later wins). Every cell is validated before anything starts (:func:`expand`); a bad one
is refused with its coordinates and the field's message.

Each cell is an ordinary run directory, labelled in ``meta.json`` with ``sweep`` (the name),
``cell`` (a hash of the cell's whole config, its identity) and ``coordinates``, so a sweep
resumes by looking, not by remembering. Editing the base or a value makes new cells; the old
runs stay but are no longer the sweep's.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolkit import config as config_lib
from toolkit import files, safe_yaml
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.runs.rundir import runs_root
from toolkit.sections import run_name_problem

SWEEPS_DIR = ".sweeps"
"""Where :func:`save` keeps each sweep's resolved file, in the runs root (``<name>.yaml``), and
the runner its lock and log."""
SEED = "seed"
METHOD = "method"
MAX_CELLS = 10_000  # each cell is a run directory: more is a typo in the grid


class SweepError(ConfigError):
    """A sweep that cannot run; the message names every bad field or cell."""


Values = list[Any]


class SweepSpec(BaseModel):
    """The sweep file's schema (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base: str | dict[str, Any]
    grid: dict[str, Values] | list[dict[str, Values]]
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] | None = None
    retries: int = Field(default=0, ge=0, le=10)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name(value, "sweep", 32)

    @field_validator("grid")
    @classmethod
    def _grid(cls, value):
        grids = value if isinstance(value, list) else [value]
        if not grids or not all(grids):
            raise ValueError("the grid is empty: give at least one path and its values")
        for grid in grids:
            for path, values in grid.items():
                if not values:
                    raise ValueError(f"{safe_yaml.short(path)} has no values: give at least one")
                if path == SEED:
                    raise ValueError("seeds go in `seeds`, not in the grid")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value):
        if value is not None and not value:
            raise ValueError("seeds is empty: leave it out for the base config's seed")
        return value

    def grids(self) -> list[dict[str, Values]]:
        return self.grid if isinstance(self.grid, list) else [self.grid]


def checked_name(value: str, kind: str, most: int) -> str:
    """``value`` if it may name a ``kind`` (a sweep, a search): a valid run name of at most
    ``most`` characters, since it prefixes its runs' ids; else a ``ValueError`` saying why."""
    if problem := run_name_problem(value):
        raise ValueError(f"{kind} names {problem}")
    if len(value) > most:
        raise ValueError(f"{kind} names have at most {most} characters (they prefix run ids)")
    return value


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its coordinates (``method``, grid paths, ``seed``), its config (named
    after its run id) and its key, a hash of that config without the name."""

    sweep: str
    coordinates: dict[str, Any]
    config: ExperimentConfig = field(compare=False)
    key: str

    @property
    def run_id(self) -> str:
        return self.config.name

    def meta(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "cell": self.key, "coordinates": self.coordinates}


def cell_run_id(sweep: str, coordinates: dict[str, Any], key: str) -> str:
    """``<sweep>-<coordinate values>-<key>``: readable, unique, a valid run id."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(map(str, coordinates.values())))
    room = 64 - len(sweep) - len(key) - 2
    return f"{sweep}-{slug[:room].strip('_-')}-{key}"


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its spec (base inlined) and its cells, in order."""

    spec: SweepSpec
    cells: tuple[Cell, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def axes(self) -> list[str]:
        """The coordinate names, ``method`` first and ``seed`` last."""
        return list(dict.fromkeys(k for cell in self.cells for k in cell.coordinates))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.spec.model_dump(exclude_none=True), sort_keys=False)


def load(path: str | Path) -> Sweep:
    """Read and expand a sweep file. ``base`` is read relative to the working directory or,
    failing that, to the sweep file's folder."""
    path = Path(path)
    return from_mapping(read_yaml(path, "sweep", SweepError), folder=path.parent)


def read_yaml(path: Path, kind: str, error: type[ConfigError]) -> Any:
    """The YAML document of the ``kind`` file (a sweep's, a search's) at ``path``; a file
    that is missing or cannot be read as YAML raises ``error`` saying so."""
    try:
        return safe_yaml.load_file(path)
    except FileNotFoundError:
        raise error(f"{kind} file {safe_yaml.short(str(path))} does not exist") from None
    except (OSError, UnicodeDecodeError) as problem:
        raise error(f"{path}: cannot be read as a YAML {kind}: {problem}") from None
    except safe_yaml.YamlError as problem:
        raise error(str(problem)) from None


def keep(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its folder made), whole or not at all; ``path``."""
    with files.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    files.replace(path, text.encode())
    return path


def from_mapping(raw: Any, folder: str | Path = ".") -> Sweep:
    """Validate a sweep mapping and every one of its cells (see :func:`expand`)."""
    if not isinstance(raw, dict):
        raise SweepError("a sweep file is a mapping with name, base, grid (methods, seeds)")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        raise SweepError(config_lib.format_errors(error, "sweep file")) from None
    if isinstance(spec.base, str):
        spec = spec.model_copy(update={"base": read_base(spec.base, Path(folder))})
    return Sweep(spec, tuple(expand(spec)))


def read_base(name: str, folder: Path) -> dict[str, Any]:
    """The config file ``name`` (a sweep's or search's ``base``), from the working directory
    or else ``folder``, as a mapping that validates; a bad one raises :class:`SweepError`
    naming the file."""
    path = next((p for p in (Path(name), folder / name) if p.is_file()), None)
    if path is None:
        raise SweepError(
            f"base: config file {safe_yaml.short(name)} does not exist (nor in {folder})"
        )
    try:
        raw = safe_yaml.load_file(path)
        if not isinstance(raw, dict):
            raise SweepError(f"base: {path} is not a mapping of config sections")
        config_lib.from_mapping(raw)  # a bad base is reported once, as the base's fault
    except (OSError, UnicodeDecodeError, safe_yaml.YamlError, ConfigError) as error:
        raise SweepError(f"base {path}: {error}") from None
    return raw


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell of ``spec``, validated: raises :class:`SweepError` listing each bad cell by its
    coordinates with the field's message (the first 10, and how many more)."""
    seeds = spec.seeds or [None]
    count = sum(
        len(grid.get(METHOD) or list(spec.methods) or [None])
        * math.prod(len(values) for path, values in grid.items() if path != METHOD)
        * len(seeds)
        for grid in spec.grids()
    )
    if count > MAX_CELLS:
        raise SweepError(f"sweep {spec.name!r}: {count:,} cells, over the limit of {MAX_CELLS:,}")
    cells, problems = [], []
    for grid in spec.grids():
        unknown = [m for m in grid.get(METHOD, []) if m not in spec.methods]
        if unknown:
            known = ", ".join(spec.methods) or "none defined"
            raise SweepError(
                f"grid: method {safe_yaml.short(unknown[0])} is not in methods ({known})"
            )
        methods = grid.get(METHOD) or list(spec.methods) or [None]
        paths = [p for p in grid if p != METHOD]
        for method, *values, seed in itertools.product(methods, *(grid[p] for p in paths), seeds):
            coordinates = {METHOD: method} if method is not None else {}
            coordinates |= dict(zip(paths, values, strict=True))
            try:
                cells.append(_cell(spec, method, coordinates, seed))
            except ConfigError as error:
                seeded = coordinates | ({SEED: seed} if seed is not None else {})
                problems.append(cell_problem(seeded, error))
    refuse(spec.name, problems)
    counts = collections.Counter(c.key for c in cells)
    if len(counts) != len(cells):
        twice = next(c for c in cells if counts[c.key] > 1)
        raise SweepError(
            f"two cells of sweep {spec.name!r} have the same config: {twice.coordinates}"
        )
    return cells


def cell_problem(coordinates: dict[str, Any], error: Exception) -> str:
    """``error`` as one line naming the cell by its ``coordinates``."""
    where = ", ".join(f"{k}={v}" for k, v in coordinates.items())
    return f"cell ({where}): " + str(error).removeprefix("invalid experiment config:\n").strip()


def refuse(name: str, problems: list[str]) -> None:
    """Raise :class:`SweepError` listing ``problems`` (the first 10, and how many more)."""
    if problems:
        more = [f"... and {len(problems) - 10} more"] if len(problems) > 10 else []
        raise SweepError(f"invalid sweep {name!r}:\n  " + "\n  ".join(problems[:10] + more))


def _cell(spec: SweepSpec, method: str | None, coordinates: dict, seed: int | None) -> Cell:
    raw = json.loads(json.dumps(spec.base))
    changes = {  # copied: a grid path into a method's mapping must not change the method
        **json.loads(json.dumps(spec.methods.get(method) or {})),
        **{k: v for k, v in coordinates.items() if k != METHOD},
    }
    for path, value in changes.items():
        config_lib.set_path(raw, path, value)
    if seed is not None:
        raw[SEED] = seed
    coordinates = {**coordinates, SEED: raw.get(SEED, 0)}
    raw["name"] = spec.name
    config = config_lib.from_mapping(raw)
    key = hashlib.sha1(config.model_dump_json(exclude={"name"}).encode()).hexdigest()[:8]
    config = config.model_copy(update={"name": cell_run_id(spec.name, coordinates, key)})
    return Cell(spec.name, coordinates, config, key)


def save(sweep: Sweep, root: str | Path | None = None) -> Path:
    """Keep the resolved sweep (base inlined) in the runs root, for the dashboard."""
    return keep(runs_root(root) / SWEEPS_DIR / f"{sweep.name}.yaml", sweep.to_yaml())


def saved(root: str | Path | None = None) -> list[Sweep]:
    """The sweeps run under this runs root (those that still validate), by name."""
    found = []
    for path in sorted((runs_root(root) / SWEEPS_DIR).glob("*.yaml")):
        try:
            found.append(load(path))
        except ConfigError:
            continue
    return found
