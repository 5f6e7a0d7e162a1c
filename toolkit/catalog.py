"""Everything an experiment config can name: datasets, models, optimizers and schedules, one
table each, with every constructor's parameters and their defaults.

The registries hold ``"module:attribute"`` references and declare each constructor's
parameters (:class:`~toolkit.registry.Entry`), so a config is checked without importing
TensorFlow: its names, its parameters, their values (:mod:`toolkit.optimizer_rules`) and its
dataset's size (:func:`train_examples`). A constructor's module is imported only when it is
built. ``tests/test_catalog.py`` checks every declared table against its constructor's
signature and every size against its loader.
"""

import math
from collections.abc import Callable, Mapping
from typing import Any

from toolkit.registry import REQUIRED, Entry, Registry

_SPLIT = {"test_fraction": 0.2}
DATASETS = Registry(
    "dataset",
    {
        "mnist1d": Entry(
            "toolkit.training.data:load_mnist1d",
            {"seed": 0, "num_samples": 5000, **_SPLIT},
        ),
        "digits": Entry("toolkit.training.data:load_digits", {"seed": 0, **_SPLIT}),
        "markov": Entry(
            "toolkit.training.data:load_markov",
            {
                "seed": 0,
                "num_samples": 20000,
                "length": 32,
                "tokens": 16,
                "num_classes": 10,
                "mixing": 0.4,
                **_SPLIT,
            },
        ),
        "synthetic": Entry(
            "toolkit.training.data:load_synthetic",
            {
                "seed": 0,
                "image_shape": (32, 32, 3),
                "num_classes": 10,
                "num_samples": 1024,
                **_SPLIT,
            },
        ),
        **{
            name: Entry(f"toolkit.training.data:load_{name}", {"seed": 0})
            for name in ("mnist", "fashion_mnist", "cifar10")
        },
    },
)


def _fraction(test_fraction: float) -> float:
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
    return test_fraction


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def _samples_less_tested(num_samples: Any, test_fraction: Any, **_) -> int:
    """A generated dataset's training examples: its samples less the ``int()`` of its test
    share, which its loader holds out."""
    return _count("num_samples", num_samples, 2) - int(num_samples * _fraction(test_fraction))


_TRAIN_EXAMPLES: dict[str, Callable[..., int]] = {
    # mnist1d's generator makes num_samples // 10 examples of each of its 10 templates and
    # keeps the first int(n * train_split) for training
    "mnist1d": lambda num_samples, test_fraction, **_: int(
        _count("num_samples", num_samples, 10) // 10 * 10 * (1 - _fraction(test_fraction))
    ),
    # scikit-learn's 1,797 digits; train_test_split rounds the test share up
    "digits": lambda test_fraction, **_: 1797 - math.ceil(_fraction(test_fraction) * 1797),
    "markov": _samples_less_tested,
    "synthetic": _samples_less_tested,
    # Keras's fixed splits (its load_data docstrings give the shapes)
    "mnist": lambda **_: 60000,
    "fashion_mnist": lambda **_: 60000,
    "cifar10": lambda **_: 50000,
}


def train_examples(name: str, params: Mapping[str, Any]) -> int:
    """How many training examples dataset ``name`` has with ``params`` (the table's defaults
    for the rest), known without loading it; a value the size depends on that its loader
    would refuse is a ``ValueError`` naming it."""
    return _TRAIN_EXAMPLES[name](**{**DATASETS.parameters(name), **params})


TOKEN_DATASETS = ("markov",)
"""Datasets whose inputs are token ids: a model embeds them (:data:`TOKEN_MODELS`, with at least
the dataset's ``tokens``) or reads any input as a flat vector (:data:`FLAT_MODELS`)."""
TOKEN_MODELS = ("gru",)
"""Models that embed token ids: they take :data:`TOKEN_DATASETS` only (a signal's values, cast
to ids, would index outside the embedding)."""
FLAT_MODELS = ("logreg", "mlp")

MODELS = Registry(
    "model",
    {
        name: Entry(
            f"toolkit.training.models:{name}",
            {"input_shape": REQUIRED, "num_classes": REQUIRED, **params},
        )
        for name, params in {
            "logreg": {},
            "mlp": {"hidden_sizes": (100, 100)},
            "cnn1d": {"channels": 25},
            "gru": {"tokens": 16, "embedding": 16, "units": 32},
        }.items()
    }
    | {
        "resnet20": Entry(
            "toolkit.training.models:resnet20", {"input_shape": (32, 32, 3), "num_classes": 10}
        ),
        "resnet50": Entry(
            "toolkit.training.models:resnet50",
            {"input_shape": (224, 224, 3), "num_classes": 1000},
        ),
    },
)

_KERAS_OPTIMIZER = {  # keras.optimizers.Optimizer's arguments, which every optimizer takes
    "clipnorm": None,
    "clipvalue": None,
    "global_clipnorm": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}
_KERAS_ADAPTIVE = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07}


def _keras(learning_rate: float, own: dict, *, name: Any = None) -> dict:
    """A Keras optimizer's parameters: ``learning_rate``, its own, the base class's, ``name``."""
    return {"learning_rate": learning_rate, **own, **_KERAS_OPTIMIZER, "name": name}


def _coupled(learning_rate: float, own: dict, name: str) -> dict:
    """A toolkit optimizer's parameters: its own, ``name``, then the Keras base class's."""
    return {"learning_rate": learning_rate, **own, "name": name, **_KERAS_OPTIMIZER}


OPTIMIZERS = Registry(
    "optimizer",
    {
        "sgd": Entry(
            "toolkit.optimizers.sgd:SGD",
            _coupled(
                0.01,
                {"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0},
                "SGD",
            ),
        ),
        "lars": Entry(
            "toolkit.optimizers.lars:LARS",
            _coupled(
                0.1,
                {
                    "momentum": 0.9,
                    "weight_decay": 0.0,
                    "trust_coefficient": 0.001,
                    "epsilon": 0.0,
                    "nesterov": False,
                    "exclude_from_layer_adaptation": None,
                    "clip": False,
                },
                "LARS",
            ),
        ),
        "lbsgd": Entry(
            "toolkit.optimizers.lbsgd:LBSGD",
            _coupled(
                0.01,
                {
                    "momentum": 0.0,
                    "weight_decay": 0.0,
                    "warmup_strategy": "linear",
                    "warmup_epochs": 5,
                    "updates_per_epoch": 32,
                    "batch_scale": 1,
                    "begin_epoch": 0,
                },
                "LBSGD",
            ),
        ),
        "adam": Entry(
            "keras.optimizers:Adam",
            _keras(0.001, {**_KERAS_ADAPTIVE, "amsgrad": False, "weight_decay": None}),
        ),
        "adamw": Entry(
            "keras.optimizers:AdamW",
            _keras(0.001, {"weight_decay": 0.004, **_KERAS_ADAPTIVE, "amsgrad": False}),
        ),
        "rmsprop": Entry(
            "keras.optimizers:RMSprop",
            _keras(
                0.001,
                {
                    "rho": 0.9,
                    "momentum": 0.0,
                    "epsilon": 1e-07,
                    "centered": False,
                    "weight_decay": None,
                },
            ),
        ),
        "adagrad": Entry(
            "keras.optimizers:Adagrad",
            _keras(
                0.001,
                {"initial_accumulator_value": 0.1, "epsilon": 1e-07, "weight_decay": None},
            ),
        ),
        "lamb": Entry(
            "keras.optimizers:Lamb", _keras(0.001, {**_KERAS_ADAPTIVE, "weight_decay": None})
        ),
        "keras_sgd": Entry(
            "keras.optimizers:SGD",
            _keras(0.01, {"momentum": 0.0, "nesterov": False, "weight_decay": None}),
        ),
    },
)
SCHEDULES = Registry(
    "schedule",
    {
        name: Entry(f"toolkit.optimizers.schedules:{name}", params)
        for name, params in {
            "constant": {},
            "poly": {"power": 2.0},
            "polynomial": {"power": 1.0, "end_learning_rate": 0.0001},
            "cosine": {"alpha": 0.0},
            "exponential": {"decay_epochs": 1.0, "decay_rate": 0.1, "staircase": False},
            "multifactor": {"epochs": REQUIRED, "factor": 0.1},
        }.items()
    },
)
"""The learning-rate schedules a config can name (``schedule.name``), in the order the form
lists them: each name, the parameters ``schedule.params`` may give (lengths in epochs) with
their defaults, and its builder in :mod:`toolkit.optimizers.schedules`, which takes
:data:`SCHEDULE_INPUTS` from the run's plan, then those parameters. The parameters are checked
here, without TensorFlow."""
SCHEDULE_INPUTS = ("base", "total_steps", "steps_per_epoch")
"""What the run gives every schedule builder: the scaled base rate, the run's length and its
epoch, in the schedule's steps (:class:`toolkit.plan.RunPlan`)."""
