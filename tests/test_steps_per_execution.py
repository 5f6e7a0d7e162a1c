"""Several steps per call of Keras's compiled train function in ``toolkit.train``
(``steps_per_execution``): every callback still acts at its exact step, the run is the same
to the bit as one step per call, and a NaN is caught within the documented granularity."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_train import SMALL

from toolkit.config import from_mapping
from toolkit.plan import RunPlan, Scale
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir

EPOCHS = 3


def execution_ends(k: int, spe: int, epochs: int) -> set[int] | None:
    """The steps after which Keras runs the batch callbacks over ``epochs`` epochs of ``spe``
    steps (its epoch iterator: executions begin at 0, k, 2k, ... < spe and run k steps each),
    or ``None`` if an execution would run past its epoch's end."""
    ends = set()
    for epoch in range(epochs):
        for begin in range(0, spe, k):
            if begin + k > spe:
                return None
            ends.add(epoch * spe + begin + k)
    return ends


def acting_steps(config, spe: int, epochs: int, world: int) -> set[int]:
    """Every step at which some callback of a run of ``epochs`` epochs acts: events, trust
    ratios, epoch ends, and with one worker the noise scale (with several it is measured in
    the compiled step)."""
    logging = config.logging
    intervals = [spe, logging.every_steps]
    if config.optimizer.name == "lars":
        intervals.append(logging.trust_ratio_every_steps)
    if Scale.of(config, 1).noise_every and world == 1:
        intervals.append(Scale.of(config, 1).noise_every * Scale.of(config, 1).steps_per_update)
    total = epochs * spe
    return {s for every in intervals for s in range(every, total + 1, every)}


def every_measurement_read(k: int, config, spe: int, epochs: int, world: int) -> bool:
    """Whether, with several workers, a callback reads each noise-scale measurement before the
    compiled step overwrites it with the next: no two measured steps between execution ends."""
    every = Scale.of(config, world).noise_every * Scale.of(config, world).steps_per_update
    if world == 1 or not every:
        return True
    ends = sorted(execution_ends(k, spe, epochs))
    measured = range(every, ends[-1] + 1, every)
    return all(
        sum(begin < step <= end for step in measured) <= 1
        for begin, end in zip([0, *ends], ends, strict=False)
    )


def serves(k: int, config, spe: int, world: int) -> bool:
    """Whether ``k`` steps per execution serve every callback of a run long enough for each
    interval to come round twice (a run may be resumed anywhere, so k may not rely on an
    interval longer than the run never acting)."""
    epochs = 2 * 200 // spe + 1  # intervals drawn below are at most 60 * 3 steps
    ends = execution_ends(k, spe, epochs)
    return (
        ends is not None
        and acting_steps(config, spe, epochs, world) <= ends
        and every_measurement_read(k, config, spe, epochs, world)
    )


@settings(max_examples=150, deadline=None)
@given(
    spe=st.integers(1, 300),
    every=st.integers(1, 60),
    trust=st.integers(1, 120),
    noise=st.integers(0, 60) | st.just("auto"),
    accumulation=st.integers(1, 3),
    optimizer=st.sampled_from(["lars", "sgd"]),
    world=st.sampled_from([1, 2]),
)
@example(spe=20, every=10, trust=10, noise=1, accumulation=2, optimizer="sgd", world=2)
@example(spe=40, every=10, trust=50, noise=3, accumulation=1, optimizer="lars", world=2)
def test_every_callback_acts_at_an_execution_end_and_k_is_the_largest_that_does(
    spe, every, trust, noise, accumulation, optimizer, world
):
    config = from_mapping(
        {
            **SMALL,
            "workers": 1,
            "optimizer": {"name": optimizer, "learning_rate": 0.1},
            "batch": {"per_worker": 32, "accumulation": accumulation},
            "logging": {
                "every_steps": every,
                "trust_ratio_every_steps": trust,
                "noise_scale_every_steps": noise,
            },
        }
    )
    plan = RunPlan.of(config, num_train=32 * spe * world, world_size=world)  # spe steps
    assert plan.steps_per_epoch == spe
    k = plan.steps_per_execution(trust_ratios=optimizer == "lars")
    assert serves(k, config, spe, world)
    assert k < every or k == 1  # the first event's clock starts before it
    assert not any(serves(larger, config, spe, world) for larger in range(k + 1, every))


def one_worker(**logging) -> dict:
    """SMALL on one worker for ``EPOCHS`` epochs: 125 steps an epoch, noise scale on, every 25
    updates."""
    logging = {**SMALL["logging"], "noise_scale_every_steps": 25, **logging}
    return {**SMALL, "workers": 1, "epochs": EPOCHS, "logging": logging}


def checkpoint_arrays(run: RunDir) -> dict[str, np.ndarray]:
    last = run.checkpoints_path / f"epoch-{EPOCHS:04d}"
    arrays = dict(np.load(last / "optimizer.npz"))
    with h5py.File(last / "model.weights.h5") as f:
        f.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run at 5 steps per execution (events every 10 steps) and at 1 (every step)."""
    from toolkit.train import train

    root = tmp_path_factory.mktemp("runs")
    grouped = train(from_mapping(one_worker(every_steps=10)), root / "grouped", verbose=0)
    single = train(from_mapping(one_worker(every_steps=1)), root / "single", verbose=0)
    return grouped, single


def test_the_runs_really_differ_in_steps_per_execution(runs):
    grouped, single = runs
    assert grouped.meta()["steps_per_execution"] == 5  # gcd(125, 10, 20, 25) below 10
    assert single.meta()["steps_per_execution"] == 1


def test_several_steps_per_execution_train_the_same_to_the_bit(runs):
    grouped, single = (checkpoint_arrays(run) for run in runs)
    assert grouped.keys() == single.keys() and len(grouped) > 10
    for key, value in single.items():
        np.testing.assert_array_equal(grouped[key], value, err_msg=key)


def test_every_event_comes_at_its_step_with_the_same_values(runs):
    grouped, single = (read_events(run.events_path) for run in runs)
    spe = 4000 // 32
    train = grouped[grouped.phase == "train"]
    assert train.step.tolist() == list(range(10, EPOCHS * spe + 1, 10))
    assert train.samples_per_sec.gt(0).all()
    expected_steps = {
        "trust_ratio": list(range(20, EPOCHS * spe + 1, 20)),
        "gns": list(range(25, EPOCHS * spe + 1, 25)),
        "eval": [spe * e for e in range(1, EPOCHS + 1)],
    }
    for phase, steps in expected_steps.items():
        assert grouped[grouped.phase == phase].step.tolist() == steps, phase
    for phase in ("train", "trust_ratio", "gns", "eval"):
        a = grouped[grouped.phase == phase].set_index("step")
        b = single[single.phase == phase].set_index("step").loc[a.index]
        columns = [c for c in a.columns if c not in ("wall", "samples_per_sec")]
        columns = [c for c in columns if a[c].notna().any()]
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True, obj=phase)


def test_a_nan_is_caught_and_logged_within_one_execution(tmp_path):
    from toolkit.train import train
    from toolkit.training.callbacks import NonFiniteLoss

    steps = {}
    for every in (10, 1):  # 5 steps per execution, then 1: the step it really diverged
        config = from_mapping(
            {**one_worker(every_steps=every), "optimizer": {"name": "sgd", "learning_rate": 1e12}}
        )
        with pytest.raises(NonFiniteLoss):
            train(config, tmp_path / str(every), verbose=0)
        run = RunDir(tmp_path / str(every))
        last = read_events(run.events_path).iloc[-1]
        assert np.isnan(last.loss) and f"at step {last.step}" in run.status()["reason"]
        steps[every] = int(last.step)
    assert steps[10] % 5 == 0 and steps[1] <= steps[10] < steps[1] + 5
