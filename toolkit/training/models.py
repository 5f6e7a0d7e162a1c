"""A small model zoo: ``build(name, input_shape=..., num_classes=..., **params)``.

Every model ends in a Dense layer named ``logits`` without activation: train with
``SparseCategoricalCrossentropy(from_logits=True)``. Layers have meaningful names, so
variable paths (``conv1/kernel``, ``stage2_block1_bn1/gamma``, ``logits/bias``) can select
variables, e.g. for LARS exclusions and per-layer trust-ratio logging. There are no weight
regularisers: weight decay belongs to the optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers

from toolkit.catalog import MODELS


def logreg(input_shape: Sequence[int], num_classes: int) -> keras.Model:
    """Multinomial logistic regression: one Dense layer on the flattened input."""
    inputs = keras.Input(tuple(input_shape), name="inputs")
    x = layers.Flatten(name="flatten")(inputs)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="logreg")


def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    hidden_sizes: Sequence[int] = (100, 100),
) -> keras.Model:
    """ReLU multilayer perceptron; the default is the MNIST-1D paper's MLP."""
    inputs = keras.Input(tuple(input_shape), name="inputs")
    x = layers.Flatten(name="flatten")(inputs)
    for i, units in enumerate(hidden_sizes, start=1):
        x = layers.Dense(units, activation="relu", name=f"dense{i}")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="mlp")


def cnn1d(input_shape: Sequence[int], num_classes: int, channels: int = 25) -> keras.Model:
    """The 1-D CNN of the MNIST-1D paper (Greydanus 2020, ``ConvBase``).

    Three stride-2 ReLU convolutions of ``channels`` filters (kernel sizes 5, 3, 3), then a
    Dense layer on the flattened features. The reference pads by 1; ``"same"`` padding gives
    the same feature length for 40-sample inputs (40 -> 20 -> 10 -> 5 vs 19 -> 10 -> 5) and
    the same 5,210 parameters for 10 classes.
    """
    inputs = keras.Input(tuple(input_shape), name="inputs")
    x = inputs
    for i, kernel_size in enumerate((5, 3, 3), start=1):
        x = layers.Conv1D(
            channels,
            kernel_size,
            strides=2,
            padding="same",
            activation="relu",
            name=f"conv{i}",
        )(x)
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="cnn1d")


def gru(
    input_shape: Sequence[int],
    num_classes: int,
    tokens: int = 16,
    embedding: int = 16,
    units: int = 32,
) -> keras.Model:
    """A recurrent classifier of token ids (the ``"markov"`` dataset's): an embedding of
    ``embedding`` per token, one GRU of ``units`` read to the sequence's end, the logits (with
    the defaults, 5.4k parameters). Unlike the zoo's other small models it reads its input one
    step at a time, carrying a state."""
    inputs = keras.Input(tuple(input_shape), name="inputs")
    x = layers.Embedding(tokens, embedding, name="embedding")(inputs)
    x = layers.GRU(units, name="gru")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="gru")


def _conv_bn(x, filters: int, kernel_size: int, strides: int, name: str, suffix=""):
    """He-initialised convolution without bias (``{name}_conv{suffix}``), then batch
    normalisation (``{name}_bn{suffix}``, momentum 0.9 and epsilon 1e-5 as in PyTorch/MXNet).
    """
    x = layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=f"{name}_conv{suffix}",
    )(x)
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=f"{name}_bn{suffix}")(x)


def _basic_block(x, filters: int, strides: int, name: str):
    """Two 3x3 conv-BN layers with a residual connection (ResNet v1, post-activation)."""
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, strides, f"{name}_shortcut")
    y = _conv_bn(x, filters, 3, strides, name, suffix="1")
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = _conv_bn(y, filters, 3, 1, name, suffix="2")
    y = layers.Add(name=f"{name}_add")([y, shortcut])
    return layers.ReLU(name=f"{name}_relu2")(y)


def resnet20(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10) -> keras.Model:
    """ResNet-20 for CIFAR-sized images (He et al. 2016, section 4.2).

    A 3x3 convolution of 16 filters, three stages of three basic blocks with 16, 32 and 64
    filters (stride 2 at the start of stages 2 and 3), global average pooling, logits.
    Where the width changes the shortcut is a 1x1 convolution with batch normalisation
    (the paper's option B; its CIFAR models use parameter-free option A): about 0.27M
    parameters either way.
    """
    inputs = keras.Input(tuple(input_shape), name="inputs")
    x = _conv_bn(inputs, 16, 3, 1, "stem")
    x = layers.ReLU(name="stem_relu")(x)
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(1, 4):
            strides = 2 if stage > 1 and block == 1 else 1
            x = _basic_block(x, filters, strides, f"stage{stage}_block{block}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet20")


def resnet50(input_shape: Sequence[int] = (224, 224, 3), num_classes: int = 1000) -> keras.Model:
    """Keras's ResNet-50 (randomly initialised) with average pooling and a logits layer."""
    backbone = keras.applications.ResNet50(
        include_top=False, weights=None, input_shape=tuple(input_shape), pooling="avg"
    )
    outputs = layers.Dense(num_classes, name="logits")(backbone.output)
    return keras.Model(backbone.input, outputs, name="resnet50")


def build(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int | None = None,
    **params,
) -> keras.Model:
    """Build the model registered as ``name`` (unknown names/parameters raise ``ValueError``).

    ``seed``, if given, is passed to ``keras.utils.set_random_seed`` before building, which
    makes the initial weights reproducible; note that it seeds Python's, NumPy's and the
    backend's global generators.
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    return MODELS.get(name, input_shape=input_shape, num_classes=num_classes, **params)
