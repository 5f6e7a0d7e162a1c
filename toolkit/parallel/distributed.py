"""Horovod for Keras 3: the glue over the backend's Horovod (``horovod.tensorflow``'s or
``horovod.torch``'s ops, as :meth:`toolkit.backends.base.Backend.horovod` gives) and, inside
the train step, the backend's collectives (Horovod's, or on JAX JAX's own).

Horovod's own ``horovod.tensorflow.keras`` targets Keras 2. This module gives the same recipe
for Keras 3 on every backend (on JAX, several workers join JAX's own engine at :func:`init`,
and :class:`BroadcastInitialState` maps the train step over them:
:mod:`toolkit.backends.jax_engine`)::

    distributed.init()
    optimizer = distributed.DistributedOptimizer(optimizer)   # before model.compile
    model.compile(optimizer=optimizer, loss=..., jit_compile=False)
    model.fit(..., callbacks=[distributed.BroadcastInitialState(),
                              distributed.MetricAverageCallback(), ...])
    if distributed.is_rank0(): ...                            # files, progress output

With one process and no ``horovodrun`` everything works unchanged: ``size() == 1`` and no
collective op is added. If Horovod cannot be imported at all, the module logs it and runs as a
single process (and refuses to, under ``horovodrun``).

Where the allreduce sits: Keras's ``Optimizer.apply`` unscales the gradients and ends in
``_backend_apply_gradients``, which accumulates them when ``gradient_accumulation_steps`` is
set and, once per update, calls ``_clip_gradients(grads)`` right before weight decay and the
update step. :func:`DistributedOptimizer` replaces exactly that hook *on the instance*: one
``grouped_allreduce`` (average) of all gradients, then the optimizer's own clipping and update.
So local accumulation over N steps costs one allreduce per N steps, clipping and LARS-style
trust ratios see the global gradient, and the optimizer's class, config and saved form are
untouched (a dynamic subclass would not do: Keras serialises a registered class by its
registered name, which a subclass lacks, so ``model.save`` could not be loaded back).

What that hook sends is :mod:`toolkit.parallel.compression`'s choice (float32, fp16, or a sparsified
allgather with error feedback). Partial synchronisation and local SGD (:mod:`toolkit.parallel.sync`)
reduce no gradient: they wrap the instance's ``apply`` instead, averaging parameters after the
update.

Mixed precision: wrap the ``LossScaleOptimizer``, not the other way round. Its finite-gradient
check runs on the local, still-scaled gradients before the inner optimizer is called; the
wrapper makes it global (a ``Min`` allreduce), so all workers skip or apply the same steps, and
the inner optimizer allreduces the unscaled gradients. If Keras wraps a distributed optimizer
itself (``compile`` under ``mixed_float16``), :func:`check_model` refuses: a local check lets
one worker skip an allreduce the others wait in.

Horovod's ops cannot run inside an XLA cluster on CPU: compile with ``jit_compile=False``
(:func:`check_model` refuses ``jit_compile=True`` when ``size() > 1``).

On PyTorch the same hook runs eagerly, in Keras's train step, with ``horovod.torch``'s grouped
allreduce; the process starts that Horovod, not TensorFlow's. What each backend's exchange
carries is its own (:meth:`toolkit.backends.base.Backend.check`), asked here as the config's
check asks it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import keras
import numpy as np

from toolkit import backends, codecs
from toolkit import config as config_lib
from toolkit.communication import Communication
from toolkit.optimizers import accumulates_batches, applies_trust_ratios, unwrapped
from toolkit.optimizers.base import state_variables
from toolkit.parallel import compression as compression_lib
from toolkit.parallel import sync as sync_lib
from toolkit.parallel.noise_meter import GradientNoiseMeter

_log = logging.getLogger(__name__)

T = TypeVar("T")
_WIRING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> _Wiring


@dataclasses.dataclass(frozen=True)
class _Wiring:
    """What :func:`DistributedOptimizer` installed on an optimizer that training reads back."""

    traffic: compression_lib.Traffic
    compressed: compression_lib.CompressedAllreduce | None


def init() -> None:
    """Start the backend's Horovod (idempotent) and make this process its worker: on GPU
    machines one GPU per local rank, on JAX one program with the others
    (:meth:`~toolkit.backends.base.Backend.start_worker`).

    Call it before the backend touches a GPU: once TensorFlow has initialised its GPUs the
    pinning cannot be changed and is skipped with a warning.
    """
    engine = _engine()
    if engine is None:
        if "HOROVOD_RANK" in os.environ:
            raise RuntimeError("started by horovodrun, but Horovod cannot be imported")
        return
    if engine.is_initialized():
        return
    engine.init()
    backends.current().start_worker(engine)


@functools.cache
def _engine():
    """The Horovod of Keras's backend (:meth:`~toolkit.backends.base.Backend.horovod`), or
    ``None`` where Horovod cannot be imported (said once: the run is one process)."""
    engine = backends.current().horovod()
    if engine is None:
        _log.warning("Horovod cannot be imported: running as a single process")
    return engine


def restart() -> None:
    """Shut Horovod down and start it again, with the workers the elastic driver has now."""
    engine = _engine()
    engine.shutdown()
    engine.init()


def elastic() -> bool:
    """Whether this process is a worker of an elastic run (``horovodrun --min-np/--max-np``),
    whose number of workers may change while it trains."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def collective_gradients() -> bool:
    """Whether gradients need collectives: more than one worker now, or an elastic run, which
    may grow while it trains."""
    return size() > 1 or elastic()


def one_program() -> bool:
    """Whether the workers are one compiled program (JAX's engine, with several workers):
    assigning a variable is collective, so every worker must do it."""
    return size() > 1 and backends.current().one_program


def rank() -> int:
    """This worker's rank, 0 .. size() - 1."""
    init()
    engine = _engine()
    return engine.rank() if engine else 0


def size() -> int:
    """The number of workers."""
    init()
    engine = _engine()
    return engine.size() if engine else 1


def local_rank() -> int:
    """This worker's rank on its machine (which GPU it uses)."""
    init()
    engine = _engine()
    return engine.local_rank() if engine else 0


def is_rank0() -> bool:
    """Whether this process does the run's side effects (files, progress output)."""
    return rank() == 0


def on_rank0(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorator: ``fn`` runs on rank 0 only; other ranks skip it and get ``None``.

    For side effects (writing files, printing). Never put a collective op (allreduce,
    broadcast) inside: the other ranks would not join it.
    """

    @functools.wraps(fn)
    def on_rank0_only(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if is_rank0() else None

    return on_rank0_only


def broadcast_object(value: T, root_rank: int = 0) -> T:
    """``value`` as rank ``root_rank`` has it (any picklable object; the others' may be of
    another type, such as ``None``: Horovod names the collective by the value's type unless
    told, and workers whose names differ wait for one another forever)."""
    if size() == 1:
        return value
    return _engine().broadcast_object(value, root_rank, name="broadcast_object")


def allgather_object(value: T) -> list[T]:
    """Every worker's ``value`` (any picklable object, of any type), in rank order, on every
    worker."""
    return _engine().allgather_object(value, name="allgather_object") if size() > 1 else [value]


def allgather_rows(row: np.ndarray, name: str | None = None) -> np.ndarray:
    """Every worker's ``row`` of numbers, stacked in rank order (``(workers, len(row))``, in
    float64), on every worker: one collective, no pickling. Every worker must call it, in the
    same order, with the same length."""
    row = np.asarray(row, dtype=np.float64)[None, :]
    if size() == 1:
        return row
    return _engine().allgather(backends.current().tensor(row), name=name).numpy()


def allreduce_mean(value: float | np.ndarray, name: str | None = None) -> float | np.ndarray:
    """The mean of a number or array over all workers (in float64), eagerly.

    Every worker must call it, in the same order, with the same shape (and ``name``, if given).
    """
    if size() == 1:
        return value if isinstance(value, np.ndarray) else float(value)
    engine = _engine()
    mean = engine.allreduce(
        backends.current().tensor(np.asarray(value, np.float64)), op=engine.Average, name=name
    ).numpy()
    return mean if isinstance(value, np.ndarray) else float(mean)


def DistributedOptimizer(  # named like Horovod's wrapper, which it replaces
    optimizer: keras.optimizers.Optimizer,
    communication: Communication | None = None,
    *,
    updates_per_epoch: int | None = None,
    backward_passes_per_step: int = 1,
    noise_meter: GradientNoiseMeter | None = None,
    **options,
) -> keras.optimizers.Optimizer:
    """Make ``optimizer`` average its gradients (or, with parameter averaging, its parameters)
    over all workers; returns the same object.

    What goes on the wire and what is averaged is ``communication``
    (:class:`~toolkit.communication.Communication`, which has checked that its options go
    together), or, as a shorthand, its options as keywords: the ``allreduce:`` section's
    fields, and ``sync`` and ``period`` for the ``sync:`` section's
    (``DistributedOptimizer(opt, compression="topk", ratio=0.01, dgc=True)``;
    :func:`toolkit.config.communication`). Default: float32 gradients every update.

    Wrap before ``model.compile``. Each update reduces all gradients at once right before the
    optimizer's clipping and update (see the module docstring). Sparse gradients
    (``IndexedSlices``, from ``Embedding``) are made dense first. What each compression sends
    (:mod:`toolkit.parallel.compression`):

    - ``none``: one ``grouped_allreduce`` (average) in float32;
    - ``fp16``: the same in float16 (half the bytes, ~3 significant digits), finite values
      clipped to ``±fp16_clip`` before the cast (default: float16's largest over the number of
      workers, so the sum over the workers cannot overflow to ``inf`` either);
    - ``topk``/``threshold``/``2bit``: each worker's encoding, allgathered, with error
      feedback and Deep Gradient Compression's techniques
      (:class:`~toolkit.communication.Techniques`). Momentum correction takes the optimizer's
      momentum (the toolkit's SGD, LARS or LBSGD, not built yet) into the allreduce: the
      optimizer then applies the averaged sent velocities without momentum, LARS and LBSGD
      their trust ratios and rates to them; their trust ratios then take the dense gradients'
      norms (the workers' mean ``‖g‖²``, one small allreduce), as ``dense_norm`` asks
      anyway. A sparsity warm-up counts its epochs in ``updates_per_epoch``.

    Parameter averaging (``sync`` partial or local SGD, :mod:`toolkit.parallel.sync`) reduces
    no gradient: each worker updates from its own gradient, and every ``period`` updates one
    partition of the parameters (``partial``: up to ``fusion_threshold_mb`` each, in turn) or
    all of them (``local_sgd``) is averaged. It takes one batch per update.

    ``backward_passes_per_step=N`` sets Keras's ``gradient_accumulation_steps``: N calls
    accumulate local gradients, the N-th reduces their mean once and applies it (so
    ``optimizer.iterations`` counts updates). With ``size() == 1`` no collective is added
    (except in an elastic run, which may grow; it takes no fp16 or parameter averaging); the
    sparse modes still select (and keep residuals), so one worker trains as its share would.

    A ``LossScaleOptimizer`` is wrapped as a whole: the inner optimizer allreduces and
    accumulates, and the finite-gradient check becomes global. ``noise_meter`` measures the
    gradient noise scale's norms in the same hook (with more than one worker).
    """
    if communication is None:
        communication = config_lib.communication(**options)
    elif options:
        raise TypeError(f"give a Communication or its options, not both (got {sorted(options)})")
    mode = communication.sync.mode
    backends.current().check(**communication.backend_needs, elastic=elastic())
    if elastic() and not communication.survives_resets:
        raise ValueError(
            "an elastic run averages gradients (sync='full') in float32 or sparsified, got "
            f"compression={communication.allreduce.compression!r}, sync={mode!r}: fp16's clip "
            "and the parameter averaging depend on a fixed number of workers"
        )
    if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
        raise ValueError(
            f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}"
        )
    if communication.averages_parameters and backward_passes_per_step != 1:
        raise ValueError(f"sync={mode!r} averages parameters: it takes no backward_passes_per_step")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        DistributedOptimizer(
            optimizer.inner_optimizer,
            communication,
            updates_per_epoch=updates_per_epoch,
            backward_passes_per_step=backward_passes_per_step,
            noise_meter=noise_meter,
        )
        if collective_gradients():
            _make_finite_check_global(optimizer)
        return optimizer
    many = collective_gradients()
    traffic = compression_lib.Traffic()
    if _allreduces(optimizer):
        raise ValueError(f"{optimizer.name} is already a DistributedOptimizer")
    reduce = _reducer(optimizer, traffic, communication, updates_per_epoch)
    if backward_passes_per_step > 1:
        _accumulate(optimizer, int(backward_passes_per_step))
    compressed = reduce if isinstance(reduce, compression_lib.CompressedAllreduce) else None
    if compressed is not None:
        _build_with_the_optimizer(optimizer, compressed)
    if communication.averages_parameters:
        if accumulates_batches(optimizer) is not None:
            raise ValueError(f"sync={mode!r}: {type(optimizer).__name__} accumulates gradients")
        if many:
            _average_after_update(optimizer, communication, traffic)
            if noise_meter is not None:  # the hook only measures: the gradient stays local
                _allreduce_before_clipping(optimizer, lambda grads: grads, noise_meter, False)
    elif compressed is not None:  # changes the update, even alone
        meter = noise_meter if many else None
        _allreduce_before_clipping(optimizer, compressed, meter, mean=False)
    elif many:
        _allreduce_before_clipping(optimizer, reduce, noise_meter)
    if compressed is not None or many:
        _WIRING[optimizer] = _Wiring(traffic, compressed)
        metered = noise_meter.variables if noise_meter is not None and many else []
        backends.current().carry(optimizer, [traffic.sent, *metered])
    return optimizer


def traffic(optimizer: keras.optimizers.Optimizer) -> compression_lib.Traffic | None:
    """The bytes counter of what :func:`DistributedOptimizer` installed on ``optimizer`` (or on
    the optimizer a ``LossScaleOptimizer`` wraps); ``None`` where nothing is sent."""
    wiring = _wiring(optimizer)
    return wiring.traffic if wiring else None


def compressed_allreduce(
    optimizer: keras.optimizers.Optimizer,
) -> compression_lib.CompressedAllreduce | None:
    """The compressed allreduce (``topk``/``threshold``/``2bit``) that
    :func:`DistributedOptimizer` installed on ``optimizer`` (or on the optimizer a
    ``LossScaleOptimizer`` wraps), whose residuals and velocities are training state; ``None``
    for any other optimizer."""
    wiring = _wiring(optimizer)
    return wiring.compressed if wiring else None


def _wiring(optimizer: keras.optimizers.Optimizer) -> _Wiring | None:
    return _WIRING.get(unwrapped(optimizer))


def _reducer(
    optimizer: keras.optimizers.Optimizer,
    traffic: compression_lib.Traffic,
    communication: Communication,
    updates_per_epoch: int | None,
) -> Callable[[list], list]:
    """The function that averages a list of gradients over the workers as ``communication``
    says, and counts what it sends in ``traffic``; an encoded mode's takes the optimizer's
    momentum under momentum correction."""
    allreduce, techniques = communication.allreduce, communication.techniques
    if not communication.encoded:
        return _dense_reducer(communication.codec, allreduce.fp16_clip, traffic)
    momentum = communication.take_momentum(optimizer, type(optimizer).__name__)
    codec = compression_lib.encoder(allreduce, techniques, updates_per_epoch)
    dense_norms = communication.norms_from_dense and applies_trust_ratios(optimizer)
    collective = collective_gradients()
    return compression_lib.CompressedAllreduce(
        codec,
        _allgather_tensors if collective else _identity,
        _allreduce_mean_tensors if collective else _identity,
        _engine().size_op if elastic() else size(),  # an elastic run's world: the step's
        residual=allreduce.residual,
        momentum=momentum,
        masking=techniques.momentum_masking,
        local_clipnorm=techniques.local_clipnorm or None,
        dense_1d=techniques.dense_1d,
        updates=optimizer.iterations,
        fusion_threshold_bytes=communication.fusion_bytes,
        traffic=traffic,
        on_dense_norms=optimizer.use_gradient_norms if dense_norms else None,
    )


def _dense_reducer(
    codec: codecs.Codec, fp16_clip: float | None, traffic: compression_lib.Traffic
) -> Callable[[list], list]:
    """One grouped allreduce (average) in float32, or in float16 (``fp16``), by the
    backend's collectives."""
    wire = None
    if codec is codecs.FP16:
        clip = fp16_clip if fp16_clip is not None else compression_lib.FLOAT16_MAX / size()
        wire = compression_lib.Float16(clip)
    element = codec.element_bytes

    def allreduce(grads: list) -> list:
        traffic.count_dense(grads)
        traffic.add(element * sum(compression_lib.elements(g) for g in grads))
        return backends.current().allreduce_mean(_engine(), grads, wire)

    return allreduce


def _build_with_the_optimizer(
    optimizer: keras.optimizers.Optimizer, compressed: compression_lib.CompressedAllreduce
) -> None:
    """Create ``compressed``'s state as ``optimizer`` is built (now, if it is), outside any
    step, and have the backend carry it with the optimizer's."""
    build, backend = optimizer.build, backends.current()  # the class's, bound

    def with_state(variables: list) -> None:
        compressed.build(variables)
        backend.carry(optimizer, compressed.variables)

    if optimizer.built:
        with_state(optimizer._trainable_variables)
        return

    def build_then_state(variables: list) -> None:
        build(variables)
        with_state(variables)

    optimizer.build = build_then_state


def _accumulate(optimizer: keras.optimizers.Optimizer, steps: int) -> None:
    current = optimizer.gradient_accumulation_steps
    if accumulates_batches(optimizer) is not None or current not in (None, steps):
        raise ValueError(
            f"{type(optimizer).__name__} accumulates gradients itself; use its own setting "
            "(batch_scale / gradient_accumulation_steps), not backward_passes_per_step"
        )
    if current == steps:  # e.g. restored by load_model
        return
    if optimizer.built:
        raise ValueError(
            "backward_passes_per_step needs an optimizer that is not built yet "
            "(its accumulators are created when it is built)"
        )
    optimizer.gradient_accumulation_steps = steps


def _allreduce_before_clipping(
    optimizer: keras.optimizers.Optimizer,
    reduce: Callable[[list], list],
    noise_meter: GradientNoiseMeter | None,
    mean: bool = True,
) -> None:
    """Put ``reduce`` before the optimizer's clipping (``mean``: it returns the workers' mean
    gradient, which the noise meter can use as it is)."""
    clip, backend = optimizer._clip_gradients, backends.current()  # the class's hook, bound

    def allreduce_then_clip(grads: list) -> list:
        dense = backend.dense(grads)
        reduced = reduce(dense)
        if noise_meter is not None:
            noise_meter.measure(dense, reduced if mean else None)
        return clip(reduced)

    optimizer._clip_gradients = allreduce_then_clip


def _average_after_update(
    optimizer: keras.optimizers.Optimizer,
    communication: Communication,
    traffic: compression_lib.Traffic,
) -> None:
    averaging = sync_lib.ParameterAveraging(
        _allreduce_mean_tensors,
        communication.sync.mode,
        period=communication.sync.period,
        fusion_threshold_bytes=communication.fusion_bytes,
        traffic=traffic,
    )
    apply = optimizer.apply  # the class's, bound

    def apply_then_average(grads, trainable_variables=None):
        apply(grads, trainable_variables)
        averaging.after_update(optimizer.iterations, optimizer._trainable_variables)

    optimizer.apply = apply_then_average


def _allreduce_mean_tensors(tensors: list) -> list:
    return backends.current().allreduce_mean(_engine(), tensors)


def _allgather_tensors(tensors: list) -> list:
    return backends.current().allgather(_engine(), tensors)


def _identity(tensors: list) -> list:
    return tensors


def _allreduces(optimizer: keras.optimizers.Optimizer) -> bool:
    return "_clip_gradients" in vars(optimizer) or "apply" in vars(optimizer)


def _make_finite_check_global(optimizer: keras.optimizers.LossScaleOptimizer) -> None:
    local_check, backend = optimizer.check_finite, backends.current()

    def finite_on_every_worker(grads: list) -> Any:
        finite = keras.ops.cast(local_check(grads), "float32")
        return backend.allreduce_min(_engine(), finite) > 0.5

    optimizer.check_finite = finite_on_every_worker


def check_model(model: keras.Model) -> None:
    """Raise ``ValueError`` if the compiled ``model`` cannot train with more than one worker:
    XLA (``jit_compile=True``, except on JAX, whose collectives are XLA's), or a
    ``LossScaleOptimizer`` (added by ``compile`` under ``mixed_float16``) around a distributed
    optimizer, whose local finite check would let workers disagree on which steps to apply
    and hang. A no-op with one worker."""
    if not collective_gradients():
        return
    if model.jit_compile and not backends.current().jit_compile:
        raise ValueError(
            "Horovod's ops cannot run inside XLA: compile the model with jit_compile=False"
        )
    optimizer = model.optimizer
    if (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and _allreduces(optimizer.inner_optimizer)
        and "check_finite" not in vars(optimizer)
    ):
        raise ValueError(
            "the model's LossScaleOptimizer wraps a DistributedOptimizer; wrap the other way "
            "round: DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))"
        )


def train_per_worker(model: keras.Model) -> None:
    """Make ``model``'s train step run on this worker's own batch, its gradients its own until
    the allreduce hook (on JAX, the step mapped over the workers; elsewhere it is so already).
    :class:`BroadcastInitialState` does it as ``fit`` starts; call it before
    ``train_on_batch``. A no-op with one worker."""
    if collective_gradients():
        backends.current().per_worker_step(model)


def broadcast_variables(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer | None = None,
    root_rank: int = 0,
) -> None:
    """Make every worker's model weights (and ``optimizer``'s state, building it on the
    model's trainable variables if needed) equal to rank ``root_rank``'s. Random-number state
    (dropout seeds) stays per worker, and so does what the backend carries among the
    optimizer's variables without being its state (a worker's residuals: on JAX,
    :meth:`~toolkit.backends.base.Backend.carry`). A no-op with one worker."""
    if size() == 1:
        return
    variables = list(model.weights)
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += state_variables(optimizer)
    broadcast_values(variables, root_rank)


def broadcast_values(variables: list[keras.Variable], root_rank: int = 0) -> None:
    """Assign rank ``root_rank``'s values to ``variables`` (Keras 3 or TensorFlow variables)
    on every worker: one grouped broadcast. A no-op with one worker."""
    if size() > 1:
        backends.current().broadcast(_engine(), variables, root_rank)


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of ``fit``: :func:`check_model`, then broadcast the model's and optimizer's
    variables from rank 0 (so workers started with different seeds, or a resumed rank 0,
    agree), and :func:`train_per_worker`."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        check_model(self.model)
        broadcast_variables(self.model, self.model.optimizer)
        train_per_worker(self.model)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each epoch-end log value with its mean over workers (one allreduce per epoch,
    in place, so the callbacks after this one, ``History`` and the progress bar included, see
    global values)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs or size() == 1:
            return
        keys = sorted(logs)
        means = allreduce_mean(
            np.array([float(logs[k]) for k in keys]), name=f"MetricAverage.{epoch}"
        )
        logs.update(zip(keys, means.tolist(), strict=True))
