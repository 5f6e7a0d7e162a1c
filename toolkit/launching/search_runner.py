"""Running a search (:mod:`toolkit.launching.search`) as a set of runs of
:mod:`toolkit.launching.runner`: Optuna asks, the launch queue trains, the runs' own eval
events answer.

Each trial is an ordinary run (or one per seed, with ``seeds``) launched by the runner, at most
``max_parallel`` runs at a time. While it trains, each new evaluation in its events is
reported to the study as the objective so far (the ``at: best`` objective reports the best so
far; with several seeds the mean over them, once each has made that evaluation), and the pruner
is asked; a trial it prunes has its runs ended by :func:`~toolkit.launching.launch.prune`
(state ``pruned``). A completed trial tells the study its objective (its seeds' mean).

A search resumes by looking, not by remembering: the study's journal says which trials were
asked and how each ended, and each trial's run directories say how its runs stand. So a rerun
after the runner died (SIGKILL, a lost terminal) picks up the trials still training and goes
on. A run that failed (its processes killed, its node lost) is given the runner's retries
(:func:`toolkit.launching.runner.retry`): resumed from its latest intact checkpoint, or, with
none, its trial rerun as a new trial with the same parameters, each at most ``retries`` times
(the search file's); a trial asked but never launched is failed and rerun the same way. No
trial is left running in the study once its runs have ended, and none is launched twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from toolkit.config import ConfigError
from toolkit.launching import launch, runner
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
from toolkit.runs.events import read_events
from toolkit.runs.rundir import LIVE, RunDir, RunError, runs_root
from toolkit.runs.states import State
from toolkit.words import counted

RUN_ID = "run_id"
RUN_IDS = "run_ids"  # a trial's run for each of its seeds, in order (RUN_ID is the first)
ATTEMPT = runner.ATTEMPT
RETRY_OF = "retry_of"
REASON = "reason"
RETRY_OWED = "retry_owed"  # set on a failure before it is told: a retry is due
ASKED = "asked"  # a trial in flight whose run does not exist yet


@dataclasses.dataclass
class _Trial:
    """A trial in flight: its Optuna trial, its seeds' runs (a flight each, once launched;
    the state each ended in), how many of its evaluations the study has been told, and where
    the pruner stopped it."""

    trial: object  # optuna.trial.Trial
    flights: dict[int, runner.Flight] = dataclasses.field(default_factory=dict)
    ended: dict[int, str] = dataclasses.field(default_factory=dict)
    reported: int = 0
    prune_at: int | None = None  # the evaluation the pruner stopped it at, until it has ended

    @property
    def number(self) -> int:
        return self.trial.number


def run(
    search: Search | str | Path,
    root: str | Path | None = None,
    *,
    max_parallel: int | None = None,
    log: Callable[[str], None] = print,
    poll_s: float = runner.POLL_S,
) -> pd.DataFrame:
    """Run ``search`` until it has its ``trials`` ended (completed, pruned, or failed with no
    retry left), ``max_parallel`` runs at a time (default: as many as the launch queue's
    slots hold; on Slurm, every run, Slurm's queue pacing them), and return :func:`trials`.
    Safe to call again after an interruption (see the module docstring). A second runner of
    the same search raises :class:`SearchError` while the first is alive."""
    search = search if isinstance(search, Search) else load(search)
    base = runs_root(root)
    runner.run(SearchSet(search, base, log), max_parallel=max_parallel, log=log, poll_s=poll_s)
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
            runner.check_fits_here(config, base)
        except (ConfigError, RunError) as error:
            raise SearchError(f"search {search.name}, {label}: {error}") from None


class SearchSet(runner.RunSet):
    """A search as a set of runs: Optuna asks, each trial trains one run per seed, the runs'
    own eval events answer (see the module docstring)."""

    kind, error = "search", SearchError

    def __init__(self, search: Search, base: Path, log: Callable[[str], None] = print):
        import optuna

        self.optuna, self.log = optuna, log
        self.search, self.base, self.name = search, base, search.name
        self.folder, self.spec = folder(base), search.spec
        self.retries = self.spec.retries
        self.trials: dict[int, _Trial] = {}

    def configs(self):
        return [self.search.config({}, 0)]

    def size(self) -> int:
        return self.spec.trials * self.spec.seeds

    def check(self) -> None:
        check_runnable(self.search, self.base)

    def save(self) -> Path:
        return save(self.search, self.base)

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

    def progress(self, word: str, in_flight: int, limit: int) -> str:
        ts = self.optuna.trial.TrialState
        if word == "starting" and self._trials(ts.COMPLETE, ts.PRUNED, ts.FAIL, ts.RUNNING):
            word = "going on"
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
            f"search {self.name} {word}: {counted(self.spec.trials, 'trial')}, "
            f"{said or 'none ended'}, {len(self.trials)} training{best}"
        )

    # --- starting and recovering -------------------------------------------------------

    def _planned(self, flight: _Trial, seed: int) -> runner.Planned:
        trial = flight.trial
        config = self.search.config(trial.params, trial.number, seed)
        meta = {"search": self.name, "trial": trial.number, "params": trial.params}
        if self.spec.seeds > 1:
            meta["seed_index"] = seed
        meta[ATTEMPT] = trial.user_attrs.get(ATTEMPT, 1)
        label = f"trial {trial.number}" + (f" seed {seed}" if self.spec.seeds > 1 else "")
        item = (trial.number, seed)
        return runner.Planned(config, config.name, meta, label, item, tags(self.name, trial.number))

    def next(self) -> runner.Planned | None:
        """A seed of a trial in flight not launched yet, else a new trial's first seed."""
        for flight in self.trials.values():
            pending = [s for s in range(self.spec.seeds) if s not in flight.flights]
            if pending and flight.prune_at is None:
                return self._planned(flight, pending[0])
        if not self._wanted():
            return None
        self.study.sampler = sampler(self.search, len(self._trials()))
        flight = _Trial(self.study.ask(self.search.distributions()))
        try:
            planned = self._planned(flight, 0)
        except ConfigError as error:  # this trial's values cannot run
            self._tell_failed(flight.trial, f"could not launch: {error}", retry=False)
            return self.next()
        self.trials[flight.number] = flight
        return planned

    def launching(self, planned: runner.Planned, run_id: str, attempt: int) -> None:
        """Record the run id on the trial before the run exists (a crash is seen), and log the
        trial's line first (what the launch warns of follows the trial it is about)."""
        number, seed = planned.item
        trial = self.trials[number].trial
        run_ids = list(trial.user_attrs.get(RUN_IDS, []))
        run_ids[seed:] = [run_id]
        trial.set_user_attr(RUN_IDS, run_ids)
        trial.set_user_attr(RUN_ID, run_ids[0])
        if seed == 0:
            shown = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
            again = f", attempt {attempt}" if attempt > 1 else ""
            seeds = f", {self.spec.seeds} seeds" if self.spec.seeds > 1 else ""
            self.log(f"trial {number} ({run_id}{seeds}{again}): {shown}")

    def launched(self, flight: runner.Flight) -> None:
        number, seed = flight.planned.item
        self.trials[number].flights[seed] = flight

    def not_launched(self, planned: runner.Planned, error: Exception) -> None:
        flight = self.trials.pop(planned.item[0])
        self._end_siblings(flight, f"trial {flight.number} could not launch")
        self._tell_failed(flight.trial, f"could not launch: {error}", retry=False)

    def recover(self, log) -> list[runner.Flight]:
        """Open the study; adopt the trials a dead runner left running; fail those whose runs
        were never launched; give a retry to each failure owed one (a runner that died between
        the two)."""
        self.study = study(self.search, self.base)
        ts = self.optuna.trial.TrialState
        adopted = []
        for frozen in self._trials(ts.RUNNING):
            # the study's live handle on a trial asked by another process
            trial = self.optuna.trial.Trial(self.study, frozen._trial_id)
            run_ids = frozen.user_attrs.get(RUN_IDS) or [frozen.user_attrs.get(RUN_ID)]
            flight = _Trial(trial, reported=len(frozen.intermediate_values))
            if any(r is None or not (self.base / r).is_dir() for r in run_ids):
                self._end_siblings(flight, f"trial {frozen.number}'s runner ended")
                self._tell_failed(trial, "its runner ended before launching it", retry=True)
                continue
            self.trials[frozen.number] = flight
            for seed, run_id in enumerate(run_ids):
                run = RunDir(self.base / run_id)
                attempt = run.meta().get(ATTEMPT, frozen.user_attrs.get(ATTEMPT, 1))
                flight.flights[seed] = runner.Flight(self._planned(flight, seed), run, attempt)
                adopted.append(flight.flights[seed])
        retried = self._retried()
        for frozen in self._trials(ts.FAIL):
            if frozen.number not in retried and frozen.user_attrs.get(RETRY_OWED):
                self._enqueue_retry(frozen.number, frozen.params, frozen.user_attrs.get(ATTEMPT, 1))
        return adopted

    # --- following a trial ---------------------------------------------------------------

    def watch(self, flights: list[runner.Flight]) -> None:
        """Report each trial's new evaluations (the mean over its seeds, once every seed has
        made it) and prune it if the pruner says so."""
        for flight in list(self.trials.values()):
            if flight.flights:
                self._report(flight)

    def _report(self, flight: _Trial) -> None:
        objective, trial = self.spec.objective, flight.trial
        values = [self._evaluations(f.run) for f in flight.flights.values()]
        live = [f for f in flight.flights.values() if f.state in LIVE]
        made = min(map(len, values)) if len(values) == self.spec.seeds else 0
        prune_at = None
        for count in range(flight.reported + 1, made + 1):
            trial.report(_mean(objective.of(v[:count]) for v in values), step=count)
            flight.reported = count
            # asked at every evaluation, even one read late or of a run that has ended:
            # ASHA keeps a trial's value at each rung as it is asked there
            if trial.should_prune() and live:
                prune_at = count
                break
        prune_at = prune_at or (flight.prune_at if live else None)
        if prune_at is None:
            return
        value = _mean(objective.of(v[:prune_at]) for v in values)
        why = (
            f"pruned by search {self.name}'s {self.spec.pruner} pruner at "
            f"evaluation {prune_at} ({objective.metric} {value:.4f})"
        )
        flight.prune_at = prune_at
        for seed_flight in live:
            try:
                launch.prune(seed_flight.run, why)
            except RunError as error:  # ended meanwhile, or busy: tried again next time
                self.log(f"trial {trial.number}: not pruned yet ({error})")
            seed_flight.status = seed_flight.run.status()

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

    def resumed(self, flight: runner.Flight) -> None:
        trial = self.trials[flight.planned.item[0]].trial
        trial.set_user_attr(ATTEMPT, max(flight.attempt, trial.user_attrs.get(ATTEMPT, 1)))

    def ended(self, flight: runner.Flight, reason: str) -> None:
        """A seed's run has ended with no further attempt. A failed or stopped one fails its
        trial at once (ending its other seeds' runs); once every seed's run has ended, the
        study is told how the trial ended: pruned if the pruner stopped it, else completed,
        worth the mean of its seeds' objectives."""
        number, seed = flight.planned.item
        if number not in self.trials:  # its trial was told already (a sibling failed)
            return
        trial_flight = self.trials[number]
        trial_flight.ended[seed] = flight.state
        if flight.state in (State.FAILED, State.STOPPED) and trial_flight.prune_at is None:
            self._fail(trial_flight, flight, reason, retry=False)
            return
        if len(trial_flight.ended) < len(trial_flight.flights) or (
            trial_flight.prune_at is None and len(trial_flight.flights) < self.spec.seeds
        ):
            return  # seeds still training, or still to launch
        del self.trials[number]
        trial, objective = trial_flight.trial, self.spec.objective
        states = set(trial_flight.ended.values())
        values = [objective.of(self._evaluations(f.run)) for f in trial_flight.flights.values()]
        if State.PRUNED in states:
            self.study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            self.log(f"trial {number}: pruned ({reason})")
        elif states == {State.COMPLETED} and None not in values:
            value = _mean(values)
            self.study.tell(trial, value)
            spread = f" (mean of {len(values)} seeds)" if len(values) > 1 else ""
            self.log(f"trial {number}: completed, {objective.metric} {value:.4f}{spread}")
        else:
            self._tell_failed(trial, "completed without an evaluation", retry=False)

    def relaunch(self, flight: runner.Flight, reason: str) -> None:
        """A failed run with no checkpoint to resume: its trial fails and is rerun as a new
        trial with the same parameters (Optuna keeps the failure, its sampler sees it)."""
        trial_flight = self.trials.get(flight.planned.item[0])
        if trial_flight is not None:
            self._fail(trial_flight, flight, reason, retry=True)

    def _fail(self, trial_flight: _Trial, flight: runner.Flight, reason: str, retry: bool):
        """The trial fails with its seed's run ``flight`` (its other seeds' runs ended)."""
        del self.trials[trial_flight.number]
        self._end_siblings(trial_flight, f"trial {trial_flight.number} failed")
        said = f"stopped ({reason})" if flight.state == State.STOPPED else reason
        self._tell_failed(trial_flight.trial, said, retry=retry)

    def _end_siblings(self, trial_flight: _Trial, why: str) -> None:
        """End the trial's other seeds' runs still live: the trial they count for is over."""
        for flight in trial_flight.flights.values():
            if flight.run.status()["state"] in LIVE:
                try:
                    launch.prune(flight.run, why)
                except RunError as error:
                    self.log(f"{flight.planned.label}: could not end it ({error})")

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


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


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
    runner.check_parallel(max_parallel, SearchError)
    base = runs_root(root)
    check_runnable(search, base)
    flags = [f"--max-parallel={max_parallel}"] * bool(max_parallel)
    return runner.start(SearchSet(search, base), flags)


def runner_active(name: str, root: str | Path | None = None) -> bool:
    """Whether a runner of search ``name`` is alive (it holds the search's lock)."""
    return runner.active(folder(root), name)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
