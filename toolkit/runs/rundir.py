"""The run directory, the contract between training, the launcher, the app and notebooks.

::

    runs/<run_id>/
      config.yaml    the resolved config, exactly what ran
      meta.json      run id, created time, argv, world size, versions, git commit, seed
      status.json    state (toolkit.runs.states: queued | starting | running | completed |
                     failed | stopped): queued
                     while it waits for slots (or for Slurm), starting once it has them
                     until its workers begin training; the run's
                     processes (toolkit.runs.processes), exit code, reason; launched,
                     released, slots: when it took and gave back its slots, and how
                     many on each host (toolkit.launching.slots)
      events.jsonl   one JSON object per line (toolkit.runs.events)
      events.parquet its columnar copy, kept by readers and the writer (toolkit.runs.events)
      stdout.log     combined output of horovodrun
      checkpoints/   model + optimizer state (toolkit.runs.checkpoints)

The rules that keep it safe and truthful:

- **Nothing outside the root.** A run id never starts with a dot (so never ``.``, ``..`` or a
  hidden name, which staging directories use) and is resolved with :func:`resolve`, which
  accepts only a real directory (not a symlink) directly inside the runs root. Files are read
  through :mod:`toolkit.files`, which never follows a symlink.
- **All or nothing.** :meth:`RunDir.create` fills a hidden staging directory and renames it into
  place, so no reader ever sees a half-made run and a failed creation leaves nothing.
- **One owner.** :meth:`RunDir.lock` is an exclusive ``flock`` on the run's directory, released
  when its holder exits or dies. Launch, resume, stop and delete hold it for their whole
  check-then-act, and every status write holds it for its read-modify-write.
- **Truthful state.** A live (queued, starting, running) run none of whose recorded processes
  is alive is reported ``failed``. The supervisor and ``stop`` write the final state only if none is
  written yet (:meth:`RunDir.finish`), and a run asked to stop never ends ``completed``.
- **Any content.** :meth:`RunDir.status`, :meth:`RunDir.meta` and the runs table's rows
  (:func:`toolkit.runs.table.summary`) never raise
  on a broken file: a field of the wrong type is dropped, and an unreadable ``status.json``
  gives the state ``unreadable`` with the reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one on Python 3.11

from toolkit import files, safe_yaml
from toolkit.config import ExperimentConfig, from_yaml
from toolkit.plan import Scale
from toolkit.runs import placement, processes
from toolkit.runs.states import LIVE, STATES, TERMINAL, State
from toolkit.sections import run_name_problem

UNREADABLE = State.UNREADABLE
RUNS_ENV = "LBL_RUNS"
STARTUP_GRACE_S = 30.0
"""A run with no recorded process yet counts as starting for this long after its last status."""
LOCK_TIMEOUT_S = 30.0
"""How long launch, resume, stop and delete wait for another holder of a run's lock."""
RUN_FILES = (
    "config.yaml",
    "meta.json",
    "status.json",
    "events.jsonl",
    "events.parquet",
    "stdout.log",
    "discover.sh",
    "job.sbatch",
    "checkpoints",
)


class RunError(ValueError):
    """A request about a run that cannot be carried out: an invalid or unknown id, a run that is
    busy or in the wrong state, or run files that cannot be written. The message says which."""


class ProcessRecord(TypedDict):
    role: str
    pid: int
    started: float
    host: str
    rank: NotRequired[int]


def _fields(**types) -> dict[str, TypeAdapter]:
    return {name: TypeAdapter(kind) for name, kind in types.items()}


STATUS_FIELDS = _fields(
    state=str,
    pid=int,
    processes=list[ProcessRecord],
    exit_code=int | None,
    reason=str | None,
    started=float,
    finished=float | None,
    updated=float,
    stop_requested=bool,
    stop_as=str | None,
    world_size=int,
    launched=float,
    released=float,
    slots=dict[str, int],
    slurm_job_id=str,
    executor=str,
    where=str,
    launcher=str,
    requeue_step=int,
    paused_s=float,
)
META_FIELDS = _fields(
    run_id=str,
    created=float,
    world_size=int,
    global_batch=int,
    learning_rate=float,
    seed=int,
    steps_per_epoch=int,
    total_steps=int,
    steps_per_execution=int,
    probe=bool,
    sweep=str,
    cell=str,
    coordinates=dict[str, Any],
    search=str,
    trial=int,
    params=dict[str, Any],
    tags=list[str],
    notes=str,
    keras_backend=str,
)
MAX_TAG_CHARS = 64
MAX_NOTES_CHARS = 10_000


def typed(record: dict[str, Any], fields: dict[str, TypeAdapter]) -> dict[str, Any]:
    """``record`` without the fields whose value is not of the type ``fields`` gives them
    (strictly: no ``true`` for a number, no ``"5"`` for an int); other keys are kept."""
    kept = {}
    for key, value in record.items():
        if key in fields:
            try:
                value = fields[key].validate_python(value, strict=True)
            except ValidationError:
                continue
        kept[key] = value
    return kept


def runs_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$LBL_RUNS``, else ``./runs``."""
    return Path(root or os.environ.get(RUNS_ENV, "runs"))


def new_run_id(config: ExperimentConfig) -> str:
    """``<name>-b<global batch>-<optimizer>-<4 hex>`` (``quickstart-b256-lars-3f2a``): short
    enough for a legend, saying what the run is, and a valid run name; its start time is in
    ``meta.json``. See :meth:`RunDir.create_new` for uniqueness."""
    batch = f"b{Scale.of(config).global_batch}"
    return f"{config.name[:32]}-{batch}-{config.optimizer.name}-{secrets.token_hex(2)}"


def check_run_id(run_id: Any) -> str:
    if problem := run_name_problem(run_id):
        raise RunError(f"invalid run id {run_id!r}: run ids {problem}")
    return run_id


def resolve(run_id: str, root: str | Path | None = None) -> RunDir:
    """The run ``run_id`` under the runs root, checked before anything reads, writes or deletes
    it: a valid id, and a real directory (not a symlink) directly inside the root."""
    base = runs_root(root)
    path = base / check_run_id(run_id)
    if path.is_symlink():
        raise RunError(f"{path} is a symlink, not a run directory")
    if not path.is_dir():
        raise RunError(f"no run {run_id!r} in {base}")
    if path.resolve().parent != base.resolve():
        raise RunError(f"{path} is not inside the runs root {base}")
    return RunDir(path)


def complete_id(prefix: str, root: str | Path | None = None) -> str:
    """What a person typed as a run id, completed: ``prefix`` itself if a run has that id, else
    the one run id under the runs root that starts with it (``quickstart-b64`` for
    ``quickstart-b64-lars-186e``); ``prefix`` if none does (:func:`resolve` then says there is
    no such run). Several are named in a :class:`RunError`. For the CLI, where ids are typed:
    code that holds an id uses it whole."""
    base = runs_root(root)
    if (base / check_run_id(prefix)).exists() or (base / prefix).is_symlink():
        return prefix
    try:
        found = sorted(
            e.name for e in os.scandir(base) if e.name.startswith(prefix) and _is_real_dir(e)
        )
    except OSError:
        return prefix
    if len(found) > 1:
        shown = safe_yaml.listed(found)
        raise RunError(f"{prefix!r} starts {len(found)} run ids ({shown}): give more of it")
    return found[0] if found else prefix


_thread_locks: dict[str, threading.RLock] = {}
_held: dict[str, tuple[int, int]] = {}  # path -> (flock'ed directory fd, depth) in this process
_registry_guard = threading.Lock()


@dataclass(frozen=True)
class RunDir:
    """One run's directory; cheap to create, reads files on demand."""

    path: Path

    @classmethod
    def create(
        cls, root: str | Path | None, run_id: str, config: ExperimentConfig | None = None
    ) -> RunDir:
        """Make ``<root>/<run_id>/`` with a queued ``status.json`` (and ``config.yaml`` if
        ``config`` is given), all or nothing. The status records the run's ``number``
        (:func:`_next_number`), kept for good: its colour on every chart. Raises
        :class:`RunError` if the id is invalid or taken, or the files cannot be written (the
        message names the file and the cause)."""
        base = runs_root(root)
        final = base / check_run_id(run_id)
        if final.exists() or final.is_symlink():
            raise RunError(f"a run named {run_id!r} already exists in {base}")
        staging = base / f".{run_id}.{secrets.token_hex(4)}.creating"
        try:
            with files.writing(staging):
                staging.mkdir(parents=True)
            run = cls(staging)
            if config is not None:
                run.write_config(config)
            status = {"state": State.QUEUED, "updated": time.time(), "number": _next_number(base)}
            files.write_json(run.status_path, status)
            os.rename(staging, final)  # fails if another creator got there first
        except OSError as error:
            shutil.rmtree(staging, ignore_errors=True)
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise RunError(f"a run named {run_id!r} already exists in {base}") from None
            raise RunError(f"cannot create run {run_id!r} in {base}: {error}") from None
        return cls(final)

    @classmethod
    def create_new(cls, root: str | Path | None, config: ExperimentConfig) -> RunDir:
        """:meth:`create` under a :func:`new_run_id` that no run has taken."""
        while (runs_root(root) / (run_id := new_run_id(config))).exists():
            pass  # 65,536 ids per name, batch and optimizer: drawn again
        return cls.create(root, run_id, config)

    @property
    def run_id(self) -> str:
        return self.path.name

    config_path = property(lambda self: self.path / "config.yaml")
    meta_path = property(lambda self: self.path / "meta.json")
    status_path = property(lambda self: self.path / "status.json")
    events_path = property(lambda self: self.path / "events.jsonl")
    stdout_path = property(lambda self: self.path / "stdout.log")
    checkpoints_path = property(lambda self: self.path / "checkpoints")
    discovery_path = property(lambda self: self.path / "discover.sh")  # an elastic run's

    @contextmanager
    def lock(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the run's lock (re-entrant within a process). Raises :class:`RunError` if
        another process keeps it for ``timeout`` s (default :data:`LOCK_TIMEOUT_S`), or the run
        is deleted meanwhile."""
        timeout = LOCK_TIMEOUT_S if timeout is None else timeout
        key = str(self.path.absolute())
        with _registry_guard:
            thread_lock = _thread_locks.setdefault(key, threading.RLock())
        if not thread_lock.acquire(timeout=timeout):
            raise RunError(f"run {self.run_id} is busy in another thread of this process")
        try:
            fd, depth = _held.get(key, (None, 0))
            if fd is None:
                fd = self._flock(time.monotonic() + timeout)
            _held[key] = (fd, depth + 1)
            try:
                yield
            finally:
                fd, depth = _held.pop(key)
                if depth > 1:
                    _held[key] = (fd, depth - 1)
                else:
                    os.close(fd)
        finally:
            thread_lock.release()

    def _flock(self, deadline: float) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            raise RunError(f"no run {self.run_id!r} in {self.path.parent}") from None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RunError(
                        f"run {self.run_id} is busy: another launch, resume, stop or delete "
                        "holds it; try again"
                    ) from None
                time.sleep(0.05)
        try:  # deleted (or replaced) while we waited?
            same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
        except OSError:
            same = False
        if not same:
            os.close(fd)
            raise RunError(f"run {self.run_id} was deleted")
        return fd

    def write_config(self, config: ExperimentConfig) -> None:
        files.replace(self.config_path, config.to_yaml().encode())

    def config(self) -> ExperimentConfig:
        """The config the run was created with (checked then; read here without importing
        TensorFlow). Raises :class:`~toolkit.config.ConfigError` or :class:`OSError` if it
        cannot be read: an empty or missing file is never taken for the defaults."""
        try:
            text = files.read_bytes(self.config_path, limit=safe_yaml.MAX_BYTES).decode()
        except UnicodeDecodeError:
            raise OSError("config.yaml is not UTF-8 text") from None
        return from_yaml(text, source=str(self.config_path), stored=True)

    def meta(self) -> dict[str, Any]:
        """``meta.json``, without fields of the wrong type; ``{}`` if it cannot be read."""
        return typed(_read_object(self.meta_path) or {}, META_FIELDS)

    def tags(self) -> list[str]:
        """The run's tags (``meta.json``), sorted."""
        return self.meta().get("tags", [])

    def set_tags(self, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str]:
        """Add and remove tags, under the run's lock; returns the tags now. A tag is 1 to
        :data:`MAX_TAG_CHARS` characters, spaces at its ends dropped, without commas or control
        characters; a bad one is a ``ValueError`` naming it, and nothing is changed."""
        add, remove = [check_tag(t) for t in add], [check_tag(t) for t in remove]
        with self.lock(timeout=120):
            tags = sorted((set(self.tags()) | set(add)) - set(remove))
            self.update_meta(tags=tags)
        return tags

    def notes(self) -> str:
        """The run's free-text notes (``meta.json``), ``''`` if none."""
        return self.meta().get("notes", "")

    def set_notes(self, notes: str) -> None:
        """Replace the run's notes (at most :data:`MAX_NOTES_CHARS` characters)."""
        self.update_meta(notes=check_notes(notes))

    def update_meta(self, **fields) -> None:
        with self.lock(timeout=120):
            files.write_json(self.meta_path, {**(_read_object(self.meta_path) or {}), **fields})

    def recorded_status(self) -> dict[str, Any]:
        """``status.json`` as written, without fields of the wrong type: ``{}`` if there is
        none, ``{"state": "unreadable", "reason": ...}`` if it is not a readable JSON object."""
        try:
            raw = files.read_json(self.status_path)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            return {"state": UNREADABLE, "reason": f"status.json: {short_error(error)}"}
        if not isinstance(raw, dict):
            return {"state": UNREADABLE, "reason": "status.json is not a JSON object"}
        status = typed(raw, STATUS_FIELDS)
        if status.get("state") not in STATES:
            allowed = ", ".join(STATES)
            reason = f"status.json: state {raw.get('state')!r} is not one of {allowed}"
            return {**status, "state": UNREADABLE, "reason": reason}
        return status

    def status(self) -> dict[str, Any]:
        """The run's state, checked against its processes: a live run none of
        whose recorded processes is alive (on this host, or by its heartbeat on another:
        :func:`toolkit.runs.processes.running`) is ``failed`` (a run that has recorded none is given
        :data:`STARTUP_GRACE_S` to start one). A run in a scheduler's queue is as the
        scheduler says (:func:`toolkit.runs.placement.live_state`). Never raises."""
        status = self.recorded_status()
        if not status:  # no status.json: a directory being created, or abandoned
            status = {"state": State.QUEUED, "updated": _mtime(self.path)}
        if status["state"] not in LIVE:
            return status
        if (scheduled := placement.live_state(status)) is not None:
            return scheduled
        entries = self.process_records(status)
        if any(processes.running(self.path, entry) for entry in entries):
            return status
        if not entries and time.time() - status.get("updated", 0) < STARTUP_GRACE_S:
            return status
        return {
            **status,
            "state": State.FAILED,
            "reason": "its processes exited without writing a final status",
        }

    @staticmethod
    def process_records(status: dict[str, Any]) -> list[dict[str, Any]]:
        """The process records of ``status`` (an old status with only ``pid``: that one)."""
        if status.get("processes"):
            return status["processes"]
        return [{"role": "supervisor", "pid": status["pid"]}] if status.get("pid") else []

    def set_status(self, state: str, **fields) -> None:
        """Record ``state`` and ``fields`` (earlier fields are kept unless overwritten), under
        the run's lock. A run whose stop was requested is recorded as the stop asked
        (``stop_as``: ``stopped`` unless a pruner's ``pruned``) where ``completed`` or
        ``stopped`` is asked: training that was asked to stop never claims to have completed,
        and whoever records the stop first records the one asked."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        with self.lock(timeout=120):
            previous = self.recorded_status()
            if previous.get("state") == UNREADABLE:
                previous = {}
            if state in (State.COMPLETED, State.STOPPED) and previous.get("stop_requested"):
                state = previous.get("stop_as") or State.STOPPED
                fields.setdefault("reason", previous.get("reason") or "stopped on request")
            files.write_json(
                self.status_path, {**previous, **fields, "state": state, "updated": time.time()}
            )

    def note(self, **fields) -> None:
        """Record ``fields`` in the status, its state unchanged."""
        with self.lock(timeout=120):
            self.set_status(self.recorded_status().get("state", State.QUEUED), **fields)

    def finish(self, state: str, **fields) -> None:
        """Record the final ``state`` unless one is recorded already: the first final state
        wins, and a later one only adds the fields it lacks (an exit code), never a new state
        or reason. So the supervisor, which writes last, cannot overwrite training's own
        ``failed`` reason or a stop's ``stopped``."""
        with self.lock(timeout=120):
            previous = self.recorded_status()
            if previous.get("state") in TERMINAL:
                fields = {k: v for k, v in fields.items() if previous.get(k) is None}
                state, fields = previous["state"], {**fields, "reason": previous.get("reason")}
            self.set_status(state, **fields)

    def record_processes(
        self, *entries: dict[str, Any], replacing: str | None = None, **fields
    ) -> None:
        """Add process records (:func:`toolkit.runs.processes.record`) and ``fields`` to the
        status; ``replacing``: a role whose earlier records go (an elastic run's new world
        replaces its workers, so the departed are not looked for)."""
        with self.lock(timeout=120):
            status = self.recorded_status()
            new = {(e["host"], e["pid"]) for e in entries}
            kept = [
                e
                for e in status.get("processes", [])
                if (e["host"], e["pid"]) not in new and e.get("role") != replacing
            ]
            state = status.get("state")
            state = state if state in STATES else State.QUEUED
            self.set_status(state, processes=kept + [*entries], **fields)


def check_tag(tag: Any) -> str:
    """``tag`` without spaces at its ends, if it may tag a run (see :meth:`RunDir.set_tags`);
    else a ``ValueError`` naming it."""
    text = tag.strip() if isinstance(tag, str) else ""
    if not 0 < len(text) <= MAX_TAG_CHARS or "," in text or not text.isprintable():
        raise ValueError(
            f"tag {safe_yaml.short(tag)} must be 1 to {MAX_TAG_CHARS} printable characters "
            "without commas"
        )
    return text


def check_notes(notes: Any) -> str:
    """``notes``, if they may be a run's notes: text of at most :data:`MAX_NOTES_CHARS`."""
    if not isinstance(notes, str) or len(notes) > MAX_NOTES_CHARS:
        raise ValueError(f"notes must be text of at most {MAX_NOTES_CHARS:,} characters")
    return notes


def _read_object(path: Path) -> dict[str, Any] | None:
    try:
        value = files.read_json(path)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def paused_s(status: dict[str, Any]) -> float:
    """The ``paused_s`` of a run resumed now: the seconds it lay stopped or failed before
    earlier resumes, and since it ended (``finished``). A run's duration leaves them out."""
    ended = status.get("finished")
    return status.get("paused_s", 0.0) + (max(0.0, time.time() - ended) if ended else 0.0)


def short_error(error: BaseException) -> str:
    """The first line of ``error``'s message (its type's name if it has none)."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def list_runs(root: str | Path | None = None) -> list[RunDir]:
    """Every run directory under the root (real directories with a valid id; symlinks and
    staging directories are not runs), newest first by when it was created."""
    base = runs_root(root)
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    runs = [
        RunDir(Path(entry.path))
        for entry in entries
        if run_name_problem(entry.name) is None and _is_real_dir(entry)
    ]
    return sorted(runs, key=_created, reverse=True)


def _is_real_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _next_number(root: Path) -> int:
    """One more than the highest ``number`` of a run in ``root``, and at least how many runs it
    holds (runs made before runs were numbered): a new run's never repeats a living one's."""
    existing = list_runs(root)
    numbers = [run.recorded_status().get("number") for run in existing]
    return max([len(existing), *(n + 1 for n in numbers if isinstance(n, int))])


def _created(run: RunDir) -> float:
    for path in (run.config_path, run.path):
        try:
            return path.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
    return 0.0
