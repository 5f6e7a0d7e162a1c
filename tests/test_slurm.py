"""Slurm as the engine beyond one machine, on a real Slurm: the namespace cluster's slurmctld and
one slurmd per host (toolkit.launching.cluster_slurm), MUNGE, sbatch, srun and scancel.

The hosts share this machine's process table, so a test checks from here, as ground truth,
that no process of a run is left on any host. The rules that need no Slurm (the job script,
the state mapping, the config's checks) are tested first, without one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import ROOT, run_cli
from test_backend_workers import assert_same_training, short
from test_checkpoint_damage import truncate
from test_multihost import SMALL, hosts_of, in_host
from test_train import wait

from toolkit import config as config_lib
from toolkit.launching import cluster, cluster_slurm, slurm, supervisor, sweep, sweep_runner
from toolkit.launching import launch as launcher
from toolkit.runs import slurm_jobs
from toolkit.runs.events import read_events
from toolkit.runs.rundir import LIVE, TERMINAL, RunDir, list_runs

pytestmark = pytest.mark.timeout(300)

TWO_NODES = {**SMALL, "epochs": 8, "slurm": {"nodes": 2}}


# --- without Slurm ----------------------------------------------------------------------------


def test_the_job_script_asks_for_one_task_per_rank_and_execs_the_driver(tmp_path):
    config = config_lib.from_mapping(
        {
            **SMALL,
            "workers": 4,
            "slurm": {
                "nodes": 2,
                "partition": "gpu",
                "account": "lab",
                "time": "1-02:00",
                "gpus_per_task": 1,
                "signal_before_end_s": 300,
                "sbatch_args": ["--qos=long"],
            },
        }
    )
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.update_meta(keras_backend="jax")  # the backend it was launched on, whatever the shell's
    script = slurm.job_script(config, run).splitlines()
    assert "export KERAS_BACKEND=jax" in script
    options = [line.removeprefix("#SBATCH ") for line in script if line.startswith("#SBATCH")]
    assert options == [
        "--open-mode=append",
        f"--chdir={ROOT}",
        "--job-name=lbl-r",
        f"--output={run.stdout_path.resolve()}",
        "--ntasks=4",
        "--nodes=2",
        "--partition=gpu",
        "--account=lab",
        "--time=1-02:00",
        "--gpus-per-task=1",
        "--signal=B:USR1@300",
        "--no-requeue",
        "--qos=long",  # last: a user's option overrides the lab's
    ]
    assert script[0] == "#!/bin/bash"
    assert script[-1] == (
        f"exec {sys.executable} -m toolkit.launching.slurm_job drive {run.path.resolve()}"
    )


@pytest.mark.parametrize(
    "state, reason, lab",
    [
        ("PENDING", "Resources", "queued"),
        ("REQUEUED", None, "queued"),
        ("RUNNING", None, "running"),
        ("COMPLETING", None, "running"),
        ("COMPLETED", None, "failed"),  # completed without the run recording its end
        ("NODE_FAIL", "NodeDown", "failed"),
        ("TIMEOUT", None, "failed"),
        ("OUT_OF_MEMORY", None, "failed"),
        ("PREEMPTED", None, "failed"),
        ("CANCELLED", None, "stopped"),
    ],
)
def test_slurm_states_map_to_the_labs_with_slurms_words(state, reason, lab):
    found, said = slurm_jobs.lab_state(slurm_jobs.Job("42", state, reason))
    assert found == lab
    assert said.startswith(f"Slurm job 42 {state}") and (reason or "") in said


@pytest.mark.parametrize(
    "slurm_section, other, expected",
    [
        ({"time": "1h"}, {}, "slurm.time"),
        ({"sbatch_args": ["-N 2"]}, {}, "slurm.sbatch_args"),
        ({"nodes": 3}, {"workers": 2}, "slurm.nodes=3 is more than workers=2"),
        ({}, {"hosts": "a:1,b:1", "workers": 2}, "give slurm.nodes, not hosts"),
        ({"time": "3"}, {}, "slurm.time='3' must be longer than slurm.signal_before_end_s=120 s"),
        ({"signal_before_end_s": 10}, {}, "slurm.signal_before_end_s"),
    ],
)
def test_a_bad_slurm_section_is_refused_naming_the_field(slurm_section, other, expected):
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.from_mapping({**SMALL, **other, "slurm": slurm_section})
    assert expected in str(refused.value)


@pytest.mark.parametrize(
    "said, reason",
    [
        (
            "*** JOB 2 ON n1 CANCELLED AT 2026-11-27T05:15:32 DUE TO NODE FAILURE, SEE SLURMCTLD "
            "LOG FOR DETAILS ***\nsrun: error: Node failure on n2\n",
            "Slurm cancelled job 2: node failure on n2; resume the run",
        ),
        (
            "*** JOB 2 ON n1 CANCELLED AT 2026-11-27T05:15:32 DUE TO TIME LIMIT ***\n",
            "Slurm cancelled job 2: time limit; resume the run",
        ),
        (
            "*** JOB 2 ON n1 CANCELLED AT 2026-11-27T05:15:32 ***\n",
            "Slurm cancelled job 2: by scancel",
        ),
        (
            "srun: error: n2: task 1: Exited with exit code 1\n",
            "worker rank 1 on n2: exited with exit code 1 (srun); srun exited with code 1",
        ),
    ],
)
def test_a_job_that_ended_badly_leaves_the_run_failed_in_slurms_words(tmp_path, said, reason):
    run = RunDir.create(tmp_path, "r", config_lib.from_mapping(SMALL))
    me = {"role": "supervisor", "pid": 1, "started": 0.0, "host": "n1"}
    run.set_status("running", slurm_job_id="2", processes=[me])
    run.stdout_path.write_text(f"Epoch 1/3\nslurmstepd-n1: error: {said}")
    supervisor.record_exit(run, me, 143 if "CANCELLED" in said else 1)
    status = run.recorded_status()
    assert status["state"] == "failed" and status["reason"].startswith(reason), status


def test_slurm_flags_without_slurm_are_refused(tmp_path):
    result = run_cli(["launch", "experiments/quickstart.yaml", "--nodes", "2"], tmp_path)
    assert result.returncode == 2
    assert "--nodes go with --slurm" in result.stderr
    assert not list(tmp_path.iterdir())


# --- on the cluster's Slurm -------------------------------------------------------------------


@pytest.fixture
def slurm_runs(tmp_path, monkeypatch, subprocess_env):
    """A runs root on the shared file system, as ``$LBL_RUNS``."""
    monkeypatch.setenv("LBL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PATH", subprocess_env["PATH"])
    return tmp_path / "runs"


def squeue_state(job: str) -> str:
    """Slurm's state of ``job`` now (``PENDING``, ``RUNNING``, ...; empty once it has left)."""
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def job_of(run: RunDir) -> str:
    return run.recorded_status()["slurm_job_id"]


def processes_of(run: RunDir) -> list[psutil.Process]:
    """Every process on any host whose command line names the run's directory."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(run.path.resolve()) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def train_steps(run: RunDir) -> list[int]:
    events = read_events(run.events_path)
    return events[events.phase == "train"].step.tolist() if "phase" in events else []


def wait_for_step(run: RunDir, step: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not (run.events_path.exists() and max(train_steps(run), default=0) >= step):
        assert run.status()["state"] in LIVE, run.stdout_path.read_text()[-3000:]
        assert time.time() < deadline, run.status()
        time.sleep(0.2)


def test_cluster_up_slurm_registers_every_host_as_a_node(slurm_hosts, subprocess_env, tmp_path):
    shown = run_cli(["cluster", "status"], tmp_path, subprocess_env).stdout.splitlines()
    assert shown[0].split()[-1] == "slurm" and [line.split()[-1] for line in shown[1:]] == [
        "idle"
    ] * len(slurm_hosts)
    seen = in_host("lbl-h2", ["sh", "-c", "sinfo -h -N -o '%N %t'; hostname"], subprocess_env)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["lbl-h1", "idle", "lbl-h2", "idle", "lbl-h3", "idle", "lbl-h2"]
    job = subprocess.run(
        ["sbatch", "--wait", "-N3", "-o", "/dev/null", "--wrap", "srun hostname"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == 0, job.stderr


@pytest.fixture(scope="module")
def two_nodes_and_one_host(slurm_hosts, tmp_path_factory, subprocess_env):
    """The small config as a Slurm job of 2 ranks on 2 nodes, submitted from the terminal of
    lbl-h3, and the same config on this host alone under horovodrun, at the same time."""
    root = tmp_path_factory.mktemp("runs")
    os.environ["PATH"] = subprocess_env["PATH"]
    local = launcher.launch(
        config_lib.from_mapping(SMALL | {"epochs": 8}), runs_root_dir=root, run_id="one-host"
    )
    config_path = root.parent / "two-nodes.yaml"
    config_path.write_text(config_lib.from_mapping(TWO_NODES).to_yaml())
    argv = [
        sys.executable,
        "-m",
        "toolkit",
        "--runs",
        str(root),
        "launch",
        str(config_path),
        "--name",
        "two-nodes",
        "--wait",
    ]
    started = time.monotonic()
    cli = in_host("lbl-h3", argv, subprocess_env)
    wait(local, TERMINAL)
    return cli, RunDir(root / "two-nodes"), local, time.monotonic() - started


def test_a_two_node_slurm_run_completes_with_one_rank_per_node(two_nodes_and_one_host):
    cli, run, _, _ = two_nodes_and_one_host
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert "where: Slurm job" in cli.stdout and "two-nodes: completed" in cli.stdout
    status = run.status()
    assert status["state"] == "completed" and status["exit_code"] == 0
    assert len(set(hosts_of(run).values())) == 2  # one rank on each of two nodes
    assert "#SBATCH --nodes=2" in (run.path / "job.sbatch").read_text()
    assert run.meta()["slurm_job_ids"] == [job_of(run)]
    assert slurm_jobs.wait_ended(job_of(run), 30)  # the driver records the exit, then ends
    assert slurm_jobs.job(job_of(run)).state == "COMPLETED"
    assert not processes_of(run)


def test_a_two_node_slurm_run_matches_the_same_run_on_one_host(two_nodes_and_one_host):
    _, slurm_run, one_host, _ = two_nodes_and_one_host
    a, b = read_events(one_host.events_path), read_events(slurm_run.events_path)
    for phase in ("train", "eval"):
        x, y = a[a.phase == phase], b[b.phase == phase]
        assert x.step.tolist() == y.step.tolist() and len(x) > 0
        np.testing.assert_allclose(y.loss, x.loss, rtol=1e-6, err_msg=phase)


def test_a_run_on_jax_is_a_two_node_slurm_job_like_any_other(slurm_hosts, slurm_runs):
    """Two workers on JAX, whose engine starts its own world (a coordinator on rank 0's node,
    ``toolkit/backends/jax_engine.py``), submitted as a job of two nodes: one rank on each,
    the losses of the same run on this host (~45 s). PyTorch's workers start through
    ``horovodrun`` as TensorFlow's do, the job script differing by ``KERAS_BACKEND`` alone;
    they run on two hosts over ssh in tests/test_backend_workers.py."""
    config = short("workers=2", "batch.per_worker=16", "slurm={nodes: 2}")
    job = launcher.launch(config, run_id="jax-job", backend="jax")
    here = launcher.launch(
        config.model_copy(update={"slurm": None}), run_id="jax-here", backend="jax"
    )
    for run in (job, here):
        assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    assert "export KERAS_BACKEND=jax" in (job.path / slurm.JOB_SCRIPT).read_text()
    assert len(set(hosts_of(job).values())) == 2  # one rank on each of two nodes
    assert_same_training(job, here)


def test_a_pending_run_is_queued_with_slurms_reason_and_stop_cancels_it(
    slurm_hosts, slurm_runs, monkeypatch
):
    hold = subprocess.run(  # every node, whole
        ["sbatch", "--parsable", "--exclusive", "-N3", "-o", "/dev/null", "--wrap", "sleep 120"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        # running first (a job the test before just ended may still hold its nodes a moment):
        # a run queued behind a job still pending waits for "Priority", not "Resources"
        deadline = time.monotonic() + 60
        while squeue_state(hold) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert squeue_state(hold) == "RUNNING"
        run = launcher.launch(config_lib.from_mapping(TWO_NODES), run_id="waits")
        slurm_jobs.forget()
        status = run.status()
        assert status["state"] == "queued", status
        assert status["reason"] == f"Slurm job {job_of(run)} PENDING (Resources)"
        second = launcher.launch(config_lib.from_mapping(TWO_NODES), run_id="waits-too")
        asked = []
        squeue = slurm_jobs._squeue
        monkeypatch.setattr(slurm_jobs, "_squeue", lambda: asked.append(1) or squeue())
        slurm_jobs.forget()
        for _ in range(10):  # a dashboard's renders, and the runs table's
            assert {r.status()["state"] for r in list_runs(slurm_runs)} == {"queued"}
        assert len(asked) == 1  # one squeue for every run, cached
        launcher.stop(second, by="a test")
        launcher.stop(run, by="a test")
    finally:
        subprocess.run(["scancel", hold], check=True)
    assert run.status()["state"] == "stopped"
    assert slurm_jobs.job(job_of(run)).state == "CANCELLED"


def test_stop_cancels_a_running_job_and_leaves_no_process_on_any_host(slurm_hosts, slurm_runs):
    run = launcher.launch(config_lib.from_mapping(TWO_NODES | {"epochs": 200}), run_id="long")
    wait_for_step(run, 20)
    assert {p.info["cmdline"][2] for p in processes_of(run)} >= {"toolkit.train"}
    result = run_cli(["stop", "long"], slurm_runs, timeout=120)
    assert result.returncode == 0, result.stderr
    status = run.status()
    assert status["state"] == "stopped" and "stopped on request from the CLI" in status["reason"]
    assert slurm_jobs.job(job_of(run)).state == "CANCELLED"
    deadline = time.time() + 30  # Slurm's KillWait (5 s here) then SIGKILL
    while processes_of(run):
        assert time.time() < deadline, [p.info["cmdline"] for p in processes_of(run)]
        time.sleep(0.5)


def test_slurms_signal_checkpoints_requeues_and_resumes_without_a_duplicate_step(
    two_nodes_and_one_host, slurm_runs
):
    """What ``--signal=B:USR1@T`` does at T seconds before the time limit, sent now:
    ``scancel --signal=USR1 --batch``. The run ends equal to the uninterrupted one."""
    _, reference, _, _ = two_nodes_and_one_host
    run = launcher.launch(config_lib.from_mapping(TWO_NODES), run_id="requeued")
    wait_for_step(run, 100)
    job = job_of(run)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    wait(run, ("queued",), timeout=60)  # checkpointed, and back in Slurm's queue
    status = wait(run, TERMINAL, timeout=240)
    assert status["state"] == "completed", run.stdout_path.read_text()[-3000:]
    log = run.stdout_path.read_text()
    assert f"[lab] checkpointed on Slurm's signal ahead of the job's end; job {job} requeued" in log
    restarted = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    assert "Restarts=1" in restarted.stdout
    steps = train_steps(run)
    assert len(steps) == len(set(steps)) and steps == sorted(steps)
    assert steps == train_steps(reference)
    mine, theirs = read_events(run.events_path), read_events(reference.events_path)
    np.testing.assert_allclose(  # the epoch's running mean restarts at the resume: compare evals
        mine[mine.phase == "eval"].loss, theirs[theirs.phase == "eval"].loss, rtol=1e-6
    )


def test_a_lost_nodes_slurmd_fails_the_run_with_slurms_words_and_resume_completes_it(
    slurm_hosts, slurm_runs
):
    """A node lost mid-run: its slurmd killed and its worker stopped, as a failed machine's
    would be, so the run cannot end before Slurm declares the node down (whatever the pace of
    training); the node comes back rebooted (its stopped worker killed, slurmd started)."""
    lost_after = TWO_NODES | {"lost_worker_after_s": 120}  # Gloo waits longer than Slurm
    run = launcher.launch(config_lib.from_mapping(lost_after), run_id="lost")
    wait_for_step(run, 200)  # three epochs' checkpoints written, 62 steps an epoch
    lost = hosts_of(run)[1]
    (worker,) = [
        p["pid"] for p in run.status()["processes"] if p["role"] == "worker" and p["host"] == lost
    ]
    pid = int((cluster_slurm.STATE / f"slurmd-{lost}.pid").read_text())
    try:
        os.kill(worker, signal.SIGSTOP)
        os.kill(pid, signal.SIGKILL)
        status = wait(run, TERMINAL, timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        cluster_slurm.start(cluster.hosts())  # the node's slurmd back: it returns to service
    assert status["state"] == "failed", status
    assert f"Slurm cancelled job {job_of(run)}: node failure on {lost}" in status["reason"]
    *_, before, latest = sorted(p.name for p in run.checkpoints_path.glob("epoch-*"))
    said = truncate(run.checkpoints_path / latest)  # and the latest checkpoint is damaged
    launcher.resume(run)
    status = wait(run, TERMINAL, timeout=240)
    assert status["state"] == "completed", run.stdout_path.read_text()[-3000:]
    assert len(run.meta()["slurm_job_ids"]) == 2
    steps = train_steps(run)
    every = TWO_NODES["logging"]["every_steps"]
    assert len(steps) == len(set(steps)) and steps[-1] == TWO_NODES["epochs"] * 62 // every * every
    events = read_events(run.events_path)
    (event,) = events[events.phase == "checkpoint"].to_dict("records")
    assert (event["checkpoint"], event["reason"], event["resumed_from"]) == (latest, said, before)


@pytest.fixture
def hidden_from_the_nodes(tmp_path):
    """A runs root the nodes cannot see: a tmpfs mounted in a mount namespace of its own, the
    launching CLI's."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs tmpfs {hidden} && exec "$@"',
        "sh",
    ], hidden


@pytest.mark.parametrize(
    "case, fields, expected",
    [
        ("no such partition", {"partition": "gpu"}, "slurm.partition='gpu': no such partition"),
        ("too many nodes", {"nodes": 2}, "slurm.nodes=2: partition 'one' has 1 node(s)"),
        ("no GPUs", {"gpus_per_task": 1}, "slurm.gpus_per_task=1 x workers=2"),
        ("no Slurm", {}, "slurm: Slurm does not answer (sinfo: sinfo not found"),
    ],
)
def test_pre_flight_refuses_before_anything_is_created_or_submitted(
    case, fields, expected, slurm_hosts, slurm_runs, monkeypatch
):
    if case == "no Slurm":  # a machine without Slurm's commands
        monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    if case == "too many nodes":  # a partition of one node, for this test
        subprocess.run(["scontrol", "create", "PartitionName=one", "Nodes=lbl-h1"], check=True)
        fields = {**fields, "partition": "one"}
    before = set((slurm_jobs.jobs() or {}).keys())
    try:
        with pytest.raises(config_lib.ConfigError) as refused:
            launcher.launch(config_lib.from_mapping(SMALL), slurm=fields)
    finally:
        if case == "too many nodes":
            subprocess.run(["scontrol", "delete", "PartitionName=one"], check=True)
    assert expected in str(refused.value)
    assert not slurm_runs.exists() or not [
        p for p in slurm_runs.iterdir() if not p.name.startswith(".")
    ]
    slurm_jobs.forget()
    submitted = set((slurm_jobs.jobs() or {}).keys()) - before
    assert all(slurm_jobs.job(j).state != "PENDING" for j in submitted)  # only the probe's


def test_pre_flight_refuses_a_runs_root_the_nodes_cannot_see_with_one_line(
    slurm_hosts, hidden_from_the_nodes, subprocess_env
):
    prefix, runs = hidden_from_the_nodes
    argv = [sys.executable, "-m", "toolkit", "--runs", str(runs), "launch"]
    argv += ["experiments/quickstart.yaml", "--slurm", "--np", "2"]
    result = subprocess.run(
        [*prefix, *argv], cwd=ROOT, env=subprocess_env, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"the runs root {runs} is not visible from partition 'lab'" in line
    assert not list(runs.iterdir())  # the nodes' view, and this one's: nothing left


def test_cluster_slurm_stop_ends_every_daemon_and_removes_its_files(slurm_hosts):
    daemons = [cluster_slurm._process(name) for name in cluster_slurm._pid_files()]
    assert len(daemons) == 2 + len(slurm_hosts) and all(daemons)
    cluster_slurm.stop()
    assert not any(d.is_running() for d in daemons)
    assert not cluster_slurm.STATE.exists() and not (cluster_slurm.CONF_DIR / "slurm.conf").exists()
    assert not cluster_slurm.running()
    cluster_slurm.stop()  # twice is fine
    cluster_slurm.start(cluster.hosts())  # as the session's fixture left it


def test_a_sweep_is_one_job_array_and_a_rerun_skips_its_completed_cells(slurm_hosts, slurm_runs):
    grid = sweep.from_mapping(
        {
            "name": "arr",
            "base": SMALL | {"workers": 1, "epochs": 1},
            "grid": {"optimizer.learning_rate": [0.1, 0.2, 0.4]},
        }
    )
    grid = sweep_runner.on_slurm(grid, {"time": "10:00"})
    said = []
    table = sweep_runner.run(grid, max_parallel=2, log=said.append, poll_s=0.5)
    assert (table["state"] == "completed").all(), said
    runs = [RunDir(slurm_runs / run_id) for run_id in table["run_id"]]
    arrays = {job_of(run).split("_")[0] for run in runs}
    assert len(arrays) == 1 and sorted(job_of(r) for r in runs) == [
        f"{next(iter(arrays))}_{i}" for i in range(3)
    ]
    script = (slurm_runs / ".sweeps" / "arr-0.sbatch").read_text()
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --time=10:00" in script
    assert all("val_accuracy" in run.stdout_path.read_text() for run in runs)  # each its own log
    said.clear()
    again = sweep_runner.run(grid, max_parallel=2, log=said.append, poll_s=0.5)
    assert said == ["sweep arr: 3 cells, 3 ended, 0 in flight, 0 to launch, 2 at a time"]
    assert again["run_id"].tolist() == table["run_id"].tolist()
    assert [r.meta()["slurm_job_ids"] for r in runs] == [[job_of(r)] for r in runs]


def test_a_search_runs_its_trials_as_slurm_jobs(slurm_hosts, slurm_runs):
    """A search with ``--slurm``: each trial a Slurm job of its own, told to the study from its
    events like any trial; a rerun adds none (~30 s: 2 one-epoch trials)."""
    from toolkit.launching import search, search_runner

    found = search.from_mapping(
        {
            "name": "srch",
            "base": SMALL | {"workers": 1, "epochs": 1},
            "space": {"optimizer.learning_rate": {"low": 0.05, "high": 0.5, "log": True}},
            "trials": 2,
            "pruner": "none",
        }
    )
    found = search.on_slurm(found, {"time": "10:00"})
    said = []
    table = search_runner.run(found, log=said.append, poll_s=0.5)
    assert (table["state"] == "completed").all(), said
    runs = [RunDir(slurm_runs / run_id) for run_id in table["run_id"]]
    jobs = [job_of(run) for run in runs]
    assert len(set(jobs)) == 2 and all(job.isdigit() for job in jobs)
    for run, value in zip(runs, table["value"]):
        assert "#SBATCH --time=10:00" in (run.path / "job.sbatch").read_text()
        events = read_events(run.events_path)
        assert events[events.phase == "eval"].accuracy.iloc[-1] == value
    said.clear()
    again = search_runner.run(found, log=said.append, poll_s=0.5)
    assert again["run_id"].tolist() == table["run_id"].tolist() and "trial 2" not in str(said)


# --- the app's doors ----------------------------------------------------------------------------


def test_the_launch_form_submits_the_quickstart_to_slurm_on_two_nodes(slurm_hosts, slurm_runs):
    from test_app import by_label, page

    at = page("launch")
    assert by_label(at.selectbox, "Start from").value == "quickstart"  # a working example
    by_label(at.radio, "Where").set_value("Slurm").run()
    # defect 9 of the third walk: Slurm's choices, as sinfo reports them
    partitions = slurm.partitions_here()
    assert by_label(at.selectbox, "Partition").options == ["(the cluster's default)", *partitions]
    (told,) = [c.value for c in at.caption if c.value.startswith("Slurm reports")]
    assert all(
        f"{name} (default): {nodes} nodes" in told
        for name, (nodes, _, default) in partitions.items()
        if default
    )
    by_label(at.number_input, "Nodes").set_value(2).run()
    by_label(at.text_input, "Run id").set_value("uislurm").run()
    by_label(at.button, "Launch").click().run(timeout=60)
    assert not at.exception and not at.error, [e.value for e in at.error]
    (run_dir,) = [p for p in slurm_runs.iterdir() if not p.name.startswith(".")]
    run = RunDir(run_dir)
    assert run.run_id == "uislurm"  # as the CLI's --name names it
    assert f"Slurm job {job_of(run)}" in at.success[0].value
    status = wait(run, TERMINAL, timeout=240)
    assert status["state"] == "completed", run.stdout_path.read_text()[-3000:]
    assert run.config().slurm.nodes == 2 and len(set(hosts_of(run).values())) == 2
    at.switch_page("views/runs.py").run()
    row = at.dataframe[0].value.iloc[0]
    assert row["run_id"] == run.run_id and row["state"] == "completed"
    at.switch_page("views/detail.py").run()
    assert any(f"where: Slurm job {job_of(run)}" in text.value for text in at.text)


def test_the_sweep_page_runs_its_cells_as_a_slurm_job_array(slurm_hosts, slurm_runs, monkeypatch):
    from test_sweep import labelled, sweep_page

    at = sweep_page(slurm_runs, monkeypatch, "Build a grid")
    labelled(at.text_input, "Sweep name").set_value("onslurm")
    grid = "epochs: [1]\nworkers: [1]\nbatch.global_size: [64, 128]\n"
    labelled(at.text_area, "Grid: config path → values (YAML)").set_value(grid)
    labelled(at.text_area, "Methods: name → overrides (YAML, optional)").set_value("")
    labelled(at.text_input, "Seeds (YAML list)").set_value("[0]").run()
    labelled(at.radio, "Where").set_value("Slurm").run()
    labelled(at.text_input, "Time limit").set_value("10:00").run()
    labelled(at.button, "Launch sweep").click().run()
    assert "Sweep onslurm started" in at.success[0].value
    grid = sweep.saved(slurm_runs)[0]
    deadline = time.time() + 180
    while not sweep_runner.states(grid, slurm_runs)["state"].isin(["completed", "failed"]).all():
        assert time.time() < deadline, (slurm_runs / ".sweeps" / "onslurm.log").read_text()
        time.sleep(1)
    runs = [RunDir(slurm_runs / r) for r in sweep_runner.states(grid, slurm_runs)["run_id"]]
    assert [r.status()["state"] for r in runs] == ["completed"] * 2
    assert len({job_of(r).split("_")[0] for r in runs}) == 1  # one array
    assert "#SBATCH --time=10:00" in (slurm_runs / ".sweeps" / "onslurm-0.sbatch").read_text()
