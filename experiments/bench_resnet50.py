"""Images per second of a one-device ResNet-50 on synthetic data, trained with the toolkit's
LARS against Keras's SGD, on the Keras backend ``KERAS_BACKEND`` names (JAX is the one the
lent GPU machines can run: they have no TensorFlow).

    KERAS_BACKEND=jax python experiments/bench_resnet50.py [--batch 256] [--steps 20]
        [--repeats 3] [--precision mixed_bfloat16] [--image-size 224] [--model tiny]

Each optimizer's model is built and compiled once (Keras's own compiled train step, jitted on
JAX), warmed up, then timed over ``--steps`` calls of ``train_on_batch`` on one batch of random
images already on the device, so the figure is the step's, not the input pipeline's; every
call returns its loss to the host, which waits for the device. The optimizers take turns,
``--repeats`` rounds of them. Printed: the median images/s of each, and its ratio to Keras
SGD's in the same round (median, with the min and max over rounds; higher is faster). Every
round goes to ``experiments/bench_resnet50_<backend>.csv`` (:mod:`benchmark_csv`), with the
device.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import benchmark_csv  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from bench_optimizers import device  # noqa: E402

from toolkit import optimizers  # noqa: E402

REFERENCE = "keras SGD momentum=0.9"
CANDIDATES = {
    REFERENCE: lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "LARS momentum=0.9 wd=5e-5": lambda: optimizers.LARS(1.0, momentum=0.9, weight_decay=5e-5),
}


def tiny_convnet(input_shape) -> keras.Model:
    """Two convolutions and a classifier: for smoke runs of this script, not for timings."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1000),
        ]
    )


MODELS = {
    "resnet50": lambda shape: keras.applications.ResNet50(weights=None, input_shape=shape),
    "tiny": tiny_convnet,
}


def compiled_model(model_name: str, make_optimizer, image_size: int) -> keras.Model:
    """The model (ResNet-50 for 1,000 classes, untrained), compiled with the optimizer
    ``make_optimizer`` builds (Keras's trainer, jit on JAX)."""
    keras.utils.set_random_seed(0)
    model = MODELS[model_name]((image_size, image_size, 3))
    model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy")
    return model


def main(
    batch: int, steps: int, repeats: int, precision: str, image_size: int, model_name="resnet50"
) -> pd.DataFrame:
    keras.mixed_precision.set_global_policy(precision)
    rng = np.random.default_rng(0)
    images = keras.ops.convert_to_tensor(
        rng.uniform(size=(batch, image_size, image_size, 3)).astype("float32")
    )
    labels = keras.ops.convert_to_tensor(rng.integers(0, 1000, size=batch).astype("int32"))
    models = {
        name: compiled_model(model_name, make, image_size) for name, make in CANDIDATES.items()
    }
    for model in models.values():  # compile and warm up
        for _ in range(2):
            model.train_on_batch(images, labels)
    rows = []
    for round_ in range(1, repeats + 1):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(steps):
                loss = model.train_on_batch(images, labels)
            seconds = time.perf_counter() - start
            rows.append(
                {"optimizer": name, "round": round_, "images_per_second": batch * steps / seconds}
                | {"seconds": seconds, "loss": float(loss), "batch": batch, "steps": steps}
            )
    backend, on = keras.backend.backend(), device()
    frame = pd.DataFrame(rows).assign(
        backend=backend, device=on, precision=precision, image_size=image_size, model=model_name
    )
    benchmark_csv.save(__file__, frame.to_dict("records"), backend)
    speed = frame.pivot(index="round", columns="optimizer", values="images_per_second")
    ratios = speed.div(speed[REFERENCE], axis=0)
    table = pd.DataFrame(
        {
            "images/s": speed.median(),
            "x keras SGD": ratios.median(),
            "min": ratios.min(),
            "max": ratios.max(),
        }
    )
    table.index.name = f"{backend} on {on}: {model_name}, batch {batch}, {precision}"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds")
    parser.add_argument("--precision", default="mixed_bfloat16", help="a Keras dtype policy")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    args = parser.parse_args()
    table = main(args.batch, args.steps, args.repeats, args.precision, args.image_size, args.model)
    print(table.to_markdown(floatfmt=".2f"))
