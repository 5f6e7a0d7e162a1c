"""The backend as one object (``toolkit/backends/``): only that package asks which Keras backend
runs; every refusal is read off a backend's attributes, by the config's check and the distributed
optimizer alike; and a new backend is one class and one line of the registry: a toy, written out
here, that delegates to TensorFlow's but carries float32 gradients only, is refused what it lacks
in its own words and trains a run in this process through its own methods. Cost: about 10 s
(one short quickstart in this process)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from conftest import ROOT

from toolkit import backends, cache
from toolkit.backends.tensorflow_backend import TensorFlowBackend
from toolkit.config import ConfigError, load

OUTSIDE = [
    path
    for path in sorted([*(ROOT / "toolkit").rglob("*.py"), *(ROOT / "app").rglob("*.py")])
    if (ROOT / "toolkit" / "backends") not in path.parents
]


def asks_the_backend_by_name(path) -> list[str]:
    """Where ``path`` asks Keras which backend runs (``keras.backend.backend()``, or any
    ``.backend()`` call of a ``backend`` module) or compares something with a backend's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("backend.backend"):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare):
            names = [
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant) and c.value in backends.REGISTRY
            ]
            if names:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_backends_package_asks_which_backend_runs():
    assert len(OUTSIDE) > 100
    assert [place for path in OUTSIDE for place in asks_the_backend_by_name(path)] == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    """The test above can fail: each form it refuses, written out, is found."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import keras\n"
        "a = keras.backend.backend() == 'torch'\n"
        "b = name in ('jax', 'other')\n"
        "c = backend.name != 'tensorflow'\n"
    )
    lines = sorted(place.split(":")[1] for place in asks_the_backend_by_name(sample))
    assert lines == ["2", "2", "3", "4"]


def test_importing_the_backends_imports_no_keras(subprocess_env):
    import subprocess
    import sys

    code = (
        "import sys; from toolkit import backends; "
        "print([backends.of(n).codecs for n in backends.BACKENDS]); "
        "print(sorted(m for m in ('keras', 'tensorflow', 'torch', 'jax') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env, cwd=ROOT, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert result.stdout.splitlines()[-1] == "[]", result.stdout


@pytest.mark.parametrize("name", ["tensorflow", "jax", "torch"])
def test_a_backend_refuses_exactly_what_its_attributes_lack(name):
    backend = backends.of(name)
    assert backend.name == name
    for codec in ("none", "fp16", "topk", "threshold", "2bit"):
        refused = backend.refusal(codec=codec)
        assert (refused is None) == (codec in backend.codecs), (name, codec)
        if refused:  # names the field and what the backend carries
            assert refused == "allreduce.compression " + " or ".join(map(repr, backend.codecs))
    for mode in ("full", "partial", "local_sgd"):
        assert (backend.refusal(sync_mode=mode) is None) == (mode in backend.sync_modes)
    for feature, field in [
        ("elastic", "elastic"),
        ("adaptive_batch", "batch.adaptive"),
        ("adascale", "lr_scaling.rule"),
    ]:
        refused = backend.refusal(**{feature: True})
        assert (refused is None) == getattr(backend, feature)
        assert refused is None or field in refused
    assert backend.lacks or backend.refusal(codec="2bit", elastic=True) is None


def test_an_unknown_backend_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="KERAS_BACKEND must be one of tensorflow, jax, torch"):
        backends.of("mxnet")


# --- a toy backend: one class, one registry line ------------------------------------------


class ToyBackend(TensorFlowBackend):
    """Keras's TensorFlow underneath, float32 gradients and full synchronisation only, and a
    note of every method of its own the lab asked."""

    codecs = ("none",)
    sync_modes = ("full",)
    elastic = adascale = adaptive_batch = False
    lacks = "the toy carries float32 gradients only"
    asked: list[str] = []

    def steps_per_execution(self, planned: int) -> int:
        self.asked.append("steps_per_execution")
        return 1

    def compiled(self, function):
        self.asked.append("compiled")
        return super().compiled(function)

    def loss_gradients(self, model, x, y):
        self.asked.append("loss_gradients")
        return super().loss_gradients(model, x, y)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "tensorflow", ToyBackend)  # the one line
    ToyBackend.asked.clear()
    return ToyBackend


def test_a_toy_backend_is_refused_what_it_lacks_in_its_own_words(toy):
    from toolkit.config_rules import check_backend
    from toolkit.parallel import distributed

    quickstart = ROOT / "experiments/quickstart.yaml"
    fp16 = load(quickstart, ["workers=1", "allreduce.compression=fp16"])
    with pytest.raises(ConfigError, match="KERAS_BACKEND=tensorflow needs allreduce.compression "
                       "'none': the toy carries float32 gradients only"):  # fmt: skip
        check_backend(fp16, "tensorflow")
    check_backend(load(quickstart, ["workers=1"]), "tensorflow")
    with pytest.raises(ValueError, match="sync.mode 'full': the toy carries"):
        distributed.DistributedOptimizer(_sgd(), sync="local_sgd", period=2)


def _sgd():
    from toolkit.optimizers import SGD

    return SGD(0.1)


def test_a_toy_backend_trains_a_run_through_its_own_methods(toy, tmp_path):
    """In this process, as a notebook trains: the steps per execution the toy chose, its
    compiled functions and its loss gradients (the one-worker noise scale's) were the ones
    used, and the run completed."""
    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import RunDir
    from toolkit.train import train

    noise = ["logging.noise_scale_batch=64", "logging.noise_scale_every_steps=20"]
    config = load(ROOT / "experiments/quickstart.yaml", ["workers=1", "epochs=1", *noise])
    train(config, tmp_path / "toy", verbose=0)
    assert RunDir(tmp_path / "toy").status()["state"] == "completed"
    assert {"steps_per_execution", "compiled", "loss_gradients"} <= set(toy.asked)
    events = read_events(tmp_path / "toy" / "events.jsonl")
    assert not events.query("phase == 'gns'").empty  # measured by the toy's gradients


WORKER_START = """
import runpy, sys
sys.argv = ["toolkit.train", "--help"]
try:
    runpy.run_module("toolkit.train", run_name="__main__")
except SystemExit:
    pass
print(sorted({"sklearn", "jax", "mnist1d"} & set(sys.modules)))
import jax, sklearn  # and afterwards they import as usual
"""


def test_a_worker_starts_without_what_keras_imports_only_because_it_is_installed(
    subprocess_env,
):
    """``python -m toolkit.train`` on TensorFlow imports neither scikit-learn nor JAX (Keras's
    scikit-learn wrappers and TensorFlow Lite's ``jit`` would, whenever they are installed:
    1.4 s of CPU of a worker's start), nor mnist1d's generator, which only a cache miss needs;
    all three import as usual afterwards. Cost: about 5 s (one TensorFlow process)."""
    env = {**subprocess_env, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_START], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: python -m toolkit.train" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def test_a_jax_worker_keeps_its_compiled_programs_in_the_labs_cache(tmp_path, subprocess_env):
    """A worker started on JAX (one, here: :func:`distributed.init` outside horovodrun) keeps
    what it compiles in the lab's cache, where the next run reads it back. Cost: about 8 s (a
    JAX process that imports Horovod's TensorFlow)."""
    script = (
        "import jax\n"
        "from toolkit.parallel import distributed\n"
        "distributed.init()\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
        "jax.jit(lambda x: x * 2)(1.0)\n"
    )
    env = {**subprocess_env, "KERAS_BACKEND": "jax", cache.ENV: str(tmp_path)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "jax").glob("jit_*")), done.stderr[-3000:]


def test_a_compilation_cache_the_user_named_stays_theirs(tmp_path):
    """``JAX_COMPILATION_CACHE_DIR`` (or JAX's config) named a folder: the lab keeps to it.
    (JAX's config in this process, restored.)"""
    import jax

    from toolkit.backends import jax_engine

    named = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
        jax_engine.keep_compiled(tmp_path / "ours")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "theirs")
    finally:
        jax.config.update("jax_compilation_cache_dir", named)
