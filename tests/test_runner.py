"""The runner of sets of runs (toolkit.launching.runner): its one retry rule, read off run
directories written here (a real checkpoint, real event files; ~3 s with Keras's import), and
each kind of set going through the one loop (the sweeps', searches' and calibrations' own
files run them for real)."""

from __future__ import annotations

import pytest
from fabricate import fake_run

from toolkit.launching import runner
from toolkit.launching.search_runner import SearchSet
from toolkit.launching.sweep_runner import SweepSet
from toolkit.runs import checkpoints
from toolkit.runs.events import EventWriter


def checkpointed(run) -> None:
    """A real, intact checkpoint in ``run``'s folder."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    checkpoints.save(run.checkpoints_path, model, checkpoints.Position(epoch=1, step=10))


@pytest.mark.parametrize(
    "state, checkpoint, diverged, attempt, retries, expected",
    [
        ("failed", True, False, 1, 1, runner.RESUME),
        ("failed", False, False, 1, 1, runner.RERUN),
        ("failed", True, False, 2, 2, runner.RESUME),  # the last attempt the rule gives
        ("failed", True, False, 2, 1, None),  # no attempt left
        ("failed", False, False, 1, 0, None),  # retries: 0, a sweep's default
        ("failed", True, True, 1, 1, None),  # a divergence is its result: not retried
        ("stopped", True, False, 1, 1, None),  # a person's stop is not a failure
        ("pruned", True, False, 1, 1, None),
        ("completed", True, False, 1, 1, None),
    ],
)
def test_the_retry_rule(tmp_path, state, checkpoint, diverged, attempt, retries, expected):
    run = fake_run(tmp_path, "r", events=60, state=state)
    run.finish(state, reason="worker rank 0 exited with 137" if state == "failed" else None)
    if checkpoint:
        checkpointed(run)
    if diverged:
        with EventWriter(run.events_path) as writer:
            writer.write({"step": 61, "epoch": 1.0, "phase": "train", "loss": float("nan")})
    planned = runner.Planned(run.config(), "r", {}, "cell r")
    flight = runner.Flight(planned, run, attempt, run.status())
    assert runner.retry(flight, retries) == expected


def test_sweeps_and_searches_are_sets_of_the_one_runner():
    """Each kind is a policy over :func:`toolkit.launching.runner.run`; neither has a loop,
    a lock or a retry of its own (what the issue found written twice)."""
    import inspect

    from toolkit.launching import search_runner, sweep_runner

    for module in (sweep_runner, search_runner):
        source = inspect.getsource(module)
        for own in ("time.sleep", "runner_lock", "subprocess.Popen", "checkpoints.latest_intact"):
            assert own not in source, (module.__name__, own)
    assert issubclass(SweepSet, runner.RunSet) and issubclass(SearchSet, runner.RunSet)
