"""Searches (toolkit.launching.search, search_runner): the search file refused naming the bad
field before anything starts, the objective's rule, and one real search under horovodrun (TPE
with ASHA, 5 trials of 1 worker on 2 slots, ~40 s) whose runner is killed with SIGKILL beside a
trial's worker, then run again: every trial ends once, the killed one resumed from its
checkpoint, the study's values are the runs' own evaluations, the pruned runs are ``pruned``,
and the best trial launched again scores the same."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT, dashboard, run_cli

from app.data import md_escape
from toolkit import terminal
from toolkit.launching import launch, search, search_runner, slots
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir, list_runs

BASE = {
    "seed": 0,
    "dataset": {"name": "mnist1d"},
    "model": {"name": "cnn1d"},
    "optimizer": {"name": "sgd", "learning_rate": 0.1, "params": {"momentum": 0.9}},
    "batch": {"per_worker": 16},  # 250 updates an epoch (0.3-0.5 s here): over 8 epochs the
    "epochs": 8,  # runner, polling each second, finds a run live after its first evaluation,
    # where the pruner acts (over 4, a hopeless trial sometimes ended before a poll saw it)
    "workers": 1,
    "logging": {"every_steps": 50},
    "checkpoint": {"every_epochs": 1},
}


GOOD = {"optimizer.learning_rate": 0.1, "optimizer.params.momentum": 0.9}
HOPELESS = {"optimizer.learning_rate": 1e-4, "optimizer.params.momentum": 0.0}


def spec(**changes) -> dict:
    return {
        "name": "s",
        "base": BASE,
        "space": {
            "optimizer.learning_rate": {"low": 1e-4, "high": 1.0, "log": True},
            "optimizer.params.momentum": {"low": 0.0, "high": 0.95},
        },
        "trials": 5,
        "seed": 3,
        **changes,
    }


# ------------------------------------------------------------------------ the search file


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"sampler": "bayes"}, "sampler: Input should be 'tpe', 'gp', 'random' or 'grid'"),
        ({"pruner": "asa"}, "pruner: Input should be 'asha', 'hyperband', 'median' or 'none'"),
        ({"trials": 0}, "trials: Input should be greater than or equal to 1"),
        ({"objective": "accuracyy"}, "objective.metric: Input should be 'accuracy' or 'loss'"),
        ({"samplr": "tpe"}, "samplr: Extra inputs are not permitted"),
        ({"space": {}}, "space: give a mapping of dotted config paths"),
        (
            {"space": {"optimizer.learning_rate": {"low": 2.0, "high": 1.0}}},
            "space: optimizer.learning_rate: low must be below high",
        ),
        (
            {"space": {"optimizer.learning_rate": {"low": 0.0, "high": 1.0, "log": True}}},
            "space: optimizer.learning_rate: a log range needs low > 0",
        ),
        (
            {"space": {"optimizer.learning_rate": {"low": 0.1, "hi": 1.0}}},
            "space: optimizer.learning_rate: high: Field required; hi: Extra inputs are not "
            "permitted",
        ),
        ({"space": {"batch.per_worker": []}}, "space: batch.per_worker has no choices"),
        ({"space": {"seed": [0, 1]}}, "space: seed is the search's to set"),
        ({"seeds": 0}, "seeds: Input should be greater than or equal to 1"),
        ({"seeds": 11}, "seeds: Input should be less than or equal to 10"),
        (
            {"sampler": "grid"},
            "space.optimizer.learning_rate: the grid sampler takes lists of choices",
        ),
    ],
)
def test_a_bad_search_file_is_refused_naming_the_field(changes, named):
    with pytest.raises(search.SearchError, match="invalid search file") as refused:
        search.from_mapping(spec(**changes))
    assert named in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    "space, named",
    [
        (
            {"optimizer.learning_rat": {"low": 0.1, "high": 1.0}},
            "space.optimizer.learning_rat = 0.1: optimizer.learning_rat: Extra inputs are not "
            "permitted (got 0.1); did you mean learning_rate?",
        ),
        (
            {"batch.per_worker": [16, 0]},
            "space.batch.per_worker = 0: batch.per_worker: Input should be greater than or "
            "equal to 1",
        ),
        (
            {"optimizer.learning_rate": {"low": -1.0, "high": 1.0}},
            "space.optimizer.learning_rate = -1.0: optimizer.learning_rate:",
        ),
    ],
)
def test_a_space_field_the_config_refuses_is_named_with_the_configs_words(space, named, tmp_path):
    with pytest.raises(search.SearchError, match="invalid search 's'") as refused:
        search.from_mapping(spec(space=space))
    assert named in str(refused.value), str(refused.value)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(space=space)))
    result = run_cli(["search", str(path)], tmp_path / "runs", timeout=60)
    assert result.returncode == 2 and named in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_a_trials_last_seed_past_the_configs_seeds_is_refused():
    """Seeds are the base's seed and the next ones: the last must be a seed the config takes."""
    with pytest.raises(search.SearchError) as refused:
        search.from_mapping(spec(base={**BASE, "seed": 2**32 - 2}, seeds=3))
    said = str(refused.value)
    assert "seeds: 3 = 4294967296: seed: Input should be less than or equal to" in said, said


def test_a_base_that_is_not_there_is_named(tmp_path):
    with pytest.raises(search.SearchError, match="base: config file 'nowhere.yaml' does not exist"):
        search.from_mapping(spec(base="nowhere.yaml"), folder=tmp_path)


def test_ranges_are_integer_when_both_bounds_are_and_say_so_in_the_dry_run(tmp_path, capsys):
    from toolkit.__main__ import main

    space = {
        "schedule.warmup.epochs": {"low": 0, "high": 2},
        "optimizer.learning_rate": {"low": 1, "high": 4, "type": "float", "log": True},
        "optimizer.params.momentum": [0.8, 0.9],
    }
    found = search.from_mapping(spec(space=space))
    kinds = {p: type(d).__name__ for p, d in found.distributions().items()}
    assert kinds == {
        "schedule.warmup.epochs": "IntDistribution",
        "optimizer.learning_rate": "FloatDistribution",
        "optimizer.params.momentum": "CategoricalDistribution",
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(space=space)))
    assert main(["--runs", str(tmp_path / "runs"), "search", str(path), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "search s: 5 trials, sampler tpe (seed 3), pruner asha" in said
    assert "schedule.warmup.epochs: int 0 to 2" in said
    assert "optimizer.learning_rate: float 1 to 4, log" in said
    assert "optimizer.params.momentum: one of 0.8, 0.9" in said


def test_a_space_value_this_machine_cannot_place_is_named_before_anything_starts(tmp_path):
    """A range of workers past the queue's slots passes the config's own rules (any count up
    to its maximum is a config), so the dry run asks the launch queue too (~2 s)."""
    slots.set_capacity("localhost:2", tmp_path / "runs")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(space={"workers": {"low": 1, "high": 64}})))
    result = run_cli(["search", str(path), "--dry-run"], tmp_path / "runs", timeout=60)
    assert result.returncode == 2, result.stdout
    assert "search s, space.workers = 64: 64 workers on localhost can never start" in (
        result.stderr
    )
    found = search.load(path)
    with pytest.raises(search.SearchError, match="space.workers = 64"):
        search_runner.start(found, tmp_path / "runs")
    assert not (tmp_path / "runs" / ".searches" / "s.journal").exists()


def test_the_trials_table_says_what_each_trial_is_doing_and_why_it_ended(tmp_path, capsys):
    """Before any trial, the status is a sentence, not a traceback; a trial whose run waits in
    the queue is ``queued``, one asked but not launched ``asked``; a pruned trial's reason is
    its run's; with trials in flight and no runner alive, both views say nobody follows them.
    No training: the study and the runs are made by hand (~2 s)."""
    from optuna.trial import TrialState

    from toolkit.__main__ import main

    root, path = tmp_path / "runs", tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec()))
    found = search.load(path)
    assert main(["--runs", str(root), "search", str(path), "--status"]) == 1
    assert capsys.readouterr().out.startswith("no trial of search s asked yet under ")
    empty = search_runner.trials(found, root)
    assert list(empty.columns) == [*search_runner.TRIAL_COLUMNS, *found.spec.space]

    study = search.study(found, root)
    pruned, queued, asked = (study.ask(found.distributions()) for _ in range(3))
    for trial in (pruned, queued):
        trial.set_user_attr(search_runner.RUN_ID, f"s-t{trial.number}")
        RunDir.create(root, f"s-t{trial.number}")
    why = "pruned by search s's asha pruner at evaluation 2 (accuracy 0.3125)"
    RunDir(root / "s-t0").finish("pruned", reason=why)
    study.tell(pruned, state=TrialState.PRUNED)
    asked.set_user_attr(search_runner.RUN_ID, "s-t2")  # its runner died before the launch
    table = search_runner.trials(found, root).set_index("trial")
    assert table["state"].tolist() == ["pruned", "queued", "asked"]
    assert table.loc[0, "reason"] == why and table.loc[[1, 2], "reason"].isna().all()
    said = search_runner.unfollowed(table, "s", root)
    assert said.startswith("no runner of search s is alive: 2 trials in flight are not followed")
    assert main(["--runs", str(root), "search", str(path), "--status"]) == 1
    out, err = capsys.readouterr()
    assert f"{why[: terminal.REASON_WIDTH - 1].rstrip()}…" in out and f"warning: {said}" in err


@pytest.mark.parametrize(
    "metric, at, values, expected",
    [
        ("accuracy", "last", [0.2, 0.5, 0.4], 0.4),
        ("accuracy", "best", [0.2, 0.5, 0.4], 0.5),
        ("loss", "best", [2.0, 1.0, 1.5], 1.0),
        ("loss", "last", [2.0, math.nan], math.inf),  # diverged: the worst there is
        ("accuracy", "best", [math.nan, 0.3], 0.3),
        ("accuracy", "last", [], None),
    ],
)
def test_the_objective_is_the_metric_at_the_last_or_best_evaluation(metric, at, values, expected):
    objective = search.Objective(metric=metric, at=at)
    assert objective.of(values) == expected
    assert objective.direction == {"accuracy": "maximize", "loss": "minimize"}[metric]


# ------------------------------------------------------------- a real search, 2 slots


@pytest.fixture(scope="module")
def searched(tmp_path_factory, subprocess_env):
    """The search of :func:`spec` on 2 slots. Before it starts, a trial (of :data:`GOOD`
    values) is asked and never launched (a runner that died between the two). The first runner
    is killed with SIGKILL once two trials train and one of them has evaluated and was not
    pruned (the runner is frozen while that is read, so its pruner cannot stop the trial in
    between); that trial's worker is killed too. :data:`HOPELESS` values are enqueued, so that
    they are the next trial to start. A second runner then runs the search to its end, and a
    third finds nothing to do."""
    root = tmp_path_factory.mktemp("search-runs")
    slots.set_capacity("localhost:2", root)
    path = root.parent / "s.yaml"
    path.write_text(yaml.safe_dump(spec(retries=2)))  # the killed trial may be the rerun
    found = search.load(path)
    study = search.study(found, root)
    study.enqueue_trial(GOOD)
    orphan = study.ask(found.distributions())
    orphan.set_user_attr(search_runner.RUN_ID, "s-t0")  # then its runner died
    command = [sys.executable, "-m", "toolkit", "--runs", str(root), "search", str(path)]
    first = subprocess.Popen(
        [*command, "--max-parallel", "2"], cwd=ROOT, env=subprocess_env, stdout=subprocess.PIPE
    )
    deadline, killed = time.time() + 120, None
    while killed is None:  # two trials train, and one of them has a checkpoint
        assert first.poll() is None and time.time() < deadline
        training = [r for r in list_runs(root) if r.status()["state"] == "running"]
        evaluated = [r for r in training if list(r.checkpoints_path.glob("epoch-*"))]
        if len(training) == 2 and evaluated:
            first.send_signal(signal.SIGSTOP)  # its runner decides nothing more from here
            if evaluated[0].status().get("stop_requested"):  # pruned just before: go on
                first.send_signal(signal.SIGCONT)
            else:
                killed = evaluated[0]
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    said_first = first.stdout.read().decode()
    (worker,) = [p for p in killed.status()["processes"] if p["role"] == "worker"]
    os.kill(worker["pid"], signal.SIGKILL)
    search.study(found, root).enqueue_trial(HOPELESS)  # its first evaluation trails GOOD's
    second = subprocess.run(
        command, cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=600
    )
    third = subprocess.run(
        command, cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=120
    )
    return {
        "root": root,
        "search": found,
        "killed": killed.run_id,
        "first": said_first,
        "second": second,
        "third": third,
        "trials": search_runner.trials(found, root),
    }


def test_every_trial_ends_once_and_the_unlaunched_one_is_rerun(searched):
    second = searched["second"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    trials = searched["trials"]
    said = "trial 0: failed (its runner ended before launching it); rerun as a new trial"
    assert said in searched["first"]
    first = trials[trials.trial == 0].iloc[0]
    assert first.state == "failed" and first.run_id == "s-t0"
    rate = trials["optimizer.learning_rate"]
    (rerun,) = trials[(trials.trial != 0) & (rate == first["optimizer.learning_rate"])].itertuples()
    killed = rerun.run_id == searched["killed"]  # then resumed too: one attempt more
    assert rerun.attempt == 2 + killed and rerun.run_id == f"s-t{rerun.trial}"
    ended = trials[trials.trial != 0]
    assert len(ended) == 5 and set(ended.state) <= {"completed", "pruned"}, trials
    runs = {run.run_id: run for run in list_runs(searched["root"])}
    assert sorted(runs) == sorted(ended.run_id)  # one run per trial, none launched twice
    for row in ended.itertuples():
        run = runs[row.run_id]
        assert run.status()["state"] == row.state
        assert run.meta()["search"] == "s" and run.meta()["trial"] == row.trial
        assert run.tags() == ["search:s", f"trial:{row.trial}"]


def test_the_trial_killed_mid_run_is_resumed_from_its_checkpoint(searched):
    killed = RunDir(searched["root"] / searched["killed"])
    status = killed.status()
    assert status["state"] in ("completed", "pruned") and status["resumed_from"], status
    trials = searched["trials"]
    (row,) = trials[trials.run_id == killed.run_id].itertuples()
    rerun = row.trial != 0 and trials.loc[row.Index, "optimizer.learning_rate"] == 0.1
    assert row.attempt == 2 + rerun  # the rerun of trial 0 starts at its attempt 2
    said = f"trial {row.trial}: failed (worker rank 0 on"
    assert said in searched["second"].stdout and "resumed from its checkpoint epoch-" in (
        searched["second"].stdout
    )


def test_the_studys_values_are_the_runs_own_evaluations_and_the_pruned_stopped_early(searched):
    """The oracle: each trial's value and intermediate values read here from its events."""
    found, root = searched["search"], searched["root"]
    study = search.study(found, root)
    pruned = {}  # the pruned trials' values -> the evaluation each was pruned at
    for trial in study.get_trials():
        if trial.number == 0:
            continue
        run = RunDir(root / trial.user_attrs["run_id"])
        events = read_events(run.events_path)
        evals = events[events.phase == "eval"].drop_duplicates("epoch", keep="last")
        accuracy = evals.sort_values("step").accuracy.tolist()
        reported = [trial.intermediate_values[k] for k in sorted(trial.intermediate_values)]
        assert reported == pytest.approx(accuracy[: len(reported)], abs=0.02)  # a resume
        # re-evaluates after its checkpoint: the study keeps the first report of a step
        if trial.state.name == "COMPLETE":
            assert len(accuracy) == BASE["epochs"] and trial.value == accuracy[-1]
        else:  # told no evaluation after the one it was pruned at (the run may have made one
            # more before its stop took hold)
            status = run.status()
            at = int(re.search(r"asha pruner at evaluation (\d+) ", status["reason"])[1])
            assert status["state"] == "pruned" and max(trial.intermediate_values) == at
            assert "pruned: pruned by search s" in run.stdout_path.read_text()
            pruned[json.dumps(trial.params, sort_keys=True)] = at
    # ASHA (reduction 3) lets only the best third of the trials that have reported at a rung
    # go on; which have reported depends on when the runner's one-second polls see each
    # evaluation (0.2-0.5 s apart here), so which trial is pruned is not fixed: some trial is
    # (the hopeless one was expected, and was not in 3 of 7 runs here)
    assert pruned, "no trial was pruned"


def test_a_rerun_of_a_finished_search_starts_nothing(searched):
    third = searched["third"]
    assert third.returncode == 0, third.stderr
    assert "search s going on: 5 trials" in third.stdout and "trial 6" not in third.stdout
    assert len(list_runs(searched["root"])) == 5


def test_the_best_trial_launched_again_scores_the_same(searched, tmp_path):
    root = searched["root"]
    best = search_runner.best(searched["search"], root)
    config = RunDir(root / best.run_id).config()
    again = launch.launch(config, runs_root_dir=tmp_path, run_id="again")
    deadline = time.time() + 120
    while again.status()["state"] in ("queued", "starting", "running"):
        assert time.time() < deadline
        time.sleep(0.5)
    events = read_events(again.events_path)
    assert events[events.phase == "eval"].accuracy.iloc[-1] == best.value
    assert json.loads((root / best.run_id / "meta.json").read_text())["params"] == {
        k: best[k] for k in searched["search"].spec.space
    }


def test_the_search_page_shows_the_trials_their_runs_and_optunas_figures(searched, monkeypatch):
    """AppTest over the search run here: every trial with its state, value and a link to its
    Run detail, the best trials first, Optuna's three figures (~5 s)."""

    monkeypatch.setenv("LBL_RUNS", str(searched["root"]))
    at = dashboard().run()
    at.switch_page("views/search.py").run()
    at.radio[0].set_value("A search run here").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert "search s: 5 trials, sampler tpe (seed 3), pruner asha" in at.code[0].value
    trials, best = (d.value for d in at.dataframe)
    expected = searched["trials"]
    assert trials["trial"].tolist() == expected["trial"].tolist()
    assert trials["state"].tolist() == expected["state"].tolist()
    ran = trials[trials.run_id.isin([r.run_id for r in list_runs(searched["root"])])]
    assert (ran["open"] == "detail?run=" + ran["run_id"]).all() and len(ran) == 5
    assert (ran["global_batch"] == BASE["batch"]["per_worker"]).all()
    completed = expected[expected.state == "completed"].sort_values("value", ascending=False)
    assert best["trial"].tolist() == completed["trial"].head(3).tolist()
    assert "No critical batch is calibrated for this task here" in at.info[0].value
    assert len(at.get("plotly_chart")) == 3


def test_a_search_started_from_the_page_runs_to_its_end(tmp_path, monkeypatch, subprocess_env):
    """Written in the page (2 trials of 1 epoch, 1 worker), refused first where a field is
    bad, then started: its runner, in a process of its own, ends both trials (~20 s)."""

    monkeypatch.setenv("LBL_RUNS", str(tmp_path))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])
    at = dashboard().run()
    at.switch_page("views/search.py").run()
    at.radio[0].set_value("Write one").run()
    # a warm-up as long as the run: each launch warns, after the trial it is about
    warned = {"epochs": 1, "batch": {"per_worker": 64}}
    warned["schedule"] = {"name": "cosine", "warmup": {"epochs": 1}}
    body = spec(name="page", trials=2, base=BASE | warned)
    body["pruner"] = "none"
    at.text_area[0].set_value(yaml.safe_dump({**body, "sampler": "bayes"})).run()
    refused = md_escape("sampler: Input should be 'tpe', 'gp', 'random' or 'grid'")
    assert refused in at.error[0].value
    at.text_area[0].set_value(yaml.safe_dump(body)).run()
    assert not at.error, [e.value for e in at.error]
    next(b for b in at.button if b.label == "Start search").click().run()
    assert any(md_escape("Search page started (runner pid") in s.value for s in at.success)
    deadline = time.time() + 180
    while search_runner.runner_active("page", tmp_path) or not list_runs(tmp_path):
        assert time.time() < deadline
        time.sleep(0.5)
    table = search_runner.trials(search.load(tmp_path / ".searches" / "page.yaml"), tmp_path)
    assert table["state"].tolist() == ["completed", "completed"], table
    log = (tmp_path / ".searches" / "page.log").read_text()
    assert "search page done: 2 trials, 2 completed" in log
    for number in (0, 1):  # each trial's warning between its line and the next trial's
        header = log.index(f"trial {number} (page-t{number}): ")
        after = log.find(f"trial {number + 1} (", header)
        assert log.index("The learning rate peaks at", header) < (after if after > 0 else len(log))


def test_a_search_of_three_seeds_is_worth_the_mean_of_its_seeds_runs(tmp_path, monkeypatch):
    """The quickstart searched over 2 trials of 3 seeds each (1 epoch on 1 worker, 2 runs at a
    time, ~30 s): each trial trains one run per seed (the base's seed, +1, +2; the trial's
    values otherwise), and the study's value of a trial is the mean of its runs' last
    held-out accuracies, read here from their events."""
    monkeypatch.setenv("PATH", f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    slots.set_capacity("localhost:2", tmp_path)
    base = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    base |= {"epochs": 1, "workers": 1, "seed": 5, "checkpoint": {"every_epochs": 1}}
    body = {
        "name": "q3",
        "base": base,
        "space": {"optimizer.learning_rate": {"low": 0.2, "high": 1.0, "log": True}},
        "trials": 2,
        "seeds": 3,
        "sampler": "random",
        "pruner": "none",
    }
    found = search.from_mapping(body)
    assert "accuracy at the last evaluation (the mean over 3 seeds)" in found.space_text()
    lines = []
    table = search_runner.run(found, tmp_path, max_parallel=2, log=lines.append, poll_s=0.3)
    assert table["state"].tolist() == ["completed", "completed"], (table, lines)
    runs = {run.run_id: run for run in list_runs(tmp_path)}
    assert sorted(runs) == sorted(f"q3-t{t}-s{s}" for t in (0, 1) for s in range(3))
    for trial in search.study(found, tmp_path).get_trials():
        own = [runs[f"q3-t{trial.number}-s{s}"] for s in range(3)]
        assert [run.config().seed for run in own] == [5, 6, 7]
        rates = {run.config().optimizer.learning_rate for run in own}
        assert rates == {trial.params["optimizer.learning_rate"]}  # the trial's, unscaled
        last = []
        for run in own:
            events = read_events(run.events_path)
            last.append(events[events.phase == "eval"].sort_values("step").accuracy.iloc[-1])
            assert run.meta()["trial"] == trial.number and run.tags() == search.tags(
                "q3", trial.number
            )
        assert trial.value == pytest.approx(sum(last) / 3, abs=1e-12)
        assert trial.user_attrs[search_runner.RUN_IDS] == [run.run_id for run in own]
    assert sum("(mean of 3 seeds)" in line for line in lines) == 2, lines
