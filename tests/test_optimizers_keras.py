"""The optimizers as Keras users meet them: fit, configs, checkpoints, mixed precision and sparse
gradients (test_every_backend.py runs some of these on JAX and PyTorch too)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from toolkit import optimizers
from toolkit.optimizers.schedules import MultiFactor, Warmup

CONFIGS = {
    "sgd": dict(learning_rate=Warmup(0.1, 8), momentum=0.9, dampening=0.1, weight_decay=1e-4),
    "sgd-nesterov": dict(learning_rate=0.05, momentum=MultiFactor(0.9, [4], 0.5), nesterov=True),
    "lars": dict(
        learning_rate=Warmup(1.0, 8, "sqrt"),
        weight_decay=MultiFactor(1e-3, [6], 0.1),
        trust_coefficient=0.02,
        clip=True,
    ),
    "lbsgd": dict(
        learning_rate=0.05,
        momentum=0.9,
        weight_decay=1e-4,
        warmup_strategy="power2",
        warmup_epochs=1,
        updates_per_epoch=4,
        batch_scale=2,
    ),
    "lbsgd-lars": dict(learning_rate=0.05, momentum=0.9, warmup_strategy="lars"),
}


def build(name):
    return optimizers.get(name.split("-")[0], **CONFIGS[name])


def toy_data(seed=0, n=256):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 10)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32") + (x[:, 3] > 1).astype("int32")
    return x, y


def toy_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((10,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(3),
        ]
    )


def compile_model(model, optimizer):
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fit_reduces_the_loss(name):
    x, y = toy_data()
    model = compile_model(toy_model(), build(name))
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trip(name):
    optimizer = build(name)
    config = optimizer.get_config()
    restored = type(optimizer).from_config(keras.saving.serialize_keras_object(optimizer)["config"])
    assert restored.get_config() == config
    for key in ("momentum", "weight_decay"):
        assert type(getattr(restored, key)) is type(getattr(optimizer, key))


def test_registry_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown optimizer 'lbfgs'; choose one of \['adagrad'"):
        optimizers.get("lbfgs")
    with pytest.raises(ValueError, match="'lars' has no parameter 'trust_coef'"):
        optimizers.get("lars", trust_coef=0.1)
    assert isinstance(optimizers.get("lamb", learning_rate=1e-3), keras.optimizers.Lamb)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_checkpoint_restore_continues_bit_for_bit(name, tmp_path):
    """Save model + optimizer mid-training (mid-accumulation for LBSGD), restore, continue."""
    x, y = toy_data(1)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)]
    model = compile_model(toy_model(1), build(name))
    for xb, yb in batches[:3]:
        model.train_on_batch(xb, yb)
    model.save(tmp_path / "mid.keras")
    for xb, yb in batches[3:]:
        model.train_on_batch(xb, yb)

    restored = keras.models.load_model(tmp_path / "mid.keras")
    assert type(restored.optimizer) is type(model.optimizer)
    for xb, yb in batches[3:]:
        restored.train_on_batch(xb, yb)
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations)


@pytest.mark.parametrize("name", ["sgd", "lars", "lbsgd"])
def test_mixed_precision_with_loss_scaling(name):
    x, y = toy_data(2)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = compile_model(toy_model(2), build(name))
        history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    finally:
        keras.config.set_dtype_policy(previous)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, type(build(name)))
    assert all(w.dtype == "float32" for w in model.trainable_weights)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize("name", ["sgd", "lars", "lbsgd-lars"])
def test_sparse_embedding_gradients(name):
    """Embedding gradients arrive as IndexedSlices on TensorFlow; rows that were looked up move
    and, without weight decay or momentum from earlier steps, the others do not."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(50, 8),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ]
    )
    params = {**CONFIGS[name], "learning_rate": 0.5}  # not a warmup that starts at 0
    params.pop("weight_decay", None)
    compile_model(model, optimizers.get(name.split("-")[0], **params))
    tokens = np.array([[1, 2, 3, 4]] * 16, "int32")
    before = model.layers[0].embeddings.numpy().copy()
    model.train_on_batch(tokens, np.zeros(16, "int32"))
    after = model.layers[0].embeddings.numpy()
    assert not np.allclose(after[1:5], before[1:5])
    np.testing.assert_array_equal(after[5:], before[5:])
