"""Keras on TensorFlow: Horovod's TensorFlow ops inside the traced train step, and every
technique the lab has (the sparsified and 2-bit exchanges with DGC's techniques, partial
synchronisation and local SGD, an elastic world, AdaScale and the adaptive batch)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolkit import codecs
from toolkit.backends.base import Backend
from toolkit.backends.devices import pin_tensorflow_gpu
from toolkit.sections import SYNC_MODES

if TYPE_CHECKING:
    import keras


class TensorFlowBackend(Backend):
    """Keras's TensorFlow backend (see the module's docstring)."""

    name = "tensorflow"
    codecs = codecs.MODES
    sync_modes = SYNC_MODES
    elastic = adascale = adaptive_batch = True
    tensorflow_kernels = True

    def start_worker(self, engine: Any) -> None:
        """Pin one GPU per local rank, where there are GPUs."""
        pin_tensorflow_gpu(engine.local_rank(), engine.local_size())

    def dense(self, gradients: list) -> list:
        """``IndexedSlices`` (an ``Embedding``'s gradient) made dense."""
        import tensorflow as tf

        return [tf.convert_to_tensor(g) for g in gradients]

    def broadcast(self, engine: Any, variables: list, root_rank: int) -> None:
        """One grouped broadcast of the variables' TensorFlow values."""
        import keras

        values = [v.value if isinstance(v, keras.Variable) else v for v in variables]
        engine.broadcast_variables(values, root_rank=root_rank)

    def outside_step(self) -> contextlib.AbstractContextManager:
        """``tf.init_scope``: out of the traced step into eager execution."""
        import tensorflow as tf

        return tf.init_scope()

    def when(self, condition: Any, action: Callable[[], None]) -> None:
        """``tf.cond``: traced into the step, run where ``condition`` holds."""
        import tensorflow as tf

        def act():
            action()
            return tf.constant(True)

        tf.cond(condition, act, lambda: tf.constant(False))

    def squared_norm(self, tensors: list) -> Any:
        """One pass a tensor (``l2_loss`` is ``‖t‖²/2``), summed in float64."""
        import tensorflow as tf

        return tf.add_n([2 * tf.cast(tf.nn.l2_loss(t), tf.float64) for t in tensors])

    def compiled(self, function: Callable) -> Callable:
        """A ``tf.function`` (no autograph)."""
        import tensorflow as tf

        return tf.function(function, autograph=False)

    def _gradients_of(self, model: keras.Model, x, y) -> Callable:
        import tensorflow as tf

        def gradients(x, y):
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=False))
            return tape.gradient(loss, model.trainable_variables)

        shapes = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None], y.dtype)]
        return tf.function(gradients, input_signature=shapes, autograph=False)
