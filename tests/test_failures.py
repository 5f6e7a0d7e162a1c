"""A failed run says why in words: the worker, its host and what to do (toolkit.launching.failures).

The first tests read logs as Horovod, Gloo and horovodrun write them (their lines taken from
real failures on this machine) in a run directory whose workers' heartbeats are aged by hand.
The last one stops a worker for real (SIGSTOP) under horovodrun: the run fails after
``lost_worker_after_s`` naming that worker, and resumes from the Runs page past a damaged
latest checkpoint. The same on two hosts is in ``test_multihost``; rank 0 itself stopped
(23 s by hand: named as here) is read from its lines above.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from types import MappingProxyType

import pytest
from test_app import by_label, page
from test_checkpoint_damage import truncate
from test_train import SMALL, wait

from app.data import md_escape
from toolkit import terminal
from toolkit.config import from_mapping
from toolkit.launching import failures
from toolkit.launching import launch as launcher
from toolkit.runs import processes
from toolkit.runs.events import read_events
from toolkit.runs.rundir import TERMINAL, RunDir
from toolkit.runs.table import silence, summary

GLOO = "[/tmp/pip-wheel/horovod/third_party/compatible17_gloo/gloo/transport/tcp"
SHUT_DOWN = (
    "tensorflow.python.framework.errors_impl.UnknownError: {{function_node "
    "__wrapped__HorovodAllreduce_device_/job:localhost/replica:0/task:0/device:CPU:0}} Horovod "
    "has been shut down. This was caused by an exception on one of the ranks ..."
)
TIMED_OUT = (
    "[0]<stderr>:[2026-11-27 08:37:30.118454: E horovod/common/operations.cc:697] [0]: Horovod "
    f"background loop uncaught exception: {GLOO}/unbound_buffer.cc:81] Timed out waiting "
    "10000ms for recv operation to complete\n"
    f"[0]<stderr>:{SHUT_DOWN}\n"
    "Process 0 exit with status code 1.\nTerminating remaining workers after failure of "
    "Process 0.\nProcess 1 exit with status code 137.\nRuntimeError: Horovod detected that one "
    "or more processes exited with non-zero status, thus causing the job to be terminated. The "
    "first process to do so was:\nProcess name: 0\nExit code: 1\n"
)


def a_run(
    tmp_path, log: str, hosts: str | None = None, ages: Mapping[int, float] = MappingProxyType({})
) -> RunDir:
    """A failed 2-worker run whose ``stdout.log`` is ``log``; rank r's heartbeat last beat
    ``ages[r]`` s ago (a rank not in ``ages`` has none: it ended cleanly)."""
    config = from_mapping({**SMALL, "hosts": hosts, "lost_worker_after_s": 10})
    run = RunDir.create(tmp_path / "runs", "failed")
    run.write_config(config)
    run.stdout_path.write_text(log)
    host = {0: "vm", 1: hosts.split(",")[1].split(":")[0] if hosts else "vm"}
    workers = [
        {"role": "worker", "pid": 100 + r, "started": time.time() - 60, "host": host[r], "rank": r}
        for r in (0, 1)
    ]
    run.set_status("failed", processes=workers, finished=time.time(), reason=SHUT_DOWN)
    for rank, age in ages.items():
        path = processes.heartbeat_path(run.path, workers[rank])
        path.parent.mkdir(exist_ok=True)
        path.touch()
        os.utime(path, (time.time() - age, time.time() - age))
    return run


def explained(run: RunDir, code: int = 1) -> failures.Failure:
    return failures.explain(run, run.recorded_status(), code)


def test_a_silent_worker_is_named_by_its_stale_heartbeat(tmp_path):
    """Rank 1 last beat 12 s before the failure (it was stopped); rank 0's is gone (it ended
    cleanly after its collective failed)."""
    failure = explained(a_run(tmp_path, TIMED_OUT, ages={1: 12.0}))
    assert failure.reason == (
        "worker rank 1 on vm stopped answering: the others waited lost_worker_after_s=10 s for "
        "it in a collective, then gave up (a stopped process, by SIGSTOP or a debugger, a "
        "hang, or a cut link); resume the run to go on from its last checkpoint, or raise "
        "lost_worker_after_s if it pauses on purpose. horovodrun exited with code 1; see "
        "stdout.log"
    )
    assert failure.blames_another


def test_a_silent_rank_0_is_named_though_rank_1_exits_first(tmp_path):
    """Rank 0 stopped: rank 1 times out and exits first, and training (rank 0's) recorded
    nothing, so the failure's time is now; rank 0's heartbeat is the stale one."""
    log = (
        f"[1]<stderr>:[...] [1]: Horovod background loop uncaught exception: {GLOO}/"
        "unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to complete\n"
        "Process 1 exit with status code 1.\nTerminating remaining workers after failure of "
        "Process 1.\nProcess 0 exit with status code 137.\nProcess name: 1\nExit code: 1\n"
    )
    run = a_run(tmp_path, log, ages={0: 13.0, 1: 2.0})
    run.set_status("running", finished=None, reason=None)
    failure = explained(run)
    assert failure.reason.startswith(
        "worker rank 0 on vm stopped answering: the others waited lost_worker_after_s=10 s"
    )
    assert failure.blames_another


def test_with_every_heartbeat_fresh_it_says_it_cannot_tell_which(tmp_path):
    failure = explained(a_run(tmp_path, TIMED_OUT, ages={0: 1.0, 1: 3.0}))
    assert failure.reason.startswith(
        "a worker stopped answering: the others waited lost_worker_after_s=10 s in a "
        "collective, then gave up; every heartbeat was fresh, so the lab cannot tell which"
    )


@pytest.mark.parametrize("log", [TIMED_OUT, "Process name: 1\nExit code: 255\n"])
def test_a_host_that_no_longer_answers_ssh_has_vanished(tmp_path, log):
    """Its workers waited for (Gloo's timeout) or their ssh session gone (ssh's 255), and a real
    ssh to it failing now (its name no longer resolves): the host, not a rank, is named."""
    run = a_run(tmp_path, log, hosts="localhost:1,lbl-gone.invalid:1", ages={1: 2.0})
    assert explained(run).reason == (
        "host lbl-gone.invalid (worker ranks 1) vanished: it does not answer ssh now (powered "
        "off, or its link is down); resume the run once it is back, or without it in hosts. "
        "horovodrun exited with code 1; see stdout.log"
    )


def test_a_worker_late_at_the_rendezvous_is_named_by_gloo(tmp_path):
    log = (
        "[0]<stderr>:terminate called after throwing an instance of 'gloo::IoException'\n"
        "[0]<stderr>:  what():  [horovod/common/gloo/http_store.cc:54] Wait timeout after 10 "
        "seconds for key(s): 1. You may want to increase the timeout via "
        "HOROVOD_GLOO_TIMEOUT_SECONDS\n[0]<stderr>:Aborted\nProcess 0 exit with status code "
        "134.\nProcess name: 0\nExit code: 134\n"
    )
    assert explained(a_run(tmp_path, log)).reason == (
        "worker rank 1 on vm did not join the others within lost_worker_after_s=10 s of the "
        "start: it started late (a slow import or file system, a busy host) or cannot reach "
        "horovodrun's rendezvous; raise lost_worker_after_s, or see its lines. horovodrun "
        "exited with code 1; see stdout.log"
    )


@pytest.mark.parametrize(
    "line, says",
    [
        (
            f"{GLOO}/pair.cc:799] connect [10.213.0.12]:42123: Connection refused",
            "could not connect to a peer at 10.213.0.12 (connection refused): a firewall",
        ),
        (
            f"{GLOO}/pair.cc:446] Connect timeout [10.213.0.12]:42123",
            "could not connect to a peer at 10.213.0.12 (connection timed out): a firewall",
        ),
        ("HTTP request failed.", "could not reach horovodrun's rendezvous"),
    ],
)
def test_a_worker_that_cannot_connect_is_named_with_the_address(tmp_path, line, says):
    log = f"[1]<stderr>:{line}\nProcess name: 1\nExit code: 1\n"
    reason = explained(a_run(tmp_path, log, hosts="localhost:1,lbl-h2:1")).reason
    assert reason.startswith(f"worker rank 1 on lbl-h2 {says}"), reason
    assert "set network_interface" in reason


@pytest.mark.parametrize(
    "code, says",
    [
        (137, "(killed by SIGKILL: the kernel's out-of-memory killer, or by hand); resume the run"),
        (-15, "(killed by SIGTERM); resume the run to go on from its last checkpoint."),
        (255, "(ssh's code: killed by a signal on that host, or the connection was lost); resume"),
        (1, "exited with code 1; horovodrun exited"),
    ],
)
def test_the_first_worker_to_exit_is_named_with_what_its_code_says(tmp_path, code, says):
    log = f"Process name: 1\nExit code: {code}\n"
    assert says in explained(a_run(tmp_path, log)).reason


def test_a_failed_collective_gives_way_to_the_worker_it_echoes_and_nothing_else_does():
    """Training's own reason stays (a non-finite loss on rank 0) unless it is only Horovod
    saying that a peer failed."""
    named = failures.Failure("worker rank 1 on vm stopped answering", blames_another=True)
    assert failures.overrides(named, SHUT_DOWN)
    assert failures.overrides(named, f"Read error {GLOO}: Connection reset by peer")
    assert failures.overrides(named, None)
    assert not failures.overrides(named, "non-finite loss nan at step 40")
    assert not failures.overrides(failures.Failure("horovodrun exited"), SHUT_DOWN)


def test_an_error_is_said_in_one_line_with_where_its_traceback_is():
    """Defect 2 of the third walk: TensorFlow's message for a failed collective went on with a
    screen of stack frames, and was the run's reason."""
    from toolkit.train import said_of

    raised = RuntimeError(
        "Graph execution error:\n\nDetected at node LARS/HorovodGroupedAllreduce defined at "
        '(most recent call last):\n  File "train.py", line 1, in <module>\n'
    )
    said = said_of(raised, "the traceback is in stdout.log")
    assert said == (
        "training raised RuntimeError: Graph execution error in a Horovod collective "
        "(the traceback is in stdout.log)"
    )
    assert failures.collective_failed(said)  # so a sentence naming the lost worker replaces it
    plain = said_of(ValueError("loss is nan at step 21"), "raised to its caller")
    assert plain == "training raised ValueError: loss is nan at step 21 (raised to its caller)"


def stop_a_worker(run: RunDir, rank: int, epoch: int = 1) -> int:
    """SIGSTOP ``run``'s worker of ``rank`` once its ``epoch`` checkpoint exists; its pid."""
    deadline = time.time() + 180
    while not (run.checkpoints_path / f"epoch-{epoch:04d}").exists():
        assert time.time() < deadline and run.status()["state"] not in TERMINAL
        time.sleep(0.1)
    (worker,) = [p for p in run.status()["processes"] if p.get("rank") == rank]
    os.kill(worker["pid"], signal.SIGSTOP)
    return worker["pid"]


def failed_after(run: RunDir, pid: int) -> tuple[dict, float]:
    """The status once the supervisor has recorded horovodrun's exit, and the seconds it took
    from now; the stopped ``pid`` is then killed (horovodrun's SIGTERM waits on it). Every
    reading on the way, as a reader sees the run, that said ``failed`` said it with the final
    reason: the state and its sentence change together, once (rank 0's collective error,
    seconds earlier, is not a reason at any moment)."""
    stopped_at, failed_with = time.monotonic(), set()
    try:
        while "released" not in (status := run.recorded_status()):
            assert time.monotonic() - stopped_at < 90, run.stdout_path.read_text()[-3000:]
            if (seen := run.status())["state"] == "failed":
                failed_with.add(seen["reason"])
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert failed_with <= {status["reason"]}, failed_with
    return status, time.monotonic() - stopped_at


def stopped_answering(rank: int) -> str:
    host = processes.record("worker")["host"]
    return (
        f"worker rank {rank} on {host} stopped answering: the others waited "
        "lost_worker_after_s=10 s for it in a collective"
    )


def test_after_a_stopped_worker_the_runs_page_resumes_past_a_damaged_checkpoint(runs):
    """Rank 1 stopped after the second checkpoint: the run is said to be silent (``show``,
    ``runs``) before it fails naming it; its latest checkpoint then truncated, the Runs page
    warns of it for the chosen run, and its Resume button continues from the one before to
    the end, which ``show`` says."""
    run = launcher.launch(from_mapping({**SMALL, "epochs": 4, "lost_worker_after_s": 10}))
    pid, stopped = stop_a_worker(run, 1, epoch=2), time.monotonic()
    while not (silent := silence(summary(run), time.time())):  # said before the run fails
        assert time.monotonic() - stopped < 9 and run.status()["state"] == "running"
        time.sleep(0.2)
    assert silent.startswith("no event for ") and silent.endswith(": a worker may be stuck")
    shown = terminal.run_text(run)
    assert f"{run.run_id}: running\n  reason: no event for " in shown
    assert "no event for " in terminal.runs_table(run.path.parent)
    silent_s = time.monotonic() - stopped
    status, took = failed_after(run, pid)
    assert status["state"] == "failed" and silent_s + took >= 10
    assert status["reason"].startswith(stopped_answering(1)), status["reason"]
    assert f"  reason: {status['reason']}\n" in terminal.run_text(run)  # the whole of it
    *_, before, latest = sorted(p.name for p in run.checkpoints_path.glob("epoch-*"))
    said = truncate(run.checkpoints_path / latest)

    ran_s = status["finished"] - status["started"]  # and, as if it had failed an hour ago:
    run.set_status("failed", finished=status["finished"] - 3600, started=status["started"] - 3600)
    at = page("runs")
    (row,) = at.dataframe[0].value.query("run_id == @run.run_id").to_dict("records")
    assert row["checkpoint"] == "⚠ damaged"  # defect 11 of the third walk: in its row
    at.selectbox(key="runs_run").set_value(run.run_id).run()
    assert [w.value for w in at.warning] == [
        md_escape(f"latest checkpoint {latest} damaged ({said}); a resume starts from {before}")
    ]
    by_label(at.button, "Resume").click().run()
    assert not at.exception, at.exception
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    events = read_events(run.events_path)
    (event,) = events[events.phase == "checkpoint"].to_dict("records")
    assert (event["checkpoint"], event["reason"], event["resumed_from"]) == (latest, said, before)
    at.switch_page("views/detail.py").run()
    by_label(at.selectbox, "Run").set_value(run.run_id).run()
    (details,) = [t.value for t in at.text if t.value.startswith("state: completed")]
    assert f"resumed from checkpoint {before}, passing over {latest} ({said})" in details
    assert "pid:" not in details  # an ended run's pid is dead: not shown
    assert f"  resumed from checkpoint {before}, passing over {latest}" in terminal.run_text(run)
    assert ran_s < summary(run)["duration_s"] < ran_s + 300  # the hour stopped is not counted
