"""The experiment config: validation messages, overrides, derived quantities, presets."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

from toolkit import config as config_lib
from toolkit.config import ConfigError, from_mapping, load
from toolkit.plan import RunPlan, Scale, world_sizes
from toolkit.training.experiment import schedule_preview

PRESETS = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_presets_are_valid(path):
    assert load(path).name


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["optimizer.name=adamx"],
            "optimizer: unknown optimizer 'adamx'; choose one of ['adagrad'",
        ),
        (
            ["optimizer.name=lbsgd", "optimizer.params.warmup_strategy=cosine"],
            "`warmup_strategy` must be one of ('linear', 'power2', 'sqrt', 'lars'), got 'cosine'",
        ),
        (
            ["optimizer.params.momentun=0.9"],
            "optimizer 'sgd' has no parameter 'momentun'",
        ),
        (
            ["schedule.warmup.strategy=exp"],
            "schedule.warmup.strategy: Input should be 'linear', 'power2' or 'sqrt' (got 'exp')",
        ),
        (["schedule.name=step"], "schedule.name: Input should be 'constant', 'poly'"),
        (
            ["schedule.name=poly", "schedule.params.max_update=3"],
            "schedule 'poly' has no parameter 'max_update'",
        ),
        (
            ["batch.per_worker=0"],
            "batch.per_worker: Input should be greater than or equal to 1",
        ),
        (
            ["name=my run!"],
            "name: run names must match ^[A-Za-z0-9_.-]{1,64}$ (got 'my run!')",
        ),
        (["hosts=h1"], "hosts: hosts must be name:slots[,name:slots...]"),
        (["hosts=h1:1", "workers=2"], "have fewer slots than workers=2"),
        (["model.name=vgg"], "model: unknown model 'vgg'; choose one of"),
        (
            ["model.name=gru"],
            "model.name='gru' embeds token ids: it needs dataset.name one of ['markov'] "
            "(got 'mnist1d')",
        ),
        (
            ["dataset.name=markov"],
            "dataset.name='markov' gives token ids: it needs model.name one of ['gru', "
            "'logreg', 'mlp'] (got 'cnn1d')",
        ),
        (
            ["dataset.name=markov", "dataset.params.tokens=20", "model.name=gru"],
            "model.params.tokens=16 embeds fewer tokens than dataset.params.tokens=20 gives",
        ),
        (["dataset.params.seed=1"], "'seed' is set by the experiment, not in params"),
        (
            ["lr_scaling.rule=cubic"],
            "lr_scaling.rule: Input should be 'none', 'linear', 'sqrt' or 'adascale'",
        ),
        (["epochs=zero"], "epochs: Input should be a valid integer"),
        (["surprise=1"], "surprise: Extra inputs are not permitted"),
        (
            ["allreduce.compression=dgc"],
            "allreduce.compression: Input should be 'none', 'fp16', 'topk', 'threshold' or '2bit'",
        ),
        (
            ["allreduce.dgc=true"],
            "allreduce.dgc needs allreduce.compression one of ('topk', 'threshold', '2bit') "
            "(got 'none')",
        ),
        (
            ["allreduce.compression=fp16", "allreduce.local_clipnorm=1"],
            "allreduce.local_clipnorm needs allreduce.compression one of",
        ),
        (
            ["allreduce.compression=2bit", "allreduce.value_dtype=float16"],
            "allreduce.value_dtype='float16' needs allreduce.compression topk or threshold "
            "(got '2bit')",
        ),
        (
            ["allreduce.compression=threshold", "allreduce.sparsity_warmup_epochs=2"],
            "allreduce.sparsity_warmup_epochs warms topk's ratio up: it needs "
            "allreduce.compression topk (got 'threshold')",
        ),
        (
            ["allreduce.compression=topk", "allreduce.momentum_masking=true"],
            "allreduce.momentum_masking clears the velocity that momentum correction keeps: "
            "it needs allreduce.momentum_correction",
        ),
        (
            ["allreduce.compression=topk", "allreduce.dgc=true", "allreduce.residual=false"],
            "allreduce.momentum_correction accumulates the velocity in the residual: it needs "
            "allreduce.residual true",
        ),
        (
            ["allreduce.compression=topk", "allreduce.momentum_correction=true"],
            "allreduce.momentum_correction: momentum correction needs momentum > 0 (got "
            "optimizer 'sgd' with params {})",
        ),
        (
            [
                "allreduce.compression=2bit",
                "allreduce.dgc=true",
                "optimizer.params={momentum: 0.9, nesterov: true}",
            ],
            "allreduce.momentum_correction: momentum correction needs nesterov off",
        ),
        (
            ["allreduce.compression=topk", "allreduce.dgc=true", "optimizer.name=adam"],
            "allreduce.momentum_correction moves the optimizer's momentum into the allreduce: "
            "it needs optimizer.name sgd, lars or lbsgd (got 'adam')",
        ),
        (
            ["allreduce.compression=topk", "allreduce.dense_norm=true"],
            "allreduce.dense_norm replaces the gradient norm of trust ratios: it needs "
            "optimizer.name lars, or lbsgd with warmup_strategy lars (got 'sgd')",
        ),
        (["allreduce.ratio=0"], "allreduce.ratio: Input should be greater than 0"),
        (["allreduce.ratio=1.5"], "allreduce.ratio: Input should be less than or equal to 1"),
        (["allreduce.threshold=-1"], "allreduce.threshold: Input should be greater than 0"),
        (["allreduce.fp16_clip=1e6"], "allreduce.fp16_clip: Input should be less than or equal"),
        (["allreduce.fusion_threshold_mb=0"], "allreduce.fusion_threshold_mb: Input should be"),
        (["allreduce.residual=maybe"], "allreduce.residual: Input should be a valid boolean"),
        (
            ["compression=fp16", "allreduce.compression=topk"],
            "`compression` moved to allreduce.compression; give it there only",
        ),
        (["sync.mode=async"], "sync.mode: Input should be 'full', 'partial' or 'local_sgd'"),
        (["sync.period=0"], "sync.period: Input should be greater than or equal to 1"),
        (
            ["sync.mode=local_sgd", "allreduce.compression=fp16"],
            "allreduce.compression must be 'none' (got 'fp16')",
        ),
        (
            ["sync.mode=partial", "batch.accumulation=2"],
            "sync.mode='partial' needs one batch per update: batch.accumulation must be 1",
        ),
    ],
)
def test_errors_name_the_field_and_the_allowed_values(overrides, expected):
    with pytest.raises(ConfigError) as error:
        from_mapping({}, overrides)
    assert expected in str(error.value)


def test_overrides_are_parsed_as_yaml_and_validated():
    config = load(
        ROOT / "experiments/quickstart.yaml",
        [
            "optimizer.params.momentum=0.95",
            "schedule.warmup.epochs=2.5",
            "hosts=a:1,b:1",
        ],
    )
    assert config.optimizer.params["momentum"] == 0.95
    assert config.schedule.warmup.epochs == 2.5
    assert config.hosts == "a:1,b:1"
    with pytest.raises(ConfigError, match="must look like section.field=value"):
        from_mapping({}, ["epochs"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("epochs: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(tmp_path / "bad.yaml")


def test_global_batch_and_linear_scaling():
    config = from_mapping(
        {
            "batch": {"per_worker": 64, "accumulation": 2},
            "workers": 4,
            "optimizer": {"learning_rate": 0.1},
            "lr_scaling": {"rule": "linear", "base_batch": 256},
        }
    )
    assert Scale.of(config).global_batch == 512
    assert Scale.of(config).learning_rate == pytest.approx(0.2)
    assert Scale.of(config, 1).global_batch == 128
    lbsgd = from_mapping(
        {
            "optimizer": {"name": "lbsgd", "params": {"batch_scale": 4}},
            "batch": {"per_worker": 32},
            "workers": 2,
        }
    )
    assert Scale.of(lbsgd).global_batch == 256
    raw = {**config.model_dump(), "lr_scaling": {"rule": "sqrt", "base_batch": 128}}
    sqrt_rule = from_mapping(raw)
    assert Scale.of(sqrt_rule).learning_rate == pytest.approx(0.1 * 2.0)  # sqrt(512 / 128)


def test_yaml_round_trip(tmp_path):
    config = load(ROOT / "experiments/large_batch_lars.yaml")
    (tmp_path / "c.yaml").write_text(config.to_yaml())
    assert load(tmp_path / "c.yaml") == config


def test_the_top_level_compression_of_earlier_configs_reads_as_allreduce_compression():
    earlier = from_mapping({"compression": "fp16", "allreduce": {"ratio": 0.5}})
    assert earlier.allreduce.compression == "fp16" and earlier.allreduce.ratio == 0.5
    assert "compression" not in earlier.model_dump()  # written back in the new place only
    assert from_mapping({}, ["compression=fp16"]).allreduce.compression == "fp16"
    same = from_mapping({"compression": "topk", "allreduce": {"compression": "topk"}})
    assert same.allreduce.compression == "topk"


def test_every_unknown_field_is_named_with_the_nearest_known_one():
    with pytest.raises(ConfigError) as error:
        from_mapping({"epochz": 3, "optimzer": {"name": "sgd"}, "batch": {"per_workr": 8, "zz": 1}})
    assert str(error.value).splitlines()[1:] == [
        "  batch.per_workr: Extra inputs are not permitted (got 8); did you mean per_worker?",
        "  batch.zz: Extra inputs are not permitted (got 1)",  # nothing near: no guess
        "  epochz: Extra inputs are not permitted (got 3); did you mean epochs?",
        "  optimzer: Extra inputs are not permitted; did you mean optimizer?",
    ]


def test_the_elastic_lost_after_s_of_earlier_configs_reads_as_lost_worker_after_s():
    """It moved to the top level when every launch, elastic or not, came to use it."""
    elastic = {"discovery": "hosts", "max_workers": 2}
    raw = {"workers": 2, "batch": {"global_size": 64}, "elastic": {**elastic, "lost_after_s": 12}}
    earlier = from_mapping(raw)
    assert earlier.lost_worker_after_s == 12 and "lost_after_s" not in earlier.elastic.model_dump()
    assert raw["elastic"]["lost_after_s"] == 12  # the caller's mapping is left as it was
    assert from_mapping({}).lost_worker_after_s == 30  # Horovod's own default
    with pytest.raises(ConfigError, match="`elastic.lost_after_s` moved to lost_worker_after_s"):
        from_mapping({**raw, "lost_worker_after_s": 20})


def test_json_schema_describes_every_section():
    schema = config_lib.json_schema()
    assert {
        "dataset",
        "model",
        "optimizer",
        "schedule",
        "batch",
        "lr_scaling",
        "epochs",
    } <= set(schema["properties"])
    assert schema["$defs"]["WarmupConfig"]["properties"]["strategy"]["enum"] == [
        "linear",
        "power2",
        "sqrt",
    ]


def test_field_errors_for_forms():
    with pytest.raises(ConfigError) as error:
        from_mapping({}, ["batch.per_worker=0", "schedule.warmup.epochs=-1"])
    fields = config_lib.field_errors(error.value)
    assert set(fields) == {"batch.per_worker", "schedule.warmup.epochs"}


def test_schedule_preview_matches_the_formula():
    """Warmup over 2 epochs then cosine decay, at the linearly scaled rate."""
    import math

    config = from_mapping(
        {
            "optimizer": {
                "name": "sgd",
                "learning_rate": 0.1,
                "params": {"momentum": 0.9},
            },
            "schedule": {
                "name": "cosine",
                "warmup": {"epochs": 2, "initial_multiplier": 0.25},
            },
            "batch": {"per_worker": 50},
            "workers": 2,
            "epochs": 10,
            "lr_scaling": {"rule": "linear", "base_batch": 50},
        }
    )
    spe = RunPlan.of(config, 4000, 2).steps_per_epoch
    assert spe == 40
    preview = schedule_preview(config, num_train=4000, points=10_000)
    assert len(preview) == 400 and preview["momentum"].eq(0.9).all()
    base, total, warm = 0.2, 400, 80
    for step in (0, 40, 79, 80, 200, 399):
        ramp = 0.25 + 0.75 * min(step / warm, 1.0)
        expected = base * 0.5 * (1 + math.cos(math.pi * step / total)) * ramp
        assert preview.loc[step, "lr"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_batch_larger_than_shard_is_refused():
    config = from_mapping({"batch": {"per_worker": 4096}, "workers": 2})
    with pytest.raises(ConfigError, match="batch.per_worker=4096 is larger than"):
        RunPlan.of(config, 4000, 2)


def test_lbsgd_preview_includes_its_warmup_multiplier():
    config = from_mapping(
        {
            "optimizer": {
                "name": "lbsgd",
                "learning_rate": 0.1,
                "params": {
                    "batch_scale": 4,
                    "warmup_epochs": 2,
                    "warmup_strategy": "sqrt",
                },
            },
            "batch": {"per_worker": 100},
            "workers": 1,
            "epochs": 4,
        }
    )
    preview = schedule_preview(config, num_train=1000, points=10_000).set_index("step")
    n_warm = 2 * 10  # updates_per_epoch defaults to the run's steps per epoch
    for step in (0, 9, 19, 30):
        n = step + 1
        mult = 4.0 if n >= n_warm else 1 + 3 * (n / n_warm) ** 0.5
        assert preview.loc[step, "lr"] == pytest.approx(0.1 * mult, rel=1e-5)


def test_fixed_global_batch_derives_the_per_worker_batch():
    config = from_mapping({"batch": {"global_size": 128, "accumulation": 2}, "workers": 2})
    assert [Scale.of(config, w).per_worker for w in (1, 2, 4)] == [64, 32, 16]
    assert {Scale.of(config, w).global_batch for w in (1, 2, 4)} == {128}
    assert (
        RunPlan.of(config, 4000, 1).steps_per_epoch
        == RunPlan.of(config, 4000, 4).steps_per_epoch
        == 62
    )
    with pytest.raises(ConfigError, match="batch.global_size=100 must be a multiple of"):
        from_mapping({"batch": {"global_size": 100}, "workers": 3})
    lbsgd = from_mapping(
        {
            "optimizer": {"name": "lbsgd", "params": {"batch_scale": 4}},
            "batch": {"global_size": 256},
            "workers": 2,
        }
    )
    assert Scale.of(lbsgd).per_worker == 32 and Scale.of(lbsgd).global_batch == 256


def test_a_stored_config_is_read_without_tensorflow(tmp_path, subprocess_env):
    """Run directories are read (dashboard, ``toolkit runs``) without the registry checks that
    import TensorFlow; a config file on its way to a new run still gets them."""
    import subprocess
    import sys

    from toolkit.runs.rundir import RunDir

    run = RunDir.create(tmp_path, "stored")
    run.write_config(load(ROOT / "experiments" / "quickstart.yaml"))
    reader = (
        "import sys; from pathlib import Path; from toolkit.runs.rundir import RunDir; "
        "from toolkit.runs.table import summary; "
        f"run = RunDir(Path({str(run.path)!r})); "
        "print(run.config().optimizer.name, summary(run)['global_batch']); "
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", reader], env=subprocess_env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["lars", "64", "False", "False"]

    raw = load(ROOT / "experiments" / "quickstart.yaml").model_dump(mode="json")
    raw["optimizer"]["params"]["momentun"] = 0.9  # hand-edited after the run was created
    assert config_lib.from_mapping(raw, stored=True).optimizer.params["momentun"] == 0.9
    with pytest.raises(ConfigError, match="has no parameter 'momentun'"):
        config_lib.from_mapping(raw)


def test_warmup_from_unscaled_starts_at_the_small_batch_rate():
    """Goyal et al.: the rate ramps linearly from eta (the base batch's) to k * eta over the
    warmup, k = B / base_batch, then follows the schedule (constant here)."""
    config = from_mapping(
        {
            "dataset": {"name": "digits"},
            "optimizer": {"name": "sgd", "learning_rate": 0.1},
            "batch": {"per_worker": 64},
            "lr_scaling": {"rule": "linear", "base_batch": 16},
            "schedule": {"warmup": {"epochs": 2, "from_unscaled": True}},
            "epochs": 4,
        }
    )
    assert Scale.of(config).warmup_multiplier == pytest.approx(16 / 64)
    spe = RunPlan.of(config, 1437, 1).steps_per_epoch
    curve = schedule_preview(config, num_train=1437, points=10**6)
    eta, k, warm = 0.1, 64 / 16, 2 * spe
    n = curve["step"].to_numpy()
    expected = np.where(n < warm, eta + (k * eta - eta) * n / warm, k * eta)
    np.testing.assert_allclose(curve["lr"], expected, rtol=1e-6)
    smaller = from_mapping(config.model_dump(), ["batch.per_worker=8"])  # B < base: no ramp down
    assert Scale.of(smaller).warmup_multiplier == 1.0
    with pytest.raises(ConfigError, match="initial_multiplier or from_unscaled, not both"):
        from_mapping(config.model_dump(), ["schedule.warmup.initial_multiplier=0.5"])


@pytest.mark.parametrize(("workers", "global_size", "scale"), [(1, 1024, 8), (2, 1024, 4)])
def test_lbsgd_batch_scale_auto_keeps_the_device_batch(workers, global_size, scale):
    raw = {
        "optimizer": {"name": "lbsgd", "params": {"batch_scale": "auto"}},
        "batch": {"per_worker": 128, "global_size": global_size},
        "workers": workers,
    }
    config = from_mapping(raw)
    assert config.optimizer.params["batch_scale"] == scale  # resolved: the stored config says so
    assert Scale.of(config).per_worker == 128 and Scale.of(config).global_batch == global_size
    assert Scale.of(config).steps_per_update == scale


@pytest.mark.parametrize("batch", [{"per_worker": 128}, {"per_worker": 128, "global_size": 1000}])
def test_lbsgd_batch_scale_auto_needs_a_global_size_that_divides(batch):
    raw = {"optimizer": {"name": "lbsgd", "params": {"batch_scale": "auto"}}, "batch": batch}
    with pytest.raises(ConfigError, match=r"optimizer.params.batch_scale: 'auto' needs"):
        from_mapping(raw)


ELASTIC = {"min_workers": 2, "max_workers": 4, "discovery": "hosts"}


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, "elastic: batch.global_size must be set"),
        (
            {"batch": {"global_size": 100}},
            "global_size=100 does not divide evenly among 3 workers (x accumulation, x "
            "batch_scale for lbsgd); a multiple of 12 fits every world size from 2 to 4",
        ),
        (
            {"batch": {"global_size": 140, "accumulation": 7}},
            "among 3 workers (x accumulation, x batch_scale for lbsgd); a multiple of 84 fits",
        ),
        ({"workers": 5, "batch": {"global_size": 120}}, "workers=5 must lie in"),
        (
            {"batch": {"global_size": 120}, "precision": "mixed_float16"},
            "elastic: needs precision='float32'",
        ),
        ({"batch": {"global_size": 120}, "sync": {"mode": "local_sgd"}}, "sync.mode='local_sgd'"),
        (
            {"batch": {"global_size": 120}, "allreduce": {"compression": "fp16"}},
            "allreduce.compression='fp16'",
        ),
        ({"batch": {"global_size": 120}, "hosts": "a:2"}, "give the hosts in elastic.discovery"),
        (
            {"batch": {"global_size": 120}, "elastic": {**ELASTIC, "min_workers": 5}},
            "elastic: min_workers=5 is above max_workers=4",
        ),
        ({"batch": {"global_size": 120}, "elastic": {"max_workers": 4}}, "elastic.discovery"),
    ],
)
def test_an_elastic_config_keeps_its_global_batch_in_every_world_or_is_refused(changes, expected):
    raw = {"workers": 2, "elastic": ELASTIC, **changes}
    with pytest.raises(ConfigError) as refused:
        from_mapping(raw)
    assert expected in str(refused.value)


def test_an_elastic_epoch_is_the_same_steps_in_every_world_of_its_range():
    config = from_mapping({"workers": 2, "batch": {"global_size": 120}, "elastic": ELASTIC})
    assert list(world_sizes(config)) == [2, 3, 4]
    for world in (2, 3, 4):
        assert (
            Scale.of(config, world).per_worker * world
            == Scale.of(config, world).global_batch
            == 120
        )
    for examples in (1003, 1079, 1199, 120 * 9 - 1, 120 * 9):
        steps = [RunPlan.of(config, examples, w).steps_per_epoch for w in (2, 3, 4)]
        assert steps == [examples // 120] * 3, examples
    plain = from_mapping({"workers": 2, "batch": {"global_size": 120}})
    assert list(world_sizes(plain)) == [2]
