"""Keras callbacks of a training run: events, trust ratios, checkpoints, the NaN guard.

They are the train loop's hooks (``before/after_step`` in detectron2 and LiBai terms), and take
the run's plan (:class:`~toolkit.plan.RunPlan`: its intervals and sizes) and what Keras gives
them. Which worker runs which (:meth:`toolkit.training.trainer.Trainer.callbacks`): the loggers
that only write (:class:`EventLogger`, :class:`TrustRatioLogger`, :class:`NoiseScaleLogger`)
run on rank 0 alone, which has the event writer; every other runs on every worker, in the same
order, because it makes a collective call or must act on all of them at once:
:class:`Checkpointer` gathers every worker's residuals (rank 0 writes), :class:`SystemLogger`
gathers a sample from each, and :class:`StopOnNonFiniteLoss` stops them all together (the
weights are the same on every worker, so all of them see a non-finite loss at once). A
collective callback left out on one worker hangs the others.
"""

from __future__ import annotations

import math
import time

import keras
import numpy as np

from toolkit import backends
from toolkit.optimizers import unwrapped
from toolkit.parallel.distributed import allgather_rows
from toolkit.plan import RunPlan
from toolkit.runs import checkpoints
from toolkit.runs.events import EventWriter
from toolkit.scaling.adaptive_batch import Accumulation
from toolkit.scaling.noise_scale import Smoother, estimate
from toolkit.training import requeue as requeue_lib
from toolkit.training import system
from toolkit.training.experiment import rates_at


def current(callback: keras.callbacks.Callback) -> None:
    """Make the variables the train step writes current before ``callback`` reads them (on
    JAX, Keras's ``Callback.model`` reattaches the compiled step's state to them; elsewhere
    they are)."""
    callback.model  # noqa: B018 (the property's side effect is the point)


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss."""


class StepCounter(keras.callbacks.Callback):
    """Counts batches (global steps) from ``start_step``; other callbacks read ``.step``.

    Under Keras's ``steps_per_execution = k`` the batch callbacks run once per ``k`` steps,
    given the index of the execution's last batch in its epoch, so the count is read from that
    index, not from the number of calls."""

    def __init__(self, start_step: int = 0):
        super().__init__()
        self.step = self._epoch_start = start_step

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.step

    def on_train_batch_end(self, batch, logs=None):
        self.step = self._epoch_start + batch + 1


class EventLogger(keras.callbacks.Callback):
    """Writes ``train`` events every ``every_steps`` steps and an ``eval`` event per epoch,
    and a ``train`` event at any other step whose loss is not finite (the step
    :class:`StopOnNonFiniteLoss` then stops at, so the divergence is in the log).

    A train event holds the step (batches done), epoch (fractional), the number of workers
    (``world_size``: an elastic run's changes), lr and momentum used at that step, Keras's
    running loss/accuracy of the epoch, and global ``samples_per_sec`` over the interval (the
    first interval starts after the first step, so tracing is not counted).
    With a ``traffic`` counter (:class:`toolkit.parallel.compression.Traffic`) it also holds
    ``comm/bytes_sent``, the bytes a worker sent per update over the interval, and
    ``comm/compression_ratio``, a dense float32 allreduce's bytes over those (when any were
    sent). With ``adascale`` (:class:`~toolkit.scaling.adascale.AdaScale`), ``lr`` is the rate the
    latest update applied, and the event holds that update's ``gain`` and the clock ``tau``
    after it. Given the run's ``accumulation``
    (:class:`~toolkit.scaling.adaptive_batch.Accumulation`: how steps group into updates), bytes
    are counted per update (without one, per step), and if the batch is adaptive, train and eval
    events hold the ``global_batch`` of the latest update. Its intervals and sizes are the
    ``plan``'s.
    """

    def __init__(
        self,
        writer: EventWriter,
        counter: StepCounter,
        plan: RunPlan,
        *,
        accumulation: Accumulation | None = None,
        traffic=None,
        adascale=None,
    ):
        super().__init__()
        self.writer, self.counter, self.world_size = writer, counter, plan.world_size
        self.adascale, self.accumulation = adascale, accumulation
        self.every_steps = plan.event_every
        self.steps_per_epoch = plan.steps_per_epoch
        self.samples_per_step = plan.examples_per_step
        self.traffic = traffic
        self._clock: tuple[int, float, float] | None = None
        self._rates = None

    def on_train_batch_end(self, batch, logs=None):
        step, logs = self.counter.step, logs or {}
        diverged = not math.isfinite(logs.get("loss", 0.0))
        if self._clock is not None and step % self.every_steps and not diverged:
            return
        current(self)  # what the step wrote (bytes sent, AdaScale's clock): read when logged
        now, sent = time.perf_counter(), self._sent()
        if self._clock is None:  # the first call: a multiple (after a reset) is still logged
            self._clock = (step, now, sent)
            if not diverged and step % self.every_steps:
                return
        last_step, last_time, last_sent = self._clock
        self._clock = (step, now, sent)
        self._rates = self._rates or rates_at(self.model.optimizer)
        lr, momentum = self._rates(step - 1)
        record = {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "phase": "train",
            "world_size": self.world_size,
            "lr": lr,
            "momentum": momentum,
        }
        if step > last_step:  # not a divergence at the first step seen, which nothing times
            record["samples_per_sec"] = (
                self.samples_per_step * (step - last_step) / (now - last_time)
            )
        if self.accumulation is not None and self.accumulation.adaptive:
            record["global_batch"] = self.accumulation.global_batch
        if self.adascale is not None:
            record["gain"] = float(self.adascale.gain.numpy())
            record["tau"] = float(self.adascale.tau.numpy())
        record.update({k: float(v) for k, v in logs.items()})
        if self.traffic is not None and step > last_step:
            accumulation = self.accumulation
            updates = (
                accumulation.updates(step) - accumulation.updates(last_step) if accumulation else 0
            )
            per_update = (sent - last_sent) / (updates or step - last_step)
            record["comm/bytes_sent"] = per_update
            if per_update > 0 and self.traffic.dense_bytes:
                record["comm/compression_ratio"] = self.traffic.dense_bytes / per_update
        self.writer.write(record)

    def _sent(self) -> float:
        return float(self.traffic.sent.numpy()) if self.traffic is not None else 0.0

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        record = {"step": self.counter.step, "epoch": epoch + 1, "phase": "eval"}
        if self.accumulation is not None and self.accumulation.adaptive:
            record["global_batch"] = self.accumulation.global_batch
        for key, value in logs.items():
            name = key.removeprefix("val_") if key.startswith("val_") else f"train_{key}"
            record[name] = float(value)
        self.writer.write(record)


class TrustRatioLogger(keras.callbacks.Callback):
    """Every ``every_steps`` steps, the per-layer trust ratios LARS (or LBSGD's ``lars``
    warmup) applied in the latest update, as a ``trust_ratio`` event with
    ``trust_ratio/<path>`` keys. They are read from the optimizer
    (:meth:`~toolkit.optimizers.base.CoupledDecayOptimizer.applied_trust_ratios`), which keeps
    them as it updates: no extra gradient, and with several workers the ratios of the averaged
    gradient, the same on every worker. Its interval is the ``plan``'s ``trust_ratio_every``."""

    def __init__(self, writer: EventWriter, counter: StepCounter, plan: RunPlan):
        super().__init__()
        self.writer, self.counter = writer, counter
        self.every_steps = plan.trust_ratio_every

    def on_train_batch_end(self, batch, logs=None):
        if self.counter.step % self.every_steps:
            return
        ratios = unwrapped(self.model.optimizer).applied_trust_ratios()
        self.writer.write(
            {
                "step": self.counter.step,
                "phase": "trust_ratio",
                **{f"trust_ratio/{path}": ratio for path, ratio in ratios.items()},
            }
        )


class HalfBatchNorms:
    """One worker's stand-in for the allreduce measurement of the noise scale: a fresh random
    batch of ``2·half`` training examples taken as two halves. ``small_sq`` is the mean of the
    halves' gradient norms², ``big_sq`` the norm² of their mean, which is the whole batch's
    gradient; so ``b_small = half`` and ``b_big = 2·half``. Each call costs one extra forward
    and backward pass of the batch. The model runs with ``training=False`` (no dropout, batch
    norm's moving statistics untouched). Called ``at`` an update, the batch is drawn from a
    generator seeded with ``(seed, at)``, so a resumed run draws what an uninterrupted one
    would; otherwise from one generator seeded with ``seed``."""

    def __init__(self, x, y, half: int, seed: int = 0):
        if half < 1:
            raise ValueError(f"half must be >= 1, got {half}")
        self.x, self.y, self.half, self.seed = x, y, half, seed
        self.rng = np.random.default_rng(seed)

    def __call__(self, model: keras.Model, at: int | None = None) -> tuple[float, float]:
        rng = self.rng if at is None else np.random.default_rng([self.seed, at])
        rows = rng.choice(len(self.x), size=2 * self.half, replace=False)
        x, y = self.x[rows], self.y[rows]
        gradients = backends.current().loss_gradients
        first = gradients(model, x[: self.half], y[: self.half])
        second = gradients(model, x[self.half :], y[self.half :])
        return self._squared_norms(first, second)

    @staticmethod
    def _squared_norms(first, second) -> tuple[float, float]:
        """``(‖g₁‖² + ‖g₂‖²) / 2`` and ``‖(g₁ + g₂) / 2‖²``, in float64 from the three dot
        products of each pair of tensors. In numpy: for two scalars a graph would cost more to
        trace and start (about 0.3 s for a ResNet) than it saves."""
        aa = bb = ab = 0.0
        for a, b in zip(first, second, strict=True):
            a, b = (keras.ops.convert_to_numpy(t).astype(np.float64).ravel() for t in (a, b))
            aa, bb, ab = aa + a @ a, bb + b @ b, ab + a @ b
        return float((aa + bb) / 2), float((aa + bb + 2 * ab) / 4)


class NoiseScaleLogger(keras.callbacks.Callback):
    """Every ``every_updates`` updates, a ``gns`` event with the gradient noise scale
    (:mod:`toolkit.scaling.noise_scale`): the smoothed ``b_simple``, ``grad_sq`` and
    ``trace_sigma``, this step's ``grad_sq_step`` and ``trace_sigma_step``, the measured
    ``small_sq`` and
    ``big_sq`` and their batch sizes ``b_small`` and ``b_big`` (the ``accumulation``'s, as
    measured: :meth:`~toolkit.scaling.adaptive_batch.Accumulation.noise_batches`).

    The norms come from ``meter`` (a :class:`~toolkit.parallel.noise_meter.GradientNoiseMeter` in
    the allreduce hook, with more than one worker), which measures inside the compiled step at
    its update, and is read here once a multiple of the interval has passed; or, with one
    worker, from ``halves`` (:class:`HalfBatchNorms`), measured here at the end of the Keras
    execution that reaches the multiple. Either way the event's step is the step measured.
    ``accumulation``: how steps group into updates. Every event is
    also kept in :attr:`records`; ``writer`` and ``counter`` may be ``None`` (no file;
    steps counted here), as in :func:`noise_scale_callback`.
    """

    def __init__(
        self,
        writer: EventWriter | None,
        counter: StepCounter | None,
        *,
        every_updates: int,
        accumulation: Accumulation,
        steps_per_epoch: int,
        smoothing: float,
        meter=None,
        halves: HalfBatchNorms | None = None,
        smoother: Smoother | None = None,
    ):
        super().__init__()
        if (meter is None) == (halves is None):
            raise ValueError("give exactly one of meter (workers > 1) and halves (one worker)")
        self.writer = writer
        self.counter, self._counts = (counter, False) if counter else (StepCounter(), True)
        self.every_updates, self.accumulation = every_updates, accumulation
        self.steps_per_epoch = steps_per_epoch
        self.smoother = smoother or Smoother(decay=smoothing)  # given: it goes on from there
        self.meter, self.halves = meter, halves
        self.records: list[dict] = []
        self._last_update = self._seen = 0

    def on_train_begin(self, logs=None):
        self._seen = self.counter.step

    def on_epoch_begin(self, epoch, logs=None):
        if self._counts:
            self.counter.on_epoch_begin(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._counts:
            self.counter.on_train_batch_end(batch)
        step, seen = self.counter.step, self._seen
        self._seen = step
        every, updates = self.every_updates, self.accumulation.updates
        if int(updates(step)) // every == int(updates(seen)) // every:
            return  # no multiple of the interval since the last call
        if self.meter is not None:
            current(self)
            update, small_sq, big_sq = self.meter.read()
            if update == self._last_update:  # nothing new measured
                return
            self._last_update, step = update, self.accumulation.step_of(update)
        else:
            small_sq, big_sq = self.halves(self.model, step)
        b_small, b_big = self.accumulation.noise_batches()
        grad_sq, trace_sigma = estimate(small_sq, big_sq, b_small, b_big)
        self.smoother.update(grad_sq, trace_sigma)
        self.records.append(
            {
                "step": step,
                "epoch": step / self.steps_per_epoch,
                "phase": "gns",
                "b_simple": self.smoother.b_simple,
                "grad_sq": self.smoother.grad_sq,
                "trace_sigma": self.smoother.trace_sigma,
                "grad_sq_step": grad_sq,
                "trace_sigma_step": trace_sigma,
                "small_sq": small_sq,
                "big_sq": big_sq,
                "b_small": b_small,
                "b_big": b_big,
            }
        )
        if self.writer is not None:
            self.writer.write(self.records[-1])


def noise_scale_callback(
    x, y, *, batch_size: int, every_steps: int = 25, smoothing: float = 0.95, seed: int = 0
) -> NoiseScaleLogger:
    """The gradient noise scale for a model you train yourself with ``model.fit`` (one
    process): every ``every_steps`` batches, ``B_simple`` from two halves of a fresh batch of
    ``batch_size`` examples of ``(x, y)``. Read the estimates from the callback's ``records``
    (dicts with the keys of a ``gns`` event), e.g. ``pd.DataFrame(callback.records)``::

        gns = noise_scale_callback(x_train, y_train, batch_size=64)
        model.fit(x_train, y_train, batch_size=64, epochs=5, callbacks=[gns])
        print(gns.smoother.b_simple)
    """
    return NoiseScaleLogger(
        None,
        None,
        every_updates=every_steps,
        accumulation=Accumulation(batch_size, world=1),
        steps_per_epoch=max(1, len(x) // batch_size),
        smoothing=smoothing,
        halves=HalfBatchNorms(x, y, batch_size // 2, seed),
    )


class HalfBatchMeter(keras.callbacks.Callback):
    """One worker's noise meter for AdaScale, which needs a measurement at every update: before
    each update (its first batch), ``halves`` measured at the weights the update starts from,
    handed to ``adascale`` before the update reads its rate. Read like a
    :class:`~toolkit.parallel.noise_meter.GradientNoiseMeter` (:meth:`read`), so the ``gns`` events
    come from the same measurements. Costs one extra forward and backward pass of a batch per
    update, and needs Keras's ``steps_per_execution`` of 1."""

    def __init__(
        self, halves: HalfBatchNorms, adascale, counter: StepCounter, accumulation: Accumulation
    ):
        super().__init__()
        self.halves, self.counter, self.accumulation = halves, counter, accumulation
        self._latest = (0, 0.0, 0.0)
        backend = backends.current()
        self._observe = backend.compiled_stateful(adascale.observe)  # a few µs, not ms
        self._dtype = backend.state_dtype()  # handed tensors: a Python float would retrace

    def on_train_batch_begin(self, batch, logs=None):
        step = self.counter.step
        if not self.accumulation.starts_update(step):
            return
        update = round(self.accumulation.updates(step))
        small_sq, big_sq = self.halves(self.model, update)
        self._observe(*(keras.ops.convert_to_tensor(sq, self._dtype) for sq in (small_sq, big_sq)))
        self._latest = (update + 1, small_sq, big_sq)

    def read(self) -> tuple[int, float, float]:
        """``(update, small_sq, big_sq)`` of the latest measurement, ``update`` counted from 1
        (0: none yet)."""
        return self._latest


class AdaScaleProgress(keras.callbacks.Callback):
    """Ends an AdaScale run once ``ended()`` says so (its clock ``τ`` has done the base run's
    updates, its ``total``, and the update that did is complete), and shows progress on that
    clock (in place of Keras's bar, whose epochs are only an upper bound): a
    ``keras.utils.Progbar`` with ``verbose=1``, a line per epoch with ``verbose=2``, nothing
    with 0. Needs ``steps_per_execution`` of 1."""

    def __init__(self, adascale, verbose: int, ended):
        super().__init__()
        self.adascale, self.total, self.verbose = adascale, adascale.total, verbose
        self.ended, self.bar = ended, None

    def on_train_begin(self, logs=None):  # once: an adaptive batch's run fits again and again
        if self.verbose == 1 and self.bar is None:
            self.bar = keras.utils.Progbar(self.total, stateful_metrics=["gain"], unit_name="τ")

    def on_train_batch_end(self, batch, logs=None):
        current(self)  # the clock, every update (on JAX, the step's state reattached)
        if self.ended():
            self.model.stop_training = True
        if self.bar is not None:
            values = [("gain", float(self.adascale.gain.numpy()))]
            values += [(k, float(v)) for k, v in (logs or {}).items()]
            self.bar.update(min(self.total, float(self.adascale.tau.numpy())), values=values)

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose != 2:
            return
        tau, gain = float(self.adascale.tau.numpy()), float(self.adascale.gain.numpy())
        metrics = " - ".join(f"{k}: {float(v):.4g}" for k, v in (logs or {}).items())
        print(
            f"epoch {epoch + 1}: τ {tau:,.0f}/{self.total:,} ({min(1.0, tau / self.total):.0%}) "
            f"- gain {gain:.3g} - {metrics}",
            flush=True,
        )


class Checkpointer(keras.callbacks.Callback):
    """Saves a checkpoint every ``checkpoint_every`` epochs of the ``plan`` and after its last
    epoch, into ``directory`` (rank 0; ``None`` on the other workers). ``gather``, if given, is
    called on every worker at those epochs (a collective: it returns every worker's residuals,
    which rank 0 saves with the checkpoint). ``state``: variables outside the optimizer saved
    with it (AdaScale's); ``finished``, if given, says the run ends at this epoch's end before
    its last (AdaScale's clock ran out), which is checkpointed too.

    With ``requeue`` (a Slurm job's ranks), at the step every rank agrees on after the
    scheduler's signal a checkpoint of that step is saved and training ends to be requeued
    (:mod:`toolkit.training.requeue`)."""

    def __init__(
        self,
        directory,
        counter: StepCounter,
        plan: RunPlan,
        *,
        gather=None,
        state: list = (),
        finished=None,
        requeue: requeue_lib.OnSignal | None = None,
    ):
        super().__init__()
        self.directory, self.counter, self.gather = directory, counter, gather
        self.every_epochs, self.last_epoch = plan.checkpoint_every, plan.last_epoch
        self.steps_per_epoch = plan.steps_per_epoch
        self.state, self.finished, self.requeue = state, finished, requeue

    def on_train_batch_end(self, batch, logs=None):
        step = self.counter.step
        if self.requeue is None or not self.requeue.due(step):
            return
        self._save(checkpoints.Position(step // self.steps_per_epoch, step), mid_epoch=True)
        self.requeue.stop(step)

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        last = done == self.last_epoch or (self.finished is not None and self.finished())
        if done % self.every_epochs and not last:
            return
        self._save(checkpoints.Position(done, self.counter.step))

    def _save(self, position: checkpoints.Position, mid_epoch: bool = False) -> None:
        residuals = self.gather() if self.gather is not None else None
        if self.directory is not None:
            with backends.current().alone():  # rank 0's write: no collective the others miss
                checkpoints.save(
                    self.directory,
                    self.model,
                    position,
                    residuals=residuals,
                    state=self.state,
                    mid_epoch=mid_epoch,
                )


class SystemLogger(keras.callbacks.Callback):
    """At the first train event's step and every ``system_every`` steps of the ``plan``, a
    sample of every worker's system metrics (:mod:`toolkit.training.system`), gathered from all
    of them (every worker runs this callback, at the same steps) and written by the one with the
    ``writer`` (rank 0) as a ``system`` event. With a ``traffic`` counter
    (:class:`toolkit.parallel.compression.Traffic`), each worker's own bytes per update since
    its previous sample are in it (per worker: a threshold's differ)."""

    def __init__(
        self, writer: EventWriter | None, counter: StepCounter, plan: RunPlan, traffic=None
    ):
        super().__init__()
        self.writer, self.counter = writer, counter
        self.first_step, self.every_steps = plan.event_every, plan.system_every
        self.steps_per_epoch = plan.steps_per_epoch
        self.sampler = system.Sampler()
        self.traffic, self._sent = traffic, None  # (updates, bytes) at the previous sample

    def on_train_batch_end(self, batch, logs=None):
        step = self.counter.step
        if step % self.every_steps and step != self.first_step:
            return
        samples = allgather_rows(self.sampler.sample(self._bytes_per_update()), "system_metrics")
        if self.writer is not None:
            record = {"step": step, "epoch": step / self.steps_per_epoch, "phase": "system"}
            self.writer.write(record | system.event_columns(samples))

    def _bytes_per_update(self) -> float:
        if self.traffic is None:
            return math.nan
        current(self)
        updates = int(unwrapped(self.model.optimizer).iterations.numpy())
        now = (updates, float(self.traffic.sent.numpy()))
        before, self._sent = self._sent, now
        if before is None or now[0] <= before[0]:
            return math.nan
        return (now[1] - before[1]) / (now[0] - before[0])


class StopWhenRequested(keras.callbacks.Callback):
    """Ends training after the current step once ``stop`` has been asked for the run (its
    status says ``stop_requested``), read every ``every_steps`` steps. For a run trained in
    this process (a notebook), which ``stop`` must not kill; a run under horovodrun is ended
    with signals instead."""

    def __init__(self, run, counter: StepCounter, *, every_steps: int):
        super().__init__()
        self.run, self.counter, self.every_steps = run, counter, every_steps

    def on_train_batch_end(self, batch, logs=None):
        if self.counter.step % self.every_steps == 0 and self.run.recorded_status().get(
            "stop_requested"
        ):
            self.model.stop_training = True


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises :class:`NonFiniteLoss` as soon as the loss is NaN or infinite. Keras's loss is
    the epoch's running mean, so once a step diverges it stays non-finite; under
    ``steps_per_execution = k`` it is seen at the end of the execution that diverged, at most
    ``k - 1`` steps after the step itself, and that is the step the error names."""

    def __init__(self, counter: StepCounter):
        super().__init__()
        self.counter = counter

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(np.asarray(loss))):
            raise NonFiniteLoss(f"loss became {float(loss)} at step {self.counter.step}")
