"""Train one experiment: ``python -m toolkit.train CONFIG [--set k=v] [--run-dir D] [--resume]``.

Under ``horovodrun -np N`` this is data-parallel: every worker reads its own shard, gradients
are averaged with one grouped allreduce per update, and rank 0 alone writes the run directory
(config, meta, status, events, checkpoints) and prints progress. In one process without
horovodrun it runs unchanged, which is how notebooks call :func:`train`.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import keras

from toolkit import config as config_lib
from toolkit.files import WriteError
from toolkit.parallel import distributed, elastic
from toolkit.runs import checkpoints, monitor, processes
from toolkit.runs.events import EventWriter, read_events, truncate_after
from toolkit.runs.rundir import RunDir, RunError
from toolkit.scaling import adaptive_batch
from toolkit.scaling.noise_scale import Smoother
from toolkit.training import callbacks
from toolkit.training.experiment import (
    adascale_of,
    batch_plan,
    build_model,
    build_optimizer,
    last_epoch,
    load_dataset,
    noise_batches,
    steps_per_epoch,
    test_batches,
    train_batches,
)


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
    join (:func:`_fit_elastic`); it needs the config's ``elastic`` section and ``run_dir``,
    where every worker, a late one included, writes once it is rank 0.
    """
    fusion_bytes = int(config.allreduce.fusion_threshold_mb * 2**20)
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
    try:
        if run:
            started = run.status().get("started") if resume else None  # a resumed run's clock
            run.record_processes(*workers)
            # a run trained here again (a notebook resuming a stopped run) starts afresh;
            # a launched run was reset by its launch, and a stop asked meanwhile must hold
            again = dict(stop_requested=False, exit_code=None, reason=None, finished=None)
            again = again if role == processes.IN_PROCESS else {}
            run.set_status("running", world_size=world, started=started or time.time(), **again)
            run.update_meta(run_id=run.run_id, **_meta(config, world), **(meta or {}))
        previous_policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(config.precision)
        try:
            _fit(
                config,
                run,
                Path(run_dir) if run_dir else None,
                resume,
                rank0,
                world,
                verbose,
                view,
            )
        finally:
            keras.config.set_dtype_policy(previous_policy)
    except BaseException as error:
        run = _recorder(run, run_dir)
        if run:
            stopped = isinstance(error, KeyboardInterrupt)
            reason = (
                str(error)  # names the file and the cause
                if isinstance(error, WriteError)
                else "".join(traceback.format_exception_only(type(error), error)).strip()
            )
            try:
                run.finish("stopped" if stopped else "failed", reason=reason, finished=time.time())
            except (OSError, RunError):  # unrecordable: it reads failed once its processes end
                pass
        raise
    else:
        run = _recorder(run, run_dir)
        if run:
            run.finish("completed", exit_code=0, finished=time.time())
    finally:
        if heartbeat:
            heartbeat.stop()
        if view is not None:  # its last look: the final state, whatever it is
            view.close(run.status())
    return run


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


def _fit(config, run, run_dir, resume, rank0, world, verbose, view):
    keras.utils.set_random_seed(config.seed)
    dataset = load_dataset(config)
    spe = steps_per_epoch(config, len(dataset.x_train), world)
    elastic_run = distributed.elastic()
    # an elastic run measures the noise scale in the allreduce hook whatever its world, as
    # several workers do: the step's intervals are those of its largest world
    per_execution = steps_per_execution(
        config, spe, max(config.world_sizes()) if elastic_run else world
    )
    num_train = len(dataset.x_train)
    model = build_model(config, dataset)
    optimizer = build_optimizer(config, spe, world, num_train)
    adascale, plan = adascale_of(optimizer), batch_plan(config, world)
    if run:  # what a progress bar outside the run counts to, and the NaN guard's granularity
        run.update_meta(
            steps_per_epoch=spe,
            total_steps=adascale.total if adascale else config.epochs * spe,
            steps_per_execution=per_execution,
        )
    if config.precision == "mixed_float16":  # loss scaling outside, so its check is global
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    noise_every = config.noise_scale_interval(world)
    meter = None
    if distributed.collective_gradients() and (noise_every or adascale):  # in the allreduce
        on_measure = adascale.observe if adascale else None
        meter = distributed.GradientNoiseMeter(1 if adascale else noise_every, on_measure)
    optimizer = distributed.DistributedOptimizer(
        optimizer,
        **config.allreduce.model_dump(),
        updates_per_epoch=max(1, int(plan.updates(spe))),  # a sparsity warm-up's epochs
        sync=config.sync.mode,
        period=config.sync.period,
        backward_passes_per_step=config.batch.accumulation,
        noise_meter=meter,
    )
    if config.batch.adaptive:
        adaptive_batch.accumulate(optimizer, plan, model.trainable_variables)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,  # Horovod's ops cannot run inside an XLA cluster on CPU
        steps_per_execution=per_execution,
    )

    position, residuals = checkpoints.Position(0, 0), None
    smoother = Smoother(decay=config.logging.noise_scale_smoothing)
    checkpoint_dir = (run.path if run else run_dir or Path(".")) / "checkpoints"
    if resume:
        latest = checkpoints.latest(checkpoint_dir) if rank0 else None
        if rank0 and latest is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {checkpoint_dir}")
        if latest is not None:
            position = checkpoints.restore(latest, model, _state(adascale, plan))
        if elastic_run:  # no collective: its state's first sync gives rank 0's to everyone
            residuals = checkpoints.residuals(latest) if latest is not None else None
        else:
            position = checkpoints.Position(
                *distributed.broadcast_object((position.epoch, position.step))
            )
            _restore_residuals(optimizer, latest, world)
            distributed.broadcast_values(_state(adascale, plan))
            plan.reload()
        if meter is not None:  # measurements stay at the multiples of the interval
            meter.continue_from(int(plan.updates(position.step)))
        if run:
            truncate_after(run.events_path, position.step)
            _smooth_on(smoother, run.events_path)
    last = last_epoch(config, num_train, world)
    if position.epoch >= last or (adascale and _ended(adascale, plan, position.step)):
        return
    if elastic_run:
        _fit_elastic(
            config, run_dir, model, dataset, spe, position, residuals, meter, smoother, verbose
        )
        return

    counter = callbacks.StepCounter(position.step)
    hooks, writer = _callbacks(
        config, run, model, dataset, spe, counter, world, meter, smoother, plan, adascale
    )
    if run and world == 1:
        every = config.logging.every_steps
        hooks.insert(-1, callbacks.StopWhenRequested(run, counter, every_steps=every))
    if view is not None:  # after the logger: it draws what was just written
        hooks.append(
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: view.refresh(at_most_every_s=1.0),
                on_epoch_end=lambda epoch, logs: view.refresh(),
            )
        )
        verbose = 0  # the view's progress line takes the bar's place
    if adascale:  # ends the run on AdaScale's clock, and shows progress on it
        progress = callbacks.AdaScaleProgress(
            adascale, _verbosity(verbose), lambda: _ended(adascale, plan, counter.step)
        )
        hooks.insert(-1, progress)
        verbose = 0
    fit = functools.partial(
        model.fit,
        steps_per_epoch=spe,
        validation_data=test_batches(dataset),
        shuffle=False,  # the order is epoch_dataset's
        callbacks=[distributed.BroadcastInitialState(), *hooks],
        verbose=_verbosity(verbose),
    )
    try:
        if config.batch.adaptive:
            _fit_adaptive(config, fit, model, dataset, spe, position.epoch, last, plan, adascale)
        else:
            fit(
                _epochs(config, dataset, position.epoch, world, last=last),
                epochs=last,
                initial_epoch=position.epoch,
            )
    finally:
        if writer:  # ended or failed: the events' columnar copy is brought up to date
            writer.close()


def _fit_adaptive(config, fit, model, dataset, spe, first, last, plan, adascale):
    """Train from epoch ``first`` with an adaptive batch (``batch.adaptive``), a ``fit`` call
    per ``every_epochs`` epochs, the batch decided before each but the run's first
    (:func:`~toolkit.scaling.adaptive_batch.follow`) from AdaScale's averaged ``B_simple``: rank
    0's, which every worker has too (it is measured on averaged gradients). Rank 0 says when it
    changes. A resumed run decides again at the epoch it resumes at, from the same state."""
    adaptive = config.batch.adaptive
    epoch = first
    while epoch < last and not _ended(adascale, plan, epoch * spe) and not model.stop_training:
        if epoch and epoch % adaptive.every_epochs == 0:
            b_simple = distributed.broadcast_object(adascale.b_simple())
            was = plan.global_batch
            if adaptive_batch.follow(b_simple, plan, adascale, adaptive, epoch * spe):
                if distributed.is_rank0():
                    print(
                        f"epoch {epoch + 1}: global batch {was} -> {plan.global_batch} "
                        f"(B_simple {b_simple:,.0f})",
                        flush=True,
                    )
        end = min(last, epoch - epoch % adaptive.every_epochs + adaptive.every_epochs)
        fit(_epochs(config, dataset, epoch, plan.world, last=end), initial_epoch=epoch, epochs=end)
        epoch = end


def _fit_elastic(
    config, run_dir, model, dataset, spe, position, residuals, meter, smoother, verbose
):
    """Train from ``position`` under elastic horovodrun (:mod:`toolkit.parallel.elastic`).

    The state (model, optimizer, the noise meter and ``smoother``, residuals, epoch and batch)
    is committed every ``elastic.commit_every_steps`` steps and at each epoch's end. When the
    world changes, training goes on from the last commit with the workers there are: every
    worker takes its new share (:func:`~toolkit.training.experiment.train_batches`) of the same
    global batches (the per-worker batch is ``batch.global_size`` over the workers), skipping the
    committed part of the epoch, so each example of the epoch is still seen once, apart from the
    steps since the commit, which are trained again. The callbacks are rebuilt for each world
    (rank 0, who writes, may have moved), the events after the commit are dropped, and rank 0
    writes an ``elastic`` event: the step, the new and previous world size, the hosts, the
    reason and ``steps_lost`` (repeated). The workers' process records are replaced by the new
    world's, so ``status`` and ``stop`` find the living ones.

    A resumed run starts from rank 0's checkpoint (``position``, and every worker's
    ``residuals`` there, dealt out to the world there is now, whatever its size, by
    :func:`~toolkit.parallel.compression.reshard_residuals`)."""
    state = elastic.TrainingState(
        model,
        variables=meter.variables if meter is not None else (),
        smoother=smoother,
        residuals=residuals or (),
        epoch=position.epoch,
        batch=0,
    )
    reached = {"step": position.step, "world": None}  # where the last fit call got to
    test_data = test_batches(dataset)

    @elastic.run
    def fit(state: elastic.TrainingState) -> None:
        world, rank = distributed.size(), distributed.rank()
        step = state.epoch * spe + state.batch
        run = RunDir(run_dir) if distributed.is_rank0() else None
        workers = distributed.allgather_object({**processes.record("worker"), "rank": rank})
        if run:
            run.record_processes(*workers, replacing="worker", world_size=world)
        if run and state.interrupted:
            truncate_after(run.events_path, step)
            with EventWriter(run.events_path) as writer:
                writer.write(
                    {
                        "step": step,
                        "epoch": step / spe,
                        "phase": "elastic",
                        "world_size": world,
                        "previous_world_size": reached["world"],
                        "hosts": ",".join(sorted({w["host"] for w in workers})),
                        "reason": state.interrupted,
                        "steps_lost": reached["step"] - step,
                    }
                )
            print(
                f"elastic: {state.interrupted}; {reached['world']} -> {world} workers at step "
                f"{step} ({reached['step'] - step} steps to train again)",
                flush=True,
            )
        reached.update(step=step, world=world)
        counter = callbacks.StepCounter(step)
        plan = batch_plan(config, world)
        hooks, writer = _callbacks(
            config, run, model, dataset, spe, counter, world, meter, smoother, plan
        )
        hooks.append(elastic.Committer(state, config.elastic.commit_every_steps))  # last
        fit_epochs = functools.partial(
            model.fit,
            validation_data=test_data,
            shuffle=False,
            callbacks=hooks,
            verbose=_verbosity(verbose),
        )
        try:
            if state.batch:  # the rest of the epoch the reset broke into
                fit_epochs(
                    _epochs(config, dataset, state.epoch, world, skip=state.batch, count=1),
                    initial_epoch=state.epoch,
                    epochs=state.epoch + 1,
                    steps_per_epoch=spe - state.batch,
                )
            if state.epoch < config.epochs:
                fit_epochs(
                    _epochs(config, dataset, state.epoch, world),
                    initial_epoch=state.epoch,
                    epochs=config.epochs,
                    steps_per_epoch=spe,
                )
        finally:
            reached["step"] = counter.step
            if writer:
                writer.close()

    fit(state)


def _epochs(
    config,
    dataset,
    first: int,
    world: int,
    skip: int = 0,
    count: int | None = None,
    last: int | None = None,
):
    """This worker's batches of ``count`` epochs from ``first`` (default: to ``last``, itself
    by default the config's last), in order, without the first ``skip`` batches (a resumed
    epoch's done part)."""
    last = (last or config.epochs) if count is None else first + count
    return train_batches(config, dataset, first, world, distributed.rank(), last).skip(skip)


def _verbosity(verbose: int | str) -> int:
    """Keras's ``verbose`` for this worker: rank 0's bar (a line per epoch off a terminal)."""
    if not distributed.is_rank0():
        return 0
    return (1 if sys.stdout.isatty() else 2) if verbose == "auto" else verbose


def _callbacks(
    config, run, model, dataset, spe, counter, world, meter, smoother, plan, adascale=None
):
    """The callbacks of a fit with ``world`` workers (``run``: rank 0's, else ``None``), in
    their order, the NaN guard last; and the event writer, if this worker has one. ``plan``:
    how the steps group into updates. With ``adascale`` and no ``meter`` (one worker), a
    :class:`~toolkit.training.callbacks.HalfBatchMeter` measures the noise before every update."""
    logging, optimizer = config.logging, model.optimizer
    hooks = [counter, distributed.MetricAverageCallback()]
    if adascale and meter is None:
        meter = callbacks.HalfBatchMeter(_half_batches(config, dataset), adascale, counter, plan)
        hooks.append(meter)
    writer = EventWriter(run.events_path) if run else None
    if writer:
        hooks.append(
            callbacks.EventLogger(
                writer,
                counter,
                every_steps=logging.every_steps,
                steps_per_epoch=spe,
                samples_per_step=config.per_worker_batch(world) * world,
                world_size=world,
                traffic=distributed.traffic(optimizer),
                plan=plan,
                adascale=adascale,
            )
        )
        if _has_trust_ratios(config):
            every = logging.trust_ratio_every_steps
            hooks.append(callbacks.TrustRatioLogger(writer, counter, every_steps=every))
    reducer = distributed.compressed_allreduce(optimizer)
    num_train = len(dataset.x_train)
    hooks.append(  # on every worker: the residuals are gathered from all of them
        callbacks.Checkpointer(
            run.checkpoints_path if run else None,
            counter,
            every_epochs=config.checkpoint.every_epochs,
            last_epoch=last_epoch(config, num_train, world),
            gather=(
                (lambda: distributed.allgather_object(reducer.state()))
                if reducer is not None and reducer.stateful
                else None
            ),
            state=_state(adascale, plan),
            finished=(lambda: _ended(adascale, plan, counter.step)) if adascale else None,
        )
    )
    # the noise scale: from the meter's norms (the allreduce hook's with several workers, so
    # none with one worker of an elastic run: its hook has one gradient; one worker's under
    # AdaScale), else from two half batches
    if meter is None:
        measurable = config.per_worker_batch(world) >= 2
    else:
        measurable = world > 1 or isinstance(meter, callbacks.HalfBatchMeter)
    if writer and config.noise_scale_interval(world) and measurable:
        hooks.append(
            _noise_scale_logger(config, writer, counter, meter, dataset, spe, plan, smoother)
        )
    if logging.system_every_events:  # every worker: each sends its own sample
        hooks.append(
            callbacks.SystemLogger(
                writer,
                counter,
                first_step=logging.every_steps,  # the first train event's step
                every_steps=logging.every_steps * logging.system_every_events,
                steps_per_epoch=spe,
                traffic=distributed.traffic(optimizer),
            )
        )
    hooks.append(callbacks.StopOnNonFiniteLoss(counter))  # after the logger: the NaN is logged
    return hooks, writer


def steps_per_execution(config: config_lib.ExperimentConfig, spe: int, world: int) -> int:
    """How many steps Keras runs per call of the compiled train function (its
    ``steps_per_execution``), so that Python, the callbacks and the host read of the loss run
    once per ``k`` steps instead of every step.

    The rule: the largest ``k`` that divides every interval a callback acts on (the events',
    the trust ratios', the one-worker noise scale's in steps, and the epoch of ``spe`` steps),
    so each of them still acts at exactly its step, and that is below the event interval (1 if
    that is 1), so the first event's throughput clock starts before it. With several workers
    the noise scale is measured inside the compiled step at its own update
    (:class:`~toolkit.parallel.distributed.GradientNoiseMeter`) and only read by a callback, so its
    interval need not be a multiple of ``k``; ``k`` is only kept at most that interval, so every
    measurement is read before the next. AdaScale (``lr_scaling.rule: adascale``) takes ``k =
    1``: it ends at the update its clock reaches the end, and with one worker measures before
    every update. Training is unchanged: the same steps in the same
    order, to the bit. Only the NaN guard coarsens: a non-finite loss is caught at the end of
    its execution, at most ``k - 1`` steps late
    (:class:`~toolkit.training.callbacks.StopOnNonFiniteLoss`)."""
    logging = config.logging
    if config.lr_scaling.rule == "adascale":
        return 1
    intervals = [spe, logging.every_steps]
    if _has_trust_ratios(config):
        intervals.append(logging.trust_ratio_every_steps)
    noise_steps = config.noise_scale_interval(world) * config.steps_per_update(world)
    if noise_steps and world == 1:
        intervals.append(noise_steps)
    common = math.gcd(*intervals)
    most = min(common, logging.every_steps - 1)
    if noise_steps and world > 1:  # each measurement read before the next overwrites it
        most = min(most, noise_steps)
    return max((k for k in range(1, most + 1) if common % k == 0), default=1)


def _restore_residuals(optimizer, checkpoint: Path | None, world: int) -> None:
    """Give each worker the residual it had at ``checkpoint`` (read on rank 0, where
    ``checkpoint`` is known), if the run sparsifies with error feedback. A checkpoint from
    another number of workers has residuals that fit no one: they restart at zero, with a
    warning."""
    reducer = distributed.compressed_allreduce(optimizer)
    if reducer is None or not reducer.stateful:  # the same on every worker
        return
    saved = checkpoints.residuals(checkpoint) if checkpoint is not None else None
    saved = distributed.broadcast_object(saved)
    if saved is not None and len(saved) == world:
        reducer.restore(saved[distributed.rank()])
    elif distributed.is_rank0():
        found = "none" if saved is None else f"{len(saved)} workers'"
        print(f"warning: residuals restart at zero (the checkpoint holds {found}, not {world})")


def _noise_scale_logger(config, writer, counter, meter, dataset, spe, plan, smoother):
    """The ``gns`` event logger: the ``meter``'s norms (the allreduce hook's with several
    workers), else two halves of an extra batch (see
    :class:`~toolkit.training.callbacks.HalfBatchNorms`); it smooths on with ``smoother``."""
    return callbacks.NoiseScaleLogger(
        writer,
        counter,
        every_updates=config.noise_scale_interval(plan.world),
        plan=plan,
        steps_per_epoch=spe,
        smoothing=config.logging.noise_scale_smoothing,
        meter=meter,
        halves=_half_batches(config, dataset) if meter is None else None,
        smoother=smoother,
    )


def _half_batches(config, dataset) -> callbacks.HalfBatchNorms:
    """One worker's noise measurement: two halves of a fresh per-worker batch."""
    half, _ = noise_batches(config, 1)
    return callbacks.HalfBatchNorms(dataset.x_train, dataset.y_train, half, config.seed)


def _ended(adascale, plan, step) -> bool:
    """Whether an AdaScale run is over after ``step`` steps: its clock has done the base run's
    updates, and the update that did is complete (one worker measures, and so advances the
    clock, at an update's first step)."""
    return adascale.done() and plan.starts_update(step)


def _state(adascale, plan) -> list:
    """The training state outside the model and optimizer that a checkpoint keeps: AdaScale's
    clock and averages, and the batch plan (an adaptive batch's), for an AdaScale run."""
    return [*adascale.variables, *plan.variables] if adascale else []


def _smooth_on(smoother: Smoother, events_path: Path) -> None:
    """Feed ``smoother`` the measurements a resumed run logged before (its ``gns`` events), so
    smoothing goes on as if it had not stopped."""
    events = read_events(events_path)
    if "grad_sq_step" in events:
        logged = events[events.phase == "gns"]
        for pair in zip(logged.grad_sq_step, logged.trace_sigma_step, strict=True):
            smoother.update(*pair)


def _has_trust_ratios(config) -> bool:
    name, params = config.optimizer.name, config.optimizer.params
    return name == "lars" or (name == "lbsgd" and params.get("warmup_strategy") == "lars")


def _prepare_run_dir(config, run_dir, runs_root) -> RunDir:
    if run_dir is None:
        return RunDir.create_new(runs_root, config)
    run = RunDir(Path(run_dir))
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_config(config)
    return run


def _meta(config, world_size: int) -> dict:
    import horovod
    import tensorflow as tf

    return {
        "argv": sys.argv,
        "world_size": world_size,
        "global_batch": config.global_batch(world_size),
        "learning_rate": config.scaled_learning_rate(world_size),
        "seed": config.seed,
        "host": socket.gethostname(),
        "git_commit": _git_commit(),
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
