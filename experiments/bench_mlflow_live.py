"""What the live MLflow mirror (a config's ``logging.mlflow``) costs training, and what an export
costs: the quickstart launched with and without the mirror to a real ``mlflow server`` on
127.0.0.1, alternately, then each run exported afresh and exported again.

    .venv/bin/python experiments/bench_mlflow_live.py [--repeats 3] [--epochs 12] [--workers 1]

Training's speed is the run's own: the median ``samples_per_sec`` of its train events (Keras's
epoch-average throughput, written every ``logging.every_steps``), so start-up is not in it; the
ratio with the mirror to without is the cost (1.00: none; lower is slower). Also the seconds from
launch to end, and the mirror's points against the events' (equal: it logged every one). Raw
rows: ``bench_mlflow_live.csv`` beside this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmark_csv  # noqa: E402
from bench_first_page import answers, free_port  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from toolkit import safe_yaml  # noqa: E402
from toolkit.config import from_mapping  # noqa: E402
from toolkit.launching import launch as launcher  # noqa: E402
from toolkit.runs import mlflow_export  # noqa: E402
from toolkit.runs.events import read_events  # noqa: E402
from toolkit.runs.states import LIVE  # noqa: E402


def launch_and_wait(config: dict, runs: Path):
    began = time.time()
    run = launcher.launch(from_mapping(config), runs_root_dir=runs)
    while run.status()["state"] in LIVE:
        time.sleep(0.2)
    return run, time.time() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    base = safe_yaml.load_file(ROOT / "experiments" / "quickstart.yaml")
    base |= {"epochs": args.epochs, "workers": args.workers}
    rows = []
    with tempfile.TemporaryDirectory(prefix="lbl-bench-mlflow-") as tmp:
        work = Path(tmp)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        port = free_port()
        uri = f"http://127.0.0.1:{port}"
        command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--workers", "1"]
        command += ["--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}"]
        command += ["--artifacts-destination", str(work / "artifacts")]
        with open(work / "server.log", "wb") as log:
            server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        try:
            while not answers(f"{uri}/health"):
                time.sleep(0.5)
            client = MlflowClient(uri)
            for repeat in range(args.repeats):
                for mirrored in (False, True):
                    config = dict(base)
                    if mirrored:
                        mirror = {"tracking_uri": uri, "experiment": "live"}
                        config["logging"] = {**base["logging"], "mlflow": mirror}
                    run, wall = launch_and_wait(config, work / "runs")
                    events = read_events(run.events_path)
                    train = events[events.phase == "train"]
                    points = len(mlflow_export.metric_points(events))
                    mirrored_points = None
                    if mirrored:
                        logged = client.search_runs(
                            [client.get_experiment_by_name("live").experiment_id],
                            f"tags.`lab.run_id` = '{run.run_id}'",
                        )[0]
                        names = logged.data.metrics
                        mirrored_points = sum(
                            len(client.get_metric_history(logged.info.run_id, name))
                            for name in names
                        )
                    began = time.time()
                    destination = mlflow_export.Destination(uri, f"export-{repeat}-{mirrored}")
                    mlflow_export.export(run, destination)
                    export_s = time.time() - began
                    began = time.time()
                    again = mlflow_export.export(run, destination).points
                    again_s = time.time() - began
                    rows.append(
                        {
                            "repeat": repeat,
                            "mirror": mirrored,
                            "workers": args.workers,
                            "epochs": args.epochs,
                            "state": run.status()["state"],
                            "samples_per_sec": float(train["samples_per_sec"].median()),
                            "launch_to_end_s": round(wall, 2),
                            "event_points": points,
                            "mirrored_points": mirrored_points,
                            "export_s": round(export_s, 3),
                            "export_again_s": round(again_s, 3),
                            "export_again_points": again,
                        }
                    )
                    print(rows[-1], flush=True)
        finally:
            os.killpg(server.pid, 15)
            server.wait()
    benchmark_csv.save(__file__, rows)
    report(rows)
    return 0


def report(rows: list[dict]) -> None:
    """The table the README quotes: speed with the mirror against without, per repeat."""
    by = {(r["repeat"], r["mirror"]): r for r in rows}
    ratios = [
        by[(k, True)]["samples_per_sec"] / by[(k, False)]["samples_per_sec"]
        for k in sorted({r["repeat"] for r in rows})
    ]
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    print("\n| | without the mirror | with it |")
    print("| --- | ---: | ---: |")
    for key, label in (
        ("samples_per_sec", "samples/s (median of train events)"),
        ("launch_to_end_s", "launch to end (s)"),
        ("export_s", "first export (s)"),
        ("export_again_s", "export again (s)"),
    ):
        off = statistics.mean(r[key] for r in rows if not r["mirror"])
        on = statistics.mean(r[key] for r in rows if r["mirror"])
        print(f"| {label} | {off:.2f} | {on:.2f} |")
    print(
        f"\nspeed with / without: {statistics.mean(ratios):.3f} ± {spread:.3f} "
        f"({len(ratios)} pairs; 1.00 = no cost)"
    )
    mirrored = [r for r in rows if r["mirror"]]
    print(
        "points the mirror logged = the events': "
        f"{all(r['mirrored_points'] == r['event_points'] for r in mirrored)}; "
        f"an export again added {sum(r['export_again_points'] for r in rows)} points"
    )


if __name__ == "__main__":
    sys.exit(main())
