"""Train one experiment: ``python -m toolkit.train CONFIG [--set k=v] [--run-dir D] [--resume]``.

Under ``horovodrun -np N`` this is data-parallel: every worker reads its own shard, gradients
are averaged with one grouped allreduce per update, and rank 0 alone writes the run directory
(config, meta, status, events, checkpoints) and prints progress. In one process without
horovodrun it runs unchanged, which is how notebooks call :func:`train`.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

from toolkit import backends

if __name__ == "__main__":  # a worker: Keras without what it imports only because it can
    backends.import_for_a_worker()

import keras

from toolkit import advice, config_rules
from toolkit import config as config_lib
from toolkit.files import WriteError
from toolkit.parallel import distributed
from toolkit.parallel.collective_errors import collective_failed
from toolkit.rates import peak_learning_rate
from toolkit.runs import checkpoints, mlflow_live, monitor, processes, rundir
from toolkit.runs.rundir import RunDir, RunError
from toolkit.runs.states import State
from toolkit.training import callbacks, requeue
from toolkit.training.trainer import Trainer


def train(
    config: config_lib.ExperimentConfig,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    runs_root: str | Path | None = None,
    verbose: int | str = "auto",
    live: bool = False,
    meta: dict | None = None,
) -> RunDir:
    """Run ``config`` to completion and return its run directory.

    ``run_dir``: where to write (created if missing; default ``<runs_root>/<name>-<time>``).
    ``meta``: extra fields for ``meta.json`` (e.g. ``{"probe": True}``).
    ``live``: in a notebook, draw the run's curves as they grow (``monitor.LiveView``, in place
    of Keras's progress bar); elsewhere it changes nothing.
    ``resume``: continue from the directory's latest checkpoint, at the same epoch, step,
    learning-rate position and data order. Failures (including a non-finite loss, or a full
    disk) are recorded in ``status.json`` with a reason, then re-raised. Every worker's process
    is recorded there too, so the run's state and ``stop`` can find them.

    Under elastic horovodrun (``--min-np/--max-np``) the run goes on when workers leave or
    join (:meth:`~toolkit.training.trainer.Trainer.fit_elastic`); it needs the config's
    ``elastic`` section and ``run_dir``, where every worker, a late one included, writes once
    it is rank 0.
    """
    if requeue.asked():
        requeue.listen()  # before anything slow: the signal may come early
    config_rules.check_backend(config, backends.current().name)
    fusion_bytes = config.communication().fusion_bytes
    os.environ["HOROVOD_FUSION_THRESHOLD"] = str(fusion_bytes)  # read when Horovod starts
    distributed.init()
    elastic_run = distributed.elastic()
    if elastic_run and (config.elastic is None or run_dir is None):
        raise config_lib.ConfigError(
            "an elastic horovodrun (--min-np/--max-np) needs the config's elastic section and "
            "--run-dir, which workers that join later write to"
        )
    rank0, world = distributed.is_rank0(), distributed.size()
    role = "worker" if "HOROVOD_RANK" in os.environ else processes.IN_PROCESS  # see processes
    me = {**processes.record(role), "rank": distributed.rank()}
    heartbeat = processes.Heartbeat(Path(run_dir), me) if run_dir else None
    if heartbeat:  # a launched run: its readers may be on another host
        heartbeat.start()
    # an elastic run gathers its workers at each start of its world, and no sooner: a worker
    # that joins later must meet the others in the state's sync, not here
    workers = [me] if elastic_run else distributed.allgather_object(me)
    run = _prepare_run_dir(config, run_dir, runs_root) if rank0 else None
    view = monitor.LiveView(run) if run and live and monitor.in_notebook() else None
    if view is not None:
        view.show()
    mirror, ended = None, None  # rank 0's MLflow mirror, and the end it is told
    try:
        if run:
            started = run.status().get("started") if resume else None  # a resumed run's clock
            run.record_processes(*workers)
            # a run trained here again (a notebook resuming a stopped run) starts afresh;
            # a launched run was reset by its launch, and a stop asked meanwhile must hold
            again = dict(
                stop_requested=False, stop_as=None, exit_code=None, reason=None, finished=None
            )
            # the time it lay stopped is not the run's; trained afresh, it has none
            again["paused_s"] = rundir.paused_s(run.recorded_status()) if resume else 0.0
            again = again if role == processes.IN_PROCESS else {}
            run.set_status(State.RUNNING, world_size=world, started=started or time.time(), **again)
            run.update_meta(run_id=run.run_id, **_meta(config, world), **(meta or {}))
            if config.logging.mlflow is not None:
                mirror = mlflow_live.LiveMirror(run, config.logging.mlflow).start()
        previous_policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(config.precision)
        try:
            # in a notebook's kernel the advice shows here; a launched run's launch gave it
            advise = run is not None and role == processes.IN_PROCESS and not resume
            directory = Path(run_dir) if run_dir else None
            _fit(config, run, directory, resume, world, verbose, view, advise)
        finally:
            keras.config.set_dtype_policy(previous_policy)
    except requeue.Requeue:  # not an end: the job's driver requeues it
        raise
    except BaseException as error:
        ended = State.STOPPED if isinstance(error, KeyboardInterrupt) else State.FAILED
        run = _recorder(run, run_dir)
        if run:
            try:
                _record_end(run, error, supervised=role != processes.IN_PROCESS)
            except (OSError, RunError):  # unrecordable: it reads failed once its processes end
                pass
        raise
    else:
        ended = State.COMPLETED
        run = _recorder(run, run_dir)
        if run:
            run.finish(State.COMPLETED, exit_code=0, finished=time.time())
    finally:
        if mirror is not None:  # a requeued run (no end) stays running in MLflow too
            mirror.close(ended)
        if heartbeat:
            heartbeat.stop()
        if view is not None:  # its last look: the final state, whatever it is
            view.close(run.status())
    return run


def _record_end(run: RunDir, error: BaseException, supervised: bool) -> None:
    """Record how training ended on ``error``: stopped on an interrupt; failed with
    :func:`said_of` the error, or, where a supervisor waits on the launcher (a launched run),
    only what training said (``training_said``): the supervisor reads the launcher's exit and
    the log and records the state and its sentence together, once
    (:func:`toolkit.launching.supervisor.record_exit`)."""
    if isinstance(error, KeyboardInterrupt):
        run.finish(State.STOPPED, reason="interrupted (KeyboardInterrupt)", finished=time.time())
    elif supervised and any(
        entry.get("role") == "supervisor" for entry in run.recorded_status().get("processes", [])
    ):
        run.note(training_said=said_of(error, "the traceback is in stdout.log"))
    else:  # the caller (a notebook, a script) gets the error with its traceback
        said = said_of(error, "raised to its caller with the traceback")
        run.finish(State.FAILED, reason=said, finished=time.time())


def said_of(error: BaseException, traceback_at: str) -> str:
    """An error as a reason: a :class:`WriteError` says the file and the cause itself; any
    other is its class and its message's first line (a TensorFlow error's message goes on with
    stack frames), with where its traceback is (``traceback_at``), said to be a Horovod
    collective's failure where its message shows one
    (:func:`~toolkit.parallel.collective_errors.collective_failed`: the echo of another
    worker's, which the supervisor's reading then names)."""
    if isinstance(error, WriteError):
        return str(error)
    first = (str(error).strip().splitlines() or [""])[0].strip().rstrip(":")
    said = f"{type(error).__name__}: {first}" if first else type(error).__name__
    where = "in a Horovod collective " if collective_failed(str(error)) else ""
    return f"training raised {said} {where}({traceback_at})"


def _recorder(run: RunDir | None, run_dir) -> RunDir | None:
    """The run this process records into now: rank 0's at the start; in an elastic run,
    whoever is rank 0 at the end (the first may be gone). ``None`` elsewhere, and where
    Horovod is down (the supervisor records the end)."""
    if not distributed.elastic():
        return run
    try:
        return RunDir(Path(run_dir)) if distributed.is_rank0() else None
    except ValueError:  # Horovod not running
        return None


def _fit(config, run, run_dir, resume, world, verbose, view, advise):
    """Build the worker's trainer, resume it if asked, and train to the end; ``advise``: first
    issue :func:`toolkit.advice.warn`'s warnings for the config."""
    trainer = Trainer.build(config, world)
    if advise:
        advice.warn(config, peak_learning_rate(config, trainer.plan.num_train), stacklevel=3)
    if run:  # what a progress bar outside the run counts to, and the NaN guard's granularity
        run.update_meta(
            **trainer.plan.meta(), steps_per_execution=trainer.model.steps_per_execution
        )
    position, residuals = checkpoints.Position(0, 0), None
    if resume:
        checkpoint_dir = (run.path if run else run_dir or Path(".")) / "checkpoints"
        position, residuals = trainer.restore(checkpoint_dir, run)
    if trainer.finished(position):
        return
    if distributed.elastic():
        trainer.fit_elastic(run_dir, position, residuals, verbose)
        return
    progress = None
    if view is not None:  # after the logger: it draws what was just written
        progress = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: view.refresh(at_most_every_s=1.0),
            on_epoch_end=lambda epoch, logs: view.refresh(),
        )
    trainer.fit(run, position, verbose, progress)


def _prepare_run_dir(config, run_dir, runs_root) -> RunDir:
    if run_dir is None:
        return RunDir.create_new(runs_root, config)
    run = RunDir(Path(run_dir))
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_config(config)
    return run


def _meta(config, world_size: int) -> dict:
    """What ``meta.json`` says of the process that trains (the plan's numbers follow once the
    data is loaded)."""
    import horovod
    import tensorflow as tf

    return {
        "argv": sys.argv,
        "world_size": world_size,
        "seed": config.seed,
        "host": socket.gethostname(),
        "git_commit": _git_commit(),
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "keras_backend": backends.current().name,
            "horovod": horovod.__version__,
        },
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("config", help="experiment YAML")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. optimizer.params.momentum=0.95",
    )
    parser.add_argument("--run-dir", help="run directory (default: runs/<name>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = parser.parse_args(argv)
    try:
        config = config_lib.load(args.config, args.set)
    except config_lib.ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    try:
        train(config, args.run_dir, resume=args.resume)
    except (callbacks.NonFiniteLoss, WriteError) as error:
        print(f"training failed: {error}", file=sys.stderr)
        return 1
    except requeue.Requeue as ended:  # this worker's part is done: 0, so that srun ends no
        print(ended, flush=True)  # other worker; rank 0 recorded it for the job's driver
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
