"""Keras on PyTorch: Horovod's PyTorch binding, called eagerly in Keras's train step (float32 or
fp16 gradients, or each worker's encoding of them, from the allreduce hook; parameters averaged
after the update under partial synchronisation or local SGD), Horovod's elastic driver, and the
optimizers' multi-tensor updates. It runs every technique TensorFlow runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolkit import codecs
from toolkit.backends.base import Backend
from toolkit.backends.devices import gpu_for_worker
from toolkit.sections import SYNC_MODES

if TYPE_CHECKING:
    import keras
    import numpy as np


class TorchBackend(Backend):
    """Keras's PyTorch backend (see the module's docstring)."""

    name = "torch"
    codecs = codecs.MODES
    sync_modes = SYNC_MODES
    elastic = adascale = adaptive_batch = True
    horovod_module = "horovod.torch"  # whose collectives take torch tensors
    one_step_per_call = True  # Keras's PyTorch trainer
    multi_tensor_updates = True

    def start_worker(self, engine: Any) -> None:
        """The GPU its local rank names as PyTorch's current device (Keras's PyTorch backend
        puts its tensors on ``"cuda"``, the current one), and its share of the CPU cores as
        PyTorch's threads. PyTorch's OpenMP threads wait by spinning, so workers that each take
        every core slow one another down (two workers on 2 cores: 44 ms a step of a small MLP,
        against 10 ms with a core each)."""
        import torch

        local_rank, local_size = engine.local_rank(), engine.local_size()
        if local_size > 1:
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
        if torch.cuda.is_available():
            gpu = gpu_for_worker(local_rank, local_size, list(range(torch.cuda.device_count())))
            torch.cuda.set_device(gpu)

    def tensor(self, array: np.ndarray) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(np.ascontiguousarray(array))

    def broadcast(self, engine: Any, variables: list, root_rank: int) -> None:
        """In place, into each variable's tensor: one grouped broadcast."""
        tensors = [(f"broadcast.{i}", v.value.data) for i, v in enumerate(variables)]
        engine.broadcast_parameters(tensors, root_rank=root_rank)

    def squared_norm(self, tensors: list) -> Any:
        return sum(t.double().square().sum() for t in tensors)

    def _gradients_of(self, model: keras.Model, x, y) -> Callable:
        from keras import ops

        def gradients(x, y):
            x, y = ops.convert_to_tensor(x), ops.convert_to_tensor(y)
            model.zero_grad()
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=False))
            loss.backward()
            grads = [v.value.grad for v in model.trainable_variables]
            model.zero_grad()
            return grads

        return gradients
