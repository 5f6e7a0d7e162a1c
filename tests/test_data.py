"""Datasets and the per-epoch, per-worker tf.data pipeline."""

from __future__ import annotations

import subprocess
import sys

import keras
import mnist1d.data
import numpy as np
import pytest

from toolkit import cache
from toolkit.training import data


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))


def _check(ds: data.Dataset, input_shape, num_train, num_test, num_classes=10):
    assert ds.input_shape == input_shape
    assert ds.x_train.shape == (num_train, *input_shape)
    assert ds.x_test.shape == (num_test, *input_shape)
    assert ds.y_train.shape == (num_train,) and ds.y_test.shape == (num_test,)
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == ds.y_test.dtype == np.int32
    assert ds.num_classes == num_classes
    labels = np.concatenate([ds.y_train, ds.y_test])
    assert labels.min() >= 0 and labels.max() < num_classes


def test_mnist1d_default_shapes_and_cache_hit(monkeypatch):
    state = np.random.get_state()
    first = data.load("mnist1d")
    _check(first, (40, 1), 4000, 1000)
    assert set(np.unique(first.y_train)) == set(range(10))
    # the generator's global seeding does not leak out
    np.testing.assert_array_equal(np.random.get_state()[1], state[1])
    assert len(list(data.cache_dir().glob("mnist1d-*.npz"))) == 1

    def no_generation(*args, **kwargs):
        raise AssertionError("regenerated instead of reading the cache")

    monkeypatch.setattr(mnist1d.data, "make_dataset", no_generation)
    second = data.load("mnist1d")
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


def test_mnist1d_parameters_change_the_data_and_the_cache_key():
    a = data.load("mnist1d", seed=1, num_samples=500, test_fraction=0.5)
    b = data.load("mnist1d", seed=2, num_samples=500, test_fraction=0.5)
    _check(a, (40, 1), 250, 250)
    assert not np.array_equal(a.x_train, b.x_train)
    assert len(list(data.cache_dir().glob("mnist1d-*.npz"))) == 2


def test_digits_scaled_and_split_by_seed():
    ds = data.load("digits", seed=3)
    _check(ds, (8, 8, 1), 1437, 360)
    assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
    same = data.load("digits", seed=3)
    other = data.load("digits", seed=4)
    np.testing.assert_array_equal(ds.y_train, same.y_train)
    assert not np.array_equal(ds.y_train, other.y_train)


def test_synthetic_any_image_shape():
    ds = data.load("synthetic", image_shape=(224, 224, 3), num_classes=1000, num_samples=5)
    _check(ds, (224, 224, 3), 4, 1, num_classes=1000)
    again = data.load("synthetic", image_shape=(224, 224, 3), num_classes=1000, num_samples=5)
    np.testing.assert_array_equal(ds.x_train, again.x_train)


@pytest.mark.parametrize(
    "name, raw_shape, raw_labels_shape, input_shape",
    [
        ("mnist", (3, 28, 28), (3,), (28, 28, 1)),
        ("fashion_mnist", (3, 28, 28), (3,), (28, 28, 1)),
        ("cifar10", (3, 32, 32, 3), (3, 1), (32, 32, 3)),
    ],
)
def test_keras_datasets_are_converted(monkeypatch, name, raw_shape, raw_labels_shape, input_shape):
    # No internet here: stand in for the download with arrays shaped like Keras's.
    x = np.full(raw_shape, 255, dtype=np.uint8)
    y = np.arange(3, dtype=np.uint8).reshape(raw_labels_shape)
    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", lambda: ((x, y), (x, y)))
    ds = data.load(name)
    _check(ds, input_shape, 3, 3)
    assert ds.x_train.max() == 1.0
    np.testing.assert_array_equal(ds.y_test, [0, 1, 2])


def test_keras_download_failure_is_a_clear_error(monkeypatch):
    def offline():  # what keras.utils.get_file raises without a network
        raise Exception("URL fetch failure: Name or service not known")  # noqa: TRY002

    monkeypatch.setattr(keras.datasets.cifar10, "load_data", offline)
    with pytest.raises(RuntimeError, match="internet") as error:
        data.load("cifar10")
    assert all(name in str(error.value) for name in ("mnist1d", "digits", "synthetic"))


def test_unknown_dataset_and_parameter():
    with pytest.raises(ValueError, match="imagenet") as error:
        data.load("imagenet")
    assert all(name in str(error.value) for name in data.DATASETS.names())
    with pytest.raises(ValueError, match="image_size"):
        data.load("synthetic", image_size=(8, 8, 3))


def _epoch(x, y, **kwargs) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Concatenated inputs and labels of one epoch, and the batch sizes."""
    batches = list(data.epoch_dataset(x, y, **kwargs).as_numpy_iterator())
    xs, ys = zip(*batches, strict=True) if batches else ((), ())
    return np.concatenate(xs), np.concatenate(ys), [len(b) for b in ys]


X = np.arange(103, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
Y = np.arange(103, dtype=np.int32)  # label == index, to check pairing and coverage


@pytest.mark.parametrize("num_shards", [1, 2, 4])
def test_shards_are_disjoint_equal_and_cover_the_epoch(num_shards):
    per_shard = data.shard_size(len(X), num_shards)
    assert per_shard == 103 // num_shards
    seen = []
    for shard_index in range(num_shards):
        x, y, sizes = _epoch(
            X,
            Y,
            batch_size=5,
            epoch=2,
            seed=7,
            num_shards=num_shards,
            shard_index=shard_index,
        )
        assert sizes == [5] * (per_shard // 5)  # same number of full batches everywhere
        np.testing.assert_array_equal(x[:, 0], y)  # inputs stay paired with labels
        seen.append(y)
    # without dropping incomplete batches, the shards of one epoch partition the examples
    # of the permutation except its last len % num_shards
    full = [
        _epoch(
            X,
            Y,
            batch_size=5,
            epoch=2,
            seed=7,
            num_shards=num_shards,
            shard_index=i,
            drop_remainder=False,
        )[1]
        for i in range(num_shards)
    ]
    assert all(len(shard) == per_shard for shard in full)
    union = np.concatenate(full)
    assert len(np.unique(union)) == len(union) == per_shard * num_shards
    for shard, dropped in zip(seen, full, strict=True):
        np.testing.assert_array_equal(shard, dropped[: len(shard)])


def test_order_is_deterministic_per_epoch_and_differs_across_epochs():
    def order(epoch, seed=0):
        return _epoch(X, Y, batch_size=1, epoch=epoch, seed=seed)[1]

    np.testing.assert_array_equal(order(3), order(3))  # a resumed run sees the same data
    assert not np.array_equal(order(3), order(4))
    assert not np.array_equal(order(3), order(3, seed=1))
    assert sorted(order(3)) == list(range(103))


def test_unshuffled_keeps_order_and_every_example():
    _, y, sizes = _epoch(X, Y, batch_size=10, shuffle=False, drop_remainder=False)
    np.testing.assert_array_equal(y, Y)
    assert sizes == [10] * 10 + [3]


def test_epochs_run_without_tf_data_autotuning():
    # Its model thread stalled the end of model.fit for up to 8 s (see data._without_autotune).
    dataset = data.epoch_dataset(X, Y, batch_size=10)
    assert dataset.options().autotune.enabled is False
    assert len(list(dataset)) == len(X) // 10  # and the epoch is still all there


def test_bad_shard_index():
    with pytest.raises(ValueError, match="shard_index"):
        data.epoch_dataset(X, Y, batch_size=4, num_shards=2, shard_index=2)


@pytest.mark.parametrize(("num_shards", "shard_index"), [(1, 0), (2, 1)])
def test_many_epochs_are_each_epochs_batches_in_turn(num_shards, shard_index):
    shard = {"num_shards": num_shards, "shard_index": shard_index}
    lazy = data.epochs_dataset(
        X, Y, batch_size=5, epochs=range(2, 5), steps_per_epoch=7, seed=3, **shard
    )
    eager = [
        batch
        for epoch in range(2, 5)
        for batch in data.epoch_dataset(X, Y, batch_size=5, epoch=epoch, seed=3, **shard)
        .take(7)
        .as_numpy_iterator()
    ]
    got = list(lazy.as_numpy_iterator())
    assert len(got) == len(eager) == 21
    for (x, y), (want_x, want_y) in zip(got, eager, strict=True):
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    assert lazy.options().autotune.enabled is False
    with pytest.raises(ValueError, match="shard_index"):
        data.epochs_dataset(
            X, Y, batch_size=4, epochs=range(2), steps_per_epoch=1, num_shards=2, shard_index=2
        )


def test_many_epochs_hold_one_copy_of_the_data():
    # Built up front, a copy per epoch: 100 epochs of these 40 MB took 4 GB or more (and a
    # 90-epoch CIFAR-10 run over 100 GB). Lazily, one copy, TensorFlow's start-up and a batch.
    script = """
import resource, numpy as np
from toolkit.training import data
x = np.ones((10_000, 1_000), np.float32); y = np.zeros(10_000, np.int32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
batches = data.epochs_dataset(x, y, batch_size=500, epochs=range(100), steps_per_epoch=20)
first = next(iter(batches))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    grown_mb = float(done.stdout.split()[-1])
    assert grown_mb < 400, f"building 100 epochs grew memory by {grown_mb:.0f} MB"


def markov_likelihoods(chains: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The oracle: each sequence's log-likelihood under each chain, ``(chains, sequences)``,
    summed over its transitions (the first token is uniform: the same for every chain)."""
    tokens = x.astype(int)
    return np.log(chains)[:, tokens[:, :-1], tokens[:, 1:]].sum(axis=-1)


def test_markov_sequences_follow_their_class_chain_and_the_bayes_rule_is_about_94_percent():
    """Each class's transitions, counted over its training sequences, match its chain within
    sampling error; the Bayes-optimal rule (the most likely chain) classifies the test split
    at the accuracy the loader's docstring gives, far from chance (10%)."""
    ds = data.load("markov")
    _check(ds, (32,), 16000, 4000)
    chains = data.markov_chains(0)
    assert chains.shape == (10, 16, 16) and np.allclose(chains.sum(axis=-1), 1)
    for label in range(10):
        tokens = ds.x_train[ds.y_train == label].astype(int)
        counts = np.zeros((16, 16))
        np.add.at(counts, (tokens[:, :-1], tokens[:, 1:]), 1)
        seen = counts.sum(axis=1, keepdims=True)
        frequencies = counts / seen
        error = np.sqrt(chains[label] * (1 - chains[label]) / seen)  # a binomial's std
        assert np.all(np.abs(frequencies - chains[label]) <= 5 * error + 1e-9)
    bayes = markov_likelihoods(chains, ds.x_test).argmax(axis=0)
    assert 0.92 < np.mean(bayes == ds.y_test) < 0.96
    other = data.load("markov", seed=1, num_samples=200)
    assert not np.array_equal(other.x_train, data.load("markov", num_samples=200).x_train)
    with pytest.raises(ValueError, match="mixing"):
        data.markov_chains(0, mixing=0)
