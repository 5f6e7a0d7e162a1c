"""The state of an elastic run for Keras 3: what a reset restores and a new worker receives.

Horovod's elastic training (``horovodrun --min-np/--max-np``) keeps a *state* on every worker:
``commit()`` copies it to host memory (and raises ``HostsUpdatedInterrupt`` when hosts came or
went), ``restore()`` brings back the last commit after a worker died mid-step
(``HorovodInternalError``), and ``sync()`` makes every worker, a new one included, equal to rank
0 after Horovod restarted with the new world. Horovod's ``TensorFlowKerasState`` targets Keras 2
(``optimizer.variables()`` is a property in Keras 3, and Horovod's ops need ``v.value``);
:class:`TrainingState` is the same contract on Horovod's ``ObjectState``, over everything a
bit-for-bit resume restores (:mod:`toolkit.runs.checkpoints`):

- the model's weights (trainable or not) and the optimizer's variables (iteration count,
  momentum buffers, gradient accumulators), and any ``variables`` outside both (the noise
  meter's counters);
- the noise-scale :class:`~toolkit.scaling.noise_scale.Smoother`, restored in place, so the callback
  that holds it goes on from the committed averages;
- the sparsified allreduce's residuals, which differ per worker: each commit gathers every
  worker's (one ``allgather``), so a worker that dies takes nothing committed with it; after a
  reset they are dealt out by :func:`~toolkit.parallel.compression.reshard_residuals`;
- plain Python values given as keywords (the epoch, the batch within it), read and set as
  attributes, as with ``ObjectState``.

Every worker must commit together (the commit gathers residuals and checks hosts with
collectives); restore and the reset's own step use no collective, since the world is broken or
not yet rebuilt when they run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import keras
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from toolkit.parallel import distributed
from toolkit.parallel.collective_errors import collective_failed
from toolkit.parallel.compression import Residuals, reshard_residuals
from toolkit.scaling.noise_scale import Smoother

T = TypeVar("T")
LOST, HOSTS_REMOVED, HOSTS_ADDED = "a worker was lost", "hosts were removed", "hosts were added"
"""The reasons :func:`run` gives for a reset."""


def run(fit: Callable[..., T]) -> Callable[..., T]:
    """``fit(state, ...)`` run elastically: Horovod's loop (``horovod.common.elastic.run_fn``)
    syncs ``state`` from rank 0 and calls ``fit``; when a worker dies it restores the last
    commit, restarts Horovod with the workers left and calls ``fit`` again, and when hosts come
    or go it does the same from the commit that noticed them. ``fit`` goes on from the
    position the state holds, and must not call a collective before its first step.

    A Horovod collective that failed inside TensorFlow is a lost worker, whatever its op: the
    grouped allreduce and allgather of :func:`toolkit.parallel.distributed.DistributedOptimizer`
    included, which ``hvd.elastic.run`` does not recognise (it looks for
    ``HorovodAllreduce``, ``HorovodAllgather`` or ``HorovodBroadcast`` in the message), and a
    named one (the noise meter's ``noise_small_sq``), whose message names neither Horovod nor
    its op but Gloo's transport that lost the peer (:func:`collective_failed`).

    Why a call ended early is kept in ``state.interrupted`` for the next call to read (see
    :class:`TrainingState`)."""

    @functools.wraps(fit)
    def horovod_errors_as_lost_workers(state, *args, **kwargs):
        try:
            return fit(state, *args, **kwargs)
        except tf.errors.OpError as error:
            if not collective_failed(error.message):
                raise
            state.interrupted = LOST
            raise HorovodInternalError(error) from error
        except HorovodInternalError:
            state.interrupted = LOST
            raise
        except HostsUpdatedInterrupt as interrupt:  # skip_sync: hosts only went, none came
            state.interrupted = HOSTS_REMOVED if interrupt.skip_sync else HOSTS_ADDED
            raise

    return run_fn(horovod_errors_as_lost_workers, distributed.restart)


class TrainingState(ObjectState):
    """The committed state of ``model`` (compiled: its optimizer too) for
    ``horovod.common.elastic.run_fn``; see the module's docstring for what it holds.
    ``residuals``: every worker's, to start from (a checkpoint's, given on rank 0).
    ``fields`` become attributes (``state.epoch``) that ``commit``/``restore``/``sync`` cover.
    ``interrupted`` is not committed: why this worker's last ``fit`` call ended early
    (:data:`LOST`, :data:`HOSTS_REMOVED`, :data:`HOSTS_ADDED`), ``None`` before any reset (and on
    a worker that has just joined)."""

    def __init__(
        self,
        model: keras.Model,
        *,
        variables: Sequence[keras.Variable] = (),
        smoother: Smoother | None = None,
        residuals: Residuals = (),
        **fields,
    ):
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        self.model, self.smoother = model, smoother
        self._variables = [*model.weights, *model.optimizer.variables, *variables]
        self._reducer = distributed.compressed_allreduce(model.optimizer)
        if self._reducer is not None and not self._reducer.stateful:
            self._reducer = None
        self.interrupted: str | None = None
        # a resumed run's checkpoint (rank 0's, sync deals it out); else none committed yet
        self._residuals: Residuals = list(residuals)
        self._save_tensors(gather=False)  # no collective: a joining worker builds it alone
        super().__init__(
            bcast_object=distributed.broadcast_object, get_rank=distributed.rank, **fields
        )

    @property
    def residuals(self) -> Residuals:
        """Every worker's residuals at the last commit, in that commit's rank order."""
        return self._residuals

    def save(self) -> None:
        self._save_tensors()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._values, strict=True):
            variable.assign(value)
        if self.smoother is not None:
            vars(self.smoother).update(vars(self._smoother))
        self._deal_residuals()
        super().restore()

    def reset(self) -> None:
        """After Horovod restarted with a new world, before any sync: this worker's share of
        the committed residuals for the new world (a reset that skips the sync, when hosts were
        only removed, has every survivor holding the same committed table)."""
        self._deal_residuals()

    def sync(self) -> None:
        distributed.broadcast_values(self._variables)
        if self.smoother is not None:
            vars(self.smoother).update(vars(distributed.broadcast_object(self.smoother)))
        if self._reducer is not None:
            self._residuals = distributed.broadcast_object(self._residuals)
            self._deal_residuals()
        self._save_tensors(gather=False)  # the table stays the committed one
        super().sync()

    def _save_tensors(self, gather: bool = True) -> None:
        self._values = [keras.ops.convert_to_numpy(v).copy() for v in self._variables]
        if self.smoother is not None:
            self._smoother = dataclasses.replace(self.smoother)
        if gather and self._reducer is not None:
            self._residuals = distributed.allgather_object(self._reducer.state())

    def _deal_residuals(self) -> None:
        if self._reducer is not None and self._residuals:
            share = reshard_residuals(self._residuals, distributed.size())[distributed.rank()]
            if share:
                self._reducer.restore(share)


class Committer(keras.callbacks.Callback):
    """Keeps ``state.epoch`` and ``state.batch`` (batches done in that epoch) up to date as
    ``fit`` trains, and commits ``state`` every ``every_steps`` batches and at each epoch's end.
    A ``fit`` that starts at ``state.batch`` (a resumed epoch) counts on from there."""

    def __init__(self, state: TrainingState, every_steps: int):
        super().__init__()
        if every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.state, self.every_steps = state, every_steps
        self._first = 0

    def on_train_begin(self, logs=None):
        self._first = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        before, self.state.batch = self.state.batch, self._first + batch + 1
        if self.state.batch // self.every_steps > before // self.every_steps:
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch, self.state.batch, self._first = epoch + 1, 0, 0
        self.state.commit()
