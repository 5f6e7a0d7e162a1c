"""Running a search (:mod:`toolkit.launching.search`): Optuna asks, the launch queue trains,
the run's own eval events answer.

Each trial is an ordinary run launched by :func:`toolkit.launching.launch.launch` (so by the
executor its config chooses), at most ``max_parallel`` at a time. While it trains, each new
evaluation in its events is reported to the study as the objective so far (the ``at: best``
objective reports the best so far), and the pruner is asked; a trial it prunes is ended by
:func:`~toolkit.launching.launch.prune` (state ``pruned``). A completed run tells the study its
objective.

A search resumes by looking, not by remembering: the study's journal says which trials were
asked and how each ended, and each trial's run directory says how its run stands. So a rerun
after the runner died (SIGKILL, a lost terminal) picks up the trials still training and goes
on; a trial whose run failed (its processes killed, its node lost) is resumed from its latest
intact checkpoint, or, with none, rerun as a new trial with the same parameters, each at most
``retries`` times (the search file's); a trial asked but never launched is failed and rerun the
same way. No trial is left running in the study once its run has ended, and none is launched
twice. One runner per search and runs root holds the search's lock.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from toolkit.config import ConfigError
from toolkit.launching import launch, runner_lock
from toolkit.launching.executors import registry
from toolkit.launching.search import (
    Search,
    SearchError,
    folder,
    load,
    sampler,
    save,
    study,
    tags,
)
from toolkit.launching.slots import capacity, check_fits, slots_of
from toolkit.launching.sweep_runner import detached, free_id
from toolkit.runs import checkpoints
from toolkit.runs.events import read_events
from toolkit.runs.rundir import LIVE, RunDir, RunError, runs_root
from toolkit.runs.states import State
from toolkit.words import counted

POLL_S = 1.0
RUN_ID = "run_id"
ATTEMPT = "attempt"
RETRY_OF = "retry_of"
REASON = "reason"
RETRY_OWED = "retry_owed"  # set on a failure before it is told: a retry is due
ASKED = "asked"  # a trial in flight whose run does not exist yet


@dataclasses.dataclass
class _InFlight:
    """A trial being trained: its Optuna trial, its run, how many of its evaluations the
    study has been told, and where the pruner stopped it."""

    trial: object  # optuna.trial.Trial
    run: RunDir
    reported: int = 0
    prune_at: int | None = None  # the evaluation the pruner stopped it at, until it has ended


def run(
    search: Search | str | Path,
    root: str | Path | None = None,
    *,
    max_parallel: int | None = None,
    log: Callable[[str], None] = print,
    poll_s: float = POLL_S,
) -> pd.DataFrame:
    """Run ``search`` until it has its ``trials`` ended (completed, pruned, or failed with no
    retry left), ``max_parallel`` trials at a time (default: as many as the launch queue's
    slots hold; on Slurm, every trial, Slurm's queue pacing them), and return :func:`trials`.
    Safe to call again after an interruption (see the module docstring). A second runner of
    the same search raises :class:`SearchError` while the first is alive."""
    search = search if isinstance(search, Search) else load(search)
    base = runs_root(root)
    check_runnable(search, base)
    config = search.config({}, 0)
    queues_here = registry.choose(config).queues_here  # else its executor's queue paces it
    need = slots_of(config)
    if max_parallel is None and not queues_here:
        max_parallel = search.spec.trials
    elif max_parallel is None:
        have = capacity(base)
        max_parallel = max(1, min(have.get(host, n) // n for host, n in need.items()))
    elif isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise SearchError(f"max_parallel must be an integer >= 1 (got {max_parallel!r})")
    refusal = SearchError(f"search {search.name!r} is already being run by another process")
    with runner_lock.held(folder(base) / f"{search.name}.lock", refusal):
        save(search, base)
        _Runner(search, base, max_parallel, log).run(poll_s)
    return trials(search, base)


def check_runnable(search: Search, root: str | Path | None = None) -> None:
    """Raise :class:`SearchError` naming the base, or the first space value, a trial could not
    run with here: a plan its dataset cannot make, or more slots than this machine's launch
    queue gives (for a trial that waits in it). Checked before anything starts: by
    :func:`run`, :func:`start` and ``search --dry-run``."""
    base = runs_root(root)
    tried = [("base", {})] + [(f"space.{p} = {_short(v)}", {p: v}) for p, v in search.edges()]
    for label, params in tried:
        config = search.config(params, 0)
        try:
            launch.check_fits_dataset(config)
            if registry.choose(config).queues_here:
                check_fits(slots_of(config), base)
        except (ConfigError, RunError) as error:
            raise SearchError(f"search {search.name}, {label}: {error}") from None


class _Runner:
    """One runner's pass over a search (see the module docstring)."""

    def __init__(self, search: Search, base: Path, limit: int, log: Callable[[str], None]):
        import optuna

        self.optuna = optuna
        self.search, self.base, self.limit, self.log = search, base, limit, log
        self.study = study(search, base)
        self.spec = search.spec
        self.in_flight: dict[int, _InFlight] = {}

    def run(self, poll_s: float) -> None:
        self._recover()
        self.log(self._progress("going on" if self.study.trials else "starting"))
        while True:
            for number in list(self.in_flight):
                self._follow(self.in_flight[number])
            while len(self.in_flight) < self.limit and self._wanted():
                self._start_next()
            if not self.in_flight:
                break
            time.sleep(poll_s)
        self.log(self._progress("done"))

    # --- the study's view -----------------------------------------------------------------

    def _trials(self, *states):
        return self.study.get_trials(deepcopy=False, states=states or None)

    def _retried(self) -> set[int]:
        return {t.user_attrs[RETRY_OF] for t in self._trials() if RETRY_OF in t.user_attrs}

    def _wanted(self) -> bool:
        """Whether another trial should be asked: one waits (a retry), or fewer than
        ``trials`` are ended or under way (a failure with a retry counts as its retry)."""
        ts = self.optuna.trial.TrialState
        if self._trials(ts.WAITING):
            return True
        retried = self._retried()
        counted_ = [t for t in self._trials() if t.state != ts.FAIL or t.number not in retried]
        return len(counted_) < self.spec.trials

    def _progress(self, word: str) -> str:
        ts = self.optuna.trial.TrialState
        ended = {
            _STATES[state.name]: len(self._trials(state))
            for state in (ts.COMPLETE, ts.PRUNED, ts.FAIL)
        }
        said = ", ".join(f"{n} {s}" for s, n in ended.items() if n)
        best = ""
        if self._trials(ts.COMPLETE):
            trial = self.study.best_trial
            best = f"; best {self.spec.objective.metric} {trial.value:.4f} (trial {trial.number})"
        return (
            f"search {self.search.name} {word}: {counted(self.spec.trials, 'trial')}, "
            f"{said or 'none ended'}, {len(self.in_flight)} training{best}"
        )

    # --- starting and recovering -------------------------------------------------------

    def _start_next(self) -> None:
        """Ask the study for a trial and launch its run, its line logged first (what the
        launch warns of follows the trial it is about)."""
        self.study.sampler = sampler(self.search, len(self._trials()))
        trial = self.study.ask(self.search.distributions())
        attempt = trial.user_attrs.get(ATTEMPT, 1)
        try:
            config = self.search.config(trial.params, trial.number)
            run_id = free_id(config.name, self.base)
            trial.set_user_attr(RUN_ID, run_id)  # before the run exists: a crash is seen
            shown = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
            again = f", attempt {attempt}" if attempt > 1 else ""
            self.log(f"trial {trial.number} ({run_id}{again}): {shown}")
            run = launch.launch(
                config,
                runs_root_dir=self.base,
                run_id=run_id,
                meta={"search": self.search.name, "trial": trial.number, "params": trial.params},
                tags=tags(self.search.name, trial.number),
            )
        except (ConfigError, RunError, OSError) as error:  # this trial's values cannot run
            self._tell_failed(trial, f"could not launch: {error}", retry=False)
            return
        self.in_flight[trial.number] = _InFlight(trial, run)

    def _recover(self) -> None:
        """Adopt the trials a dead runner left running; fail those never launched; give a
        retry to each failure owed one (a runner that died between the two)."""
        ts = self.optuna.trial.TrialState
        for frozen in self._trials(ts.RUNNING):
            # the study's live handle on a trial asked by another process
            trial = self.optuna.trial.Trial(self.study, frozen._trial_id)
            run_id = frozen.user_attrs.get(RUN_ID)
            if run_id is None or not (self.base / run_id).is_dir():
                self._tell_failed(trial, "its runner ended before launching it", retry=True)
                continue
            reported = len(frozen.intermediate_values)
            self.in_flight[frozen.number] = _InFlight(trial, RunDir(self.base / run_id), reported)
        retried = self._retried()
        for frozen in self._trials(ts.FAIL):
            if frozen.number not in retried and frozen.user_attrs.get(RETRY_OWED):
                self._enqueue_retry(frozen.number, frozen.params, frozen.user_attrs.get(ATTEMPT, 1))

    # --- following a trial ---------------------------------------------------------------

    def _follow(self, flight: _InFlight) -> None:
        """Report the trial's new evaluations, prune it if the pruner says so, and tell the
        study how it ended once its run has."""
        status = launch.settle(flight.run)
        values = self._evaluations(flight.run)
        trial, objective = flight.trial, self.spec.objective
        state, prune_at = status["state"], None
        for count in range(flight.reported + 1, len(values) + 1):
            trial.report(objective.of(values[:count]), step=count)
            flight.reported = count
            # asked at every evaluation, even one read late or of a run that has ended:
            # ASHA keeps a trial's value at each rung as it is asked there
            if trial.should_prune() and state in LIVE:
                prune_at = count
                break
        if prune_at is None and state in LIVE:
            prune_at = flight.prune_at  # a prune that could not end its run last time
        if prune_at is not None:
            value = objective.of(values[:prune_at])
            why = (
                f"pruned by search {self.search.name}'s {self.spec.pruner} pruner at "
                f"evaluation {prune_at} ({objective.metric} {value:.4f})"
            )
            try:
                launch.prune(flight.run, why)
            except RunError as error:  # ended meanwhile, or busy: tried again next time
                flight.prune_at = prune_at
                self.log(f"trial {trial.number}: not pruned yet ({error})")
                return
            state = flight.run.status()["state"]
        if state in LIVE:
            return
        del self.in_flight[trial.number]
        reason = flight.run.status().get("reason") or "no reason recorded"
        if state == State.PRUNED:
            self.study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            self.log(f"trial {trial.number}: pruned ({reason})")
        elif state == State.COMPLETED and (value := objective.of(values)) is not None:
            self.study.tell(trial, value)
            self.log(f"trial {trial.number}: completed, {objective.metric} {value:.4f}")
        elif state == State.COMPLETED:
            self._tell_failed(trial, "completed without an evaluation", retry=False)
        elif state == State.STOPPED:
            self._tell_failed(trial, f"stopped ({reason})", retry=False)
        else:
            self._failed(flight, reason)

    def _evaluations(self, run: RunDir) -> list[float]:
        """The objective's metric at each evaluation in ``run``'s events, in order."""
        try:
            events = read_events(run.events_path)
        except OSError:
            return []
        metric = self.spec.objective.metric
        if events.empty or "phase" not in events or metric not in events:
            return []
        evals = events[events.phase == "eval"].sort_values("step")
        return [float(v) for v in evals[metric]]

    def _failed(self, flight: _InFlight, reason: str) -> None:
        """A trial whose run failed: resumed from its latest intact checkpoint while it has
        retries, else failed (and rerun as a new trial while it has retries)."""
        trial = flight.trial
        attempt = trial.user_attrs.get(ATTEMPT, 1)
        intact, _ = checkpoints.latest_intact(flight.run.checkpoints_path)
        if attempt <= self.spec.retries and intact is not None:
            try:
                launch.resume(flight.run, self.base)
            except (RunError, ConfigError, OSError) as error:
                reason = f"{reason}; could not resume: {error}"
            else:
                trial.set_user_attr(ATTEMPT, attempt + 1)
                self.in_flight[trial.number] = flight
                self.log(
                    f"trial {trial.number}: failed ({reason}); resumed from its checkpoint "
                    f"{intact.name} (attempt {attempt + 1} of {self.spec.retries + 1})"
                )
                return
        self._tell_failed(trial, reason, retry=True)

    def _tell_failed(self, trial, reason: str, retry: bool) -> None:
        attempt = trial.user_attrs.get(ATTEMPT, 1)
        owed = retry and attempt <= self.spec.retries
        trial.set_user_attr(REASON, reason)
        trial.set_user_attr(RETRY_OWED, owed)
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        then = "; rerun as a new trial" if owed else ""
        self.log(f"trial {trial.number}: failed ({reason}){then}")
        if owed:
            self._enqueue_retry(trial.number, trial.params, attempt)

    def _enqueue_retry(self, number: int, params: dict, attempt: int) -> None:
        """Ask for trial ``number``'s parameters again, as its attempt ``attempt + 1``."""
        self.study.enqueue_trial(params, user_attrs={ATTEMPT: attempt + 1, RETRY_OF: number})


TRIAL_COLUMNS = ["trial", "state", "value", RUN_ID, ATTEMPT, REASON]
"""The columns of :func:`trials` before the space's parameters."""


def trials(search: Search | str | Path, root: str | Path | None = None) -> pd.DataFrame:
    """One row per trial asked so far, in the order asked: its number, state, objective value,
    run id, attempt, reason and parameters. A trial the study has been told the end of has that
    end (in the lab's words); one in flight has its run's state (``queued``, ``running``, or an
    end no runner has told the study yet), ``asked`` before its run exists. The reason is why a
    trial did not complete: its failure's, or its run's (a pruned trial's pruner and
    evaluation). The columns are the same with no trial asked yet."""
    search = search if isinstance(search, Search) else load(search)
    base = runs_root(root)
    if not (folder(base) / f"{search.name}.journal").exists():
        return pd.DataFrame(columns=TRIAL_COLUMNS + list(search.spec.space))
    rows = []
    for trial in study(search, base).get_trials(deepcopy=False):
        run_id = trial.user_attrs.get(RUN_ID)
        run = RunDir(base / run_id) if run_id and (base / run_id).is_dir() else None
        status = run.status() if run else {}
        state = _STATES.get(trial.state.name) or status.get("state") or ASKED
        reason = trial.user_attrs.get(REASON)
        if state != State.COMPLETED and reason is None:
            reason = status.get("reason")
        rows.append(
            {
                "trial": trial.number,
                "state": str(state),
                "value": trial.value,
                RUN_ID: run_id,
                ATTEMPT: trial.user_attrs.get(ATTEMPT, 1),
                REASON: reason,
                **trial.params,
            }
        )
    return pd.DataFrame(rows, columns=TRIAL_COLUMNS + list(search.spec.space))


def unfollowed(table: pd.DataFrame, name: str, root: str | Path | None = None) -> str | None:
    """What to say when trials of ``table`` are in flight and no runner of search ``name`` is
    alive to follow them (their evaluations are not reported, nothing is pruned, no trial
    is asked after them); ``None`` when a runner is alive or nothing is in flight."""
    in_flight = table[table["state"].isin([*LIVE, ASKED])] if len(table) else table
    if in_flight.empty or runner_active(name, root):
        return None
    return (
        f"no runner of search {name} is alive: {counted(len(in_flight), 'trial')} in flight "
        f"{'is' if len(in_flight) == 1 else 'are'} not followed (not reported, not pruned); "
        "run the search again to go on from where it stopped"
    )


_STATES = {"COMPLETE": "completed", "FAIL": "failed", "PRUNED": "pruned", "WAITING": "waiting"}


def best(search: Search | str | Path, root: str | Path | None = None) -> pd.Series:
    """The best completed trial's row of :func:`trials` (raises :class:`SearchError` if none
    has completed)."""
    table = trials(search, root)
    done = table[table.state == "completed"] if len(table) else table
    if done.empty:
        raise SearchError("no trial of this search has completed yet")
    objective = (search if isinstance(search, Search) else load(search)).spec.objective
    values = done["value"]
    return done.loc[values.idxmax() if objective.direction == "maximize" else values.idxmin()]


def start(
    search: Search, root: str | Path | None = None, *, max_parallel: int | None = None
) -> int:
    """Run ``search`` in a background process of its own session (the app's and notebooks'
    way: it outlives them), output appended to ``<root>/.searches/<name>.log``; returns its
    pid. Raises :class:`SearchError` if a runner of this search is alive already."""
    base = runs_root(root)
    if runner_active(search.name, base):
        raise SearchError(f"search {search.name!r} is already being run by another process")
    check_runnable(search, base)
    command = [sys.executable, "-m", "toolkit", "--runs", str(base), "search"]
    command += [str(save(search, base))]
    command += [f"--max-parallel={max_parallel}"] * bool(max_parallel)
    return detached(command, folder(base) / f"{search.name}.log")


def runner_active(name: str, root: str | Path | None = None) -> bool:
    """Whether a runner of search ``name`` is alive (it holds the search's lock)."""
    return runner_lock.is_held(folder(root) / f"{name}.lock")


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
