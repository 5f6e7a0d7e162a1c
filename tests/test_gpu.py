"""The GPU path: what only a machine with an NVIDIA GPU and the GPU build can check.

Every test here skips without a GPU visible to TensorFlow, saying so; ``scripts/gpu_check.sh``
runs them with the GPU benchmarks in one command. What they check:

* Horovod was built with NCCL, and a one-rank ``horovodrun`` pins a GPU and allreduces a GPU
  tensor through NCCL (Horovod's timeline names the operation). One GPU cannot check NCCL
  across ranks: NCCL refuses two ranks on one device.
* The optimizers on GPU variables take TensorFlow's own momentum kernels (the fused CPU
  library is for CPU variables), and agree with the same update on CPU variables, which the
  CPU tests check against torch and numpy; compiled with XLA they agree too.
* The compressed allreduce on GPU variables matches the numpy simulation of its workers.
* A short ``toolkit.train`` run in mixed precision trains on the GPU and logs its memory.
"""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, run_workers

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from scenarios import WIRE, WIRE_SHAPES, WIRE_STEPS, wire_grads
from test_distributed import simulate_workers

from toolkit import optimizers
from toolkit.optimizers import kernels
from toolkit.parallel import distributed
from toolkit.runs import events

GPUS = tf.config.list_physical_devices("GPU")
pytestmark = pytest.mark.skipif(
    not GPUS,
    reason="no GPU visible to TensorFlow: these run on a GPU machine after the GPU build "
    "(scripts/gpu_check.sh does both)",
)


def test_horovod_was_built_with_cuda_and_nccl():
    import horovod.tensorflow as hvd

    assert hvd.cuda_built() and hvd.nccl_built()


def test_one_rank_horovodrun_pins_a_gpu_and_allreduces_through_nccl(tmp_path, subprocess_env):
    timeline = tmp_path / "timeline.json"
    env = {**subprocess_env, "HOROVOD_TIMELINE": str(timeline)}
    run_workers("one_rank_nccl.py", tmp_path, env, workers=1, timeout=300)
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["visible_gpus"] == 1
    assert "GPU" in result["device"] and result["equal"]
    assert "NCCL_ALLREDUCE" in timeline.read_text()


OPTIMIZERS = {
    "sgd": lambda: optimizers.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "lars": lambda: optimizers.LARS(1.0, momentum=0.9, weight_decay=5e-4),
    "lbsgd-lars": lambda: optimizers.LBSGD(
        0.1,
        momentum=0.9,
        weight_decay=5e-4,
        warmup_strategy="lars",
        warmup_epochs=1,
        updates_per_epoch=2,
        batch_scale=4,
    ),
}
SHAPES = ((3, 3, 16, 32), (32,), (512, 10))


def three_updates(make, device: str, jit: bool = False) -> list[np.ndarray]:
    """Three updates of ``make()`` on variables placed on ``device``, from fixed values."""
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(s).astype("float32") for s in SHAPES]
    grads = [[rng.standard_normal(s).astype("float32") for s in SHAPES] for _ in range(3)]
    with tf.device(device):
        variables = [keras.Variable(w) for w in start]
        optimizer = make()
        optimizer.build(variables)
        step = tf.function(lambda g: optimizer.apply(g, variables), jit_compile=jit)
        for g in grads:
            step([tf.constant(x) for x in g])
    return [v.numpy() for v in variables]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_on_gpu_variables_use_tensorflows_kernels_and_agree_with_cpu(name):
    with tf.device("/GPU:0"):
        variable = keras.Variable(np.zeros(3, "float32"))
    assert "GPU" in variable.value.device
    assert kernels.fused_kernels_for(variable) is None
    got = three_updates(OPTIMIZERS[name], "/GPU:0")
    want = three_updates(OPTIMIZERS[name], "/CPU:0")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lars", "lbsgd-lars"])
def test_the_optimizer_step_compiled_by_xla_agrees_with_the_plain_one(name):
    got = three_updates(OPTIMIZERS[name], "/GPU:0", jit=True)
    want = three_updates(OPTIMIZERS[name], "/GPU:0")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(
    "scenario", ["topk", "topk_sampled", "threshold", "topk_fp16_values", "2bit", "dense_1d"]
)
def test_compressed_allreduce_on_gpu_variables_matches_the_simulation(scenario):
    optimizer = distributed.DistributedOptimizer(keras.optimizers.SGD(1.0), **WIRE[scenario])
    with tf.device("/GPU:0"):
        variables = [keras.Variable(np.zeros(shape, "float32")) for shape in WIRE_SHAPES]
        optimizer.build(variables)
        apply = tf.function(lambda grads: optimizer.apply(grads, variables))
        expected = simulate_workers(WIRE[scenario], workers=1)
        for step in range(WIRE_STEPS):
            for v in variables:
                v.assign(np.zeros(v.shape, "float32"))
            apply(wire_grads(0, step))
            for v, want in zip(variables, expected[step]):
                np.testing.assert_allclose(-v.numpy(), want, rtol=1e-5, atol=1e-7)


def test_training_in_mixed_precision_runs_on_the_gpu_and_logs_its_memory(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "workers=1",
        "epochs=1",
        "precision=mixed_float16",
        "logging.system_every_events=1",
    ]
    command = [sys.executable, "-m", "toolkit.train", "experiments/quickstart.yaml", "--run-dir"]
    command += [str(run_dir), *(arg for o in overrides for arg in ("--set", o))]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = events.read_events(run_dir / "events.jsonl")
    train = logged[logged["phase"] == "train"]
    assert np.isfinite(train["loss"]).all() and len(train) > 0
    system = logged[logged["phase"] == "system"]
    assert (system["gpu_memory_gb/rank0"] > 0).all()
