"""This machine: a run waits for its slots in the launch queue (:mod:`toolkit.launching.slots`)
under a supervisor (:mod:`toolkit.launching.supervisor`), which then runs::

    horovodrun --gloo -np N -H localhost:N python -m toolkit.train runs/<id>/config.yaml ...

(horovodrun as :mod:`toolkit.launching.horovodrun` runs it: Horovod's launcher without its build
probe; for an elastic run ``--min-np M --max-np X --host-discovery-script ...`` in place of
``-H``) as an argv list, never a shell string, with output to ``stdout.log``. The supervisor,
horovodrun and every worker record themselves in ``status.json`` (:mod:`toolkit.runs.processes`),
so :meth:`LocalExecutor.end` finds and ends them all, on every host they ran on, even when the
supervisor itself was killed. The hosts executor (:mod:`toolkit.launching.executors.hosts`) is
this one with other hosts in ``-H``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit import backends
from toolkit.config import ExperimentConfig
from toolkit.files import writing
from toolkit.launching import horovodrun, preflight, remote, slots, supervisor
from toolkit.launching import hosts as hosts_lib
from toolkit.launching.executors.base import Executor
from toolkit.runs import processes
from toolkit.runs.rundir import RunDir


class LocalExecutor(Executor):
    """This machine, under the launch queue and a supervisor (see the module's docstring)."""

    kind = "local"
    title = "This machine"

    @classmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        return True  # where no other place is asked for

    def check(self, config: ExperimentConfig, root: Path) -> None:
        slots.check_fits(slots.slots_of(config), root)
        preflight.check(config, root)

    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        return "this machine"

    def argv(self, config: ExperimentConfig, run: RunDir, resume: bool) -> list[str]:
        """The command line the supervisor starts once the run has its slots."""
        return horovodrun_argv(config, run, resume)

    def start(self, run: RunDir, config: ExperimentConfig, resume: bool, meta: dict) -> None:
        argv = self.argv(config, run, resume)
        # a resumed run holds no slots until its new supervisor takes them
        self.queued(run, config, launched=None, released=None, slots=None)
        self.record_launch(run, config, argv, meta)
        slots.enqueue(run, slots.slots_of(config))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["KERAS_BACKEND"] = backends.of_run(run.meta())
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(remote.PACKAGE_ROOT), env.get("PYTHONPATH")])
        )
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        with writing(run.stdout_path):
            log = os.open(run.stdout_path, flags, 0o644)
        try:
            started = subprocess.Popen(
                supervisor.command(run, argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        finally:
            os.close(log)
        run.record_processes(processes.record("supervisor", started.pid), pid=started.pid)

    def end(self, run: RunDir, status: dict, timeout: float) -> list[str]:
        """End the run's recorded processes on every host at once, here directly and elsewhere
        over ssh with the run's options (the supervisors and this process are spared)."""
        entries = run.process_records(status)
        by_host: dict[str, list[dict]] = {}
        for entry in entries:
            by_host.setdefault(entry.get("host", ""), []).append(entry)
        try:
            ssh = remote.Ssh.of(run.config())
        except (ValueError, OSError):  # an unreadable config: the default options
            ssh = remote.Ssh()

        def end_on(host: str) -> str | None:
            mine = by_host[host]
            try:
                if processes.is_local(mine[0]):
                    left = [p.pid for p in processes.terminate_records(mine, timeout)]
                else:
                    left = processes.terminate_on(host, mine, timeout, ssh)
            except OSError as error:
                return str(error)
            if not left:
                return None
            return f"processes {', '.join(map(str, left))} on {host} survived SIGKILL"

        with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
            problems = [problem for problem in pool.map(end_on, by_host) if problem]
        if not problems:  # all ended: their heartbeats would read alive for a while yet
            for entry in entries:
                if entry.get("role") != "supervisor":
                    processes.heartbeat_path(run.path, entry).unlink(missing_ok=True)
        return problems


def horovodrun_argv(config: ExperimentConfig, run: RunDir, resume: bool) -> list[str]:
    """The horovodrun command line for ``run``: Horovod's launcher, through
    :mod:`toolkit.launching.horovodrun` (without its 6-second build probe)."""
    if importlib.util.find_spec("horovod") is None:
        raise FileNotFoundError("horovodrun not found: run scripts/setup.sh first")
    hosts = config.hosts or f"localhost:{config.workers}"
    interface = remote.network_interface(config)
    ssh = [
        *(["-p", str(config.ssh_port)] if config.ssh_port else []),
        *(["-i", config.ssh_identity_file] if config.ssh_identity_file else []),
        *(["--network-interfaces", interface] if interface else []),
    ]
    where = ["-H", hosts] if config.elastic is None else _elastic_options(config, run)
    return [
        *horovodrun.COMMAND,
        "--gloo",
        "--gloo-timeout-seconds",
        str(config.lost_worker_after_s),
        "-np",
        str(config.workers),
        *where,
        *ssh,
        *supervisor.train_argv(run, resume),
    ]


def _elastic_options(config: ExperimentConfig, run: RunDir) -> list[str]:
    """horovodrun's elastic options for ``config.elastic``. A hosts file is read through
    ``<run>/discover.sh``, written here, which prints it: horovodrun runs it every second."""
    elastic = config.elastic
    script = Path(elastic.discovery).resolve()
    if not hosts_lib.is_script(script):
        with writing(run.discovery_path):
            run.discovery_path.write_text(f"#!/bin/sh\nexec cat -- {shlex.quote(str(script))}\n")
            run.discovery_path.chmod(0o755)
        script = run.discovery_path.resolve()
    cooldown = ["--blacklist-cooldown-range", str(elastic.cooldown_s), "3600"]
    return [
        "--min-np",
        str(elastic.min_workers),
        "--max-np",
        str(elastic.max_workers),
        "--host-discovery-script",
        str(script),
        "--elastic-timeout",
        str(elastic.timeout_s),
        *(cooldown if elastic.cooldown_s else []),
    ]
