"""Everything an experiment config can name: datasets, models, optimizers and schedules.

The registries hold ``"module:attribute"`` references, so a config's names are checked without
importing TensorFlow (a bad config is refused in well under a second); a constructor's module
is imported when its parameters are checked or it is built.
"""

from toolkit.registry import Registry

DATASETS = Registry(
    "dataset",
    {
        "mnist1d": "toolkit.training.data:load_mnist1d",
        "digits": "toolkit.training.data:load_digits",
        "synthetic": "toolkit.training.data:load_synthetic",
        "mnist": "toolkit.training.data:load_mnist",
        "fashion_mnist": "toolkit.training.data:load_fashion_mnist",
        "cifar10": "toolkit.training.data:load_cifar10",
    },
)
MODELS = Registry(
    "model",
    {
        name: f"toolkit.training.models:{name}"
        for name in ("logreg", "mlp", "cnn1d", "resnet20", "resnet50")
    },
)
OPTIMIZERS = Registry(
    "optimizer",
    {
        "sgd": "toolkit.optimizers.sgd:SGD",
        "lars": "toolkit.optimizers.lars:LARS",
        "lbsgd": "toolkit.optimizers.lbsgd:LBSGD",
        "adam": "keras.optimizers:Adam",
        "adamw": "keras.optimizers:AdamW",
        "rmsprop": "keras.optimizers:RMSprop",
        "adagrad": "keras.optimizers:Adagrad",
        "lamb": "keras.optimizers:Lamb",
        "keras_sgd": "keras.optimizers:SGD",
    },
)
SCHEDULES = Registry(
    "schedule",
    {
        "poly": "toolkit.optimizers.schedules:Poly",
        "polynomial": "keras.optimizers.schedules:PolynomialDecay",
        "exponential": "keras.optimizers.schedules:ExponentialDecay",
        "piecewise": "keras.optimizers.schedules:PiecewiseConstantDecay",
        "cosine": "keras.optimizers.schedules:CosineDecay",
        "multifactor": "toolkit.optimizers.schedules:MultiFactor",
        "warmup": "toolkit.optimizers.schedules:Warmup",
    },
)
