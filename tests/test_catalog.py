"""The catalog's tables are its constructors' own: every declared parameter and default is the
signature's, every dataset size is its loader's, and every value the front door refuses without
TensorFlow (toolkit.optimizer_rules) is one the constructor refuses, and no other.
(About 10 s: it builds each optimizer a few dozen times and loads the offline datasets.)"""

from __future__ import annotations

import itertools
import re

import keras
import pytest

from toolkit import catalog, optimizer_rules
from toolkit.registry import Entry
from toolkit.training import data

REGISTRIES = (catalog.DATASETS, catalog.MODELS, catalog.OPTIMIZERS, catalog.SCHEDULES)


@pytest.mark.parametrize(
    "registry, name",
    [(r, n) for r in REGISTRIES for n in r],
    ids=lambda x: x if isinstance(x, str) else x.kind,
)
def test_every_entry_declares_its_constructors_parameters(registry, name):
    assert registry.declares(name)
    declared = dict(registry._entries[name].params)
    if registry is catalog.SCHEDULES:  # builders take the run's inputs, then the table's
        signature = registry.signature(name)
        assert list(signature)[: len(catalog.SCHEDULE_INPUTS)] == list(catalog.SCHEDULE_INPUTS)
        assert set(signature) - set(catalog.SCHEDULE_INPUTS) == set(declared)
        return
    assert registry.signature(name) == declared
    assert list(registry.signature(name)) == list(declared)  # the order a form lists them in


def test_an_entry_is_a_reference_not_an_import():
    for registry in REGISTRIES:
        for name in registry:
            entry = registry._entries[name]
            assert isinstance(entry, Entry) and isinstance(entry.constructor, str)


SIZES = {
    "mnist1d": [{}, {"num_samples": 1000}, {"num_samples": 1234, "test_fraction": 0.33}],
    "digits": [{}, {"test_fraction": 0.1}, {"test_fraction": 0.37}],
    "markov": [{}, {"num_samples": 101, "test_fraction": 0.3}],
    "synthetic": [{}, {"num_samples": 100, "test_fraction": 0.3}, {"num_samples": 7}],
}


@pytest.mark.parametrize("name, params", [(n, p) for n, ps in SIZES.items() for p in ps], ids=str)
def test_a_datasets_size_is_its_loaders(name, params):
    loaded = data.load(name, seed=3, **params)
    assert catalog.train_examples(name, params) == len(loaded.x_train)


@pytest.mark.parametrize(
    "name, size", [("mnist", 60000), ("fashion_mnist", 60000), ("cifar10", 50000)]
)
def test_a_keras_datasets_size_is_the_one_keras_documents(name, size):
    """Keras downloads these (no network here); its load_data docstring gives the shapes."""
    assert catalog.train_examples(name, {}) == size
    documented = re.findall(r"\((\d+), ", getattr(keras.datasets, name).load_data.__doc__)
    assert int(documented[0]) == size  # x_train's shape comes first


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("mnist1d", {"num_samples": 5.5}, "num_samples"),
        ("mnist1d", {"num_samples": 9}, "num_samples"),
        ("digits", {"test_fraction": 1.0}, "test_fraction"),
        ("synthetic", {"test_fraction": "a lot"}, "test_fraction"),
    ],
)
def test_a_size_its_loader_refuses_is_refused_naming_the_parameter(name, params, field):
    with pytest.raises(ValueError, match=field):
        catalog.train_examples(name, params)


# Values around each rule's edges, for every optimizer: the constructor is the oracle.
TRIALS = {
    "momentum": [0.0, 0.5, 1.0, 1.5, -0.1, "x"],
    "dampening": [0.0, 0.1, -1.0],
    "nesterov": [False, True],
    "weight_decay": [None, 0.0, 1e-4, -1.0],
    "trust_coefficient": [0.001, 0.0, -1.0, "x"],
    "epsilon": [0.0, 1e-8, -1.0],
    "warmup_strategy": ["linear", "sqrt", "lars", "cosine"],
    "warmup_epochs": [0, 2, 2.5, -1],
    "updates_per_epoch": [1, 0, 3.5],
    "batch_scale": [1, 2, 0, 2.5],
    "begin_epoch": [0, -1, 1.5],
    "clipnorm": [None, 1.0],
    "clipvalue": [None, 0.5],
    "global_clipnorm": [None, 2.0],
    "use_ema": [False, True],
    "ema_momentum": [0.99, 1.5, -0.5],
    "ema_overwrite_frequency": [None, 5, 0, 2.5],
    "gradient_accumulation_steps": [None, 1, 2, 4],
    "beta_1": [0.9, "x", [0.9]],
}


def trials(name: str):
    """Each trial value alone, then every pair of two rules that speak of each other."""
    params = catalog.OPTIMIZERS.parameters(name)
    singles = [{k: v} for k, values in TRIALS.items() if k in params for v in values]
    pairs = [
        ("momentum", "nesterov"),
        ("dampening", "nesterov"),
        ("clipnorm", "clipvalue"),
        ("clipnorm", "global_clipnorm"),
        ("use_ema", "ema_momentum"),
        ("use_ema", "ema_overwrite_frequency"),
    ]
    for a, b in pairs:
        if a in params and b in params:
            singles += [{a: x, b: y} for x, y in itertools.product(TRIALS[a], TRIALS[b])]
    return singles


def refused(build) -> bool:
    try:
        build()
    except (ValueError, TypeError):
        return True
    return False


@pytest.mark.parametrize("name", list(catalog.OPTIMIZERS))
def test_the_front_door_refuses_what_the_constructor_refuses_and_nothing_else(name):
    constructor = catalog.OPTIMIZERS.constructor(name)
    disagreements = []
    for params in trials(name):
        built = refused(lambda: constructor(learning_rate=0.1, **params))  # noqa: B023
        checked = refused(lambda: optimizer_rules.check(name, params))  # noqa: B023
        if built != checked and not (checked and not built and _kind_only(name, params)):
            disagreements.append((params, "constructor refuses" if built else "rules refuse"))
    assert disagreements == []


def _kind_only(name: str, params: dict) -> bool:
    """A value of the wrong kind that Keras takes when built and fails on in training (a
    string for a beta): the front door refuses it earlier, which is the one difference."""
    try:
        catalog.OPTIMIZERS.check_kinds(name, params)
    except ValueError:
        return True
    return False


def test_trust_ratios_and_momentum_are_the_built_optimizers_answers():
    for name in catalog.OPTIMIZERS:
        for params in ({}, {"warmup_strategy": "lars"}, {"momentum": 0.9}):
            params = {k: v for k, v in params.items() if k in catalog.OPTIMIZERS.parameters(name)}
            built = catalog.OPTIMIZERS.get(name, **params)
            assert optimizer_rules.applies_trust_ratios(name, params) == bool(
                getattr(built, "applies_trust_ratios", False)
            ), (name, params)
            hands = name in optimizer_rules.HANDS_MOMENTUM_OVER
            assert hands == hasattr(built, "take_momentum"), name
            if hands:
                full = {**catalog.OPTIMIZERS.parameters(name), **params}
                why = optimizer_rules.momentum_refusals(
                    full["momentum"], full.get("nesterov", False), full.get("dampening", 0.0)
                )
                assert refused(built.take_momentum) == bool(why), (name, params)
