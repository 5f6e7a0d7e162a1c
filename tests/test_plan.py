"""The redesign's promises, each a test that the drifted copies it replaced would have failed:
one plan that training, the preview and readers all take their numbers from; capabilities
asked of the optimizer, never of its name; the communication object's rules said once, in the
same words, to the config and the Python door; and the callbacks each worker runs, as the
callbacks module says."""

from __future__ import annotations

import dataclasses

import keras
import pytest

from toolkit import catalog, sections
from toolkit import config as config_lib
from toolkit.config import ConfigError, from_mapping
from toolkit.optimizers import LARS
from toolkit.parallel import distributed
from toolkit.plan import RunPlan, Scale
from toolkit.runs import rundir
from toolkit.runs.events import read_events
from toolkit.training import callbacks
from toolkit.training.trainer import Trainer

TINY = {  # logistic regression on the digits: a second of training
    "name": "tiny",
    "dataset": {"name": "digits"},
    "model": {"name": "logreg"},
    "optimizer": {"name": "lars", "learning_rate": 0.1, "params": {"momentum": 0.9}},
    "batch": {"per_worker": 32},
    "epochs": 1,
    "logging": {"every_steps": 4, "trust_ratio_every_steps": 8, "noise_scale_every_steps": 0},
}
DIGITS_TRAIN = 1437  # sklearn's 1,797 digits less the 20% test split


def test_a_run_records_the_plan_the_preview_computes(tmp_path):
    """``meta.json`` holds what the run trained with; it is the plan anyone computes for the
    config before it starts (the Launch form's preview, a sweep's dry run)."""
    from toolkit.train import train

    config = from_mapping({**TINY, "lr_scaling": {"rule": "linear", "base_batch": 16}})
    run = train(config, tmp_path / "run", verbose=0)
    plan = RunPlan.of(config, DIGITS_TRAIN)
    assert plan.meta().items() <= run.meta().items()
    assert plan.learning_rate == 0.2 and plan.steps_per_epoch == DIGITS_TRAIN // 32


def test_adascale_plans_its_clock_not_its_epochs():
    """AdaScale trains until its clock has done the base run's updates: the most steps it may
    take are those updates at a gain of 1, not ``epochs`` of its own (which the Launch form
    once showed as its total)."""
    config = from_mapping(
        {**TINY, "batch": {"global_size": 64}, "lr_scaling": {"rule": "adascale", "base_batch": 16}}
    )
    plan = RunPlan.of(config, DIGITS_TRAIN)
    base_updates = DIGITS_TRAIN // 16  # one base epoch at batch 16
    assert plan.base_updates == plan.total_updates == base_updates
    assert plan.total_steps == base_updates and plan.total_steps != plan.steps_per_epoch
    assert plan.last_epoch == -(-base_updates // plan.steps_per_epoch)  # epochs of its own
    assert plan.schedule_steps_per_epoch == base_updates and plan.steps_per_execution(True) == 1


def test_an_optimizer_that_applies_trust_ratios_gets_them_logged_whatever_its_name(
    tmp_path, monkeypatch
):
    """Trust-ratio logging asks the optimizer, not its name: one catalog line (here, LARS
    under another name) is enough."""
    from toolkit.train import train

    class Layerwise(LARS):
        pass

    monkeypatch.setitem(catalog.OPTIMIZERS._entries, "layerwise", Layerwise)
    config = from_mapping(
        {
            **TINY,
            "optimizer": {**TINY["optimizer"], "name": "layerwise"},
            "logging": {**TINY["logging"], "every_steps": 22, "trust_ratio_every_steps": 4},
        }
    )
    run = train(config, tmp_path / "run", verbose=0)
    events = read_events(run.events_path)
    ratios = events[events["phase"] == "trust_ratio"]
    total = RunPlan.of(config, DIGITS_TRAIN).total_steps  # 44
    assert list(ratios["step"]) == list(range(4, total + 1, 4))
    assert run.meta()["steps_per_execution"] == 2  # gcd(44, 22, 4): 11 without trust ratios


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"dgc": True},
            "allreduce.dgc needs allreduce.compression one of ('topk', 'threshold', '2bit')",
        ),
        (
            {"compression": "topk", "momentum_masking": True},
            "allreduce.momentum_masking clears the velocity that momentum correction keeps",
        ),
        (
            {"sync": "partial", "compression": "fp16"},
            "sync.mode='partial' averages parameters, not gradients: allreduce.compression",
        ),
        (
            {"compression": "topk", "dense_norm": True},
            "allreduce.dense_norm replaces the gradient norm of trust ratios",
        ),
        (
            {"compression": "2bit", "momentum_correction": True},
            "allreduce.momentum_correction: momentum correction needs momentum > 0",
        ),
    ],
)
def test_the_config_and_the_python_door_refuse_a_combination_in_the_same_words(options, message):
    """The rules of which communication options go together are written once
    (:class:`toolkit.communication.Communication`): the config and ``DistributedOptimizer``
    refuse the same thing with the same sentence."""
    sections = {"allreduce": {k: v for k, v in options.items() if k != "sync"}}
    if "sync" in options:
        sections["sync"] = {"mode": options["sync"]}
    plain_sgd = {"optimizer": {"name": "sgd", "learning_rate": 0.1}}
    with pytest.raises(ConfigError) as from_config:
        from_mapping({**plain_sgd, **sections})
    with pytest.raises(ConfigError) as from_python:
        distributed.DistributedOptimizer(
            catalog.OPTIMIZERS.get("sgd", learning_rate=0.1), **options
        )
    assert message in str(from_config.value) and message in str(from_python.value)


def test_the_python_door_takes_every_option_the_config_has():
    """``DistributedOptimizer``'s keywords are the config sections' fields, not a copy of
    them: a field added to ``allreduce:`` is an option in Python at once."""
    allreduce = sections.AllreduceConfig.model_fields
    defaults = {name: field.default for name, field in allreduce.items()}
    communication = config_lib.communication(**defaults, sync="local_sgd", period=3)
    assert communication.allreduce == sections.AllreduceConfig()
    assert (communication.sync.mode, communication.sync.period) == ("local_sgd", 3)
    with pytest.raises(ConfigError, match="ratio: Input should be less than or equal to 1"):
        distributed.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="topk", ratio=2)


def callback_types(hooks) -> list[str]:
    return [type(hook).__name__ for hook in hooks]


def test_every_worker_runs_the_collective_callbacks_and_rank_0_also_the_loggers(tmp_path):
    """As the callbacks module says: the loggers that only write run on rank 0, which has the
    writer; the checkpointer, the system logger, the metric average and the NaN guard run on
    every worker, in the same order (they make collective calls)."""
    config = from_mapping({**TINY, "logging": {**TINY["logging"], "noise_scale_every_steps": 4}})
    trainer = Trainer.build(config, 1)
    accumulation = trainer.accumulation
    run = rundir.RunDir.create(tmp_path, "run", config)
    writer_side, _ = trainer.callbacks(run, callbacks.StepCounter(), trainer.plan, accumulation)
    elsewhere, none = trainer.callbacks(None, callbacks.StepCounter(), trainer.plan, accumulation)
    assert none is None
    everywhere = [
        "StepCounter",
        "MetricAverageCallback",
        "Checkpointer",
        "SystemLogger",
        "StopOnNonFiniteLoss",
    ]
    assert callback_types(elsewhere) == everywhere
    loggers = ["EventLogger", "TrustRatioLogger", "NoiseScaleLogger"]
    assert callback_types(writer_side) == everywhere[:2] + loggers[:2] + [
        "Checkpointer",
        loggers[2],
        *everywhere[3:],
    ]


def test_a_scale_is_the_config_on_its_workers_before_any_data():
    """The arithmetic of an update, against numbers written out: LBSGD's batch_scale and the
    local accumulation multiply the steps per update; a fixed global batch splits."""
    lbsgd = from_mapping(
        {"optimizer": {"name": "lbsgd", "params": {"batch_scale": 4}}, "batch": {"per_worker": 8}}
    )
    assert dataclasses.astuple(Scale.of(lbsgd, 3))[:3] == (3, 8, 4)
    assert Scale.of(lbsgd, 3).global_batch == 8 * 3 * 4
    fixed = from_mapping({"batch": {"global_size": 96, "accumulation": 2}, "workers": 3})
    assert (Scale.of(fixed).per_worker, Scale.of(fixed).steps_per_update) == (16, 2)
