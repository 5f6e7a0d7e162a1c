"""The interface every Keras backend the lab trains on implements: a :class:`Backend`.

A backend says **what it can do**, as class attributes the config's rules read before any
process starts (which gradient codecs its exchange carries, which synchronisation modes, an
elastic world, AdaScale, an adaptive batch), and **does what differs** between Keras's backends
once a worker runs: which Horovod carries its collectives, how a worker takes its share of the
host, how a tensor is made for that Horovod, how a function is compiled and the model's step
configured, how a conditional side effect runs (in a graph or eagerly), the dtype of
higher-precision state, and how rank 0 acts alone. Nothing outside :mod:`toolkit.backends`
asks a backend's name to decide what to do.

Importing this module, or a backend's, imports no Keras: a launcher reads the attributes of the
backend its workers will get. A new backend is one module with a subclass and one line in
:data:`toolkit.backends.REGISTRY`.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from toolkit import codecs
from toolkit.errors import ConfigError

if TYPE_CHECKING:
    import keras
    import numpy as np

_GRADIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> compiled


class Backend:
    """One Keras backend (see the module's docstring). The defaults are Keras's portable
    ``keras.ops`` forms; a backend overrides what it does otherwise."""

    name: ClassVar[str]
    """Keras's name for it, the value of ``KERAS_BACKEND``."""

    # ---------------------------------------------------------------- what it can do
    codecs: ClassVar[tuple[str, ...]] = (codecs.DENSE.name,)
    """The ``allreduce.compression`` modes its gradient exchange carries."""
    sync_modes: ClassVar[tuple[str, ...]] = ("full",)
    """The ``sync.mode`` values it runs."""
    elastic: ClassVar[bool] = False
    """Whether it trains in an elastic world (workers leaving and joining)."""
    adascale: ClassVar[bool] = False
    """Whether it runs AdaScale's rate (``lr_scaling.rule: adascale``)."""
    adaptive_batch: ClassVar[bool] = False
    """Whether it runs an adaptive batch (``batch.adaptive``)."""
    varying_payloads: ClassVar[bool] = True
    """Whether its exchange carries an encoding whose size varies from update to update (a
    threshold's count, a top-k read off a sample, a sparsity warm-up's k)."""
    lacks: ClassVar[str] = ""
    """Why it refuses what it refuses, in one sentence (shown with every refusal)."""

    # ---------------------------------------------------------------- how it trains
    horovod_module: ClassVar[str] = "horovod.tensorflow"
    """The Horovod that carries its collectives (:meth:`horovod`); inside the train step too,
    unless the backend's own collectives do (:meth:`allreduce_mean`, :meth:`allgather`)."""
    one_program: ClassVar[bool] = False
    """Its workers are one compiled program (JAX's engine): assigning a variable is
    collective, so every worker does it, and its step runs on each worker's own batch only
    once :meth:`per_worker_step` made it."""
    jit_compile: ClassVar[bool] = False
    """The ``jit_compile`` its train step is compiled with (Horovod's ops cannot run inside
    XLA)."""
    one_step_per_call: ClassVar[bool] = False
    """Its Keras trainer runs one step per call (``steps_per_execution`` is 1)."""
    multi_tensor_updates: ClassVar[bool] = False
    """The optimizers update every variable at once (:mod:`toolkit.optimizers.multi_tensor`)."""
    tensorflow_kernels: ClassVar[bool] = False
    """Its variables are TensorFlow's, so the optimizers' fused and raw TensorFlow kernels
    apply (:mod:`toolkit.optimizers.kernels`)."""
    unused_imports: ClassVar[tuple[str, ...]] = ("sklearn", "jax")
    """What Keras and TensorFlow import only because it is installed and a worker of this
    backend never calls: scikit-learn (Keras's scikit-learn wrappers) and JAX (TensorFlow
    Lite's ``jit``, Keras's Orbax callback). :func:`toolkit.backends.import_for_a_worker`
    leaves them out."""

    def refusal(
        self,
        *,
        codec: str = "none",
        sync_mode: str = "full",
        elastic: bool = False,
        adaptive_batch: bool = False,
        adascale: bool = False,
        varying_payload: bool = False,
    ) -> str | None:
        """What the first of these settings this backend does not run would need instead,
        naming its field (``"sync.mode 'full'"``), else ``None``: the one rule the config's
        check and the distributed optimizer ask."""
        for refused, needs in (
            (elastic and not self.elastic, "no elastic section"),
            (
                codec not in self.codecs,
                "allreduce.compression " + " or ".join(repr(c) for c in self.codecs),
            ),
            (
                varying_payload and not self.varying_payloads,
                "an encoding of fixed size (allreduce.topk_sample 0, "
                "allreduce.sparsity_warmup_epochs 0)",
            ),
            (
                sync_mode not in self.sync_modes,
                "sync.mode " + " or ".join(repr(m) for m in self.sync_modes),
            ),
            (adaptive_batch and not self.adaptive_batch, "no batch.adaptive section"),
            (adascale and not self.adascale, "lr_scaling.rule other than 'adascale'"),
        ):
            if refused:
                return needs
        return None

    def check(self, **settings) -> None:
        """Raise :class:`~toolkit.errors.ConfigError` naming the backend, the field and why
        (:attr:`lacks`) where :meth:`refusal` refuses ``settings``."""
        if refused := self.refusal(**settings):
            raise ConfigError(f"KERAS_BACKEND={self.name} needs {refused}: {self.lacks}")

    # ---------------------------------------------------------------- its workers
    def horovod(self) -> Any:
        """The Horovod module that carries this backend's collectives, :attr:`horovod_module`
        (``None`` where Horovod cannot be imported). A process starts only one: each has its
        own rendezvous."""
        try:
            return importlib.import_module(self.horovod_module)
        except ImportError:
            return None

    def start_worker(self, engine: Any) -> None:
        """Make this process a worker of ``engine``'s started world: its device and threads,
        and for a backend that averages in its step, the joined program."""

    def tensor(self, array: np.ndarray) -> Any:
        """``array`` as a tensor :meth:`horovod`'s collectives take."""
        import tensorflow as tf

        return tf.constant(array)

    def dense(self, gradients: list) -> list:
        """The gradients as dense tensors, as the allreduce hook takes them."""
        return list(gradients)

    def broadcast(self, engine: Any, variables: list, root_rank: int) -> None:
        """Assign rank ``root_rank``'s values to ``variables`` on every worker (``engine``:
        :meth:`horovod`'s started module)."""
        import keras

        values = engine.broadcast_object(
            [keras.ops.convert_to_numpy(v) for v in variables], root_rank
        )
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Run what rank 0 does by itself (writing a checkpoint) where no collective of the
        others could be reached."""
        yield

    def outside_step(self) -> contextlib.AbstractContextManager:
        """A context in which variables made while a step runs are made once, outside it (a
        traced step's graph); nothing where steps run eagerly."""
        return contextlib.nullcontext()

    def per_worker_step(self, model: keras.Model) -> None:
        """Make ``model``'s train step run on this worker's own batch, its gradients this
        worker's until the optimizer's allreduce hook averages them (the step already is, where
        each worker is its own program)."""

    def carry(self, optimizer: keras.optimizers.Optimizer, variables: list) -> None:
        """Make ``variables``, state outside the model that ``optimizer``'s update writes (a
        traffic counter, the noise meter's norms, the trust ratios applied), part of what the
        compiled step keeps: nothing where a step writes variables in place."""

    def assign_own(self, variable: keras.Variable, value: np.ndarray) -> None:
        """Assign ``variable`` this worker's own ``value`` (a codec's residual), which the
        other workers' values need not equal."""
        variable.assign(value)

    def carried(self, optimizer: keras.optimizers.Optimizer) -> list:
        """What :meth:`carry` made part of ``optimizer``'s variables (none where a step writes
        variables in place): not the optimizer's state, so a saved model leaves it out."""
        return []

    # ---------------------------------------------------------------- inside its step
    def allreduce_mean(self, engine: Any, tensors: list, compression: Any = None) -> list:
        """The workers' mean of each of ``tensors``, inside the train step: one grouped
        allreduce of ``engine`` (:meth:`horovod`'s started module), sent through
        ``compression`` (a Horovod compressor: ``compress``/``decompress``)."""
        wire = compression if compression is not None else engine.Compression.none
        return engine.grouped_allreduce(tensors, op=engine.Average, compression=wire)

    def allgather(self, engine: Any, tensors: list) -> list:
        """Each of ``tensors`` concatenated over the workers along its first axis, in rank
        order, inside the train step (one grouped allgather)."""
        return engine.grouped_allgather(tensors)

    def allreduce_min(self, engine: Any, tensor: Any) -> Any:
        """The workers' minimum of ``tensor``, inside the train step."""
        return engine.allreduce(tensor, op=engine.Min)

    # ---------------------------------------------------------------- its arithmetic
    def when(self, condition: Any, action: Callable[[], None]) -> None:
        """Run ``action`` (side effects only) where the boolean tensor ``condition`` holds,
        eagerly or in the traced step as the backend runs it."""
        if bool(condition):
            action()

    def squared_norm(self, tensors: list) -> Any:
        """``Σ‖t‖²`` over ``tensors``, in float64."""
        from keras import ops

        return sum(ops.sum(ops.square(ops.cast(t, "float64"))) for t in tensors)

    def state_dtype(self) -> str:
        """The dtype of state kept in higher precision (AdaScale's averages): ``float64``."""
        return "float64"

    def compiled(self, function: Callable) -> Callable:
        """``function`` compiled as the backend compiles (itself where it runs eagerly)."""
        return function

    def compiled_stateful(self, function: Callable) -> Callable:
        """``function``, which reads or writes variables, compiled where the backend's compiled
        functions read and write them as they are at each call (:meth:`compiled`), as it is
        elsewhere."""
        return self.compiled(function)

    def steps_per_execution(self, planned: int) -> int:
        """The ``steps_per_execution`` the model compiles with, given the plan's."""
        return 1 if self.one_step_per_call else planned

    def loss_gradients(self, model: keras.Model, x, y) -> list:
        """The gradients of ``model``'s compiled loss on ``(x, y)``, one per trainable
        variable, the model run with ``training=False`` (no dropout, batch norm's moving
        statistics untouched). Compiled once per model (eagerly a gradient costs several times
        a compiled one; tracing one costs about a second for a ResNet), for any batch size."""
        if model not in _GRADIENTS:
            _GRADIENTS[model] = self._gradients_of(model, x, y)  # x, y: what to compile for
        return _GRADIENTS[model](x, y)

    def _gradients_of(self, model: keras.Model, x, y) -> Callable:
        """A function of ``(x, y)`` giving :meth:`loss_gradients`, for inputs like these."""
        raise NotImplementedError
