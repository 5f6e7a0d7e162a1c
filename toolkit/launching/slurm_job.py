"""Inside a Slurm job: the run's supervisor on the first node, and each rank's start.

``python -m toolkit.launching.slurm_job drive RUN_DIR`` is the job script's one command
(:func:`toolkit.launching.slurm.job_script`). On the job's first node it

1. records itself as the run's supervisor (with a heartbeat, so readers on other hosts see it);
2. places the ranks on the allocation's nodes as horovodrun would (Horovod's own
   ``get_host_assignments`` over ``SLURM_JOB_NODELIST`` and ``SLURM_TASKS_PER_NODE``) and starts
   Horovod's Gloo rendezvous server (Horovod's ``RendezvousServer``) on the interface the ranks
   share: the run's ``network_interface``, else the one this node reaches the next node
   through (loopback on one node);
3. starts every rank with ``srun`` (one task each, ``--kill-on-bad-exit``: one rank's failure
   ends the step), each as ``python -m toolkit.launching.slurm_job rank -- TRAIN ARGV``, which
   finds its slot by its node and its local task id, sets Horovod's variables for it, and
   becomes ``python -m toolkit.train`` (``--resume`` when the run has a checkpoint: a requeued
   job, or a resubmitted one, goes on from it);
4. on Slurm's ``USR1`` (the time limit or a preemption ahead, ``--signal=B:USR1@...``) passes
   the signal to the ranks, which checkpoint and end, and requeues the job
   (:mod:`toolkit.training.requeue`: the protocol, step by step);
5. otherwise records the run's end as the local supervisor does
   (:func:`toolkit.launching.supervisor.record_exit`), srun's words naming a failed rank.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from toolkit import host_list
from toolkit.launching import hosts as hosts_lib
from toolkit.launching import remote, slurm, supervisor
from toolkit.launching.executors.slurm import SlurmExecutor  # noqa: F401  (its failure reading)
from toolkit.runs import checkpoints, processes
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import State
from toolkit.training import requeue

PLAN_ENV = "LBL_SLURM_PLAN"
SLOT_FIELDS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


def drive(run: RunDir) -> int:
    """The supervisor of ``run`` inside its job; returns the job's exit code."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars
    from horovod.runner.http.http_server import RendezvousServer

    signalled = threading.Event()  # Slurm's signal may come at any time from now on
    signal.signal(signal.SIGUSR1, lambda *_: signalled.set())
    signal.signal(signal.SIGTERM, lambda *_: None)  # scancel: outlive the step to record it
    me = processes.record("supervisor")
    heartbeat = processes.Heartbeat(run.path, me)
    heartbeat.start()
    run.record_processes(me, replacing="supervisor", reason=None, requeue_step=None)
    run.set_status(State.STARTING)  # until train.py says its workers are training
    config = run.config()
    allocation = hosts_lib.from_slurm()
    slots = get_host_assignments(parse_hosts(allocation), config.workers)
    interface = _interface(config, list(host_list.parse(allocation)))
    rendezvous = RendezvousServer()
    port = rendezvous.start()
    rendezvous.init(slots)
    plan = [{"host": s.hostname, **{f: getattr(s, f) for f in SLOT_FIELDS}} for s in slots]
    gloo = create_run_env_vars(_address(interface), [interface], port)
    env = {
        **os.environ,
        **{name: str(value) for name, value in gloo.items()},
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(config.lost_worker_after_s),  # horovodrun's option
        PLAN_ENV: json.dumps(plan),
        requeue.ENV: "1",
    }
    train = supervisor.train_argv(run, resume=checkpoints.latest(run.checkpoints_path) is not None)
    gpus = [f"--gpus-per-task={config.slurm.gpus_per_task}"] if config.slurm.gpus_per_task else []
    ranks = [sys.executable, "-m", "toolkit.launching.slurm_job", "rank", "--", *train]
    step = subprocess.Popen(
        ["srun", f"--ntasks={config.workers}", "--kill-on-bad-exit=1", *gpus, *ranks],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    code = requeue.pass_on(step, signalled)
    rendezvous.stop()
    job_id = os.environ["SLURM_JOB_ID"]
    if requeue.checkpointed(run.recorded_status()):  # whatever srun's code
        said = f"checkpointed on Slurm's signal ahead of the job's end; job {job_id} requeued"
        print(f"[lab] {said}", flush=True)
        run.set_status(State.QUEUED, reason=said)
        heartbeat.stop()
        slurm.requeue(job_id)
        return 0
    supervisor.record_exit(run, me, code)
    heartbeat.stop()
    return code


def _array_task_run(listing: str) -> RunDir:
    """A job array task's run: line ``SLURM_ARRAY_TASK_ID + 1`` of the array's list, with this
    process's output sent to its ``stdout.log`` from here on (the array's own output file
    keeps what came before)."""
    paths = Path(listing).read_text().splitlines()
    run = RunDir(Path(paths[int(os.environ["SLURM_ARRAY_TASK_ID"])]))
    log = os.open(run.stdout_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for stream in (1, 2):
        os.dup2(log, stream)
    os.close(log)
    return run


def rank(argv: list[str]) -> None:
    """Become this task's rank: Horovod's variables for the slot the driver's plan gives this
    node and local task id, then ``argv`` in place of this process."""
    plan = json.loads(os.environ[PLAN_ENV])
    node, local = os.environ["SLURMD_NODENAME"], int(os.environ["SLURM_LOCALID"])
    slot = next((s for s in plan if s["host"] == node and s["local_rank"] == local), None)
    if slot is None:
        sys.exit(f"[lab] Slurm placed task {local} on {node}, where the plan has no slot: {plan}")
    os.environ["HOROVOD_HOSTNAME"] = node
    for field in SLOT_FIELDS:
        os.environ[f"HOROVOD_{field.upper()}"] = str(slot[field])
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # kept across exec, until training listens
    os.execv(argv[0], argv)


def _interface(config, nodes: list[str]) -> str:
    """The interface the ranks talk over (see the module's docstring)."""
    if config.network_interface:
        return config.network_interface.split(",")[0]
    others = [n for n in nodes if n != os.environ.get("SLURMD_NODENAME", socket.gethostname())]
    return (remote.interface_towards(others[0]) if others else None) or "lo"


def _address(interface: str) -> str:
    for address in psutil.net_if_addrs().get(interface, []):
        if address.family == socket.AF_INET:
            return address.address
    raise OSError(f"this node has no IPv4 address on {interface!r} for the rendezvous")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m toolkit.launching.slurm_job")
    parser.add_argument("command", choices=["drive", "rank"])
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.command == "drive":
        sys.exit(
            drive(
                _array_task_run(args.argv[1])
                if args.argv[0] == "--list"
                else RunDir(Path(args.argv[0]))
            )
        )
    rank(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
