"""Shared test set-up: quiet TensorFlow, the repository root, a Python that has the toolkit."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The dashboard's token (app/access.py) in a folder of the test session's own, never the user's.
os.environ["LBL_CONFIG"] = tempfile.mkdtemp(prefix="lbl-config-")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from toolkit.launching import horovodrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
collect_ignore = [] if os.environ.get("KERAS_BACKEND") == "torch" else ["on_torch"]
"""``tests/on_torch`` tests what exists on PyTorch alone (``test_every_backend`` runs it)."""
CHROMIUM = "/usr/bin/chromium"  # Debian's: the browser tests never download one


CLUSTER_GROUP = "namespace-cluster"
"""The pytest-xdist group of every test file that asks for the namespace cluster."""
SHARED_RUNS_GROUP = "shared-worker-runs"
"""The group of the other files that read the session's shared worker runs (:func:`two_workers`,
:func:`keras_workers_on`): a session fixture is built once a worker, so their readers share one."""


@functools.cache
def files_asking(*fixtures: str) -> frozenset[str]:
    """The test files (as node ids name them) whose code names one of ``fixtures``."""
    asks = re.compile(rf"\b({'|'.join(fixtures)})\b")
    files = (ROOT / "tests").rglob("test_*.py")
    return frozenset(f.relative_to(ROOT).as_posix() for f in files if asks.search(f.read_text()))


def cluster_files() -> frozenset[str]:
    """The test files whose code asks for the namespace cluster."""
    return files_asking("cluster_hosts", "slurm_hosts")


def xdist_group(nodeid: str) -> str:
    """Which of pytest-xdist's workers runs a test: a file's tests run in one worker, which
    builds the file's module fixtures once; every file on the namespace cluster joins
    :data:`CLUSTER_GROUP`, whose worker alone brings the cluster and Slurm up and down, and
    every other file reading a shared worker run joins :data:`SHARED_RUNS_GROUP` (a run
    built twice cost a minute: test_elastic's readers of two_workers were moved out of the
    cluster's group for it)."""
    path = nodeid.split("::")[0]
    if path in cluster_files():
        return CLUSTER_GROUP
    shared = files_asking("two_workers", "keras_workers", "keras_workers_on", "on_torch")
    return SHARED_RUNS_GROUP if path in shared else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n``: the tests shared out by :func:`xdist_group`, in the order collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cluster's group first: the longest, it sets the suite's time unless it starts
    first. A test that reaches the cluster through another file's fixture is refused: its file
    would not join the group, and two workers would share the cluster."""
    for item in items:
        if "cluster_hosts" in item.fixturenames and xdist_group(item.nodeid) != CLUSTER_GROUP:
            raise pytest.UsageError(f"{item.nodeid} uses the cluster: name cluster_hosts in it")
    items.sort(key=lambda item: xdist_group(item.nodeid) != CLUSTER_GROUP)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker a core, at most four. (Three on two cores took as long as two,
    37.2 min of tests against 35.7-38.0, the cluster's group setting the time, and their load
    failed an elastic worker's 20 s rendezvous and an MLflow request's 5 s timeout.)"""
    return min(os.cpu_count() or 1, 4)


@pytest.fixture(scope="session")
def subprocess_env():
    """Environment for child processes: this interpreter's bin first on PATH (horovodrun)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def run_cli(args: list[str], runs, env: dict | None = None, timeout: float = 300):
    """``python -m toolkit --runs RUNS ARGS`` from the repository root, finished."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "toolkit", "--runs", str(runs), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dashboard(timeout: float = 60):
    """The dashboard's pages (app/main.py) in a Streamlit ``AppTest``, as their owner opens
    them: with the token in the address (:mod:`app.access`). Not yet run."""
    from streamlit.testing.v1 import AppTest

    from app import access

    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=timeout)
    at.query_params[access.QUERY] = access.token()
    return at


def as_in_training(step: Callable) -> Callable:
    """``step`` as a training loop runs it: in a ``tf.function`` on the TensorFlow backend,
    unchanged on the others (the optimizer oracle tests run on PyTorch too)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return step
    import tensorflow as tf

    return tf.function(step)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(
    command: list[str],
    *,
    log_path: Path,
    ready: Callable[[], bool],
    timeout_s: float,
    **popen,
) -> Iterator[subprocess.Popen]:
    """A server started by ``command`` (its output in ``log_path``), yielded once ``ready()``
    is true, and ended afterwards (terminated, then killed), also when it never got ready."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
        try:
            deadline = time.time() + timeout_s
            while not _answers(ready):
                assert process.poll() is None, log_path.read_text()
                assert time.time() < deadline, f"{command[:4]} did not start"
                time.sleep(0.5)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@contextlib.contextmanager
def dashboard_server(runs: Path, log_path: Path, env: dict | None = None) -> Iterator[str]:
    """The dashboard as ``./lab start`` serves it (``streamlit run app/server.py --server.address
    127.0.0.1``, headless) on a free port, ``runs`` its runs root; yields the address it printed,
    its owner's token in it, once it answers."""
    env = {**(env or os.environ), "LBL_RUNS": str(runs)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    port = free_port()
    command = [sys.executable, "-m", "streamlit", "run", "app/server.py"]
    command += ["--server.address", "127.0.0.1", "--server.port", str(port)]
    command += ["--server.headless", "true"]

    def printed() -> str | None:
        found = re.search(r"^\[lab\] the dashboard: (\S+)$", log_path.read_text(), re.M)
        return found and found[1]

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.read() == b"ok" and printed() is not None

    with serving(command, log_path=log_path, ready=ready, timeout_s=60, cwd=ROOT, env=env):
        yield printed()


def _answers(ready: Callable[[], bool]) -> bool:
    try:
        return ready()
    except OSError:  # not listening yet
        return False


def headless_chromium(playwright):
    """Debian's Chromium, headless, as every browser test drives it."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=["--no-sandbox", "--enable-unsafe-swiftshader"],
    )


@pytest.fixture(scope="session")
def cluster_hosts() -> Iterator[list[str]]:
    """The namespace cluster of three hosts (toolkit.launching.cluster), unshaped, shared by every
    multi-host test of the session and taken down after it, also when a test fails (a cluster
    a developer already had up is left up)."""
    from toolkit.launching import cluster

    was_up = cluster.describe() is not None
    made = cluster.up(3, cluster.Shaping())
    try:
        yield [host.name for host in made]
    finally:
        if not was_up:
            cluster.down()


@pytest.fixture(scope="session")
def slurm_hosts(cluster_hosts) -> Iterator[list[str]]:
    """The session's namespace cluster with Slurm on it; Slurm is ended after the session
    (with the cluster, or alone where the cluster was up before)."""
    from toolkit.launching import cluster, cluster_slurm

    was_running = cluster_slurm.running()
    cluster_slurm.start(cluster.hosts())
    yield cluster_hosts
    if not was_running:
        cluster_slurm.stop()


def run_workers(
    script: str,
    out: Path,
    env: dict,
    *options: str,
    workers: int = 2,
    args: tuple = (),
    timeout: float = 240,
):
    """``horovodrun --gloo -np WORKERS OPTIONS python tests/workers/SCRIPT OUT ARGS``, with
    horovodrun as the launcher runs it (:mod:`toolkit.launching.horovodrun`); asserts that it
    succeeded and returns the finished process (its output)."""
    worker = ROOT / "tests" / "workers" / script
    command = [*horovodrun.COMMAND, "--gloo", "-np", str(workers), *options]
    result = subprocess.run(
        [*command, sys.executable, str(worker), str(out), *args],
        check=False,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


@pytest.fixture(scope="session")
def two_workers(tmp_path_factory, subprocess_env):
    """One run of tests/workers/two_workers.py under ``horovodrun -np 2``, shared by every
    test that checks what two real workers did: each rank's arrays, logs and output folder."""
    out = tmp_path_factory.mktemp("hvd")
    run_workers("two_workers.py", out, subprocess_env, "-H", "localhost:2")
    ranks = [np.load(out / f"rank{r}.npz") for r in range(2)]
    infos = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, infos, out


_KERAS_WORKERS: dict[str, tuple] = {}  # backend -> what keras_workers.py left, once a session


def keras_workers_on(backend: str, tmp_path_factory, subprocess_env) -> tuple:
    """``(two, alone)`` on ``backend`` (``torch`` or ``jax``): each process's ``(arrays, info)``,
    of tests/workers/keras_workers.py under ``horovodrun -np 2`` (ranks 0 and 1) and run alone
    (rank 0 only); run once a session on each backend."""
    if backend in _KERAS_WORKERS:
        return _KERAS_WORKERS[backend]
    env = {**subprocess_env, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    two = tmp_path_factory.mktemp(f"{backend}-two")
    alone = tmp_path_factory.mktemp(f"{backend}-alone")
    run_workers("keras_workers.py", two, env, "-H", "localhost:2")
    worker = ROOT / "tests" / "workers" / "keras_workers.py"
    result = subprocess.run(
        [sys.executable, str(worker), str(alone)], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    def read(out, ranks):
        return [
            (np.load(out / f"rank{r}.npz"), json.loads((out / f"rank{r}.json").read_text()))
            for r in ranks
        ]

    _KERAS_WORKERS[backend] = read(two, (0, 1)), read(alone, (0,))
    return _KERAS_WORKERS[backend]


@pytest.fixture(scope="session")
def on_torch(tmp_path_factory, subprocess_env):
    """:func:`keras_workers_on` PyTorch."""
    return keras_workers_on("torch", tmp_path_factory, subprocess_env)


@pytest.fixture(scope="session", params=["torch", "jax"])
def keras_workers(request, tmp_path_factory, subprocess_env):
    """:func:`keras_workers_on` each of PyTorch and JAX."""
    return keras_workers_on(request.param, tmp_path_factory, subprocess_env)


def backends_running(**settings) -> list[str]:
    """The Keras backends that run ``settings`` (:meth:`toolkit.backends.base.Backend.refusal`'s
    keywords), so a test of them covers each backend as soon as it runs them."""
    from toolkit import backends

    return [name for name in backends.BACKENDS if backends.of(name).refusal(**settings) is None]


def weights(npz, scenario: str) -> list[np.ndarray]:
    keys = [k for k in npz.files if k.split("/")[0] == scenario]
    return [npz[k] for k in sorted(keys, key=lambda k: int(k.split("/")[1]))]


@pytest.fixture
def runs(tmp_path, monkeypatch, subprocess_env):
    """An empty runs root, as ``$LBL_RUNS``, with the venv's ``horovodrun`` on ``PATH``."""
    monkeypatch.setenv("LBL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])
    return tmp_path / "runs"
