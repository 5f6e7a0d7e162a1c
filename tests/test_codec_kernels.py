"""The fused codec kernels (``toolkit/parallel/codec_kernels.cc``) against the TensorFlow ops of
``toolkit.parallel.compression`` they replace, bit for bit: every payload, every residual and
velocity, every averaged gradient. (What two real workers exchange through them is checked
against the numpy simulation in tests/test_distributed.py, where the fused path is the one
taken.)"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from toolkit.parallel import compression
from toolkit.parallel.compression import CompressedAllreduce, Sparse, TwoBit

# Over two 65,536-entry chunks, with a tensor boundary inside a chunk and a 7-entry tensor.
SHAPES = ((300, 250), (7,), (129, 513))

CODECS = {
    "threshold": lambda: Sparse("threshold", threshold=0.9),
    "topk sampled": lambda: Sparse("topk", ratio=0.01, topk_sample=0.01),
    "topk sampled, fp16 values": lambda: Sparse(
        "topk", ratio=0.05, topk_sample=0.1, value_dtype="float16"
    ),
    "topk sampled, warm-up": lambda: Sparse(
        "topk", ratio=0.01, topk_sample=0.01, warmup_epochs=2, updates_per_epoch=2
    ),
    "2bit": lambda: TwoBit(0.7),
}
TECHNIQUES = {  # CompressedAllreduce's options beyond the codec
    "residual": {},
    "dropped": {"residual": False},
    "momentum correction, masking": {"momentum": 0.9, "masking": True},
    "one bucket a tensor": {"fusion_threshold_bytes": 1},
}


def same(tensors):
    """The collectives of one worker."""
    return tensors


@pytest.fixture(scope="module")
def library():
    found = compression.fused_codecs()
    assert found is not None, "the set-up builds the fused kernels; this machine has no GPU"
    return found


def gradients(seed: int, shapes=SHAPES) -> list[tf.Tensor]:
    """Normal gradients rounded to 1/8, so magnitudes tie at every selection bar, and a few
    entries huge for float16's clip."""
    rng = np.random.default_rng(seed)
    grads = [np.round(rng.normal(size=s) * 8) / 8 for s in shapes]
    grads[0].flat[:3] = [1e6, -1e6, 70000.0]
    return [tf.constant(g.astype("float32")) for g in grads]


def run(codec_name: str, techniques: dict, fused: bool, steps: int = 5):
    """Each step's averaged gradients and the state after it, one worker."""
    updates = tf.Variable(0, dtype=tf.int64)
    allreduce = CompressedAllreduce(
        CODECS[codec_name](),
        same,
        same,
        1,
        updates=updates,
        fused=fused,
        **techniques,
    )
    step = tf.function(allreduce)
    seen = []
    for s in range(steps):
        out = step(gradients(s))
        seen.append(([t.numpy() for t in out], allreduce.state()))
        updates.assign_add(1)
    kernels = {op.type for op in step.get_concrete_function(gradients(0)).graph.get_operations()}
    return seen, kernels


@pytest.mark.parametrize("techniques", list(TECHNIQUES))
@pytest.mark.parametrize("codec", list(CODECS))
def test_a_fused_worker_takes_the_same_steps_bit_for_bit(library, codec, techniques):
    fused, kernels = run(codec, TECHNIQUES[techniques], fused=True)
    plain, plain_kernels = run(codec, TECHNIQUES[techniques], fused=False)
    encoder = "TwoBitEncode" if codec == "2bit" else "SparseEncode"
    assert encoder in kernels and encoder not in plain_kernels  # each path is the one taken
    for (got, got_state), (want, want_state) in zip(fused, plain, strict=True):
        for a, b in zip([*got, *got_state], [*want, *want_state], strict=True):
            np.testing.assert_array_equal(a, b)
    assert any(np.any(g) for g in fused[-1][0])  # something was sent


def test_exact_top_k_keeps_tensorflows_selection_and_decodes_fused(library):
    """Its entries come in ``top_k``'s order, not by index: the decode adds them as they come."""
    codec = Sparse("topk", ratio=0.01)
    graph = tf.function(CompressedAllreduce(codec, same, same, 1)).get_concrete_function(
        gradients(0)
    )
    kinds = {op.type for op in graph.graph.get_operations()}
    assert "TopKV2" in kinds and "SparseEncode" not in kinds and "SparseDecodeMean" in kinds
    entries = sum(int(np.prod(s)) for s in SHAPES)
    flats = [tf.concat([tf.reshape(g, [-1]) for g in gradients(rank)], 0) for rank in range(3)]
    payloads = [codec.encode(flat, 0, tf.int32)[0] for flat in flats]
    values, index = (tf.concat(slot, 0) for slot in zip(*payloads, strict=True))
    assert np.any(np.diff(index.numpy()) < 0)
    want = codec.decode_sum((values, index), entries) / 3
    got = codec.decode_mean_fused(library, (values, index), [tf.TensorShape(s) for s in SHAPES], 3)
    np.testing.assert_array_equal(tf.concat([tf.reshape(g, [-1]) for g in got], 0), want)


@pytest.mark.parametrize("workers", [2, 3, 5])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("codec", list(CODECS))
def test_payloads_and_their_mean_over_workers_are_bit_for_bit(library, codec, index_dtype, workers):
    """Each worker's payload from the kernel equals the TensorFlow ops' (index order included),
    and the kernel's mean of all the workers' payloads equals ``decode_sum / workers``."""
    codec = CODECS[codec]()
    entries = sum(int(np.prod(s)) for s in SHAPES)
    update = tf.constant(1, tf.int64)
    payloads = []
    for rank in range(workers):
        grads, residual = gradients(rank), gradients(100 + rank)
        flat = tf.concat([tf.reshape(g + r, [-1]) for g, r in zip(grads, residual)], 0)
        want, _ = codec.encode(flat, update, index_dtype)
        state = {
            "grads": grads,
            "velocities": [],
            "residuals": [tf.Variable(r).handle for r in residual],
            "momentum": 0.0,
            "masking": False,
        }
        got = codec.encode_fused(library, state, entries, update, index_dtype)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        payloads.append(want)
    gathered = [tf.concat(slot, 0) for slot in zip(*payloads, strict=True)]
    mean = codec.decode_sum(gathered, entries) / workers
    want = tf.split(mean, [int(np.prod(s)) for s in SHAPES])
    got = codec.decode_mean_fused(library, gathered, [tf.TensorShape(s) for s in SHAPES], workers)
    for a, b, shape in zip(got, want, SHAPES, strict=True):
        assert a.shape == shape
        np.testing.assert_array_equal(a.numpy(), tf.reshape(b, shape).numpy())


def test_bad_payloads_are_refused_with_the_reason(library):
    shapes = [tf.TensorShape([4])]
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        library.sparse_decode_mean([1.0], tf.constant([4]), 1, N=1, shapes=shapes)
    with pytest.raises(tf.errors.InvalidArgumentError, match="whole payloads"):
        library.two_bit_decode_mean(tf.zeros([3], tf.int32), 0.5, 2, N=1, shapes=[[17]])
    state = {"grads": [tf.ones([4])], "velocities": [], "residuals": [], "momentum": 0.0}
    with pytest.raises(tf.errors.InvalidArgumentError, match="k must be"):
        library.sparse_encode(**state, threshold=0.0, k=9, stride=2)


def test_a_gpu_keeps_to_the_tensorflow_ops(library, monkeypatch):
    """The kernels are CPU kernels: where a GPU holds the gradients, the TensorFlow path runs."""
    listed = tf.config.list_logical_devices
    monkeypatch.setattr(
        tf.config,
        "list_logical_devices",
        lambda kind=None: ["/GPU:0"] if kind == "GPU" else listed(kind),
    )
    assert compression.fused_codecs() is None


def test_float16_gradients_keep_to_the_tensorflow_encoder(library):
    """The kernels take float32: a float16 bucket is encoded by the TensorFlow ops."""
    grads = [tf.cast(g, tf.float16) for g in gradients(0, ((40, 30), (9,)))]
    results = []
    for fused in (True, False):
        allreduce = CompressedAllreduce(TwoBit(0.7), same, same, 1, fused=fused)
        step = tf.function(allreduce)
        kinds = {op.type for op in step.get_concrete_function(grads).graph.get_operations()}
        assert "TwoBitEncode" not in kinds
        results.append([t.numpy() for t in step(grads)])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
