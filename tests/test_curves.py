"""``toolkit.runs.curves``: which panels a run's events draw as (the rule every view shares), and
the downsampling that thins long curves for drawing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from toolkit.runs.curves import Curve, bytes_axis, downsample, panels, spread


def test_panels_follow_the_rule_for_known_and_unplanned_metrics():
    nan = float("nan")
    events = pd.DataFrame(
        [
            {
                "step": 10,
                "epoch": 0.5,
                "wall": 1.0,
                "phase": "train",
                "loss": 2.0,
                "accuracy": 0.3,
                "lr": 0.1,
                "momentum": 0.9,
                "samples_per_sec": 900.0,
                "top5": 0.7,
            },
            {
                "step": 20,
                "epoch": 1.0,
                "phase": "eval",
                "loss": 1.9,
                "accuracy": 0.4,
                "train_loss": 2.1,
                "train_accuracy": 0.35,
                "top5": nan,
            },
            {"step": 20, "phase": "gns", "b_simple": 300.0, "grad_sq": 1.0, "trace_sigma": 2.0},
            {
                "step": 20,
                "phase": "trust_ratio",
                "trust_ratio/dense/kernel": 0.01,
                "trust_ratio/conv/kernel": 0.02,
            },
            {"step": 30, "phase": "mystery", "thing": 1.0},
        ]
    )
    assert panels(events) == {
        "loss": [
            Curve("train", "loss", "train"),
            Curve("eval", "loss", "eval"),
            Curve("eval", "train_loss", "train (epoch)"),
        ],
        "accuracy": [
            Curve("train", "accuracy", "train"),
            Curve("eval", "accuracy", "eval"),
            Curve("eval", "train_accuracy", "train (epoch)"),
        ],
        "lr": [Curve("train", "lr", "train")],
        "samples_per_sec": [Curve("train", "samples_per_sec", "train")],
        "b_simple": [Curve("gns", "b_simple", "gns")],
        "momentum": [Curve("train", "momentum", "train")],
        "top5": [Curve("train", "top5", "train")],  # eval's top5 has no number
        "trust_ratio": [
            Curve("trust_ratio", "trust_ratio/conv/kernel", "conv/kernel"),
            Curve("trust_ratio", "trust_ratio/dense/kernel", "dense/kernel"),
        ],
    }


def test_no_phase_no_panels():
    assert panels(pd.DataFrame()) == {}
    assert panels(pd.DataFrame({"step": [1], "loss": [2.0]})) == {}


def test_downsample_keeps_extremes_and_ends():
    y = np.sin(np.linspace(0, 20, 10_000))
    y[4321] = 50.0
    keep = downsample(y, 500)
    assert len(keep) <= 502 and keep[0] == 0 and keep[-1] == len(y) - 1
    assert 4321 in keep and np.all(np.diff(keep) > 0)
    assert list(downsample(y[:100], 500)) == list(range(100))


def test_downsample_keeps_non_finite_markers_within_its_budget():
    rng = np.random.default_rng(0)
    y = rng.normal(size=50_001)
    y[[777, 20_000, 20_001, 45_678]] = [np.nan, np.inf, -np.inf, np.nan]
    keep = downsample(y, 2000)
    assert len(keep) <= 2000 and keep[0] == 0 and keep[-1] == 50_000
    assert {777, 20_000, 45_678} <= set(keep)  # the first non-finite value of its bucket
    size = int(np.ceil(len(y) / (1998 // 3)))  # every bucket's min and max (of finite values)
    for start in range(0, len(y), size):
        bucket = y[start : start + size]
        finite = np.flatnonzero(np.isfinite(bucket))
        assert start + finite[bucket[finite].argmin()] in keep
        assert start + finite[bucket[finite].argmax()] in keep


def test_bytes_axis_sums_bytes_per_update_over_the_updates_between_events():
    events = pd.DataFrame(
        [
            {"step": 10, "phase": "train", "comm/bytes_sent": 100.0},
            {"step": 15, "phase": "eval", "accuracy": 0.5},
            {"step": 20, "phase": "train", "comm/bytes_sent": 300.0},
            {"step": 30, "phase": "train", "comm/bytes_sent": 0.0},  # no averaging in between
        ]
    )
    # 2 batches per update: 5 updates to step 10, 5 more to 20, 5 more to 30
    axis = bytes_axis(events, steps_per_update=2)
    assert axis.tolist() == [500.0, 1250.0, 2000.0, 2000.0]  # the eval event: interpolated
    assert bytes_axis(events.drop(columns="comm/bytes_sent")) is None


def test_spread_is_the_mean_min_and_max_of_the_curves_each_within_its_own_range():
    """Oracle: each curve's value at x written out piecewise-linearly, none outside its range."""
    a = (np.array([0.0, 2.0, 4.0]), np.array([1.0, 3.0, 5.0]))
    b = (np.array([1.0, 3.0]), np.array([10.0, 20.0]))
    c = (np.array([4.0, 0.0, 6.0]), np.array([np.nan, 7.0, 9.0]))  # unsorted, a missing point

    def at(curve, x):
        xs, ys = curve
        keep = ~np.isnan(ys)
        xs, ys = xs[keep], ys[keep]
        if x < xs.min() or x > xs.max():
            return None
        for (x0, y0), (x1, y1) in zip(sorted(zip(xs, ys)), sorted(zip(xs, ys))[1:]):
            if x0 <= x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return float(ys[xs == x][0])

    got = spread([a, b, c])
    assert got["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0]
    for row in got.itertuples():
        values = [v for v in (at(a, row.x), at(b, row.x), at(c, row.x)) if v is not None]
        assert row.mean == pytest.approx(np.mean(values)), row
        assert (row.low, row.high) == pytest.approx((min(values), max(values))), row
