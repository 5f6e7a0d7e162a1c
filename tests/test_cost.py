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
    fixed, passes = cost.local_work(mode, ratio=0.02)
    local = fixed + passes * copy
    got = cost.seconds_per_update(
        mode, entries, workers, cost.Link(gbit, latency), ratio=0.02, memcpy_seconds=copy
    )
    assert got == pytest.approx(local + wire, rel=1e-12)
    alone = cost.seconds_per_update(mode, entries, 1, cost.Link(gbit), memcpy_seconds=copy)
    assert alone == pytest.approx(local)  # one worker sends nothing


def test_the_local_work_is_the_line_through_the_benchmarks_two_models():
    """Per mode, the median ms per update on ResNet-20 and ResNet-50 (2 workers on localhost)
    against their dense bytes in ResNet-50's memcpy time: its slope in passes, its intercept in
    fixed milliseconds."""
    local = pd.read_csv(EXPERIMENTS / "bench_allreduce_localhost.csv")
    medians = local.groupby(["mode", "model"]).ms.median()
    big = local.model == "resnet50"
    copy_per_byte = local[big].memcpy_ms.median() / (4 * 25_583_592)
    small_copy, big_copy = (copy_per_byte * 4 * n for n in (272_474, 25_583_592))
    named = {
        "dense": "dense",
        "fp16": "fp16",
        "topk": "topk 1%, sampled 1%",
        "topk, exact 1%": "topk 1%",
        "topk, exact 0.1%": "topk 0.1%",
        "threshold": "threshold ~1%",
        "2bit": "2bit",
    }
    assert set(named) == set(cost.LOCAL_WORK)
    for key, mode in named.items():
        small, large = medians[mode, "resnet20"], medians[mode, "resnet50"]
        passes = (large - small) / (big_copy - small_copy)
        fixed = max(0.0, small - passes * small_copy)
        assert cost.LOCAL_WORK[key] == pytest.approx((fixed, passes), abs=0.01), key
    for ratio, key in {0.01: "topk, exact 1%", 0.001: "topk, exact 0.1%"}.items():
        fixed_ms, passes = cost.LOCAL_WORK[key]  # an exact top-k's own points
        assert cost.local_work("topk", 0.0, ratio) == pytest.approx((fixed_ms / 1e3, passes))


def test_the_model_is_checked_against_the_shaped_link_at_1_and_10_gbit():
    """The committed check covers every mode at both speeds, with the error computed from its
    own columns."""
    check = pd.read_csv(EXPERIMENTS / "cost_model_check.csv")
    assert set(check.link_gbit) == {1, 10}
    assert check.groupby("link_gbit")["mode"].nunique().min() >= 8
    recomputed = check.predicted_ms / check.measured_ms - 1
    pd.testing.assert_series_equal(check.error, recomputed, check_names=False, rtol=1e-9)
