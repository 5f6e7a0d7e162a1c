"""The cost model (``toolkit.parallel.cost``) against the benchmark it predicts.

    .venv/bin/python experiments/cost_model_check.py

Reads ``bench_allreduce_1gbit.csv`` and ``bench_allreduce_10gbit.csv`` (ResNet-50's shapes, 2
workers on two namespace hosts, the link shaped by ``toolkit cluster shape``), predicts each
mode's milliseconds per update from the link's speed, the model's entries and this machine's
``memcpy`` (timed now), and prints the median measured, the prediction and the error; the rows
go to ``cost_model_check.csv`` beside this script. Then what the model says for 4 workers on
ResNet-20 and ResNet-50 (``cost_model_check_predictions.csv``), the table the docs quote.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402  (after the path is set)

from experiments import benchmark_csv  # noqa: E402
from toolkit.parallel import cost  # noqa: E402

HERE = Path(__file__).parent
ENTRIES = {"resnet20": 272_474, "resnet50": 25_583_592}  # trainable entries
MODES = {  # bench_allreduce's modes as the model's arguments
    "dense": {"compression": "none"},
    "fp16": {"compression": "fp16"},
    "topk 1%": {"compression": "topk", "ratio": 0.01, "topk_sample": 0.0},
    "topk 0.1%": {"compression": "topk", "ratio": 0.001, "topk_sample": 0.0},
    "topk 1%, sampled 1%": {"compression": "topk", "ratio": 0.01},
    "topk 0.1%, sampled 1%": {"compression": "topk", "ratio": 0.001},
    "topk 1%, sampled 1%, fp16 values": {"compression": "topk", "ratio": 0.01, "value_bytes": 2},
    "threshold ~1%": {"compression": "threshold", "ratio": 0.01},
    "2bit": {"compression": "2bit"},
    "DGC: topk 0.1%, sampled 1%": {"compression": "topk", "ratio": 0.001},
}


def predicted_seconds(mode: str, entries: int, workers: int, gbit: float) -> float:
    """The cost model's seconds per update for one of :data:`MODES`."""
    options = dict(MODES[mode])
    compression = options.pop("compression")
    return cost.seconds_per_update(compression, entries, workers, cost.Link(gbit), **options)


def main() -> int:
    rows = []
    for gbit in (1, 10):
        measured = pd.read_csv(HERE / f"bench_allreduce_{gbit}gbit.csv")
        medians = measured[measured.model == "resnet50"].groupby("mode").ms.median()
        for mode in MODES:
            predicted = predicted_seconds(mode, ENTRIES["resnet50"], 2, gbit)
            ms = medians[mode]
            rows.append(
                {"link_gbit": gbit, "mode": mode, "measured_ms": ms}
                | {"predicted_ms": predicted * 1e3, "error": predicted * 1e3 / ms - 1}
            )
    benchmark_csv.save(__file__, rows)
    frame = pd.DataFrame(rows)
    copy_ms = cost.memcpy_seconds_per_byte() * 4e3 * ENTRIES["resnet50"]
    print(f"memcpy of ResNet-50's bytes here: {copy_ms:.1f} ms")
    print("| link | mode | measured ms | predicted ms | error |")
    print("| --- | --- | --- | --- | --- |")
    for r in frame.itertuples():
        print(
            f"| {r.link_gbit} Gbit/s | {r.mode} | {r.measured_ms:,.0f} | {r.predicted_ms:,.0f} "
            f"| {r.error:+.0%} |"
        )
    errors = frame.error.abs()
    print(f"median |error|: {errors.median():.0%}, largest {errors.max():.0%}")
    predict_for_four_workers()
    return 0


def predict_for_four_workers() -> None:
    modes = ("dense", "fp16", "topk 1%, sampled 1%", "2bit")
    rows = []
    for model, entries in ENTRIES.items():
        for gbit in (1, 10):
            for mode in modes:
                seconds = predicted_seconds(mode, entries, 4, gbit)
                rows.append(
                    {"model": model, "link_gbit": gbit, "mode": mode, "predicted_ms": seconds * 1e3}
                )
    benchmark_csv.save(__file__, rows, "predictions")
    table = pd.DataFrame(rows).pivot_table(
        index=["model", "link_gbit"], columns="mode", values="predicted_ms", sort=False
    )[list(modes)]
    print("4 workers, predicted ms per update")
    print("| model | link | " + " | ".join(modes) + " |")
    print("| --- | --- |" + " --- |" * len(modes))
    for (model, gbit), r in table.iterrows():
        print(f"| {model} | {gbit} Gbit/s | " + " | ".join(f"{v:,.0f}" for v in r) + " |")


if __name__ == "__main__":
    sys.exit(main())
