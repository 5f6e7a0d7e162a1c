"""The front door starts no TensorFlow: validating a config, the launch's work up to handing
the run to its workers (pre-flight, the dataset's size, the schedule's peak, the advice), the
probe's plan and the dry runs of a sweep and a calibration run in a process that never imports
TensorFlow, Keras, scikit-learn or MLflow. (About 5 s: one fresh interpreter; the launched run is
stopped as soon as it is handed over.)"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

from toolkit.launching import launch as launcher
from toolkit.runs.states import LIVE

SCRIPT = """
import json, sys
from toolkit import config, plan
from toolkit.__main__ import main
from toolkit.launching import launch

quickstart = "experiments/quickstart.yaml"
valid = config.load(quickstart)
plan.RunPlan.of(valid, valid.dataset.train_examples(), 2)  # the probe's plan, as probe.py makes it
refused = False
try:
    config.load(quickstart, ["optimizer.params.trust_coefficient=-1"])
except config.ConfigError:
    refused = True
main(["--runs", sys.argv[1], "sweep", "experiments/study/study.yaml", "--dry-run"])
main(["--runs", sys.argv[1], "calibrate", "experiments/mlp_mnist1d.yaml", "--dry-run"])
run = launch.launch(quickstart, np=2, runs_root_dir=sys.argv[1], overrides=["epochs=1"])
heavy = ("tensorflow", "keras", "sklearn", "horovod", "mlflow")
heavy = sorted(m for m in heavy if m in sys.modules)
print(json.dumps({"run": run.run_id, "heavy": heavy, "refused": refused}))
"""


def test_no_tensorflow_before_the_workers(tmp_path, subprocess_env):
    runs = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(runs)],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    try:
        assert said["refused"]
        assert said["heavy"] == []
        assert launcher.RunDir(runs / said["run"]).status()["state"] in LIVE  # handed over
    finally:
        launcher.stop(said["run"], runs)
