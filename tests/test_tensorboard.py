"""``python -m toolkit tensorboard``: a run's events as TensorBoard event files.

The oracle is ``events.jsonl`` read line by line with ``json`` here; the other side is what
TensorBoard's own data provider returns (what its Scalars dashboard reads), so every numeric
key of every record must come back equal, per step, through TensorBoard's reader.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import psutil
import pytest
import yaml
from conftest import ROOT, free_port, run_cli
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer

from toolkit.config import from_mapping
from toolkit.runs import tensorboard_export
from toolkit.runs.events import EventWriter, truncate_after
from toolkit.runs.rundir import RunDir

SHORT = {
    "name": "tb",
    "dataset": {"name": "mnist1d"},
    "model": {"name": "cnn1d"},
    "optimizer": {"name": "lars", "learning_rate": 0.2, "params": {"momentum": 0.9}},
    "batch": {"per_worker": 64},
    "epochs": 2,
    "workers": 1,
    "logging": {"every_steps": 5, "trust_ratio_every_steps": 20, "noise_scale_every_steps": 10},
}
NOT_SCALARS = {"step", "wall", "phase"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> RunDir:
    """One short real run, trained in this process; tests that change it work on a copy."""
    from toolkit.train import train

    return train(from_mapping(SHORT), runs_root=tmp_path_factory.mktemp("runs"), verbose=0)


@pytest.fixture
def run(trained, tmp_path) -> RunDir:
    """A copy of the trained run that a test may append to or rewind."""
    copy = tmp_path / "runs" / trained.run_id
    shutil.copytree(trained.path, copy)
    return RunDir(copy)


def from_jsonl(path) -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) points, in file order, read with ``json``: numbers, and the
    non-finite spellings the writer uses for infinities; NaN left out. A key's tag is
    ``<phase>/<key>``, the key alone where it already starts with its phase; ``epoch`` is one
    tag, at the first record of each step."""
    points = defaultdict(list)
    for line in path.read_bytes().splitlines():
        record = json.loads(line)
        phase = record.get("phase", "events")
        for key, value in record.items():
            if key in NOT_SCALARS or isinstance(value, bool):
                continue
            if value in ("Infinity", "-Infinity"):
                value = float(value)
            if not isinstance(value, (int, float)) or math.isnan(value):
                continue
            if key == "epoch":
                if points["epoch"] and points["epoch"][-1][0] == record["step"]:
                    continue
                name = "epoch"
            else:
                name = key if key.split("/")[0] == phase else f"{phase}/{key}"
            points[name].append((record["step"], value))
    return dict(points)


def from_tensorboard(logdir, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """The same, as TensorBoard's data provider reads the export (every point kept)."""
    keep_all = {event_accumulator.TENSORS: 0}
    mux = multiplexer.EventMultiplexer(size_guidance=keep_all, tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    scalars = provider.read_scalars(
        context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=10**9
    )
    return {tag: [(d.step, d.value) for d in data] for tag, data in scalars[run_id].items()}


def assert_same(logdir, run: RunDir):
    want = from_jsonl(run.events_path)
    assert from_tensorboard(logdir, run.run_id) == want
    return want


def test_every_numeric_key_reads_back_equal_per_step(trained, tmp_path):
    written = tensorboard_export.export(trained, tmp_path)
    tags = assert_same(tmp_path, trained)
    phases = {tag.split("/")[0] for tag in tags}
    assert {"train", "eval", "system", "gns"} <= phases
    assert {"train/loss", "eval/accuracy", "train/lr", "gns/b_simple"} <= set(tags)
    assert written == len(trained.events_path.read_bytes().splitlines())


def test_trust_ratios_are_tagged_once_and_epoch_is_one_tag(trained, tmp_path):
    tensorboard_export.export(trained, tmp_path)
    tags = from_tensorboard(tmp_path, trained.run_id)
    ratios = [t for t in tags if "trust_ratio" in t]
    assert ratios and all(
        t.startswith("trust_ratio/") and t.count("trust_ratio") == 1 for t in ratios
    )
    assert "epoch" in tags and not [t for t in tags if t.endswith("/epoch")]
    steps = [step for step, _ in tags["epoch"]]
    assert steps == sorted(set(steps))  # one value a step


def test_the_config_goes_out_as_hparams_and_as_text(trained, tmp_path):
    """The HParams dashboard's session of the run holds every config field by its dotted path
    (compared with config.yaml flattened here) and its tags; the text plugin, config.yaml."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    tensorboard_export.export(trained, tmp_path)
    mux = multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    content = mux.PluginRunToTagToContent("hparams")[trained.run_id]["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    exported = {
        name: getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()
    }
    want = {}
    stack = [("", yaml.safe_load(trained.config_path.read_text()))]
    while stack:
        prefix, mapping = stack.pop()
        for key, value in mapping.items():
            if isinstance(value, dict):
                stack.append((f"{prefix}{key}.", value))
            else:
                want[f"{prefix}{key}"] = (
                    json.dumps(value) if value is None or isinstance(value, list) else value
                )
    want["tags"] = ""
    assert exported == want
    assert exported["optimizer.name"] == "lars" and exported["epochs"] == 2
    (text,) = mux.Tensors(trained.run_id, "config")
    shown = text.tensor_proto.string_val[0].decode()
    assert [
        line.removeprefix("    ") for line in shown.splitlines()
    ] == trained.config_path.read_text().splitlines()


def test_a_second_export_adds_only_the_new_records(run, tmp_path):
    logdir = tmp_path / "tb"
    tensorboard_export.export(run, logdir)
    last = max(json.loads(line)["step"] for line in run.events_path.read_bytes().splitlines())
    with EventWriter(run.events_path) as writer:
        writer.write({"step": last + 1, "phase": "train", "loss": 0.25, "lr": 0.1})
        writer.write({"step": last + 1, "phase": "eval", "loss": float("inf")})
    assert tensorboard_export.export(run, logdir) == 2
    assert tensorboard_export.export(run, logdir) == 0  # nothing new: no new file either
    # the config's file, then one per export that had records
    assert len(list((logdir / run.run_id).glob("events.out.tfevents.*"))) == 3
    tags = assert_same(logdir, run)
    assert tags["eval/loss"][-1] == (last + 1, math.inf)


def test_a_rewound_log_is_exported_again_from_its_start(run, tmp_path):
    logdir = tmp_path / "tb"
    tensorboard_export.export(run, logdir)
    truncate_after(run.events_path, 10)  # what a resumed run does to its log
    with EventWriter(run.events_path) as writer:
        writer.write({"step": 11, "phase": "train", "loss": 0.5})
    tensorboard_export.export(run, logdir)
    tags = assert_same(logdir, run)
    assert max(step for points in tags.values() for step, _ in points) == 11


@pytest.mark.parametrize("position", ["damaged", "deleted"])
def test_without_a_readable_position_the_run_is_exported_again_once(run, tmp_path, position):
    logdir = tmp_path / "tb"
    tensorboard_export.export(run, logdir)
    saved = logdir / run.run_id / tensorboard_export.POSITION
    if position == "damaged":
        saved.write_text('{"offset": "x"')
    else:
        saved.unlink()
    tensorboard_export.export(run, logdir)
    assert_same(logdir, run)  # each point once: the first export's files are gone


def test_the_run_directory_is_only_read(run, tmp_path):
    def snapshot():
        return {
            path.relative_to(run.path): (hashlib.sha1(path.read_bytes()).hexdigest(), path.stat())
            for path in sorted(run.path.rglob("*"))
            if path.is_file()
        }

    before = snapshot()
    tensorboard_export.export(run, tmp_path / "tb")
    after = snapshot()
    assert after.keys() == before.keys()
    for name, (digest, stat) in before.items():
        assert after[name][0] == digest and after[name][1].st_mtime_ns == stat.st_mtime_ns, name


def test_the_command_exports_and_serves_on_loopback_only(trained, tmp_path):
    runs_root, logdir = trained.path.parent, tmp_path / "tb"
    done = run_cli(["tensorboard", "--logdir", str(logdir), "--no-serve"], runs_root)
    assert done.returncode == 0, done.stderr
    assert f"{trained.run_id}: " in done.stdout and str(logdir) in done.stdout
    assert_same(logdir, trained)

    port = free_port()
    command = [sys.executable, "-m", "toolkit", "--runs", str(runs_root), "tensorboard"]
    server = subprocess.Popen(
        [*command, "--logdir", str(logdir), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline, served = time.time() + 120, None
        while served is None and time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as r:
                    served = json.loads(r.read())
            except OSError:
                time.sleep(0.5)
        assert served == [trained.run_id], server.stdout.read1().decode() if server.poll() else ""
        listening = {
            c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
        }
        assert listening == {"127.0.0.1"}
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    assert server.returncode == 0
    assert not any(c.laddr and c.laddr.port == port for c in psutil.net_connections("tcp"))
