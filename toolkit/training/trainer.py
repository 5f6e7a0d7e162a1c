"""One worker's training of a config: what it builds once, and the ``fit`` calls that train it.

A worker builds its data, model and optimizer once, from the config and the plan of its world
(:class:`~toolkit.plan.RunPlan`), and then trains in *stretches*, each one ``model.fit`` call
(:meth:`Trainer.stretch`) with the callbacks of its world (:meth:`Trainer.callbacks`):

- a fixed batch: one stretch, from the epoch the run starts or resumes at to its last;
- an adaptive batch (``batch.adaptive``): ``every_epochs`` epochs a stretch, the global batch
  decided before each but the run's first (:func:`~toolkit.scaling.adaptive_batch.follow`);
- an elastic run (``horovodrun --min-np/--max-np``): a stretch for as long as its world lasts;
  when workers leave or join, training goes on from the last commit with the plan and the
  callbacks of the new world (:meth:`Trainer.fit_elastic`).

Every worker runs the callbacks that make collective calls (the checkpointer's gathers, the
system sampler's, the noise meters', the requeue check), at the same steps and in the same
order; rank 0 alone has a run directory, and with it the callbacks that only write events into
it (the event and trust-ratio loggers).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import keras
import tensorflow as tf

from toolkit import backends
from toolkit.config import ExperimentConfig
from toolkit.optimizers import applies_trust_ratios, unwrapped
from toolkit.parallel import distributed, elastic, noise_meter
from toolkit.plan import RunPlan
from toolkit.runs import checkpoints, processes
from toolkit.runs.events import EventWriter, read_events, truncate_after
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import State
from toolkit.scaling import adaptive_batch
from toolkit.scaling.adaptive_batch import Accumulation
from toolkit.scaling.adascale import AdaScale
from toolkit.scaling.noise_scale import Smoother
from toolkit.training import callbacks, data, requeue
from toolkit.training.experiment import (
    adascale_of,
    build_model,
    build_optimizer,
    load_dataset,
    test_batches,
    train_batches,
)


@dataclasses.dataclass
class Trainer:
    """What one worker builds once to train ``config`` (see the module docstring): the plan
    of the world it starts in, the data, the compiled model, AdaScale's rate (or ``None``), the
    accumulation of steps into updates, the noise meter in the allreduce hook (or ``None``),
    and the noise scale's smoother, which goes on across resumes and elastic resets."""

    config: ExperimentConfig
    plan: RunPlan
    dataset: data.Dataset
    model: keras.Model
    adascale: AdaScale | None
    accumulation: Accumulation
    meter: noise_meter.GradientNoiseMeter | None
    smoother: Smoother
    test_data: tf.data.Dataset

    @classmethod
    def build(cls, config: ExperimentConfig, world: int) -> Trainer:
        """Seed, load the data, build and compile the model with its distributed optimizer
        for ``world`` workers."""
        keras.utils.set_random_seed(config.seed)
        dataset = load_dataset(config)
        plan = RunPlan.of(config, len(dataset.x_train), world)
        model = build_model(config, dataset)
        optimizer = build_optimizer(config, plan)
        adascale = adascale_of(optimizer)
        if config.precision == "mixed_float16":  # loss scaling outside, so its check is global
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        meter = None
        if distributed.collective_gradients() and (plan.noise_every or adascale):  # in the hook
            meter = noise_meter.GradientNoiseMeter(
                1 if adascale else plan.noise_every, adascale.observe if adascale else None
            )
        optimizer = distributed.DistributedOptimizer(
            optimizer,
            config.communication(),
            updates_per_epoch=plan.updates_per_epoch,  # a sparsity warm-up's epochs
            backward_passes_per_step=config.batch.accumulation,
            noise_meter=meter,
        )
        backend = backends.current()
        if adascale:  # its state, which the rate reads in the step (and the hook writes there)
            backend.carry(unwrapped(optimizer), adascale.variables)
        accumulation = Accumulation.starting(plan)
        if plan.adaptive:
            adaptive_batch.accumulate(optimizer, accumulation, model.trainable_variables)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=backend.jit_compile,
            steps_per_execution=backend.steps_per_execution(
                plan.steps_per_execution(applies_trust_ratios(optimizer))
            ),
        )
        smoother = Smoother(decay=plan.noise_smoothing)
        return cls(
            config, plan, dataset, model, adascale, accumulation, meter, smoother,
            test_batches(dataset),
        )  # fmt: skip

    @property
    def state(self) -> list:
        """The training state outside the model and optimizer that a checkpoint keeps:
        AdaScale's clock and averages, and the accumulation (an adaptive batch's), for an
        AdaScale run."""
        if self.adascale is None:
            return []
        return [*self.adascale.variables, *self.accumulation.variables]

    def ended(self, step: int) -> bool:
        """Whether an AdaScale run is over after ``step`` steps: its clock has done the base
        run's updates, and the update that did is complete (one worker measures, and so
        advances the clock, at an update's first step)."""
        return self.adascale.done() and self.accumulation.starts_update(step)

    def finished(self, position: checkpoints.Position) -> bool:
        """Whether a run at ``position`` has nothing left to train."""
        return position.epoch >= self.plan.last_epoch or bool(
            self.adascale and self.ended(position.step)
        )

    # ---------------------------------------------------------------------------- resuming

    def restore(
        self, checkpoint_dir: Path, run: RunDir | None
    ) -> tuple[checkpoints.Position, list | None]:
        """Continue from the latest intact checkpoint in ``checkpoint_dir`` (rank 0's; ``run``
        is rank 0's, else ``None``), passing over damaged ones, each said in the log and as a
        ``checkpoint`` event (:func:`~toolkit.runs.checkpoints.latest_intact`) after a
        ``resume`` event naming the one resumed from: its position,
        and in an elastic run every worker's residuals there, which the run's state deals out
        (elsewhere each worker takes its own now). The events after the checkpoint are
        dropped and the smoother fed the ones before, so smoothing goes on as if the run had
        not stopped."""
        rank0 = distributed.is_rank0()
        position, residuals = checkpoints.Position(0, 0), None
        latest, damaged = checkpoints.latest_intact(checkpoint_dir) if rank0 else (None, [])
        for checkpoint, problem in damaged:
            print(f"checkpoint {checkpoint.name} is damaged, passed over: {problem}", flush=True)
        if rank0 and latest is None:
            raise FileNotFoundError(f"--resume: {checkpoints.none_intact(checkpoint_dir, damaged)}")
        if distributed.one_program():  # assignments are collective: every worker loads it
            name = distributed.broadcast_object(latest.name if latest is not None else None)
            latest = checkpoint_dir / name if name is not None else None
        if latest is not None:
            position = checkpoints.restore(latest, self.model, self.state)
            if rank0:
                print(f"resuming from checkpoint {latest.name} (step {position.step})", flush=True)
        if distributed.elastic():  # no collective: its state's first sync gives rank 0's
            residuals = checkpoints.residuals(latest) if latest is not None else None
        else:
            position = checkpoints.Position(
                *distributed.broadcast_object((position.epoch, position.step))
            )
            self._restore_residuals(latest)
            distributed.broadcast_values(self.state)
            self.accumulation.reload()
        if self.meter is not None:  # measurements stay at the multiples of the interval
            self.meter.continue_from(int(self.accumulation.updates(position.step)))
        if run:
            truncate_after(run.events_path, position.step)
            self._smooth_on(run.events_path)
            with EventWriter(run.events_path) as writer:  # after the truncation: it stays
                at = {"step": position.step, "epoch": position.epoch}
                writer.write({**at, "phase": "resume", "resumed_from": latest.name})
                for checkpoint, problem in damaged:
                    writer.write(
                        {
                            "step": position.step,
                            "epoch": position.epoch,
                            "phase": "checkpoint",
                            "checkpoint": checkpoint.name,
                            "reason": problem,
                            "resumed_from": latest.name,
                        }
                    )
        return position, residuals

    def _restore_residuals(self, checkpoint: Path | None) -> None:
        """Give each worker the residual it had at ``checkpoint`` (read on rank 0, where
        ``checkpoint`` is known), if the run sparsifies with error feedback. A checkpoint from
        another number of workers has residuals that fit no one: they restart at zero, with a
        warning."""
        reducer = distributed.compressed_allreduce(self.model.optimizer)
        if reducer is None or not reducer.stateful:  # the same on every worker
            return
        saved = checkpoints.residuals(checkpoint) if checkpoint is not None else None
        saved = distributed.broadcast_object(saved)
        world = self.plan.world_size
        if saved is not None and len(saved) == world:
            reducer.restore(saved[distributed.rank()])
        elif distributed.is_rank0():
            found = "none" if saved is None else f"{len(saved)} workers'"
            print(f"warning: residuals restart at zero (the checkpoint holds {found}, not {world})")

    def _smooth_on(self, events_path: Path) -> None:
        events = read_events(events_path)
        if "grad_sq_step" in events:
            logged = events[events.phase == "gns"]
            for pair in zip(logged.grad_sq_step, logged.trace_sigma_step, strict=True):
                self.smoother.update(*pair)

    # --------------------------------------------------------------------------- callbacks

    def callbacks(
        self,
        run: RunDir | None,
        counter: callbacks.StepCounter,
        plan: RunPlan,
        accumulation: Accumulation,
    ) -> tuple[list[keras.callbacks.Callback], EventWriter | None]:
        """The callbacks of a fit in ``plan``'s world (``run``: rank 0's, else ``None``), in
        their order, the NaN guard last; and the event writer, if this worker has one. With
        AdaScale and no meter in the allreduce hook (one worker), a
        :class:`~toolkit.training.callbacks.HalfBatchMeter` measures the noise before every
        update."""
        optimizer = self.model.optimizer
        traffic = distributed.traffic(optimizer)
        hooks = [counter, distributed.MetricAverageCallback()]
        meter = self.meter
        if self.adascale and meter is None:
            meter = callbacks.HalfBatchMeter(
                self._half_batches(plan), self.adascale, counter, accumulation
            )
            hooks.append(meter)
        writer = EventWriter(run.events_path) if run else None
        if writer:
            hooks.append(
                callbacks.EventLogger(
                    writer,
                    counter,
                    plan,
                    accumulation=accumulation,
                    traffic=traffic,
                    adascale=self.adascale,
                )
            )
            if applies_trust_ratios(optimizer):
                hooks.append(callbacks.TrustRatioLogger(writer, counter, plan))
        reducer = distributed.compressed_allreduce(optimizer)
        hooks.append(  # on every worker: the residuals are gathered from all of them
            callbacks.Checkpointer(
                run.checkpoints_path if run else None,
                counter,
                plan,
                gather=(
                    (lambda: distributed.allgather_object(reducer.state()))
                    if reducer is not None and reducer.stateful
                    else None
                ),
                state=self.state,
                finished=(lambda: self.ended(counter.step)) if self.adascale else None,
                requeue=self._requeue(run, plan, accumulation),
            )
        )
        # the noise scale: from the meter's norms (the allreduce hook's with several workers, so
        # none with one worker of an elastic run: its hook has one gradient; one worker's under
        # AdaScale), else from two half batches
        if meter is None:
            measurable = plan.noise_batch >= 2
        else:
            measurable = plan.world_size > 1 or isinstance(meter, callbacks.HalfBatchMeter)
        if writer and plan.noise_every and measurable:
            hooks.append(
                callbacks.NoiseScaleLogger(
                    writer,
                    counter,
                    every_updates=plan.noise_every,
                    accumulation=accumulation,
                    steps_per_epoch=plan.steps_per_epoch,
                    smoothing=plan.noise_smoothing,
                    meter=meter,
                    halves=self._half_batches(plan) if meter is None else None,
                    smoother=self.smoother,
                )
            )
        if plan.system_every:  # every worker: each sends its own sample
            hooks.append(callbacks.SystemLogger(writer, counter, plan, traffic=traffic))
        hooks.append(callbacks.StopOnNonFiniteLoss(counter))  # after the logger: the NaN is logged
        return hooks, writer

    def _requeue(
        self, run: RunDir | None, plan: RunPlan, accumulation: Accumulation
    ) -> requeue.OnSignal | None:
        """Checkpoint and requeue on the scheduler's signal, for a Slurm job's ranks
        (:mod:`toolkit.training.requeue`); not with an adaptive batch, whose stretches start
        only at epochs."""
        if not requeue.asked() or self.config.batch.adaptive is not None:
            return None

        def record(it: requeue.Requeue) -> None:
            run.set_status(State.QUEUED, requeue_step=it.step, reason=str(it))

        return requeue.OnSignal(
            plan.event_every, accumulation.starts_update, record if run else None
        )

    def _half_batches(self, plan: RunPlan) -> callbacks.HalfBatchNorms:
        """One worker's noise measurement: two halves of a fresh batch of
        :attr:`~toolkit.plan.Scale.noise_batch` examples."""
        half = plan.noise_batch // 2
        return callbacks.HalfBatchNorms(
            self.dataset.x_train, self.dataset.y_train, half, self.config.seed
        )

    # ---------------------------------------------------------------------------- training

    def stretch(
        self,
        plan: RunPlan,
        hooks: list[keras.callbacks.Callback],
        first: int,
        last: int,
        verbose: int,
        skip: int = 0,
    ) -> None:
        """One ``model.fit`` call: this worker's batches of epochs ``first`` to ``last`` in
        ``plan``'s world, in order, without the first ``skip`` batches (the done part of a
        single epoch an elastic reset broke into)."""
        if skip and last != first + 1:
            raise ValueError("a stretch that skips batches is one epoch")
        batches = train_batches(
            plan,
            self.dataset,
            first,
            seed=self.config.seed,
            rank=distributed.rank(),
            last=last,
        )
        self.model.fit(
            batches.skip(skip),
            initial_epoch=first,
            epochs=last,
            steps_per_epoch=plan.steps_per_epoch - skip,
            validation_data=self.test_data,
            shuffle=False,  # the order is epoch_dataset's
            callbacks=hooks,
            verbose=verbose,
        )

    def fit(
        self,
        run: RunDir | None,
        position: checkpoints.Position,
        verbose: int | str = "auto",
        on_progress=None,
    ) -> None:
        """Train a fixed or adaptive batch from ``position`` to the end (``run``: rank 0's).
        ``on_progress``, if given, is a callback that draws progress in place of Keras's bar
        (a notebook's live view), after the loggers."""
        plan, world = self.plan, self.plan.world_size
        counter = callbacks.StepCounter(position.step)
        hooks, writer = self.callbacks(run, counter, plan, self.accumulation)
        if run and world == 1:  # trained in this process (a notebook): stopped by its status
            stop = callbacks.StopWhenRequested(run, counter, every_steps=plan.event_every)
            hooks.insert(-1, stop)
        if on_progress is not None:
            hooks.append(on_progress)
            verbose = 0
        if self.adascale:  # ends the run on AdaScale's clock, and shows progress on it
            progress = callbacks.AdaScaleProgress(
                self.adascale, verbosity(verbose), lambda: self.ended(counter.step)
            )
            hooks.insert(-1, progress)
            verbose = 0
        hooks = [distributed.BroadcastInitialState(), *hooks]
        # a checkpoint from the middle of an epoch (Slurm's signal): the epoch's rest first (an
        # AdaScale run's last checkpoint, at the end of its clock, is behind its epoch's end)
        done_in_epoch = max(0, position.step - position.epoch * plan.steps_per_epoch)
        try:
            if done_in_epoch:
                epoch = position.epoch
                self.stretch(plan, hooks, epoch, epoch + 1, verbosity(verbose), done_in_epoch)
            for first, last in self._stretches(position.epoch + bool(done_in_epoch)):
                self.stretch(plan, hooks, first, last, verbosity(verbose))
        finally:
            if writer:  # ended or failed: the events' columnar copy is brought up to date
                writer.close()

    def _stretches(self, first: int):
        """``(first, last)`` epochs of each fit call from epoch ``first``: the whole run at
        once, or an adaptive batch's ``every_epochs`` at a time, the batch decided before
        each but the run's first (from AdaScale's averaged ``B_simple``: rank 0's, which
        every worker has too, since it is measured on averaged gradients; rank 0 says when it
        changes). A resumed run decides again at the epoch it resumes at, from the same
        state."""
        last, adaptive = self.plan.last_epoch, self.config.batch.adaptive
        if adaptive is None:
            yield first, last
            return
        every, spe, epoch = adaptive.every_epochs, self.plan.steps_per_epoch, first
        while epoch < last and not self.ended(epoch * spe) and not self.model.stop_training:
            if epoch and epoch % every == 0:
                b_simple = distributed.broadcast_object(self.adascale.b_simple())
                was = self.accumulation.global_batch
                step = epoch * spe
                changed = adaptive_batch.follow(
                    b_simple, self.accumulation, self.adascale, adaptive, step
                )
                if changed and distributed.is_rank0():
                    aimed = f", aim {adaptive.aim * b_simple:,.0f}" if adaptive.aim != 1 else ""
                    print(
                        f"epoch {epoch + 1}: global batch {was} -> "
                        f"{self.accumulation.global_batch} (B_simple {b_simple:,.0f}{aimed})",
                        flush=True,
                    )
            end = min(last, epoch - epoch % every + every)
            yield epoch, end
            epoch = end

    def fit_elastic(
        self,
        run_dir: Path,
        position: checkpoints.Position,
        residuals: list | None,
        verbose: int | str = "auto",
    ) -> None:
        """Train from ``position`` under elastic horovodrun (:mod:`toolkit.parallel.elastic`).

        The state (model, optimizer, the noise meter and smoother, residuals, epoch and batch)
        is committed every ``elastic.commit_every_steps`` steps and at each epoch's end. When
        the world changes, training goes on from the last commit with the workers there are:
        every worker takes its new share of the same global batches (the per-worker batch is
        ``batch.global_size`` over the workers), skipping the committed part of the epoch, so
        each example of the epoch is still seen once, apart from the steps since the commit,
        which are trained again. The plan and callbacks are rebuilt for each world (rank 0,
        who writes, may have moved), the events after the commit are dropped, and rank 0
        writes an ``elastic`` event: the step, the new and previous world size, the hosts, the
        reason and ``steps_lost`` (repeated). The workers' process records are replaced by the
        new world's, so ``status`` and ``stop`` find the living ones.

        A resumed run starts from rank 0's checkpoint (``position``, and every worker's
        ``residuals`` there, dealt out to the world there is now, whatever its size, by
        :func:`~toolkit.parallel.compression.reshard_residuals`)."""
        config, spe = self.config, self.plan.steps_per_epoch  # the same in every world
        state = elastic.TrainingState(
            self.model,
            variables=self.meter.variables if self.meter is not None else (),
            smoother=self.smoother,
            residuals=residuals or (),
            epoch=position.epoch,
            batch=0,
        )
        reached = {"step": position.step, "world": None}  # where the last fit call got to

        @elastic.run
        def fit(state: elastic.TrainingState) -> None:
            world, rank = distributed.size(), distributed.rank()
            step = state.epoch * spe + state.batch
            run = RunDir(run_dir) if distributed.is_rank0() else None
            workers = distributed.allgather_object({**processes.record("worker"), "rank": rank})
            if run:
                run.record_processes(*workers, replacing="worker", world_size=world)
            if run and state.interrupted:
                _record_reset(run, state, step, spe, world, workers, reached)
            reached.update(step=step, world=world)
            counter = callbacks.StepCounter(step)
            plan = RunPlan.of(config, self.plan.num_train, world)
            hooks, writer = self.callbacks(run, counter, plan, Accumulation.starting(plan))
            hooks.append(elastic.Committer(state, config.elastic.commit_every_steps))  # last
            try:
                if state.batch:  # the rest of the epoch the reset broke into
                    self.stretch(
                        plan, hooks, state.epoch, state.epoch + 1, verbosity(verbose), state.batch
                    )
                if state.epoch < config.epochs:
                    self.stretch(plan, hooks, state.epoch, config.epochs, verbosity(verbose))
            finally:
                reached["step"] = counter.step
                if writer:
                    writer.close()

        fit(state)


def _record_reset(run, state, step, spe, world, workers, reached) -> None:
    """Rank 0's account of an elastic reset: the events after the commit dropped, an
    ``elastic`` event written, a line printed."""
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


def verbosity(verbose: int | str) -> int:
    """Keras's ``verbose`` for this worker: rank 0's bar (a line per epoch off a terminal)."""
    if not distributed.is_rank0():
        return 0
    return (1 if sys.stdout.isatty() else 2) if verbose == "auto" else verbose
