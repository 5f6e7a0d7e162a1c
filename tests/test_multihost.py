"""Runs across hosts, for real: the namespace cluster (toolkit.launching.cluster), ssh, horovodrun
and the run directory's records, from the terminal and from Python (the app's door is in test_app).

The hosts share this machine's process table (only their network and hostname are their own),
so a test can check from here, as ground truth, that a process the toolkit reached over ssh is
really gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from conftest import ROOT, run_cli
from test_app import by_label, launch_page
from test_checkpoint_damage import flip_a_bit
from test_failures import failed_after, stop_a_worker
from test_train import SMALL as TRAIN_SMALL
from test_train import wait

from toolkit import config as config_lib
from toolkit import files
from toolkit.config import from_mapping
from toolkit.launching import cluster, slots
from toolkit.launching import launch as launcher
from toolkit.launching.executors.local import horovodrun_argv
from toolkit.runs.events import read_events
from toolkit.runs.rundir import TERMINAL, RunDir

pytestmark = pytest.mark.timeout(300)

SMALL = {**TRAIN_SMALL, "epochs": 2}
LONG = {**SMALL, "epochs": 500}


def hosts_of(run: RunDir) -> dict[int, str]:
    """``{rank: host}`` of the run's workers, as its status records them."""
    return {p["rank"]: p["host"] for p in run.status()["processes"] if p["role"] == "worker"}


def in_host(host: str, argv: list[str], env: dict, timeout: float = 300):
    return subprocess.run(
        cluster.exec_argv(host, argv),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def state_seen_from(host: str, run: RunDir, env: dict) -> str:
    """The run's state as a reader on ``host`` sees it (no process of the run there)."""
    code = (
        "import sys; from pathlib import Path; from toolkit.runs.rundir import RunDir; "
        "print(RunDir(Path(sys.argv[1])).status()['state'])"
    )
    seen = in_host(host, [sys.executable, "-c", code, str(run.path)], env)
    assert seen.returncode == 0, seen.stderr
    return seen.stdout.strip()


def started_training(run: RunDir) -> None:
    wait(run, ("running",))
    deadline = time.time() + 120
    while not run.events_path.exists() or len(run.events_path.read_text().splitlines()) < 3:
        assert run.status()["state"] == "running", run.stdout_path.read_text()[-2000:]
        assert time.time() < deadline
        time.sleep(0.2)


def test_the_cluster_is_hosts_with_their_own_names_addresses_and_sshd(
    cluster_hosts, subprocess_env
):
    rows = cluster.status()
    assert [r["host"] for r in rows] == cluster_hosts == ["lbl-h1", "lbl-h2", "lbl-h3"]
    assert all(r["namespace"] and r["sshd"] and r["ssh"] for r in rows), rows
    assert len({r["address"] for r in rows}) == 3
    seen = in_host("lbl-h2", ["sh", "-c", "hostname; ssh lbl-h3 hostname"], subprocess_env)
    assert seen.stdout.split() == ["lbl-h2", "lbl-h3"], seen.stderr  # ssh between hosts too
    interfaces = in_host("lbl-h3", ["ip", "-o", "-4", "addr"], subprocess_env).stdout
    assert f" {cluster.INTERFACE} " in interfaces and "10.213.0.13/24" in interfaces


@pytest.fixture(scope="module")
def cli_and_one_host(cluster_hosts, tmp_path_factory, subprocess_env):
    """The small config across lbl-h1 and lbl-h2, launched from the terminal inside lbl-h1 (so
    rank 1 goes through ssh), and the same config on this host alone, at the same time."""
    root = tmp_path_factory.mktemp("runs")
    config_path = root.parent / "small.yaml"
    config_path.write_text(yaml.safe_dump(SMALL))
    os.environ["PATH"] = subprocess_env["PATH"]
    local = launcher.launch(from_mapping(SMALL), runs_root_dir=root, run_id="one-host")
    argv = [sys.executable, "-m", "toolkit", "--runs", str(root), "launch", str(config_path)]
    argv += ["--hosts", "lbl-h1:1,lbl-h2:1", "--name", "two-hosts", "--wait"]
    cli = in_host("lbl-h1", argv, subprocess_env)
    wait(local, TERMINAL)
    return cli, RunDir(root / "two-hosts"), local


def test_a_two_host_run_from_the_terminal_completes_on_both_hosts(cli_and_one_host):
    cli, run, _ = cli_and_one_host
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert "two-hosts: completed" in cli.stdout
    assert hosts_of(run) == {0: "lbl-h1", 1: "lbl-h2"}
    launcher_host = {p["host"] for p in run.status()["processes"] if p["role"] != "worker"}
    assert launcher_host == {"lbl-h1"}  # the supervisor and horovodrun ran inside lbl-h1
    assert "[0]<stdout>:Epoch 2/2" in run.stdout_path.read_text()  # horovodrun's log, here


def test_a_two_host_run_matches_the_same_run_on_one_host(cli_and_one_host):
    _, two_hosts, one_host = cli_and_one_host
    assert one_host.status()["state"] == "completed"
    assert set(hosts_of(one_host).values()) != set(hosts_of(two_hosts).values())
    a, b = read_events(one_host.events_path), read_events(two_hosts.events_path)
    for phase in ("train", "eval"):
        x, y = a[a.phase == phase], b[b.phase == phase]
        assert x.step.tolist() == y.step.tolist() and len(x) > 0
        np.testing.assert_allclose(y.loss, x.loss, rtol=1e-6, err_msg=phase)
    np.testing.assert_array_equal(b[b.phase == "train"].lr, a[a.phase == "train"].lr)


def test_a_run_on_one_other_host_names_the_interface_it_is_reached_through(cluster_hosts, runs):
    """horovodrun's own choice for one remote host is loopback half the time (see
    toolkit.launching.remote.network_interface); the launcher names the interface instead."""
    config = from_mapping({**SMALL, "epochs": 1})
    run = launcher.launch(config, hosts="lbl-h3:2", run_id="one-other")
    argv = horovodrun_argv(run.config(), run, resume=False)
    assert argv[argv.index("--network-interfaces") + 1] == cluster.INTERFACE
    assert wait(run, TERMINAL)["state"] == "completed", run.stdout_path.read_text()
    assert hosts_of(run) == {0: "lbl-h3", 1: "lbl-h3"}


def test_stop_ends_every_process_on_every_host_after_the_supervisor_was_killed(
    cluster_hosts, runs, subprocess_env
):
    run = launcher.launch(from_mapping(LONG), hosts="lbl-h1:1,lbl-h2:1", run_id="stopped")
    started_training(run)
    assert state_seen_from("lbl-h3", run, subprocess_env) == "running"  # by the heartbeats
    recorded = run.status()["processes"]
    (supervisor,) = [p for p in recorded if p["role"] == "supervisor"]
    os.kill(supervisor["pid"], signal.SIGKILL)
    time.sleep(1)
    assert run.status()["state"] == "running"  # its workers still train, on both hosts
    launcher.stop(run)
    for record in recorded:
        if psutil.pid_exists(record["pid"]):
            process = psutil.Process(record["pid"])
            assert abs(process.create_time() - record["started"]) > 0.05 or (
                process.status() == psutil.STATUS_ZOMBIE
            ), record
    assert run.status()["state"] == "stopped"
    assert state_seen_from("lbl-h3", run, subprocess_env) == "stopped"
    assert not list((run.path / ".heartbeats").glob("lbl-h*"))


def test_a_worker_killed_on_host_2_leaves_the_run_failed_with_the_reason(cluster_hosts, runs):
    run = launcher.launch(from_mapping(LONG), hosts="lbl-h1:1,lbl-h2:1", run_id="killed")
    started_training(run)
    (rank1,) = [p for p in run.status()["processes"] if p.get("rank") == 1]
    assert rank1["host"] == "lbl-h2"
    subprocess.run(["ssh", "lbl-h2", "kill", "-KILL", str(rank1["pid"])], check=True)
    wait(run, TERMINAL, timeout=60)  # rank 0's own failure, written first,
    deadline = time.time() + 30  # then the supervisor's account of horovodrun's exit
    while "released" not in (status := run.status()) and time.time() < deadline:
        time.sleep(0.2)
    assert status["state"] == "failed" and status["exit_code"] != 0
    assert "worker rank 1 on lbl-h2 exited" in status["reason"], status["reason"]
    assert len(read_events(run.events_path)) >= 3 and run.stdout_path.stat().st_size > 0


def test_a_worker_stopped_on_host_2_is_named_and_the_run_resumes_past_a_damaged_checkpoint(
    cluster_hosts, runs
):
    """Rank 1 on lbl-h2 stopped (SIGSTOP) after the second checkpoint: the run fails after
    ``lost_worker_after_s`` naming it; its latest checkpoint then bit-flipped, resuming from
    Python passes over it to the one before and completes on both hosts."""
    config = from_mapping({**SMALL, "epochs": 4, "lost_worker_after_s": 10})
    run = launcher.launch(config, hosts="lbl-h1:1,lbl-h2:1", run_id="stopped-on-h2")
    status, took = failed_after(run, stop_a_worker(run, 1, epoch=2))
    assert status["state"] == "failed" and took >= 10
    assert status["reason"].startswith(
        "worker rank 1 on lbl-h2 stopped answering: the others waited lost_worker_after_s=10 s"
    ), status["reason"]
    *_, before, latest = sorted(p.name for p in run.checkpoints_path.glob("epoch-*"))
    said = flip_a_bit(run.checkpoints_path / latest)
    launcher.resume(run)
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    assert hosts_of(run) == {0: "lbl-h1", 1: "lbl-h2"}
    events = read_events(run.events_path)
    (event,) = events[events.phase == "checkpoint"].to_dict("records")
    assert (event["checkpoint"], event["reason"], event["resumed_from"]) == (latest, said, before)


def test_two_runs_on_one_slot_hosts_run_one_after_the_other(cluster_hosts, runs):
    """Launched from Python on two one-slot hosts: each run puts its ranks where asked, and the
    second waits in the queue until the first has given the hosts back."""
    slots.set_capacity("lbl-h1:1,lbl-h2:1", runs)
    first = launcher.launch(from_mapping(SMALL), hosts="lbl-h1:1,lbl-h2:1", run_id="first")
    second = launcher.launch(from_mapping(SMALL), hosts="lbl-h1:1,lbl-h2:1", run_id="second")
    assert slots.positions(runs) == {"second": 1}
    for run in (first, second):
        assert wait(run, TERMINAL)["state"] == "completed", run.stdout_path.read_text()
        assert hosts_of(run) == {0: "lbl-h1", 1: "lbl-h2"} and run.meta()["world_size"] == 2
    a, b = first.recorded_status(), second.recorded_status()
    assert b["launched"] >= a["released"]  # the hosts were never shared


@pytest.fixture
def hidden_on_lbl_h3():
    """Hides a path from lbl-h3 alone, as a host without it would be: an empty tmpfs mounted
    over it in the mount namespace of lbl-h3's sshd (every ssh session there inherits it)."""
    (host,) = [h for h in cluster.hosts() if h.name == "lbl-h3"]
    mounted = []

    def hide(path: Path) -> None:
        enter = ["nsenter", "--target", str(host.sshd_pid), "--mount", "--"]
        subprocess.run([*enter, "mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
        mounted.append([*enter, "umount", str(path)])

    yield hide
    for umount in mounted:
        subprocess.run(umount, check=True)


@pytest.fixture
def sshd_stopped_on_lbl_h3(cluster_hosts):
    (host,) = [h for h in cluster.hosts() if h.name == "lbl-h3"]
    os.kill(host.sshd_pid, signal.SIGTERM)
    psutil.wait_procs([psutil.Process(host.sshd_pid)], timeout=10)
    yield
    cluster.up(3)  # restarts it


@pytest.mark.parametrize(
    "case, hosts, expected",
    [
        ("unresolvable", "lbl-h1:1,lbl-h9:1", "lbl-h9: does not answer ssh"),
        ("sshd stopped", "lbl-h1:1,lbl-h3:1", "lbl-h3: does not answer ssh"),
        ("no repository", "lbl-h1:1,lbl-h3:1", "lbl-h3: has no"),
        ("no shared runs root", "lbl-h1:1,lbl-h3:1", "lbl-h3: does not see the runs root"),
        ("too many slots", "lbl-h1:1,lbl-h2:64", "lbl-h2: 64 workers asked of it"),
        ("no such interface", "lbl-h2:1,lbl-h3:1", "lbl-h3: has no network interface eth9"),
    ],
)
def test_pre_flight_refuses_a_host_by_name_before_any_run_directory_exists(
    case, hosts, expected, cluster_hosts, runs, subprocess_env, request
):
    if case == "sshd stopped":
        request.getfixturevalue("sshd_stopped_on_lbl_h3")
    if case in ("no repository", "no shared runs root"):
        runs.mkdir(parents=True, exist_ok=True)
        request.getfixturevalue("hidden_on_lbl_h3")(ROOT if case == "no repository" else runs)
    started = time.monotonic()
    argv = ["launch", "experiments/quickstart.yaml", "--hosts", hosts]
    if case == "no such interface":
        argv += ["--set", "network_interface=eth9"]
    result = run_cli(argv, runs, subprocess_env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "nothing was started" in result.stderr
    assert time.monotonic() - started < 45  # not horovodrun's minute-long hang
    assert not runs.exists() or not list(runs.iterdir())  # no run, no marker left behind


def test_the_cluster_commands_refuse_with_what_is_missing(
    cluster_hosts, runs, subprocess_env, tmp_path
):
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    refused = {
        "needs root": subprocess.run(
            [*nobody, sys.executable, "-m", "toolkit", "cluster", "up"],
            cwd=ROOT,
            env={**subprocess_env, "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
        ),
        "missing ip, tc, nsenter, unshare, taskset, ssh, ssh-keygen: run scripts/setup.sh": run_cli(
            ["cluster", "up"], runs, {**subprocess_env, "PATH": str(tmp_path)}
        ),
        "a cluster of 3 hosts is up": run_cli(["cluster", "up", "--hosts", "2"], runs),
        "argument --hosts: must be an integer from 1 to 50 (got '0')": run_cli(
            ["cluster", "up", "--hosts", "0"], runs
        ),
        "--bandwidth must look like 1gbit": run_cli(
            ["cluster", "shape", "--bandwidth", "fast"], runs
        ),
        "the command is missing": run_cli(["cluster", "exec", "lbl-h1", "--"], runs),
    }
    for expected, result in refused.items():
        assert result.returncode == 2, (expected, result.stdout, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert [r["host"] for r in cluster.status()] == cluster_hosts  # untouched by all of it


def test_each_host_runs_on_its_own_share_of_the_cores(cluster_hosts, subprocess_env):
    """As a real host has CPUs of its own: what a host runs, logged in over ssh or entered,
    sees its share (on 2 cores, one each, the third host on the first's). ~2 s."""
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    for index, host in enumerate(cluster_hosts, start=1):
        want = str(cluster.cores_of(index, len(cluster_hosts)))
        over_ssh = subprocess.run(
            ["ssh", host, sys.executable, "-c", f"'{show}'"], capture_output=True, text=True
        )
        entered = in_host(host, [sys.executable, "-c", show], subprocess_env)
        assert over_ssh.stdout.strip() == entered.stdout.strip() == want, (over_ssh, entered)
    shares = [set(cluster.cores_of(i, len(cluster_hosts))) for i in (1, 2, 3)]
    all_cores = os.sched_getaffinity(0)
    assert all(len(share) == max(1, len(all_cores) // 3) for share in shares)
    if len(all_cores) <= 3:  # every core is some host's
        assert set().union(*shares) == all_cores
    else:  # each host's own
        assert all(not a & b for a, b in [(shares[0], shares[1]), (shares[1], shares[2])])


def test_shaping_limits_the_link_and_a_delay_needs_netem(cluster_hosts, runs):
    try:
        shaped = run_cli(["cluster", "shape", "--bandwidth", "200mbit"], runs)
        assert shaped.returncode == 0, shaped.stderr
        assert [r["bandwidth"] for r in cluster.status()] == ["200mbit"] * 3
        qdisc = subprocess.run(
            cluster.exec_argv("lbl-h2", ["tc", "qdisc", "show", "dev", cluster.INTERFACE]),
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc, qdisc
        delayed = run_cli(["cluster", "shape", "--delay", "100us"], runs)
        if delayed.returncode == 0:  # a kernel with sch_netem
            assert [r["delay"] for r in cluster.status()] == ["100us"] * 3
        else:  # this one's kernel has none: refused by name, the old shaping kept
            assert delayed.returncode == 2 and "sch_netem" in delayed.stderr, delayed.stderr
            assert [r["bandwidth"] for r in cluster.status()] == ["200mbit"] * 3
    finally:
        cluster.shape(cluster.Shaping())
    assert [(r["bandwidth"], r["delay"]) for r in cluster.status()] == [("-", "-")] * 3


def test_cluster_down_leaves_no_namespace_process_or_file_and_can_run_twice(cluster_hosts):
    sshd = [h.sshd_pid for h in cluster.hosts()]
    cluster.down()
    cluster.down()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "lbl-h" not in namespaces
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.INTERFACE not in links and "lbl-h" not in links
    assert "lbl-cluster" not in Path("/etc/hosts").read_text()
    assert not cluster.SSH_CLIENT_CONFIG.exists() and not cluster.STATE.exists()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).name() == "sshd" for pid in sshd)
    cluster.up(3)  # as the session's fixture left it, for any test after this one


@pytest.mark.timeout(240)
def test_launch_quickstart_for_real_through_the_form_on_two_hosts(cluster_hosts, runs):
    """The quickstart preset (6 of its 20 epochs), 2 Horovod workers, through the real
    toolkit.launching.launch.launch on two hosts of the namespace cluster, each reached over
    ssh, one rank on each, from the Launch page (an AppTest). (The same launch on this host is
    tests/test_app_browser.py's, from the form in Chromium.)"""
    hosts = "lbl-h2:1,lbl-h3:1"
    at = launch_page()
    by_label(at.selectbox, "Start from").set_value("quickstart").run()
    assert by_label(at.number_input, "Workers").value == 2
    by_label(at.radio, "Where").set_value("Hosts over ssh").run()
    by_label(at.text_input, "Hosts").set_value(hosts).run()
    by_label(at.number_input, "Epochs").set_value(6).run()  # of the preset's 20: to its end
    by_label(at.button, "Launch").click().run(timeout=60)
    assert not at.exception and not at.error, [e.value for e in at.error]
    (run_dir,) = runs.iterdir()
    run = RunDir(run_dir)
    assert wait(run, timeout=200)["state"] == "completed", files.tail(run.stdout_path)
    expected = config_lib.load(ROOT / "experiments" / "quickstart.yaml", ["epochs=6"])
    assert run.config() == expected.model_copy(update={"hosts": hosts})
    ranks = {p["rank"]: p["host"] for p in run.status()["processes"] if p["role"] == "worker"}
    assert ranks == {0: "lbl-h2", 1: "lbl-h3"}  # neither is this machine: both by ssh
    assert run.meta()["world_size"] == 2
    at.switch_page("views/runs.py").run()
    row = at.dataframe[0].value.iloc[0]
    assert row["run_id"] == run.run_id and row["state"] == "completed" and row["workers"] == 2
    assert row["best_eval_accuracy"] > 0.5
    at.switch_page("views/compare.py").run()
    assert not at.exception and len(at.get("plotly_chart")) == 3
