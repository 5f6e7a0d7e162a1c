"""Everything an experiment config can name: datasets, models, optimizers and schedules, one
table each.

The registries hold ``"module:attribute"`` references, so a config's names are checked without
importing TensorFlow (a bad config is refused in well under a second); a constructor's module
is imported when its parameters are checked or it is built.
"""

from toolkit.registry import REQUIRED, Entry, Registry

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
