"""The dashboard (app/), page by page, through Streamlit's AppTest.

Runs are fabricated with tests/fabricate.py (the toolkit's own event writer and run directory), and
launches go through a fake ``toolkit.launching.launch.launch`` except in the one real-launch test.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import dashboard, run_cli
from fabricate import fake_run
from streamlit.testing.v1 import AppTest

from app import charts, data, form
from app.data import md_escape
from toolkit import config as config_lib
from toolkit.launching import launch as launcher
from toolkit.parallel import cost
from toolkit.plan import Scale
from toolkit.runs import processes, table, theme
from toolkit.runs.curves import downsample
from toolkit.runs.events import EventWriter, read_events
from toolkit.runs.rundir import RunDir
from toolkit.scaling import noise_scale
from toolkit.training import data as datasets
from toolkit.training import models

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty runs root, as ``$LBL_RUNS``."""
    path = tmp_path / "runs"
    path.mkdir()
    monkeypatch.setenv("LBL_RUNS", str(path))
    return path


@pytest.fixture
def launches(monkeypatch, root):
    """Replace ``toolkit.launching.launch.launch`` with a recorder that creates the run directory
    only."""
    calls = []

    def fake(config, **kwargs):
        calls.append((config, kwargs))
        run = RunDir.create(kwargs.get("runs_root_dir"), f"{config.name}-fake{len(calls)}")
        run.write_config(config)
        return run

    monkeypatch.setattr(launcher, "launch", fake)
    return calls


def page(name: str | None = None, timeout: float = 60) -> AppTest:
    """The app, run once, switched to ``views/<name>.py`` and run again."""
    at = dashboard(timeout).run()
    assert not at.exception, at.exception
    if name:
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception, at.exception
    return at


def launch_page() -> AppTest:
    """The Launch page from the schema's defaults: "(blank)", not the quickstart it opens on."""
    at = page("launch")
    by_label(at.selectbox, "Start from").set_value(form.BLANK).run()
    return at


def test_the_launch_form_opens_on_a_working_example_and_names_runs_as_the_cli(root, launches):
    """Defect 9 of the third walk: it opened on "(blank)" (SGD, constant rate, one worker), and
    its "Run name" became ``uislurm-b64-lars-0dc9`` where the CLI's ``--name`` is the run id."""
    at = page("launch")
    assert by_label(at.selectbox, "Start from").value == form.FIRST == "quickstart"
    assert by_label(at.number_input, "Workers").value == 2 and not at.error
    by_label(at.text_input, "Run id").set_value("uislurm").run()
    by_label(at.button, "Launch").click().run()
    ((config, kwargs),) = launches
    assert kwargs["run_id"] == "uislurm" and config.name == "quickstart"


def by_label(widgets, label: str):
    found = [w for w in widgets if w.label == label]
    assert len(found) == 1, f"{label!r} in {[w.label for w in widgets]}"
    return found[0]


def flat(node) -> list:
    """Every element under ``node`` in document order."""
    children = getattr(node, "children", None)
    if children is None:
        return [node]
    return [leaf for key in sorted(children) for leaf in flat(children[key])]


def after(at: AppTest, widget) -> object:
    """The first element after ``widget`` in document order (empty placeholders skipped)."""
    elements = flat(at.main)
    index = next(i for i, e in enumerate(elements) if getattr(e, "id", None) == widget.id)
    return next(e for e in elements[index + 1 :] if e.type != "empty")


def decode(array) -> np.ndarray:
    """A Plotly JSON array: a list, or a typed array ``{"dtype", "bdata"}``."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"]))
    return np.asarray(array)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


# --- Launch -------------------------------------------------------------------------------


def test_launch_blank_form_previews_scaling_and_schedule(root, launches):
    at = launch_page()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Global batch"] == "32" and metrics["Steps per epoch"] == "125"
    workers = by_label(at.number_input, "Workers").set_value(4)
    by_label(at.selectbox, "Learning-rate scaling rule").set_value("linear")
    by_label(at.number_input, "Base batch").set_value(64)
    at.run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Global batch"] == "128"  # 32 x 4 workers
    assert metrics["Scaled learning rate"] == "0.2"  # 0.1 x 128 / 64
    assert workers.value == 4 and not at.error
    assert launches == []  # previewing starts nothing


def test_launch_preview_is_the_toolkit_schedule(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Start from").set_value("quickstart").run()
    assert not at.error, [e.value for e in at.error]
    config = config_lib.load(ROOT / "experiments" / "quickstart.yaml")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Global batch"] == f"{Scale.of(config).global_batch:,}"
    assert metrics["Scaled learning rate"] == f"{Scale.of(config).learning_rate:.4g}"
    (figure,) = figures(at)
    lr, momentum = figure["data"]
    from toolkit.training import data as datasets
    from toolkit.training.experiment import schedule_preview

    n = len(datasets.load("mnist1d", seed=config.seed).x_train)
    expected = schedule_preview(config, n)
    np.testing.assert_allclose(decode(lr["y"]), expected["lr"], rtol=1e-6)
    np.testing.assert_allclose(decode(lr["x"]), expected["epoch"], rtol=1e-6)
    np.testing.assert_allclose(decode(momentum["y"]), expected["momentum"])
    assert decode(lr["x"])[-1] > config.epochs - 0.1  # the whole run


def test_launch_invalid_fields_show_schema_messages_next_to_them_and_launch_nothing(root, launches):
    at = launch_page()
    name = by_label(at.text_input, "Run name").set_value("my run!")
    per_worker = by_label(at.number_input, "Batch per worker").set_value(0)
    warmup = by_label(at.number_input, "Warmup epochs").set_value(-1.0)
    at.run()
    for widget, field in (
        (name, "name"),
        (per_worker, "batch.per_worker"),
        (warmup, "schedule.warmup.epochs"),
    ):
        message = after(at, widget)
        assert message.type == "error", message
        assert message.value.startswith(data.md_escape(f"{field}: ")), message.value
    assert "greater than or equal to 1" in after(at, per_worker).value
    assert "run names must match" in after(at, name).value
    assert not at.get("plotly_chart") and not at.metric  # no preview of an invalid config
    by_label(at.button, "Launch").click().run()
    assert any("Nothing was launched" in e.value for e in at.error)
    assert launches == [] and list(root.iterdir()) == []


def test_launch_section_and_cross_field_errors_are_reported(root, launches):
    at = launch_page()
    by_label(at.radio, "Where").set_value("Hosts over ssh").run()
    by_label(at.text_input, "Hosts").set_value("h1:1")
    by_label(at.number_input, "Workers").set_value(2)
    params = by_label(at.text_input, "Schedule params (YAML mapping)").set_value("{power: 2}")
    at.run()
    assert "has no parameter" in after(at, params).value  # schedule 'constant' takes none
    by_label(at.selectbox, "Schedule").set_value("poly").run()
    (first, *_) = at.error  # whole-config errors go to the slot above the form
    assert first.value.startswith("config\\:") and "fewer slots than workers" in first.value
    by_label(at.button, "Launch").click().run()
    assert launches == []
    by_label(at.text_input, "Hosts").set_value("h1:1,h2:1").run()
    assert not at.error
    assert [m.value for m in at.metric][:2] == ["64", "0.1"]


def test_launch_where_slurm_gives_the_config_a_slurm_section_and_no_hosts(root, launches):
    at = launch_page()
    assert by_label(at.radio, "Where").value == "This machine"
    assert not [w for w in at.text_input if w.label in ("Hosts", "Partition")]
    by_label(at.radio, "Where").set_value("Slurm").run()
    assert not [w for w in at.text_input if w.label == "Hosts"]
    by_label(at.number_input, "Nodes").set_value(2).run()
    assert any(
        "slurm.nodes=2 is more than workers=1" in e.value.replace("\\", "") for e in at.error
    )
    by_label(at.number_input, "Workers").set_value(2)
    by_label(at.text_input, "Time limit").set_value("1:00:00")
    by_label(at.text_area, "More sbatch options").set_value("--qos=long\n\n--mail-type=END")
    at.run()
    assert not at.error, [e.value for e in at.error]
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    assert config.slurm.model_dump(exclude_defaults=True) == {
        "nodes": 2,
        "time": "1:00:00",
        "sbatch_args": ["--qos=long", "--mail-type=END"],
    }
    assert config.hosts is None
    by_label(at.text_input, "Time limit").set_value("1h").run()
    assert any("slurm.time" in e.value.replace("\\", "") for e in at.error)


def test_launch_batch_larger_than_the_dataset_is_stopped_before_launch(root, launches):
    at = launch_page()
    per_worker = by_label(at.number_input, "Batch per worker").set_value(100_000)
    at.run()
    assert "larger than each" in after(at, per_worker).value
    by_label(at.button, "Launch").click().run()
    assert launches == []


def test_launch_fixed_global_batch_derives_per_worker_or_is_refused(root, launches):
    at = launch_page()
    by_label(at.number_input, "Workers").set_value(2)
    by_label(at.number_input, "Global batch (optional)").set_value(101).run()
    (first, *_) = at.error
    assert "batch\\.global\\_size\\=101 must be a multiple of workers" in first.value
    by_label(at.button, "Launch").click().run()
    assert launches == []
    by_label(at.number_input, "Global batch (optional)").set_value(128).run()
    assert not at.error
    assert at.metric[0].value == "128"


def test_launch_synchronisation_and_compression_fields(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Synchronisation").set_value("local_sgd")
    by_label(at.selectbox, "Compression").set_value("fp16")
    at.run()
    (first, *_) = at.error  # a cross-field error: the slot above the form
    assert "allreduce\\.compression must be \\'none\\'" in first.value, first.value
    by_label(at.button, "Launch").click().run()
    assert launches == []
    by_label(at.selectbox, "Synchronisation").set_value("full")
    by_label(at.selectbox, "Compression").set_value("topk")
    by_label(at.number_input, "Top-k: ratio sent").set_value(0.05)
    by_label(at.checkbox, "Residual").uncheck()
    at.run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    assert config.allreduce.compression == "topk" and config.allreduce.ratio == 0.05
    assert config.allreduce.residual is False and config.sync.mode == "full"


def test_launch_says_when_compression_pays_on_the_link_given(root, launches):
    """The line under the synchronisation section is toolkit.parallel.cost's prediction for
    the config's model (its trainable entries counted here), workers and the link given."""
    at = launch_page()
    by_label(at.number_input, "Workers").set_value(4)
    by_label(at.selectbox, "Compression").set_value("topk")
    by_label(at.number_input, "Top-k: ratio sent").set_value(0.05)
    at.run()
    line = next(m.value for m in at.markdown if "Gbit/s link" in m.value)
    dataset = datasets.load("mnist1d", seed=0)  # the blank form's dataset and model
    model = models.build("cnn1d", input_shape=dataset.input_shape, num_classes=dataset.num_classes)
    entries = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    link = cost.Link(1.0)
    dense = cost.seconds_per_update("none", entries, 4, link)
    chosen = cost.seconds_per_update("topk", entries, 4, link, ratio=0.05, topk_sample=0.0)
    assert line.startswith("On a 1 Gbit/s link with 4 workers")
    assert f"{entries / 1e6:.2f}M gradients" in line
    assert f"dense ≈ {dense * 1e3:,.0f} ms" in line
    assert f"topk 0.05 (this config) ≈ {chosen * 1e3:,.0f} ms" in line
    by_label(at.number_input, "When does it pay? Link between the hosts (Gbit/s)").set_value(10)
    at.run()
    line = next(m.value for m in at.markdown if "Gbit/s link" in m.value)
    faster = cost.seconds_per_update("none", entries, 4, cost.Link(10.0))
    assert line.startswith("On a 10 Gbit/s link") and f"dense ≈ {faster * 1e3:,.0f} ms" in line
    by_label(at.selectbox, "Sparse values on the wire").set_value("float16")
    slow = by_label(at.number_input, "When does it pay? Link between the hosts (Gbit/s)")
    slow.set_value(0.01)  # slow enough that 6 bytes an entry, not 8, show in the milliseconds
    at.run()
    line = next(m.value for m in at.markdown if "Gbit/s link" in m.value)
    wide, narrow = (
        cost.seconds_per_update(
            "topk", entries, 4, cost.Link(0.01), ratio=0.05, topk_sample=0.0, value_bytes=width
        )
        for width in (4, 2)
    )
    assert round(wide * 1e3) != round(narrow * 1e3)
    assert f"topk 0.05 (this config) ≈ {narrow * 1e3:,.0f} ms" in line


def test_launch_elastic_fields_need_a_global_batch_for_every_world(root, launches, tmp_path):
    at = launch_page()
    by_label(at.checkbox, "Elastic").check()
    by_label(at.number_input, "Workers").set_value(2)
    by_label(at.number_input, "Fewest workers").set_value(2)
    by_label(at.number_input, "Most workers").set_value(3)
    by_label(at.text_input, "Hosts file or discovery script").input(str(tmp_path / "hosts"))
    by_label(at.number_input, "Global batch (optional)").set_value(64).run()
    (first, *_) = at.error  # 64 does not divide among 3
    assert "does not divide evenly among 3 workers" in first.value.replace("\\", "")
    by_label(at.button, "Launch").click().run()
    assert launches == []
    by_label(at.number_input, "Global batch (optional)").set_value(96).run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    elastic = config.elastic
    assert (elastic.min_workers, elastic.max_workers) == (2, 3)
    assert elastic.discovery == str(tmp_path / "hosts") and Scale.of(config, 3).global_batch == 96


def test_launch_adascale_fields(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Learning-rate scaling rule").set_value("adascale")
    by_label(at.number_input, "Global batch (optional)").set_value(128)
    by_label(at.number_input, "Base batch").set_value(256).run()
    (first, *_) = at.error  # the gain is at least 1: the batch must be at least the base
    assert "at least lr_scaling.base_batch=256" in first.value.replace("\\", "")
    by_label(at.number_input, "Base batch").set_value(32).run()
    assert not at.error
    assert any("AdaScale" in c.value for c in at.caption)
    assert by_label(at.number_input, "Noise scale every (updates, 0: off)").value is None
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    assert config.lr_scaling.rule == "adascale" and config.lr_scaling.base_batch == 32
    assert config.logging.noise_scale_every_steps == "auto"
    assert Scale.of(config).global_batch / config.lr_scaling.base_batch == 4


def test_the_launch_form_sets_an_adaptive_batch(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Learning-rate scaling rule").set_value("adascale")
    by_label(at.number_input, "Base batch").set_value(32).run()
    by_label(at.checkbox, "Adaptive batch").check()
    by_label(at.number_input, "Smallest global batch").set_value(48).run()
    assert any("power of two" in e.value for e in at.error)
    by_label(at.number_input, "Smallest global batch").set_value(32)
    by_label(at.number_input, "Largest global batch").set_value(512)
    by_label(at.number_input, "Hysteresis").set_value(1.5).run()
    assert any("hysteresis" in e.value for e in at.error)
    by_label(at.number_input, "Hysteresis").set_value(0.5)
    by_label(at.number_input, "Aim (× the noise scale)").set_value(3.5).run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    assert config.batch.adaptive.min == 32 and config.batch.adaptive.max == 512
    assert config.batch.adaptive.every_epochs == 1
    assert config.batch.adaptive.aim == 3.5 and config.batch.adaptive.hysteresis == 0.5


def test_launch_labels_are_plain_words_with_the_field_name_as_help(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Optimizer").set_value("lars").run()
    widgets = [*at.number_input, *at.text_input, *at.selectbox, *at.checkbox, *at.multiselect]
    for widget in widgets:
        assert "_" not in widget.label and widget.label[:1].isupper(), widget.label
    decay = by_label(at.number_input, "Weight decay")
    assert decay.help == "`weight_decay`"


def test_launch_warns_when_the_warmup_keeps_the_rate_below_the_scaled_one(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Schedule").set_value("cosine")
    by_label(at.number_input, "Epochs").set_value(1)
    by_label(at.number_input, "Warmup epochs").set_value(1.0).run()
    (warning,) = at.warning
    scaled = float(next(m.value for m in at.metric if m.label == "Scaled learning rate"))
    assert md_escape(f"of the scaled rate {scaled:.4g}") in warning.value
    assert md_escape("the 1-epoch warmup overlaps the cosine decay of a 1-epoch run") in (
        warning.value
    )
    by_label(at.number_input, "Epochs").set_value(10)
    by_label(at.number_input, "Warmup epochs").set_value(1.0).run()
    assert not at.warning


def test_launch_preset_through_the_launcher(root, launches):
    at = launch_page()
    by_label(at.selectbox, "Start from").set_value("large_batch_lars").run()
    by_label(at.number_input, "Momentum").set_value(0.95)
    by_label(at.number_input, "Epochs").set_value(3)
    at.run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    assert not at.exception
    ((config, kwargs),) = launches
    preset = config_lib.load(ROOT / "experiments" / "large_batch_lars.yaml")
    # no run id given: a new one; the backend this app's workers would get (none chosen)
    assert kwargs == {"runs_root_dir": root, "run_id": None, "backend": "tensorflow"}
    assert config.optimizer.name == "lars" and config.optimizer.params["momentum"] == 0.95
    assert config.epochs == 3
    assert config.model_dump(exclude={"epochs", "optimizer"}) == preset.model_dump(
        exclude={"epochs", "optimizer"}
    )
    assert config.optimizer.params == {**preset.optimizer.params, "momentum": 0.95}
    assert at.session_state["current_run"] == "large-batch-lars-fake1"
    assert "large\\-batch\\-lars\\-fake1" in at.success[0].value


def test_launch_backend_is_a_choice_checked_before_anything_starts(root, launches):
    at = launch_page()
    by_label(at.number_input, "Workers").set_value(2)
    by_label(at.selectbox, "Compression").set_value("threshold")  # a count that varies
    by_label(at.selectbox, "Keras backend").set_value("jax").run()
    (refused,) = [e.value for e in at.error if "keras\\_backend" in e.value]
    assert "KERAS\\_BACKEND\\=jax" in refused and "compression \\'none\\'" in refused
    by_label(at.button, "Launch").click().run()
    assert launches == []
    by_label(at.selectbox, "Keras backend").set_value("torch").run()  # Horovod's PyTorch allreduce
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, kwargs),) = launches
    assert kwargs["backend"] == "torch" and config.workers == 2
    assert config.allreduce.compression == "threshold"


def test_launch_form_sets_dgcs_switches(root, launches):
    """The preset and its switches reach the config: empty and "preset" follow ``dgc``,
    explicit values win."""
    at = launch_page()
    by_label(at.selectbox, "Start from").set_value("quickstart").run()
    by_label(at.selectbox, "Compression").set_value("topk")
    by_label(at.selectbox, "Sparse values on the wire").set_value("float16")
    by_label(at.checkbox, "DGC preset").check()
    by_label(at.selectbox, "Momentum masking").set_value("off")
    by_label(at.number_input, "Sparsity warm-up (epochs)").set_value(2)
    by_label(at.number_input, "Local clip norm").set_value(2.5)
    at.run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    allreduce = config.allreduce
    assert (allreduce.compression, allreduce.value_dtype, allreduce.dgc) == (
        "topk",
        "float16",
        True,
    )
    assert (allreduce.momentum_correction, allreduce.momentum_masking) == (None, False)
    assert (allreduce.local_clipnorm, allreduce.sparsity_warmup_epochs) == (2.5, 2)
    assert allreduce.dense_1d is None and not allreduce.dense_norm
    assert config.communication().summary() == (
        "topk 1%, float16 values; DGC: momentum correction, local clip 2.5, "
        "warm-up 2 epochs, 1-D dense"
    )


def test_the_launch_form_logs_to_mlflow_where_asked_and_names_a_bad_uri(root, launches):
    at = launch_page()
    assert by_label(at.text_input, "MLflow tracking URI").disabled  # off: no section
    by_label(at.checkbox, "Log to MLflow as it trains").check().run()
    by_label(at.text_input, "MLflow tracking URI").set_value("mlruns").run()
    (shown,) = [e.value for e in at.error if "tracking" in e.value]
    assert "must be an MLflow server" in shown
    assert by_label(at.button, "Launch").disabled or not launches
    by_label(at.text_input, "MLflow tracking URI").set_value("http://127.0.0.1:5000")
    by_label(at.text_input, "MLflow experiment").set_value("lab")
    at.run()
    assert not at.error
    by_label(at.button, "Launch").click().run()
    ((config, _),) = launches
    assert config.logging.mlflow.model_dump() == {
        "tracking_uri": "http://127.0.0.1:5000",
        "experiment": "lab",
    }


# --- Runs ---------------------------------------------------------------------------------


@pytest.fixture
def three_runs(root):
    fake_run(root, "alpha-lars", events=300, optimizer="lars")
    fake_run(root, "beta-sgd", events=200, optimizer="sgd", state="failed", seed=1)
    fake_run(root, "gamma-live", events=100, state="running", pid=os.getpid(), seed=2)
    return root


def test_runs_table_lists_summaries_and_filters(three_runs):
    at = page()
    table = at.dataframe[0].value
    assert set(table["run_id"]) == {"alpha-lars", "beta-sgd", "gamma-live"}
    rows = table.set_index("run_id")
    assert (
        rows.loc["beta-sgd", "state"] == "failed" and rows.loc["gamma-live", "state"] == "running"
    )
    assert (
        rows.loc["alpha-lars", "optimizer"] == "lars"
        and rows.loc["alpha-lars", "global_batch"] == 64
    )
    events = read_events(three_runs / "alpha-lars" / "events.jsonl")
    train = events[events["phase"] == "train"]
    assert rows.loc["alpha-lars", "last_loss"] == pytest.approx(train["loss"].iloc[-1])
    assert rows.loc["alpha-lars", "best_eval_accuracy"] == pytest.approx(
        events[events["phase"] == "eval"]["accuracy"].max()
    )
    by_label(at.multiselect, "State").set_value(["failed", "running"]).run()
    assert set(at.dataframe[0].value["run_id"]) == {"beta-sgd", "gamma-live"}
    by_label(at.text_input, "Search").set_value("GAMMA").run()
    assert list(at.dataframe[0].value["run_id"]) == ["gamma-live"]
    by_label(at.multiselect, "State").set_value([])
    by_label(at.text_input, "Search").set_value("")
    by_label(at.multiselect, "Optimizer").set_value(["sgd"]).run()
    assert list(at.dataframe[0].value["run_id"]) == ["beta-sgd"]


def test_runs_selected_run_output_config_and_diff(three_runs):
    (three_runs / "beta-sgd" / "stdout.log").write_text(
        "".join(f"line {i}\n" for i in range(20_000))
    )
    at = page()
    by_label(at.selectbox, "Selected run").set_value("beta-sgd").run()
    log, config, diff = at.main.code
    assert log.value.endswith("line 19999") and not log.value.startswith("line 0\n")
    assert len(log.value) <= 32_000
    assert config.value == (three_runs / "beta-sgd" / "config.yaml").read_text().rstrip().strip()
    by_label(at.selectbox, "Compare with").set_value("alpha-lars").run()
    diff = at.main.code[2].value
    assert "--- beta-sgd/config.yaml" in diff and "+++ alpha-lars/config.yaml" in diff
    assert "-  name: sgd" in diff and "+  name: lars" in diff


def test_runs_stop_and_rerun_use_the_launcher(three_runs, launches, monkeypatch):
    stopped = []
    monkeypatch.setattr(launcher, "stop", lambda *args, **kw: stopped.append((*args, kw)))
    at = page()
    by_label(at.selectbox, "Selected run").set_value("gamma-live").run()
    assert by_label(at.button, "Delete…").disabled  # a live run cannot be deleted
    by_label(at.button, "Stop").click().run()
    assert stopped == [("gamma-live", three_runs, {"by": "the app"})]
    assert "Stopped gamma\\-live" in at.success[0].value
    by_label(at.selectbox, "Selected run").set_value("alpha-lars").run()
    assert by_label(at.button, "Stop").disabled
    by_label(at.button, "Rerun with the same config").click().run()
    ((config, kwargs),) = launches
    assert config == RunDir(three_runs / "alpha-lars").config() and kwargs == {
        "runs_root_dir": three_runs
    }
    assert at.session_state["current_run"] == f"{config.name}-fake1"


def test_runs_delete_needs_confirmation(three_runs):
    at = page()
    by_label(at.selectbox, "Selected run").set_value("alpha-lars").run()
    by_label(at.button, "Delete…").click().run()
    assert (three_runs / "alpha-lars").is_dir()
    assert "cannot be undone" in at.warning[0].value
    by_label(at.button, "Cancel").click().run()
    assert (three_runs / "alpha-lars").is_dir() and not at.warning
    by_label(at.button, "Delete…").click().run()
    by_label(at.button, "Yes, delete it").click().run()
    assert not (three_runs / "alpha-lars").exists()
    assert set(at.dataframe[0].value["run_id"]) == {"beta-sgd", "gamma-live"}
    assert "Deleted alpha\\-lars" in at.success[0].value


def test_runs_shows_progress_first_and_no_none_for_missing_values(three_runs):
    at = page()
    table = at.dataframe[0].value.set_index("run_id")
    columns = list(table.columns)
    assert columns[:6] == [
        "state",
        "progress",
        "epochs_done",
        "best_eval_accuracy",
        "last_eval_accuracy",
        "checkpoint",  # ⚠ damaged, where the newest is
    ]  # no horizontal scroll to see how it went
    assert table.loc["alpha-lars", "progress"] == 1.0
    assert table.loc["alpha-lars", "epochs_done"] == "10 of 10"
    assert (table["checkpoint"] == "").all()  # no run here has a damaged checkpoint
    live = read_events(three_runs / "gamma-live" / "events.jsonl")
    epoch = live[live["phase"] == "train"]["epoch"].iloc[-1]
    assert table.loc["gamma-live", "progress"] == pytest.approx(epoch / 10)
    assert table.loc["gamma-live", "epochs_done"] == f"{round(epoch, 2):g} of 10"
    assert all(frame.proto.placeholder == "" for frame in at.dataframe)


def test_tags_and_notes_are_edited_on_runs_and_searched(three_runs):
    RunDir(three_runs / "beta-sgd").set_tags(["baseline"])  # from Python
    at = page()
    by_label(at.selectbox, "Selected run").set_value("alpha-lars").run()
    tags = by_label(at.multiselect, "Tags")
    assert tags.options == ["baseline"] and tags.value == []
    tags.set_value(["baseline", "wd 1e-4"]).run()
    assert RunDir(three_runs / "alpha-lars").tags() == ["baseline", "wd 1e-4"]
    by_label(at.text_area, "Notes").set_value("lr too high after warmup").run()
    assert RunDir(three_runs / "alpha-lars").notes() == "lr too high after warmup"
    table = at.dataframe[0].value.set_index("run_id")
    assert list(table.loc["alpha-lars", "tags"]) == ["baseline", "wd 1e-4"]

    by_label(at.multiselect, "With tags").set_value(["baseline"]).run()
    assert set(at.dataframe[0].value["run_id"]) == {"alpha-lars", "beta-sgd"}
    by_label(at.multiselect, "With tags").set_value([])
    by_label(at.text_input, "Search").set_value("TOO HIGH").run()
    assert list(at.dataframe[0].value["run_id"]) == ["alpha-lars"]
    result = run_cli(["tag", "alpha-lars", "--remove", "baseline"], three_runs)
    assert result.stdout.strip() == "wd 1e-4"  # the CLI sees what the app wrote


def test_any_config_field_is_a_column_to_filter_sort_and_group_by(three_runs):
    at = page()
    fields = by_label(at.multiselect, "Config columns")
    assert {"optimizer.name", "optimizer.params.momentum", "batch.per_worker"} <= set(
        fields.options
    )
    fields.set_value(["optimizer.name", "seed"]).run()
    table = at.dataframe[0].value.set_index("run_id")
    seed = RunDir(three_runs / "beta-sgd").config().seed
    assert (
        table.loc["beta-sgd", "optimizer.name"] == "sgd" and table.loc["beta-sgd", "seed"] == seed
    )
    by_label(at.selectbox, "Group by").set_value("optimizer.name").run()
    groups = at.dataframe[1].value.set_index("optimizer.name")
    summaries = at.dataframe[0].value.set_index("run_id")
    lars = summaries[summaries["optimizer.name"] == "lars"]["best_eval_accuracy"]
    assert groups.loc["lars", "runs"] == len(lars) == 2 and groups.loc["sgd", "runs"] == 1
    assert groups.loc["lars", "mean best eval acc"] == pytest.approx(lars.mean())  # NaN skipped
    assert groups.loc["lars", "max best eval acc"] == pytest.approx(lars.max())
    by_label(at.selectbox, "Filter by").set_value("optimizer.name").run()
    by_label(at.multiselect, "optimizer.name is").set_value(["sgd"]).run()
    assert list(at.dataframe[0].value["run_id"]) == ["beta-sgd"]
    by_label(at.multiselect, "optimizer.name is").set_value([]).run()
    by_label(at.multiselect, "State").set_value(["completed"]).run()
    assert at.dataframe[1].value.set_index("optimizer.name").loc["lars", "runs"] == 1


def test_a_run_opens_from_its_row_and_shows_its_labels_and_config(three_runs):
    """The Runs table links each run to its Run detail (``detail?run=<id>``), which opens on
    that run with its tags, notes and config.yaml."""
    RunDir(three_runs / "beta-sgd").set_tags(add=["baseline"])
    RunDir(three_runs / "beta-sgd").set_notes("lr too high")
    at = page()
    table = at.dataframe[0].value
    assert (table["open"] == "detail?run=" + table["run_id"]).all()
    drawn = json.loads(at.dataframe[0].proto.columns)  # the id, drawn as its link, pinned
    assert drawn["run_id"] == {"hidden": True} and drawn["open"]["pinned"]
    assert drawn["open"]["label"] == "run" and drawn["open"]["type_config"]["display_text"]
    at = dashboard()
    at.query_params["run"] = "beta-sgd"  # a new tab, opened at the link's address
    at.switch_page("views/detail.py").run()
    assert not at.exception and at.selectbox[0].value == "beta-sgd"
    assert md_escape("tags: baseline  ·  notes: lr too high") in [c.value for c in at.caption]
    (config,) = [c for c in at.code if c.language == "yaml"]
    assert config.value == (three_runs / "beta-sgd" / "config.yaml").read_text().rstrip()


def test_config_columns_come_beside_the_run_and_groups_are_labelled(three_runs):
    at = page()
    by_label(at.multiselect, "Config columns").set_value(["seed", "optimizer.name"]).run()
    assert list(at.dataframe[0].value.columns[:3]) == ["run_id", "seed", "optimizer.name"]
    RunDir(three_runs / "alpha-lars").set_tags(add=["baseline"])
    by_label(at.selectbox, "Group by").set_value("tags").run()
    groups = at.dataframe[1].value.set_index("tags")
    assert groups.loc["(untagged)", "runs"] == 2 and groups.loc["baseline", "runs"] == 1
    drawn = json.loads(at.dataframe[1].proto.columns)  # the column configs it was drawn with
    formats = {name: c.get("type_config", {}).get("format") for name, c in drawn.items()}
    assert formats["mean best eval acc"] == "%.4f" and formats["median samples/s"] == "%.0f"


def test_run_names_and_messages_are_never_markup(root):
    run = fake_run(root, "x_y", events=50, state="failed")
    run.set_status("failed", reason="<script>alert(1)</script> [link](javascript:x) **bold**")
    at = page()
    assert any("<script>alert(1)</script>" in t.value for t in at.text)  # st.text: literal
    assert data.md_escape("<b>[x](y)</b>") == "\\<b\\>\\[x\\]\\(y\\)\\<\\/b\\>"
    assert charts.label("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"
    source = "\n".join(p.read_text() for p in (ROOT / "app").rglob("*.py"))
    assert "unsafe_allow_html" not in source and "st.html" not in source


# --- Half-written and crashed runs ----------------------------------------------------------


@pytest.fixture
def broken_runs(root):
    """A run directory with nothing in it, one with a torn config and events, and a crash."""
    (root / "empty").mkdir()
    torn = root / "torn"
    torn.mkdir()
    (torn / "config.yaml").write_text("optimizer: {name: lars\n")
    (torn / "status.json").write_text('{"state": "runn')
    (torn / "events.jsonl").write_bytes(
        b'{"step": 1, "phase": "train", "loss": 1.0, "epoch": 0.1}\nnot json\n'
        b'{"step": 2, "phase": "train", "loss": "NaN", "epoch": 0.2}\n[1, 2]\n'
        b'{"step": 3, "phase": "eval", "loss": 0.7, "accuracy": 0.4}\n{"step": 4, "pha'
    )
    crashed = fake_run(root, "crashed", events=120, state="running", pid=2**22 + 12345)
    (crashed.path / "stdout.log").write_bytes(b"Traceback \xff\xfe (most recent call last)\n")
    with EventWriter(crashed.events_path) as writer:  # odd values and keys must not break pages
        writer.write({"step": 999, "phase": "train", "loss": "n/a", "extra": [1], "epoch": None})
    return root


def test_half_written_and_crashed_runs_are_displayed(broken_runs):
    at = page()
    rows = at.dataframe[0].value.set_index("run_id")
    assert set(rows.index) == {"empty", "torn", "crashed"}
    assert rows.loc["crashed", "state"] == "failed"  # its process is gone
    assert rows.loc["torn", "last_step"] == 2
    for run_id in ("empty", "torn", "crashed"):
        at.session_state["current_run"] = run_id
        for name in ("runs", "detail", "compare"):
            at.switch_page(f"views/{name}.py")
            at.session_state["compare_runs"] = ["empty", "torn", "crashed"]
            at.run()
            assert not at.exception, (run_id, name, at.exception)
    at.session_state["current_run"] = "torn"
    at.switch_page("views/detail.py").run()
    texts = " ".join(t.value for t in [*at.text, *at.markdown])
    assert md_escape("config.yaml is missing or not valid") in texts
    frame = at.session_state["event_tails"][str(broken_runs / "torn")][1]
    assert list(frame["step"]) == [
        1,
        2,
        3,
    ]  # the torn last line and the junk lines skipped
    assert np.isnan(frame["loss"].iloc[1])
    at.switch_page("views/runs.py")
    at.session_state["current_run"] = "crashed"
    at.run()
    assert "Traceback \ufffd\ufffd" in at.main.code[0].value


# --- Run detail ---------------------------------------------------------------------------


def test_detail_shows_status_progress_curves_and_trust_ratios(root):
    fake_run(root, "lars-run", events=600, epochs=4)
    at = page("detail")
    assert "state: completed" in at.text[0].value
    assert at.get("progress")[0].proto.value == 100
    by_label(at.slider, "EMA smoothing").set_value(0.0).run()  # the raw curves alone
    specs = figures(at)
    assert [f["layout"]["title"]["text"] for f in specs] == [
        "loss",
        "learning rate",
        "accuracy",
        "samples/sec",
        "Per-layer trust ratio",
    ]
    loss = specs[0]
    assert [t["name"] for t in loss["data"]] == ["train", "eval"]
    assert all(t["type"] == "scatter" for t in loss["data"])  # SVG: see app/charts.py
    heatmap = specs[-1]["data"][0]
    assert heatmap["type"] == "heatmap" and heatmap["y"] == [
        "conv1/kernel",
        "conv2/kernel",
        "conv3/kernel",
        "dense/kernel",
        "dense/bias",
    ]


def test_detail_shows_the_traffic_of_a_run_that_logs_it(root):
    """Each of its two bytes-per-update charts says over which window it averages (every train
    event's 10 steps; every 5th event's 50 for the workers' samples), so they may differ."""
    fake_run(root, "sparse", events=300, bytes_per_update=800.0, system_every=50)
    at = page("detail")
    lines = [f["layout"]["title"]["text"].split("<br>") for f in figures(at)]
    assert all(len(line) <= charts.TITLE_CHARS for title in lines for line in title)  # not cut
    titles = [" ".join(title) for title in lines]
    assert "bytes rank 0 sent per update (mean over the 10 steps to each event)" in titles
    assert "bytes each worker sent per update (mean over the 50 steps to each sample)" in titles
    assert "compression (dense bytes / sent)" in titles
    ratio = figures(at)[titles.index("compression (dense bytes / sent)")]
    np.testing.assert_allclose(decode(ratio["data"][0]["y"]), 50.0)


def header(at: AppTest) -> str:
    return next(m.value for m in at.markdown if "global batch" in m.value)


def test_detail_header_says_how_high_the_rate_got_where_it_fell_short(root):
    """The events' highest rate against the scaled one: a fake run logs at most 0.1; with a
    scaled rate of 0.4 the header says so, with 0.1 it says nothing more."""
    run = fake_run(root, "short", events=200)
    assert "highest reached" not in header(page("detail"))
    config = run.config()
    faster = config.optimizer.model_copy(update={"learning_rate": 0.4})
    run.write_config(config.model_copy(update={"optimizer": faster}))
    assert md_escape("lr 0.4 (highest reached 0.1)") in header(page("detail"))


def test_detail_header_says_what_the_run_is_how_it_went_and_how_sure_b_simple_is(root):
    run = fake_run(root, "lars-run", events=600, epochs=4, gns_every=20)
    at = page("detail")
    header = next(m.value for m in at.markdown if "global batch" in m.value)
    config, row = run.config(), table.summary(run)
    for said in (
        "lars",
        f"global batch {Scale.of(config).global_batch}",
        "on 2 workers",
        "constant",
        "4 epochs",
        f"final accuracy {row['last_eval_accuracy']:.4f}",
        f"best {row['best_eval_accuracy']:.4f}",
        f"{round(row['duration_s'])}s",
    ):
        assert md_escape(said) in header, (said, header)
    events = read_events(run.events_path)
    readings = events[events["phase"] == "gns"]["b_simple"].to_numpy()[-10:]
    low, high = np.percentile(readings, [10, 90])
    (band,) = [c.value for c in at.caption if md_escape("B_simple") in c.value]
    said = f"B_simple ≈ {np.median(readings):,.0f} over this run's last 10 readings "
    said += f"({low:,.0f}–{high:,.0f})"
    assert md_escape(said) in band and md_escape(noise_scale.GROWS) in band  # which, and why

    fake_run(root, "one-reading", events=30, epochs=1, gns_every=20)
    at.run()
    by_label(at.selectbox, "Run").set_value("one-reading").run()
    (band,) = [c.value for c in at.caption if md_escape("B_simple") in c.value]
    assert md_escape("from 1 reading(s)") in band and "too few to trust" in band


def test_lab_starts_demo_run_points_to_the_dashboard_that_comes_next(root, monkeypatch, capsys):
    """Defect 12 of the third walk: ``./lab start``'s demo run said "or ./lab start" while
    ``./lab start`` was running; the script tells ``launch --wait`` the dashboard is next."""
    from toolkit.__main__ import _wait

    run = fake_run(root, "demo", events=100)
    assert "LBL_DASHBOARD_NEXT=1" in (ROOT / "lab").read_text()
    monkeypatch.setenv("LBL_DASHBOARD_NEXT", "1")
    assert _wait(run) == 0
    said = capsys.readouterr().out
    assert "the dashboard starts next" in said and "./lab start" not in said
    monkeypatch.delenv("LBL_DASHBOARD_NEXT")
    _wait(run)
    assert "or ./lab start (Runs, Run detail, Compare)" in capsys.readouterr().out


def test_a_run_that_did_not_complete_has_a_last_accuracy_not_a_final_one(root):
    """Defect 10 of the third walk: a stopped run's last value was its "final accuracy"."""
    fake_run(root, "cut-short", events=300, state="stopped")
    at = page("detail")
    by_label(at.selectbox, "Run").set_value("cut-short").run()
    row = table.summary(RunDir(root / "cut-short"))
    assert md_escape(f"last accuracy {row['last_eval_accuracy']:.4f}") in header(at)
    assert "final accuracy" not in header(at)


def test_stop_from_run_detail_ends_the_run_and_its_log_says_so(root):
    run = fake_run(root, "watched", events=100, state="running")
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        run.set_status("running", processes=[processes.record("worker", sleeper.pid)])
        at = page("detail")
        by_label(at.button, "Stop").click().run()
        assert sleeper.wait(timeout=30) is not None
    finally:
        sleeper.kill()
    status = run.status()
    assert status["state"] == "stopped" and "from the app" in status["reason"]
    last = run.stdout_path.read_text().rstrip().splitlines()[-1]
    assert "stopped on request from the app" in last and "resume watched" in last
    assert by_label(at.button, "Stop").disabled and not at.exception


def test_one_colour_per_run_on_run_detail_and_compare(compare_runs):
    at = page("detail")
    colours = {}
    for run_id in ("run-0", "run-1", "run-2"):
        by_label(at.selectbox, "Run").set_value(run_id).run()
        lines = {t["line"]["color"] for f in figures(at)[:4] for t in f["data"]}
        assert len(lines) == 1, lines  # train and eval: one colour, two dashes
        colours[run_id] = lines.pop()
    assert len(set(colours.values())) == 3
    at = page("compare")
    by_label(at.multiselect, "Runs").set_value(["run-2", "run-0"]).run()
    for figure in figures(at):
        for trace in figure["data"]:
            assert trace["line"]["color"] == colours[trace["legendgroup"]]


def test_compare_groups_runs_by_a_config_field_into_mean_and_band(compare_runs):
    """Grouped by optimizer: the two LARS runs' train loss is one mean over their min-max band
    (where only the longer run goes on, its own curve), SGD's one run its own line."""
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-1", "run-2"]
    at.switch_page("views/compare.py").run()
    group = by_label(at.selectbox, "Group runs by")
    assert "optimizer.name" in group.options
    assert "epochs" not in group.options  # the same for every chosen run: nothing to group
    by_label(at.slider, "EMA smoothing").set_value(0.0)
    by_label(at.multiselect, "Metrics").set_value(["train/loss"])
    group.set_value("optimizer.name").run()
    (chart,) = [f for f in figures(at) if f["layout"]["title"]["text"] == "train/loss"]
    drawn = {}
    for trace in chart["data"]:
        drawn.setdefault(trace["name"], []).append(decode(trace["y"]))
    assert set(drawn) == {"optimizer.name=lars (2 runs)", "optimizer.name=sgd (1 run)"}
    losses = []
    for run_id in ("run-0", "run-2"):
        events = read_events(RunDir(compare_runs / run_id).events_path)
        losses.append(events[events.phase == "train"].set_index("step")["loss"])
    both = pd.concat(losses, axis=1)
    low, high, mean = drawn["optimizer.name=lars (2 runs)"]
    np.testing.assert_allclose(mean, both.mean(axis=1))  # one run alone past run-0's end
    np.testing.assert_allclose(low, both.min(axis=1))
    np.testing.assert_allclose(high, both.max(axis=1))
    sgd = read_events(RunDir(compare_runs / "run-1").events_path).query("phase == 'train'")
    np.testing.assert_allclose(drawn["optimizer.name=sgd (1 run)"][2], sgd["loss"])


def test_compare_plots_any_config_field_against_an_outcome_a_point_per_run(compare_runs):
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-1", "run-2"]
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    by_label(at.toggle, "Config against outcome").set_value(True).run()
    by_label(at.selectbox, "Config field").set_value("optimizer.name")
    by_label(at.selectbox, "Outcome").set_value("samples/s").run()
    (chart,) = [f for f in figures(at) if "against optimizer.name" in f["layout"]["title"]["text"]]
    (points,) = chart["data"]
    drawn = dict(zip(points["text"], zip(points["x"], points["y"], strict=True), strict=True))
    for run_id in ("run-0", "run-1", "run-2"):
        run = RunDir(compare_runs / run_id)
        row = table.summary(run)
        assert drawn[run_id] == (run.config().optimizer.name, pytest.approx(row["samples_per_sec"]))
    by_label(at.selectbox, "Colour by").set_value("optimizer.name").run()
    (chart,) = [f for f in figures(at) if "against optimizer.name" in f["layout"]["title"]["text"]]
    assert {t["name"] for t in chart["data"]} == {"optimizer.name=lars", "optimizer.name=sgd"}


def test_no_page_script_draws_a_stray_string():
    """Streamlit's magic draws a page script's bare strings (a constant's docstring) on the
    page: every page script's only one is its module docstring."""
    for path in [MAIN, *sorted((MAIN.parent / "views").glob("*.py"))]:
        body = ast.parse(path.read_text()).body
        strays = [
            node.lineno
            for node in body[1:]
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ]
        assert not strays, (path.name, strays)


def test_a_config_fields_axis_is_ticked_at_its_values():
    """Defect 12 of the third walk: a momentum axis read "0.181, 0.362 ... 0.906"."""
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "m": [0.9, 0.9, 0.95], "acc": [0.5, 0.6, 0.7]})
    axis = charts.scatter(runs, "m", "acc").layout.xaxis
    assert list(axis.tickvals) == [0.9, 0.95] and list(axis.ticktext) == ["0.9", "0.95"]
    many = pd.DataFrame({"run_id": list("abcdefghijklmn"), "m": range(14), "acc": range(14)})
    assert charts.scatter(many, "m", "acc").layout.xaxis.tickvals is None  # Plotly's own


def test_counts_are_said_in_the_singular_for_one():
    """Defect 12 of the third walk: "1 warmup epochs", "1 cells"."""
    from toolkit.words import counted

    assert [counted(n, "cell") for n in (0, 1, 2, 1000)] == [
        "0 cells",
        "1 cell",
        "2 cells",
        "1,000 cells",
    ]
    assert (
        counted(1, "warmup epoch") == "1 warmup epoch"
        and counted(2, "warmup epoch") == "2 warmup epochs"
    )
    assert counted(1.5, "pass") == "1.5 passes" and counted(3, "batch") == "3 batches"


def test_run_detail_and_compare_start_at_one_smoothing(compare_runs):
    """TensorBoard's 0.6 on both pages: a curve reads the same on either."""
    detail = page("detail")
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-2"]
    at.switch_page("views/compare.py").run()
    smoothings = [by_label(p.slider, "EMA smoothing").value for p in (detail, at)]
    assert smoothings == [charts.SMOOTHING, charts.SMOOTHING] and charts.SMOOTHING == 0.6


def test_detail_draws_against_samples_seen_smoothed(root):
    run = fake_run(root, "axes", events=300, epochs=3)
    at = page("detail")
    by_label(at.radio, "x-axis").set_value("samples seen")
    by_label(at.slider, "EMA smoothing").set_value(0.9).run()
    loss = figures(at)[0]
    assert loss["layout"]["xaxis"]["title"]["text"] == "samples seen (all workers)"
    events = read_events(run.events_path)
    train = events[events["phase"] == "train"]
    (raw,) = [t for t in loss["data"] if t.get("opacity") == 0.25 and t["name"] == "train"]
    batch = Scale.of(run.config()).global_batch
    np.testing.assert_array_equal(decode(raw["x"]), train["step"].to_numpy() * batch)
    (solid,) = [t for t in loss["data"] if t["name"] == "train" and "opacity" not in t]
    np.testing.assert_allclose(decode(solid["y"]), charts.ema(train["loss"].to_numpy(), 0.9))


def test_what_the_run_set_is_drawn_as_set_and_what_it_measured_smoothed(root):
    """The learning rate is the schedule's own, never smoothed (a smoothed one lags its warm-up),
    on Run detail and Compare alike; the loss beside it is."""
    run = fake_run(root, "exact", events=300, epochs=3)
    train = read_events(run.events_path).query("phase == 'train'")
    detail = page("detail")
    compare = page()
    compare.session_state["compare_runs"] = ["exact"]
    compare.switch_page("views/compare.py").run()
    by_label(compare.multiselect, "Metrics").set_value(["train/lr", "train/loss"]).run()
    for at in (detail, compare):
        drawn = {f["layout"]["title"]["text"]: f["data"] for f in figures(at)}
        lr = drawn.get("learning rate", drawn.get("train/lr"))
        (line,) = lr
        np.testing.assert_array_equal(decode(line["y"]), train["lr"])
        loss = drawn.get("loss", drawn.get("train/loss"))
        solid = [t for t in loss if "opacity" not in t and t["name"] in ("train", "exact")]
        np.testing.assert_allclose(decode(solid[0]["y"]), charts.ema(train["loss"], 0.6))


def test_detail_draws_each_workers_system_metrics(root):
    run = fake_run(root, "system", events=300, system_every=50)
    at = page("detail")
    drawn = {f["layout"]["title"]["text"]: f for f in figures(at)}
    cpu = drawn["CPU per worker (%, 100 = one core)"]
    assert [t["name"] for t in cpu["data"]] == ["rank 0", "rank 1"]
    events = read_events(run.events_path)
    system = events[events["phase"] == "system"]
    np.testing.assert_allclose(decode(cpu["data"][1]["y"]), system["cpu_percent/rank1"])
    np.testing.assert_array_equal(decode(cpu["data"][1]["x"]), system["step"])
    assert "memory per worker (GB)" in drawn


def test_detail_marks_an_elastic_runs_resets_and_draws_its_workers(root):
    run = fake_run(root, "elastic", events=300, epochs=3, resets=[(60, 1), (150, 3)])
    at = page("detail")
    drawn = {f["layout"]["title"]["text"]: f for f in figures(at)}
    workers = drawn["workers (elastic)"]
    events = read_events(run.events_path)
    train = events[events["phase"] == "train"]
    np.testing.assert_array_equal(decode(workers["data"][0]["y"]), train["world_size"])
    for title in ("loss", "accuracy", "learning rate", "workers (elastic)"):
        marks = [shape["x0"] for shape in drawn[title]["layout"]["shapes"]]
        assert marks == [60, 150], title
    said = [c.value.replace("\\", "") for c in at.caption if "workers on" in c.value]
    assert said == [
        "step 60: a worker was lost, 2 → 1 workers on h1; 3 steps trained again",
        "step 150: hosts were added, 1 → 3 workers on h1,h2,h3; 0 steps trained again",
    ]


def test_a_run_that_sends_dense_gradients_gets_a_line_not_flat_charts(root):
    """Defect 8 of the third walk: a dense run's workers' samples drew a bytes chart too."""
    fake_run(root, "dense", events=300, bytes_per_update=40_000.0, system_every=50)
    at = page("detail")
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    assert "CPU" in " ".join(titles)  # the workers' samples are drawn, their bytes are not
    assert not [t for t in titles if t.startswith("bytes")], titles
    assert any("each worker sends 40,000 bytes per update (dense)" in t.value for t in at.text)


def test_every_chart_on_every_page_has_the_notebooks_template(compare_runs):
    fake_run(compare_runs, "lars-gns", events=300, gns_every=20)
    charts_seen = 0
    for name in ("detail", "compare", "launch"):
        at = page(name)
        for chart in at.get("plotly_chart"):
            spec = json.loads(chart.proto.spec)
            assert chart.proto.theme == "", name  # Streamlit's own theme would restyle it
            assert spec["layout"]["template"]["layout"]["colorway"] == list(theme.COLORS), name
            charts_seen += 1
    assert charts_seen >= 8


def test_axes_never_show_fractional_steps_flat_ticks_or_digit_only_log_labels():
    short = charts.lines([charts.Series("loss", np.arange(4), [3.0, 2.0, 1.5, 1.2])])
    assert short.layout.xaxis.dtick == 1  # steps 0..3: no 0.5 ticks
    long = charts.lines([charts.Series("loss", np.arange(500), np.linspace(3, 1, 500))])
    assert long.layout.xaxis.dtick is None
    flat = charts.lines([charts.Series("bytes", np.arange(50), np.full(50, 20_840.0))])
    assert flat.layout.yaxis.rangemode == "tozero"
    decades = charts.lines([charts.Series("b", np.arange(3), [3.0, 40.0, 5000.0])], log_y=True)
    assert list(decades.layout.yaxis.tickvals) == [10.0, 100.0, 1000.0]
    assert list(decades.layout.yaxis.ticktext) == ["10", "100", "1,000"]
    narrow = charts.lines([charts.Series("b", np.arange(3), [400.0, 900.0, 3000.0])], log_y=True)
    ticks = list(narrow.layout.yaxis.tickvals)
    assert ticks[0] == 400.0 and ticks[-1] == 3000.0 and len(ticks) == 5
    assert all(t == float(f"{t:.2g}") for t in ticks)  # round values, labelled in full
    assert list(narrow.layout.yaxis.ticktext) == [f"{t:,.6g}" for t in ticks]


def test_detail_gives_the_lines_that_open_the_run_in_a_notebook(root, subprocess_env):
    run = fake_run(root, "lars-run", events=120, epochs=2)
    at = page("detail")
    (lines,) = [c.proto.code_text for c in at.get("code") if "monitor" in c.proto.code_text]
    assert f"rundir.resolve('lars-run', '{root.resolve()}')" in lines
    assert "read_events(" in lines and "monitor.live(run)" in lines
    # what a notebook would run; outside one, monitor.live is the terminal's progress bar
    written = len(read_events(run.events_path))
    check = f"\nassert len(events) == {written} and run.status()['state'] == 'completed'"
    result = subprocess.run(
        [sys.executable, "-c", lines + check],
        cwd=tempfile.gettempdir(),
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_detail_live_run_reads_only_new_events(root):
    run = fake_run(root, "live", events=100, state="running", pid=os.getpid(), epochs=10)
    at = page("detail")
    tail, frame = at.session_state["event_tails"][str(run.path)]
    assert tail._offset == run.events_path.stat().st_size
    first = len(frame)
    with EventWriter(run.events_path) as writer:
        for step in range(1000, 1005):
            writer.write({"step": step, "epoch": 5.0, "phase": "train", "loss": 0.1, "lr": 0.01})
    with open(run.events_path, "ab") as f:
        f.write(b'{"step": 1005, "pha')  # a line being written
    at.run()
    tail, frame = at.session_state["event_tails"][str(run.path)]
    assert len(frame) == first + 5 and frame["step"].iloc[-1] == 1004
    assert at.get("progress")[0].proto.value == 50  # epoch 5 of 10
    assert tail._offset == run.events_path.stat().st_size - len(b'{"step": 1005, "pha')


def test_detail_live_run_that_ends_is_redrawn_without_timer(root):
    run = fake_run(root, "ends", events=100, state="running", pid=os.getpid())
    at = page("detail")
    assert "state: running" in at.text[0].value
    run.set_status("completed", exit_code=0)
    at.run()
    assert "state: completed" in at.text[0].value and not at.exception


# --- Compare ------------------------------------------------------------------------------


@pytest.fixture
def compare_runs(root):
    for i in range(3):
        fake_run(
            root,
            f"run-{i}",
            events=500 + 100 * i,
            seed=i,
            optimizer=("lars", "sgd")[i % 2],
        )
        time.sleep(0.01)
    return root


def test_compare_overlays_runs_with_smoothing_and_axes(compare_runs):
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-1", "run-2"]
    at.switch_page("views/compare.py").run()
    assert not at.exception
    metrics = by_label(at.multiselect, "Metrics")
    assert metrics.value == ["train/loss", "eval/loss", "eval/accuracy"]
    assert {"train/lr", "train/samples_per_sec", "eval/accuracy"} <= set(metrics.options)
    specs = figures(at)
    assert len(specs) == 3
    traces = specs[0]["data"]
    assert len(traces) == 6  # raw (faint) + smoothed per run
    raw, smooth = traces[0], traces[1]
    assert raw["opacity"] < 0.5 and raw["showlegend"] is False and smooth["name"] == "run-0"
    frame = read_events(compare_runs / "run-0" / "events.jsonl")
    train = frame[frame["phase"] == "train"]
    np.testing.assert_allclose(decode(raw["y"]), train["loss"])
    expected = charts.ema(train["loss"].to_numpy(), 0.6)
    np.testing.assert_allclose(decode(smooth["y"]), expected)
    assert abs(decode(smooth["y"])[-1] - train["loss"].iloc[-1]) < 0.1

    by_label(at.slider, "EMA smoothing").set_value(0.0)
    by_label(at.checkbox, "log y").check()
    by_label(at.radio, "x-axis").set_value("relative time")
    metrics.set_value(["train/lr"])
    at.run()
    (spec,) = figures(at)
    assert len(spec["data"]) == 3 and spec["layout"]["yaxis"]["type"] == "log"
    x = decode(spec["data"][0]["x"])
    assert x[0] == pytest.approx(0.0) and spec["layout"]["xaxis"]["title"]["text"].startswith(
        "time since"
    )
    by_label(at.radio, "x-axis").set_value("epoch").run()
    assert decode(figures(at)[0]["data"][0]["x"])[-1] == pytest.approx(train["epoch"].iloc[-1])


def test_compare_opens_on_the_newest_runs_without_probes_and_a_removed_run_stays_out(root):
    for name in ("demo", "second", "third"):
        fake_run(root, name, events=100)
        time.sleep(0.01)
    fake_run(root, "probe-x", events=50).update_meta(probe=True)
    at = page("compare")
    runs = by_label(at.multiselect, "Runs")
    assert runs.value == ["third", "second", "demo"]  # the demo run in, the probe out
    runs.unselect("second").run()
    at.run()  # and again: the removal holds
    assert by_label(at.multiselect, "Runs").value == ["third", "demo"]
    assert at.query_params["run"] == ["third", "demo"]
    assert {t["name"] for f in figures(at) for t in f["data"]} == {"third", "demo"}


def test_compare_opens_the_runs_its_address_names_and_names_its_own(compare_runs):
    at = dashboard()
    at.switch_page("views/compare.py")
    at.query_params["run"] = ["run-2", "run-0", "no-such-run"]
    at.run()
    assert not at.exception
    assert at.multiselect[0].value == ["run-2", "run-0"]  # unknown ids are left out
    assert at.query_params["run"] == ["run-2", "run-0"]
    at.multiselect[0].set_value(["run-1"]).run()
    assert at.query_params["run"] in ("run-1", ["run-1"])  # AppTest stores one value bare
    assert [t["name"] for t in figures(at)[0]["data"]] == ["run-1", "run-1"]


def test_compare_charts_follow_a_growing_run_and_stay_cached_while_it_does_not(root):
    run = fake_run(root, "growing", events=300)
    at = page()
    at.session_state["compare_runs"] = ["growing"]
    at.switch_page("views/compare.py").run()
    first = figures(at)[0]
    assert figures(at.run())[0] == first
    last = decode(first["data"][1]["x"])[-1]
    with EventWriter(run.events_path) as writer:
        writer.write({"step": last + 5, "phase": "train", "loss": float("nan")})
        writer.write({"step": last + 6, "phase": "train", "loss": 0.25})
    x = decode(figures(at.run())[0]["data"][0]["x"])  # the raw curve
    y = decode(figures(at)[0]["data"][0]["y"])
    assert list(x[-2:]) == [last + 5, last + 6] and np.isnan(y[-2]) and y[-1] == 0.25


def test_a_chart_of_many_long_runs_holds_its_point_budget_and_every_end():
    rng = np.random.default_rng(1)
    steps = np.arange(50_000)
    series = [charts.Series(f"r{i}", steps, rng.normal(size=50_000)) for i in range(100)]
    figure = charts.lines(series, smoothing=0.6)
    assert len(figure.data) == 200
    sizes = [len(trace.x) for trace in figure.data]
    assert sum(sizes) <= charts.CHART_POINTS and min(sizes) >= charts.FEWEST_POINTS - 2
    assert all(trace.x[0] == 0 and trace.x[-1] == 49_999 for trace in figure.data)
    few = charts.lines(series[:2], smoothing=0.0)
    assert [len(trace.x) for trace in few.data] == [len(downsample(series[0].y))] * 2


def test_compare_against_the_bytes_each_run_sent(root):
    fake_run(root, "dense", events=400, bytes_per_update=40_000.0)
    fake_run(root, "topk", events=400, bytes_per_update=600.0, seed=1)
    fake_run(root, "alone", events=400, seed=2)  # one worker: no traffic logged
    at = page()
    at.session_state["compare_runs"] = ["dense", "topk", "alone"]
    at.switch_page("views/compare.py").run()
    by_label(at.slider, "EMA smoothing").set_value(0.0)
    by_label(at.multiselect, "Metrics").set_value(["eval/accuracy"])
    by_label(at.radio, "x-axis").set_value("bytes sent").run()
    assert not at.exception
    (spec,) = figures(at)
    assert [t["name"] for t in spec["data"]] == ["dense", "topk"]
    assert spec["layout"]["xaxis"]["title"]["text"] == "bytes a worker sent (cumulative)"
    for trace, per_update in zip(spec["data"], (40_000.0, 600.0)):
        frame = read_events(root / trace["name"] / "events.jsonl")
        steps = frame[frame["phase"] == "eval"]["step"].to_numpy()
        # a train event every step from step 0, one update each: step s has sent s updates
        np.testing.assert_allclose(decode(trace["x"]), per_update * steps)


def test_compare_values_at_step_and_min_max_last(compare_runs):
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-2"]
    at.switch_page("views/compare.py").run()
    by_label(at.number_input, "Values at step").set_value(150).run()
    table = at.dataframe[0].value
    row = table[(table["run"] == "run-2") & (table["metric"] == "train/loss")].iloc[0]
    frame = read_events(compare_runs / "run-2" / "events.jsonl")
    train = frame[frame["phase"] == "train"]
    assert row["at step 150"] == pytest.approx(train.loc[train["step"] == 150, "loss"].iloc[0])
    assert row["min"] == pytest.approx(train["loss"].min()) and row["max"] == pytest.approx(
        train["loss"].max()
    )
    assert (
        row["last"] == pytest.approx(train["loss"].iloc[-1])
        and row["last step"] == train["step"].iloc[-1]
    )
    evals = table[(table["run"] == "run-0") & (table["metric"] == "eval/accuracy")].iloc[0]
    ev = frame = read_events(compare_runs / "run-0" / "events.jsonl")
    ev = ev[(ev["phase"] == "eval") & (ev["step"] <= 150)]
    assert evals["at step 150"] == pytest.approx(ev["accuracy"].iloc[-1])
    assert set(table["run"]) == {"run-0", "run-2"}

    ended = read_events(compare_runs / "run-0" / "events.jsonl")["step"].max()
    beyond = int(train["step"].max())  # run-2 trained on past where run-0 ended
    assert beyond > ended
    by_label(at.number_input, "Values at step").set_value(beyond).run()
    table = at.dataframe[0].value.set_index(["run", "metric"])[f"at step {beyond}"]
    assert table[("run-2", "train/loss")] == pytest.approx(train["loss"].iloc[-1])
    assert pd.isna(table[("run-0", "train/loss")]) and pd.isna(table[("run-0", "eval/accuracy")])


def test_compare_csv_export_holds_the_selected_runs_events(compare_runs, monkeypatch):
    import streamlit.testing.v1.app_test as app_test_module

    managers = []

    class Recording(app_test_module.MediaFileManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            managers.append(self)

    monkeypatch.setattr(app_test_module, "MediaFileManager", Recording)
    at = page()
    at.session_state["compare_runs"] = ["run-0", "run-2"]
    at.switch_page("views/compare.py").run()
    (button,) = at.get("download_button")
    assert button.proto.label.endswith("(CSV)")
    url = managers[-1].execute_deferred(button.proto.deferred_file_id)  # the click
    assert url.endswith(".csv")
    csv = managers[-1].read_file(url.rsplit("/", 1)[-1].split(".")[0]).content
    exported = pd.read_csv(io.BytesIO(csv))
    assert list(exported.columns[:2]) == ["run_id", "wall"]
    expected = [read_events(compare_runs / r / "events.jsonl") for r in ("run-0", "run-2")]
    assert len(exported) == sum(map(len, expected))
    assert exported["run_id"].value_counts().to_dict() == {
        "run-0": len(expected[0]),
        "run-2": len(expected[1]),
    }
    mine = exported[exported["run_id"] == "run-2"].reset_index(drop=True)
    np.testing.assert_allclose(mine["loss"], expected[1]["loss"])
    assert data.events_csv([RunDir(compare_runs / "run-0")]).startswith(b"run_id,")


def test_event_files_are_parsed_once_until_they_change(root, monkeypatch):
    run = fake_run(root, "cached", events=300)
    parsed = []
    monkeypatch.setattr(data, "read_events", lambda path: parsed.append(path) or read_events(path))
    at = page()
    at.session_state["compare_runs"] = ["cached"]
    at.switch_page("views/compare.py").run()
    at.run()
    at.switch_page("views/compare.py").run()
    assert parsed == [str(run.events_path)]  # three renders, one parse
    last = at.dataframe[0].value["last step"].max()
    with EventWriter(run.events_path) as writer:
        writer.write({"step": last + 7, "phase": "train", "loss": 0.5})
    at.run()
    assert len(parsed) == 2 and at.dataframe[0].value["last step"].max() == last + 7


def test_streamlit_config_is_local_with_xsrf_and_no_telemetry():
    import tomllib

    settings = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert settings["server"]["address"] == "127.0.0.1"
    assert settings["server"]["enableXsrfProtection"] is True
    assert settings["browser"]["gatherUsageStats"] is False


def test_reading_pages_do_not_import_tensorflow(root, subprocess_env):
    """Runs, Run detail and Compare in a fresh interpreter: no TensorFlow or Keras (a new
    server's first page must not pay their import); the Launch page, as a control, does."""
    fake_run(root, "reads", events=50)
    script = (
        "import sys\n"
        "from streamlit.testing.v1 import AppTest\n"
        "from app import access\n"
        "at = AppTest.from_file('app/main.py', default_timeout=60)\n"
        "at.query_params['token'] = access.token()\n"
        "at.run()\n"
        "for page in ('runs', 'detail', 'compare'):\n"
        "    at.switch_page(f'views/{page}.py').run()\n"
        "    assert not at.exception and not at.error, (page, at.exception, at.error)\n"
        "print('reading:', sorted({'tensorflow', 'keras'} & set(sys.modules)))\n"
        "at.switch_page('views/launch.py').run()\n"
        "print('launch:', sorted({'tensorflow', 'keras'} & set(sys.modules)))\n"
    )
    env = {**subprocess_env, "LBL_RUNS": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reading: []" in result.stdout, result.stdout
    assert "launch: ['keras', 'tensorflow']" in result.stdout, result.stdout


def bare_strings(tree) -> list[int]:
    """Lines of string statements that are not a module's, class's or function's docstring:
    in a page, Streamlit's magic renders each one as page text."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, (ast.Constant, ast.JoinedStr))
        and isinstance(getattr(node.value, "value", ""), str)
        and id(node) not in docstrings
    ]


@pytest.mark.parametrize(
    "script", ["main.py", *(f"views/{p.name}" for p in (MAIN.parent / "views").glob("*.py"))]
)
def test_no_page_shows_a_bare_string_as_text(script):
    assert bare_strings(ast.parse((MAIN.parent / script).read_text())) == [], script


def test_the_bare_string_check_sees_one():
    assert bare_strings(ast.parse('"""doc"""\nx = 1\n"""shown by magic"""\n')) == [3]
