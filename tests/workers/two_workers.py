"""Run under ``horovodrun -np 2``: the checks of tests/test_distributed.py that need workers.

Each rank writes ``<out>/rank<r>.npz`` with the weights each scenario ended with and the epoch
logs ``fit`` reported after metric averaging.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from toolkit import distributed

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import GLOBAL_BATCH, SCENARIOS, global_data, make_model  # noqa: E402


def main(out: Path) -> None:
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    x, y = global_data()
    half = GLOBAL_BATCH // size
    results, logs = {}, {}
    for name, scenario in SCENARIOS.items():
        # A different seed on every rank: only the broadcast makes the workers agree.
        model = make_model(
            seed=100 + rank, optimizer=scenario["optimizer"](), **scenario["wrap"]
        )
        distributed.broadcast_variables(model, model.optimizer)
        for step in range(scenario["steps"]):
            rows = slice(
                step * GLOBAL_BATCH + rank * half,
                step * GLOBAL_BATCH + (rank + 1) * half,
            )
            model.train_on_batch(x[rows], y[rows])
        results.update({f"{name}/{i}": w for i, w in enumerate(model.get_weights())})

    model = make_model(seed=100 + rank, optimizer=SCENARIOS["sgd"]["optimizer"]())
    history = model.fit(
        x[rank::size],
        y[rank::size],
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            distributed.BroadcastInitialState(),
            distributed.MetricAverageCallback(),
        ],
    )
    results.update({f"fit/{i}": w for i, w in enumerate(model.get_weights())})
    logs = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps({"size": size, "logs": logs}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
