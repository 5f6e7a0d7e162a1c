"""Model zoo: shapes, parameter counts, names, one training step each."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from toolkit.training import models

# name, input shape, classes, parameters (counted by hand for the small ones)
CASES = [
    ("logreg", (40, 1), 10, 40 * 10 + 10),
    ("mlp", (40, 1), 10, (40 * 100 + 100) + (100 * 100 + 100) + (100 * 10 + 10)),
    # MNIST-1D ConvBase: 1->25 k5, 25->25 k3, 25->25 k3, then 5*25 -> 10
    ("cnn1d", (40, 1), 10, (5 * 25 + 25) + 2 * (3 * 25 * 25 + 25) + (125 * 10 + 10)),
    # 16 tokens x 16; a GRU of 32 (Keras's reset_after: three gates of input, recurrent and
    # two biases); 32 -> 10
    ("gru", (32,), 10, 16 * 16 + 3 * (16 * 32 + 32 * 32 + 2 * 32) + (32 * 10 + 10)),
    ("resnet20", (32, 32, 3), 10, None),
]


def _train_one_step(model: keras.Model, num_classes: int) -> None:
    """Fit one batch; assert the loss is finite and every trainable weight moved."""
    rng = np.random.default_rng(0)
    shape = (4, *model.input_shape[1:])
    embeds = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
    x = (  # token ids where the model embeds them, else a signal
        rng.integers(embeds[0].input_dim, size=shape) if embeds else rng.normal(size=shape)
    ).astype(np.float32)
    y = rng.integers(num_classes, size=4).astype(np.int32)
    before = [w.numpy().copy() for w in model.trainable_weights]
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,  # one step: tracing a graph would cost more than it saves
    )
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    moved = [
        not np.array_equal(b, w.numpy())
        for b, w in zip(before, model.trainable_weights, strict=True)
    ]
    assert all(moved)


def _check_logits_layer(model: keras.Model, num_classes: int) -> None:
    logits = model.get_layer("logits")
    assert logits is model.layers[-1]
    assert logits.activation is keras.activations.linear  # logits, not softmax
    assert model.output_shape == (None, num_classes)


@pytest.mark.parametrize(
    "name, input_shape, num_classes, params", CASES, ids=[case[0] for case in CASES]
)
def test_small_models(name, input_shape, num_classes, params):
    model = models.build(name, input_shape=input_shape, num_classes=num_classes, seed=0)
    if params is not None:
        assert model.count_params() == params
    _check_logits_layer(model, num_classes)
    _train_one_step(model, num_classes)


def test_resnet20_structure():
    model = models.build("resnet20", input_shape=(32, 32, 3), num_classes=10)
    assert 0.26e6 < model.count_params() < 0.28e6  # the paper's 0.27M
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    # 1 stem + 3 stages x 3 blocks x 2 convs = 19 weighted conv layers, + 2 projections
    assert len(convs) == 21
    assert model.get_layer("stage3_block3_relu2").output.shape == (None, 8, 8, 64)
    paths = {w.path for w in model.weights}
    assert {"stem_conv/kernel", "stage2_block1_bn1/gamma", "logits/bias"} <= paths
    assert len(paths) == len(model.weights)  # unique paths, for LARS exclusions and logging


def test_resnet50():
    model = models.build("resnet50", input_shape=(32, 32, 3), num_classes=1000)
    assert model.count_params() == 25_636_712  # Keras's / torchvision's ResNet-50
    _check_logits_layer(model, 1000)
    _train_one_step(model, 1000)


def test_cnn1d_feature_length_matches_the_reference():
    model = models.build("cnn1d", input_shape=(40, 1), num_classes=10)
    lengths = [model.get_layer(f"conv{i}").output.shape[1] for i in (1, 2, 3)]
    assert lengths == [20, 10, 5]
    assert model.get_layer("logits").kernel.shape == (125, 10)


def test_mlp_hidden_sizes():
    model = models.build("mlp", input_shape=(8, 8, 1), num_classes=3, hidden_sizes=(7,))
    assert [layer.name for layer in model.layers[-2:]] == ["dense1", "logits"]
    assert model.count_params() == (64 * 7 + 7) + (7 * 3 + 3)


def test_seed_makes_initial_weights_reproducible():
    def weights(seed):
        model = models.build("cnn1d", input_shape=(40, 1), num_classes=10, seed=seed)
        return [w.numpy() for w in model.weights]

    for a, b in zip(weights(1), weights(1), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(weights(1)[0], weights(2)[0])


def test_unknown_model_and_parameter():
    with pytest.raises(ValueError, match="vgg16") as error:
        models.build("vgg16", input_shape=(32, 32, 3), num_classes=10)
    assert all(name in str(error.value) for name in models.MODELS.names())
    with pytest.raises(ValueError, match="hidden"):
        models.build("cnn1d", input_shape=(40, 1), num_classes=10, hidden=(3,))
