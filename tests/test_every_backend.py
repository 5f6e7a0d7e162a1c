"""The optimizers, schedules and AdaScale on every Keras backend. Keras chooses its backend when
it is first imported, so each backend runs in a subprocess with ``KERAS_BACKEND`` set: the
oracle tests again (torch for SGD, numpy for the published formulas), importing the toolkit's
optimizers without TensorFlow, and models saved with their optimizer state on TensorFlow
training on where they stopped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import ROOT
from test_optimizers_keras import CONFIGS, build, compile_model, toy_data, toy_model

BACKENDS = ["jax", "torch"]
ORACLE_TESTS = [
    "tests/test_sgd_vs_torch.py",
    "tests/test_lars.py",
    "tests/test_lbsgd.py",
    "tests/test_schedules.py",
    "tests/test_adascale_gain.py",
    "tests/test_adascale.py::test_one_worker_logs_what_the_numpy_model_of_adascale_computes",
    "tests/test_adaptive_batch.py::test_one_worker_grows_the_batch_the_same_way",
    "tests/test_optimizers_keras.py::test_config_round_trip",
    "tests/test_optimizers_keras.py::test_checkpoint_restore_continues_bit_for_bit",
    "tests/test_compression.py::test_two_bit_codes_pack_in_mxnets_layout_and_round_trip",
]


def run_on(backend: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    """``python ARGS`` with Keras on ``backend``, from the repository root, finished."""
    return subprocess.run(
        [sys.executable, *args],
        env={**env, "KERAS_BACKEND": backend},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


ONLY_ON = {"torch": ["tests/on_torch"]}
"""Tests of what exists on one backend alone (PyTorch's multi-tensor update)."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_oracle_tests_pass_on(backend, subprocess_env):
    tests = [*ORACLE_TESTS, *ONLY_ON.get(backend, [])]
    # -n 0: in this test's process alone; xdist's workers would import every backend again
    # (16 s more CPU each here, on a machine the suite's own workers already fill)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests]
    result = run_on(backend, args, subprocess_env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


CONTINUE = """
import sys
from pathlib import Path

import keras
import numpy as np

import toolkit.optimizers, toolkit.scaling.adascale

assert keras.backend.backend() == "{backend}", keras.backend.backend()
assert "tensorflow" not in sys.modules, "importing the optimizers imported TensorFlow"
folder = Path("{folder}")
data = np.load(folder / "data.npz")
for name in {names}:
    model = keras.models.load_model(folder / f"{{name}}.keras")
    for xb, yb in zip(data["x"], data["y"], strict=True):
        model.train_on_batch(xb, yb)
    np.savez(folder / f"{{name}}-{backend}.npz", *model.get_weights(),
             iterations=int(model.optimizer.iterations))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_saved_with_its_optimizer_on_tensorflow_trains_on(
    backend, tmp_path, subprocess_env
):
    """Each optimizer of test_optimizers_keras (schedules for the rate, momentum and decay;
    LBSGD saved halfway through an accumulation) saved after 3 batches on TensorFlow, then 5
    more batches on TensorFlow and on ``backend``: the same weights to float32's round-off
    (the backends' kernels add in other orders), the same number of updates."""
    assert keras.backend.backend() == "tensorflow"
    x, y = toy_data(1)
    batches = x.reshape(8, 32, 10), y.reshape(8, 32)
    np.savez(tmp_path / "data.npz", x=batches[0][3:], y=batches[1][3:])
    expected = {}
    for name in CONFIGS:
        model = compile_model(toy_model(1), build(name))
        for i in range(8):
            if i == 3:
                model.save(tmp_path / f"{name}.keras")
            model.train_on_batch(batches[0][i], batches[1][i])
        expected[name] = model.get_weights(), int(model.optimizer.iterations)
    program = CONTINUE.format(backend=backend, folder=tmp_path, names=sorted(CONFIGS))
    result = run_on(backend, ["-c", textwrap.dedent(program)], subprocess_env)
    assert result.returncode == 0, result.stderr[-4000:]
    for name, (weights, iterations) in expected.items():
        with np.load(tmp_path / f"{name}-{backend}.npz") as got:
            assert int(got["iterations"]) == iterations, name
            for i, weight in enumerate(weights):
                np.testing.assert_allclose(
                    got[f"arr_{i}"], weight, rtol=1e-5, atol=1e-6, err_msg=name
                )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_worker_run_writes_the_run_the_dashboard_reads(
    backend, tmp_path, subprocess_env, monkeypatch
):
    """The quickstart (LARS, cosine with warmup, the one-worker noise scale) for 2 epochs through
    ``python -m toolkit.train`` on ``backend``: the same run directory, events and checkpoints
    as on TensorFlow, with finite trust ratios and a falling loss, read by the runs table and
    the Run detail page like any run."""
    from test_app import figures, page

    from toolkit.runs import table
    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import RunDir

    run_dir = tmp_path / "runs" / f"on-{backend}"
    args = ["-m", "toolkit.train", "experiments/quickstart.yaml", "--run-dir", str(run_dir)]
    overrides = ["--set", "workers=1", "--set", "epochs=2"]
    result = run_on(backend, [*args, *overrides], subprocess_env)
    assert result.returncode == 0, result.stderr[-4000:]
    run = RunDir(run_dir)
    assert run.status()["state"] == "completed"
    assert run.meta()["versions"]["keras_backend"] == backend
    assert [p.name for p in run.checkpoints_path.glob("epoch-*")] == ["epoch-0002"]
    events = read_events(run.events_path)
    assert {"train", "eval", "trust_ratio", "gns"} <= set(events.phase)
    ratios = events[events.phase == "trust_ratio"].filter(like="trust_ratio/")
    assert not ratios.empty and np.isfinite(ratios.to_numpy()).all()
    evals = events[events.phase == "eval"]
    assert evals.loss.iloc[-1] < evals.loss.iloc[0] and evals.accuracy.iloc[-1] > 0.3
    assert table.summary(run, events)["state"] == "completed"
    monkeypatch.setenv("LBL_RUNS", str(run_dir.parent))
    at = page("detail")
    assert not at.exception
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    assert any("trust ratio" in title.lower() for title in titles), titles


@pytest.mark.parametrize(
    "change, field, runs_on",
    [
        ("allreduce.compression=topk", "allreduce.compression", ["tensorflow", "torch", "jax"]),
        ("allreduce.compression=2bit", "allreduce.compression", ["tensorflow", "torch", "jax"]),
        ("allreduce.compression=threshold", "allreduce.compression", ["tensorflow", "torch"]),
        (
            "allreduce={compression: topk, topk_sample: 0.01}",
            "allreduce.topk_sample 0",
            ["tensorflow", "torch"],
        ),
        (
            "allreduce={compression: topk, dgc: true}",  # DGC's warm-up of the ratio
            "allreduce.sparsity_warmup_epochs 0",
            ["tensorflow", "torch"],
        ),
        ("sync.mode=local_sgd", "sync.mode", ["tensorflow", "torch", "jax"]),
        ("sync.mode=partial", "sync.mode", ["tensorflow", "torch", "jax"]),
        (
            "lr_scaling={rule: adascale, base_batch: 32}",
            "lr_scaling.rule",
            ["tensorflow", "torch", "jax"],
        ),
    ],
)
def test_what_a_backend_lacks_is_refused_naming_the_field_the_backend_and_why(
    change, field, runs_on
):
    from toolkit import backends
    from toolkit.config import ConfigError, load
    from toolkit.config_rules import check_backend

    config = load(ROOT / "experiments/quickstart.yaml", ["workers=1", change])
    for backend in runs_on:
        check_backend(config, backend)
    for backend in set(backends.BACKENDS) - set(runs_on):
        with pytest.raises(ConfigError, match=f"KERAS_BACKEND={backend}") as error:
            check_backend(config, backend)
        assert field in str(error.value)
        assert backends.of(backend).lacks in str(error.value)  # and why, in its own words


def test_several_workers_run_on_every_backend_in_float32_and_fp16():
    from toolkit.config import load
    from toolkit.config_rules import check_backend

    for compression in ("none", "fp16"):  # tests/test_backend_workers.py, test_keras_workers.py
        config = load(
            ROOT / "experiments/quickstart.yaml",
            [
                "workers=2",
                f"allreduce.compression={compression}",
                "logging.noise_scale_every_steps=10",
            ],
        )
        for backend in BACKENDS:
            check_backend(config, backend)


def test_a_launch_on_jax_with_what_it_lacks_is_refused_before_anything_starts(
    tmp_path, subprocess_env
):
    from conftest import run_cli

    threshold = ["--set", "allreduce.compression=threshold"]
    result = run_cli(
        ["launch", "experiments/quickstart.yaml", "--np", "2", *threshold],
        tmp_path / "runs",
        env={**subprocess_env, "KERAS_BACKEND": "jax"},
    )
    assert result.returncode != 0
    assert "KERAS_BACKEND=jax" in result.stderr
    assert "allreduce.compression 'none' or 'fp16' or 'topk' or '2bit'" in result.stderr
    assert not any((tmp_path / "runs").glob("*/config.yaml"))


def test_the_keras_gpu_check_runs_on_the_cpu(tmp_path, subprocess_env):
    """scripts/gpu_check_keras.sh --smoke, as CI can run it (JAX and PyTorch on the CPU): every
    step passes, and each benchmark leaves its rows, one per repeat and candidate, with the
    backend and device they ran on, and its table in the summary."""
    import pandas as pd

    env = {**subprocess_env, "PYTHON": sys.executable, "LBL_WHEELS": str(tmp_path / "none")}
    result = subprocess.run(
        ["bash", "scripts/gpu_check_keras.sh", "--smoke", str(tmp_path / "out")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert result.returncode == 0, summary + result.stderr[-2000:]
    assert summary.count(": ok in ") == 5 and "FAILED" not in summary
    for name, backend, rows in [
        ("bench_optimizers_jax", "jax", 2 * 7),
        ("bench_optimizers_torch", "torch", 2 * (7 + 3)),  # and 3 per-variable updates
        ("bench_resnet50_jax", "jax", 2),
        ("bench_resnet50_torch", "torch", 2),
    ]:
        frame = pd.read_csv(tmp_path / "out" / f"{name}.csv")
        assert len(frame) == rows and set(frame.backend) == {backend}, name
        assert (frame.filter(["seconds", "images_per_second"]).to_numpy() > 0).all(), name
        assert frame.device.notna().all()
    assert summary.count("| keras SGD momentum=0.9") == 4


def test_a_launch_on_a_backend_keras_has_not_is_refused_naming_the_ones_it_has(tmp_path):
    from toolkit.config import ConfigError
    from toolkit.launching import launch as launcher

    with pytest.raises(ConfigError, match="one of tensorflow, jax, torch, got 'mxnet'"):
        launcher.launch(
            ROOT / "experiments/quickstart.yaml", runs_root_dir=tmp_path, backend="mxnet"
        )
    assert not list(tmp_path.iterdir())
