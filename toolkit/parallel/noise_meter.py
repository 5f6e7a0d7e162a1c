"""The gradient noise scale's two norms, measured inside the allreduce hook
(:class:`GradientNoiseMeter`); the estimate itself is :mod:`toolkit.scaling.noise_scale`'s."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf


class GradientNoiseMeter:
    """The two squared gradient norms of the noise scale (:mod:`toolkit.scaling.noise_scale`),
    measured inside the allreduce hook every ``every`` updates, on the gradients the loss produced
    (after loss-scale unscaling and local accumulation, before clipping, weight decay or trust
    ratios): ``small_sq``, each worker's own gradient norm² averaged over the workers (one
    scalar allreduce), and ``big_sq``, the norm² of the allreduced gradient. Their batch sizes
    are the per-worker examples per update and the global batch. Read after a step with
    :meth:`read`; the variables live outside the optimizer, so checkpoints do not change.
    ``on_measure(small_sq, big_sq)``, if given, is called in the graph with each measurement,
    before the update reads its learning rate (AdaScale's gain: :mod:`toolkit.scaling.adascale`)."""

    def __init__(
        self, every: int, on_measure: Callable[[tf.Tensor, tf.Tensor], None] | None = None
    ):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.on_measure = every, on_measure
        self._updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._measured = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._small_sq = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._big_sq = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def measure(self, local: list[tf.Tensor], reduced: list[tf.Tensor] | None) -> None:
        """Count one update; on every ``every``-th, record the two norms (every worker must
        call it, as the allreduce hook does). ``reduced=None``: the hook's reduced gradient is
        not the mean one (a sparsified allreduce), so the mean is allreduced here, on the
        measured updates only. On PyTorch the hook runs eagerly and so does this."""
        count = self._updates.assign_add(1)
        if keras.backend.backend() == "torch":
            if int(count) % self.every == 0:
                self._record_eagerly(local, reduced, int(count))
            return
        import horovod.tensorflow as hvd  # only where the hook allreduces: Horovod is there

        def record():
            small = hvd.allreduce(squared_norm(local), op=hvd.Average, name="noise_small_sq")
            self._small_sq.assign(small)
            mean = hvd.grouped_allreduce(local, op=hvd.Average) if reduced is None else reduced
            big = self._big_sq.assign(squared_norm(mean))
            self._measured.assign(count)
            if self.on_measure is not None:
                self.on_measure(small, big)
            return tf.constant(True)

        tf.cond(count % self.every == 0, record, lambda: tf.constant(False))

    def _record_eagerly(self, local: list, reduced: list | None, count: int) -> None:
        import horovod.torch as hvd

        small = hvd.allreduce(torch_squared_norm(local), op=hvd.Average, name="noise_small_sq")
        mean = hvd.grouped_allreduce(local, op=hvd.Average) if reduced is None else reduced
        self._small_sq.assign(float(small))
        big = torch_squared_norm(mean)
        self._big_sq.assign(float(big))
        self._measured.assign(count)
        if self.on_measure is not None:
            self.on_measure(small, big)

    def continue_from(self, updates: int) -> None:
        """Count on from ``updates`` done before (a resumed run), so measurements fall on the
        same updates as in a run that was never interrupted."""
        self._updates.assign(updates)

    @property
    def variables(self) -> list[tf.Variable]:
        """Its counters and latest norms: state outside the optimizer, which an elastic run
        commits (:class:`toolkit.parallel.elastic.TrainingState`)."""
        return [self._updates, self._measured, self._small_sq, self._big_sq]

    def read(self) -> tuple[int, float, float]:
        """``(update, small_sq, big_sq)`` of the latest measurement, ``update`` counted from
        1 (0: none yet)."""
        return (
            int(self._measured.numpy()),
            float(self._small_sq.numpy()),
            float(self._big_sq.numpy()),
        )


def squared_norm(tensors: list[tf.Tensor]) -> tf.Tensor:
    """``Σ‖t‖²`` over ``tensors`` in float64 (one pass each: ``l2_loss`` is ``‖t‖²/2``)."""
    return tf.add_n([2 * tf.cast(tf.nn.l2_loss(t), tf.float64) for t in tensors])


def torch_squared_norm(tensors: list):
    """:func:`squared_norm` of torch tensors."""
    return sum(t.double().square().sum() for t in tensors)
