"""toolkit.parallel.cost, the model of when compression pays: its formula against one written
out here, its constants against the benchmarks' committed CSVs, and the Launch form's line."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import ROOT

from toolkit.parallel import cost

EXPERIMENTS = ROOT / "experiments"


@pytest.mark.parametrize("workers", [2, 4, 16])
@pytest.mark.parametrize("mode", ["none", "fp16", "topk", "threshold", "2bit"])
def test_each_mode_is_its_local_passes_plus_horovods_ring_on_the_link(mode, workers):
    entries, gbit, latency, copy = 3_000_001, 2.5, 80.0, 0.004
    bytes_per_second, step = gbit * 1e9 / 8, latency * 1e-6
    sent = {  # one worker's payload
        "none": 4 * entries,
        "fp16": 2 * entries,
        "topk": math.ceil(0.02 * entries) * 8,
        "threshold": math.ceil(0.02 * entries) * 8,
        "2bit": 4 * math.ceil(entries / 16),
    }[mode]
    if mode in ("none", "fp16"):  # ring allreduce: reduce-scatter, then allgather
        wire = 2 * (workers - 1) / workers * sent / bytes_per_second + 2 * (workers - 1) * step
    else:  # allgather of the sizes, then of every worker's payload
        wire = (workers - 1) * sent / bytes_per_second + 2 * (workers - 1) * step
    local = cost.passes(mode, ratio=0.02) * copy
    got = cost.seconds_per_update(
        mode, entries, workers, cost.Link(gbit, latency), ratio=0.02, memcpy_seconds=copy
    )
    assert got == pytest.approx(local + wire, rel=1e-12)
    alone = cost.seconds_per_update(mode, entries, 1, cost.Link(gbit), memcpy_seconds=copy)
    assert alone == pytest.approx(local)  # one worker sends nothing


def test_the_passes_are_the_benchmarks_medians():
    local = pd.read_csv(EXPERIMENTS / "bench_allreduce_localhost.csv")
    local = local[local.model == "resnet50"]
    measured = (local.ms / local.memcpy_ms).groupby(local["mode"]).median()
    named = {
        "dense": "dense",
        "fp16": "fp16",
        "topk": "topk 1%, sampled 1%",
        "topk, exact 1%": "topk 1%",
        "topk, exact 0.1%": "topk 0.1%",
        "threshold": "threshold ~1%",
        "2bit": "2bit",
    }
    assert set(named) == set(cost.PASSES)
    for key, mode in named.items():
        assert cost.PASSES[key] == pytest.approx(measured[mode], abs=0.05), key
    for ratio, mode in {0.01: "topk 1%", 0.001: "topk 0.1%"}.items():  # an exact top-k's
        assert cost.passes("topk", 0.0, ratio) == pytest.approx(measured[mode], abs=0.05)


def test_the_model_is_checked_against_the_shaped_link_at_1_and_10_gbit():
    """The committed check covers every mode at both speeds, with the error computed from its
    own columns."""
    check = pd.read_csv(EXPERIMENTS / "cost_model_check.csv")
    assert set(check.link_gbit) == {1, 10}
    assert check.groupby("link_gbit")["mode"].nunique().min() >= 8
    recomputed = check.predicted_ms / check.measured_ms - 1
    pd.testing.assert_series_equal(check.error, recomputed, check_names=False, rtol=1e-9)
