"""toolkit.parallel.compression in this process (one worker, so the reduced update is what this
worker sent): MXNet's 2-bit layout, DGC's momentum correction against momentum SGD, its sparsity
warm-up against the paper's schedule, and LARS's trust ratio from the dense gradient's norm.
What two real workers exchange is checked against a simulation in tests/test_distributed.py."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_distributed import mxnet_2bit_pack

from toolkit.optimizers import LARS, SGD
from toolkit.parallel import distributed
from toolkit.parallel.compression import Sparse, TwoBit


@pytest.mark.parametrize("entries", [1, 16, 37, 160])
def test_two_bit_codes_pack_in_mxnets_layout_and_round_trip(entries):
    """On every backend (tests/test_every_backend.py runs it on each)."""
    codes = np.random.default_rng(entries).choice([0, 2, 3], size=entries).astype("int32")
    words = keras.ops.convert_to_numpy(TwoBit.pack(keras.ops.convert_to_tensor(codes)))
    np.testing.assert_array_equal(words, mxnet_2bit_pack(codes))  # byte for byte
    assert words.nbytes == 4 * -(-entries // 16)  # 16 entries a 32-bit word
    unpacked = TwoBit.unpack(keras.ops.convert_to_tensor(words))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(unpacked)[:entries], codes)


def test_sparsity_warm_up_follows_the_papers_schedule():
    """DGC: 25%, 6.25%, 1.5625%, 0.4%, then 0.1% over four warm-up epochs."""
    densities = Sparse("topk", ratio=0.001, warmup_epochs=4, updates_per_epoch=10).densities()
    np.testing.assert_allclose(densities, [0.25, 0.0625, 0.015625, 0.004, 0.001], rtol=0.02)


def run(optimizer, steps: int = 6, shapes=((6, 5), (7,))):
    """Apply ``steps`` seeded gradients to variables starting at one; their values each step."""
    variables = [keras.Variable(np.ones(s, "float32")) for s in shapes]
    apply = tf.function(lambda grads: optimizer.apply(grads, variables))
    rng, seen = np.random.default_rng(0), []
    for _ in range(steps):
        apply([tf.constant(rng.normal(size=s).astype("float32")) for s in shapes])
        seen.append([v.numpy() for v in variables])
    return seen


WRAPPINGS = {  # how the optimizer is used: alone, under mixed precision, accumulating 2 steps
    "alone": (lambda optimizer: optimizer, {}),
    "mixed precision": (keras.optimizers.LossScaleOptimizer, {}),
    "accumulation": (lambda optimizer: optimizer, {"backward_passes_per_step": 2}),
}


@pytest.mark.parametrize("wrapping", list(WRAPPINGS))
def test_momentum_correction_sending_everything_is_momentum_sgd(wrapping):
    """With every entry sent, the velocity the allreduce keeps is the optimizer's own buffer:
    the same updates, bit for bit, and the optimizer applies them without momentum. (Weight
    decay stays with the optimizer, outside the velocity, as in DGC's reference code.) Under
    mixed precision the allreduce sees the unscaled gradient; accumulating, the mean of the
    steps, once per update."""
    wrap, options = WRAPPINGS[wrapping]
    corrected = SGD(0.1, momentum=0.9)
    dense = wrap(SGD(0.1, momentum=0.9))
    distributed.DistributedOptimizer(dense, **options)
    got = run(
        distributed.DistributedOptimizer(
            wrap(corrected), compression="topk", ratio=1.0, momentum_correction=True, **options
        )
    )
    for got_step, want_step in zip(got, run(dense), strict=True):
        for g, w in zip(got_step, want_step, strict=True):
            np.testing.assert_array_equal(g, w)
    assert corrected.momentum == 0.0 and corrected.moved_momentum == 0.9


def test_momentum_correction_is_refused_where_the_velocity_differs():
    with pytest.raises(ValueError, match="nesterov"):
        distributed.DistributedOptimizer(
            SGD(0.1, momentum=0.9, nesterov=True), compression="topk", dgc=True
        )
    with pytest.raises(ValueError, match="SGD, LARS or LBSGD"):
        distributed.DistributedOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.9), compression="topk", dgc=True
        )
    with pytest.raises(ValueError, match="compressed mode"):
        distributed.DistributedOptimizer(SGD(0.1, momentum=0.9), dgc=True)


@pytest.mark.parametrize("source", ["sent", "dense norm", "momentum correction"])
def test_lars_takes_its_trust_ratio_from_the_dense_gradient_norm(source):
    """topk 10%: the sent update is a tenth of the gradient; with dense_norm (and always under
    momentum correction, where the update is a velocity) the trust ratio is still
    ``eta ||w|| / (||g|| + wd ||w||)`` of this step's whole gradient ``g``."""
    eta, wd, shape = 0.02, 1e-4, (6, 5)
    momentum = 0.9 if source == "momentum correction" else 0.0
    lars = LARS(0.0, momentum=momentum, weight_decay=wd, trust_coefficient=eta)
    distributed.DistributedOptimizer(
        lars,
        compression="topk",
        ratio=0.1,
        dense_norm=source == "dense norm",
        momentum_correction=source == "momentum correction",
    )
    w = keras.Variable(np.ones(shape, "float32"))
    rng, residual = np.random.default_rng(1), np.zeros(shape, "float32")
    for _ in range(2):  # the second step's velocity is not its gradient, nor what it sends
        g = rng.normal(size=shape).astype("float32")
        lars.apply([tf.constant(g)], [w])
        flat = g + residual
        sent = np.where(np.abs(flat) >= np.sort(np.abs(flat).ravel())[-3], flat, 0)  # k = 3
        residual = flat - sent
    norm = np.linalg.norm(sent if source == "sent" else g)
    weight_norm = np.sqrt(30.0)  # rate 0: w stays at ones
    (ratio,) = lars.applied_trust_ratios().values()
    np.testing.assert_allclose(ratio, eta * weight_norm / (norm + wd * weight_norm), rtol=1e-5)
