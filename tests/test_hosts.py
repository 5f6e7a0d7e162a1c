"""Host lists (toolkit.launching.hosts): written out, horovodrun hostfiles and Slurm allocations,
and the ssh fields of the config as horovodrun receives them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import run_cli

from toolkit import host_list
from toolkit.config import ConfigError, from_mapping
from toolkit.launching import horovodrun, hosts


def test_a_host_list_parses_and_joins_back():
    assert host_list.parse("lbl-h1:2,lbl-h2:1") == {"lbl-h1": 2, "lbl-h2": 1}
    assert host_list.parse("a:1,b:2,a:3") == {"a": 4, "b": 2}  # named twice: the slots add up
    assert host_list.join({"a": 1, "b.example.org": 16}) == "a:1,b.example.org:16"
    for bad in ("a", "a:0", "a:1,", ":1", "a:-1", "a b:1", ""):
        with pytest.raises(ConfigError, match="name:slots"):
            host_list.parse(bad)


@pytest.mark.parametrize(
    "nodes, tasks, expected",
    [
        ("lbl-h[1-3,5]", "2(x3),1", "lbl-h1:2,lbl-h2:2,lbl-h3:2,lbl-h5:1"),
        ("node07", "8", "node07:8"),
        ("a[01-02],b3", "1,4(x2)", "a01:1,a02:4,b3:4"),  # zero padding kept, two lists
        ("gpu-[9-11]", "4(x3)", "gpu-9:4,gpu-10:4,gpu-11:4"),
    ],
)
def test_a_slurm_allocation_expands_to_horovodruns_hosts(nodes, tasks, expected):
    environ = {"SLURM_JOB_NODELIST": nodes, "SLURM_TASKS_PER_NODE": tasks}
    assert hosts.from_slurm(environ) == expected


@pytest.mark.parametrize(
    "environ, message",
    [
        ({}, "needs a Slurm allocation"),
        ({"SLURM_JOB_NODELIST": "a[1-2]"}, "needs a Slurm allocation"),
        ({"SLURM_JOB_NODELIST": "a[1-", "SLURM_TASKS_PER_NODE": "1"}, "Slurm allocation"),
        ({"SLURM_JOB_NODELIST": "a[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}, "names 3 nodes"),
    ],
)
def test_a_missing_or_malformed_slurm_allocation_is_refused(environ, message):
    with pytest.raises(ConfigError, match=message):
        hosts.from_slurm(environ)


def test_a_hostfile_in_horovodruns_format(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# the cluster\nlbl-h1 slots=2\n\nlbl-h2   slots = 1  # one core\nlbl-h3\n")
    assert hosts.read_hostfile(path) == "lbl-h1:2,lbl-h2:1,lbl-h3:1"
    path.write_text("lbl-h1 slots=2\nlbl-h2 slots=0\n")
    with pytest.raises(ConfigError, match="line 2: expected 'name slots=N'"):
        hosts.read_hostfile(path)
    path.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="lists no host"):
        hosts.read_hostfile(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        hosts.read_hostfile(tmp_path / "missing")
    with pytest.raises(ConfigError, match="not both"):
        hosts.resolve("a:1", path)


def test_auto_outside_slurm_and_a_bad_hostfile_exit_2_before_anything_starts(
    tmp_path, monkeypatch, subprocess_env
):
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("SLURM_")}
    runs = tmp_path / "runs"
    auto = run_cli(["launch", "experiments/quickstart.yaml", "--hosts", "auto"], runs, env)
    assert auto.returncode == 2 and "needs a Slurm allocation" in auto.stderr
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("lbl-h1 slots=x\n")
    bad = run_cli(["launch", "experiments/quickstart.yaml", "--hostfile", str(hostfile)], runs, env)
    assert bad.returncode == 2 and "line 1" in bad.stderr and "Traceback" not in bad.stderr
    assert not runs.exists() or not list(runs.iterdir())


def test_ssh_fields_are_validated_and_reach_horovodrun(tmp_path):
    from toolkit.launching.executors.local import horovodrun_argv
    from toolkit.runs.rundir import RunDir

    config = from_mapping(
        {
            "workers": 2,
            "hosts": "lbl-h1:1,lbl-h2:1",
            "ssh_port": 2222,
            "ssh_identity_file": "/keys/id_ed25519",
            "network_interface": "lbl0",
        }
    )
    argv = horovodrun_argv(config, RunDir.create(tmp_path, "r", config), resume=False)
    at = argv.index("-H")
    assert argv[at : at + 8] == [
        "-H",
        "lbl-h1:1,lbl-h2:1",
        "-p",
        "2222",
        "-i",
        "/keys/id_ed25519",
        "--network-interfaces",
        "lbl0",
    ]
    bad = {"ssh_port": 70000, "ssh_identity_file": "", "network_interface": "eth0; rm -rf /"}
    with pytest.raises(ConfigError) as refused:
        from_mapping(bad)
    for field in bad:
        assert f"\n  {field}: " in str(refused.value)


def test_elastic_discovery_reads_a_hosts_file_or_runs_a_script(tmp_path):
    listed = tmp_path / "hosts"
    listed.write_text("lbl-h1:2\n\nlbl-h2\n")  # a bare name is one slot, as Horovod reads it
    assert hosts.discover(listed) == "lbl-h1:2,lbl-h2:1"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listed}\necho lbl-h3:4\n")
    script.chmod(0o755)
    assert hosts.is_script(script) and not hosts.is_script(listed)
    assert hosts.discover(script) == "lbl-h1:2,lbl-h2:1,lbl-h3:4"
    for text, message in [
        ("", "lists no host"),
        ("lbl-h1:two\n", "hosts must be name:slots"),
        ("#!/bin/sh\nexit 3\n", "exited with code 3"),
    ]:
        bad = tmp_path / "bad"
        bad.write_text(text)
        bad.chmod(0o755 if text.startswith("#!") else 0o644)
        with pytest.raises(ConfigError, match=f"elastic.discovery: {bad}") as refused:
            hosts.discover(bad)
        assert message in str(refused.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        hosts.discover(tmp_path / "missing")
    endless = tmp_path / "endless"
    for body, message in [("exec yes lbl-h1:1", "printed more than"), ("sleep 60", "killed")]:
        endless.write_text(f"#!/bin/sh\n{body}\n")
        endless.chmod(0o755)
        started = time.monotonic()
        with pytest.raises(ConfigError, match=message):
            hosts.discover(endless, timeout=1)
        assert time.monotonic() - started < 10


def test_an_elastic_run_reaches_horovodrun_through_its_discovery_script(tmp_path):
    from toolkit.launching.executors.local import horovodrun_argv
    from toolkit.runs.rundir import RunDir

    listed = tmp_path / "hosts"
    listed.write_text("lbl-h1:1\nlbl-h2:1\n")
    elastic = {"min_workers": 1, "max_workers": 2, "discovery": str(listed), "cooldown_s": 3}
    config = from_mapping(
        {"workers": 2, "batch": {"global_size": 64}, "elastic": elastic, "lost_worker_after_s": 12}
    )
    run = RunDir.create(tmp_path, "r", config)
    argv = horovodrun_argv(config, run, resume=False)
    assert "-H" not in argv
    assert argv[argv.index("--gloo-timeout-seconds") + 1] == "12"  # as every launch has
    at = argv.index("--min-np")
    assert argv[at : at + 11] == [
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(run.discovery_path.resolve()),
        "--elastic-timeout",
        "600",
        "--blacklist-cooldown-range",
        "3",
        "3600",
    ]
    assert hosts.discover(run.discovery_path) == "lbl-h1:1,lbl-h2:1"  # it prints the file
    listed.write_text("lbl-h3:2\n")  # ... as it is now, every time horovodrun runs it
    assert hosts.discover(run.discovery_path) == "lbl-h3:2"
    never = from_mapping({**config.model_dump(), "elastic": {**elastic, "cooldown_s": 0}})
    assert "--blacklist-cooldown-range" not in horovodrun_argv(never, run, resume=False)


def test_the_launcher_answers_horovods_build_probe_instead_of_importing_tensorflow(
    subprocess_env, monkeypatch
):
    """toolkit.launching.horovodrun is horovodrun with its Gloo probe answered (set-up checked
    it): a --gloo launch imports no TensorFlow in the launcher, and a Horovod that stops asking
    by that name is refused with the reason, not silently probed."""
    probe = (
        "import sys; from toolkit.launching import horovodrun; horovodrun.answers(); "
        "from horovod.runner import launch; "
        "print(launch.gloo_built(), 'tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=subprocess_env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["True", "False"], out.stderr
    command = [*horovodrun.COMMAND, "--gloo", "-np", "2"]
    command += ["-H", "localhost:2", sys.executable, "-c", "print('worker')"]
    ran = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.count("worker") == 2, ran.stdout + ran.stderr

    from horovod.runner import launch

    monkeypatch.delattr(launch, "gloo_built")
    with pytest.raises(RuntimeError, match="has no gloo_built: this Horovod probes its build"):
        horovodrun.answers()
