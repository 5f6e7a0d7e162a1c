"""Runs' events as TensorBoard event files: ``python -m toolkit tensorboard``.

Each lab run becomes one TensorBoard run, ``<logdir>/<run id>/``, a record an event holding its
:func:`~toolkit.runs.events.scalars` (every numeric key, at the record's ``step`` and ``wall``
time, tagged ``<phase>/<key>``: ``train/loss``, ``eval/accuracy``, ``trust_ratio/conv1/kernel``;
``epoch`` once a step). Values go in as float64 scalars, so TensorBoard reads back exactly what
``events.jsonl`` holds. NaN (a key the record lacks, or a diverged loss) is left out:
TensorBoard cannot draw it.

The run's config goes in twice: as HParams (:func:`hparams`: every field, flattened to
``optimizer.learning_rate``, with its tags), so the HParams dashboard tables and plots runs by
any field against their final metrics; and as text (tag ``config``: ``config.yaml`` itself).

An export is incremental: ``<logdir>/<run id>/lbl-position.json`` keeps where the last one
stopped (:meth:`toolkit.runs.events.EventTail.position`), and the next appends an event file with
the records after it. A log that was rewound (a resumed run) or replaced, or a position that is
missing or unreadable, means exporting the run again from its start, its old event files
removed. The run directory itself is only read.

Written with TensorBoard's own event writer and protocol buffers (the ``tensorboard`` package
comes with TensorFlow); nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from toolkit import files
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.runs.events import EventTail, scalars
from toolkit.runs.rundir import RunDir

POSITION = "lbl-position.json"
EVENT_FILES = "events.out.tfevents.*"
_SCALAR = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
)


def export(run: RunDir, logdir: str | Path) -> int:
    """Bring ``<logdir>/<run id>/`` up to date with ``run``'s events; the number of records
    written (0 when nothing is new)."""
    out = Path(logdir) / run.run_id
    if not run.events_path.exists():
        return 0
    out.mkdir(parents=True, exist_ok=True)
    try:
        tail, resumed = EventTail(run.events_path, files.read_json(out / POSITION)), True
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or damaged
        tail, resumed = EventTail(run.events_path), False
    frame = tail.read_new()
    if tail.restarted or not resumed:  # from the log's start: what was exported goes
        for stale in out.glob(EVENT_FILES):
            stale.unlink()
        _write_config(out, run)
    written = _write(out, frame) if len(frame) else 0
    files.write_json(out / POSITION, tail.position())
    return written


def hparams(run: RunDir, config: ExperimentConfig) -> dict[str, bool | float | str]:
    """``run``'s ``config`` as HParams: each field by its dotted path
    (:meth:`~toolkit.config.ExperimentConfig.flat`; ``None`` as ``null``, since HParams take
    numbers, booleans and text), with the run's ``tags``."""
    fields = {k: "null" if v is None else v for k, v in config.flat().items()}
    return {**fields, "tags": ", ".join(run.tags())}


def _write_config(out: Path, run: RunDir) -> None:
    """The run's HParams and its ``config.yaml`` as text, in an event file of their own (none
    where the config cannot be read: the scalars still go out)."""
    try:
        config = run.config()
    except (OSError, ConfigError):
        return
    session, text = hparams(run, config), config.to_yaml()
    started = run.meta().get("created")
    writer = EventFileWriter(str(out), filename_suffix=".config")
    for summary in (
        hparams_summary.hparams_pb(session, trial_id=run.run_id, start_time_secs=started),
        text_summary.text_pb("config", "\n".join("    " + line for line in text.splitlines())),
    ):
        writer.add_event(event_pb2.Event(wall_time=started or 0.0, step=0, summary=summary))
    writer.close()


def _write(out: Path, frame: pd.DataFrame) -> int:
    """One new event file in ``out`` with the records of ``frame`` that have a step (their
    :func:`~toolkit.runs.events.scalars`, a record an event); their count."""
    writer = EventFileWriter(str(out))
    introduced: set[str] = set()  # tags whose metadata this file has given
    written = 0
    for (_, step, wall), values in scalars(frame).groupby(
        ["record", "step", "wall"], sort=False, dropna=False
    ):
        event = event_pb2.Event(wall_time=wall if math.isfinite(wall) else 0.0, step=int(step))
        for name, value in zip(values["name"], values["value"], strict=True):
            scalar = event.summary.value.add(
                tag=name, tensor=tensor_util.make_tensor_proto(np.float64(value))
            )
            if name not in introduced:
                scalar.metadata.CopyFrom(_SCALAR)
                introduced.add(name)
        writer.add_event(event)
        written += 1
    writer.close()
    return written


def export_all(runs: Iterable[RunDir], logdir: str | Path) -> dict[str, int]:
    """:func:`export` each run; the records written, by run id."""
    return {run.run_id: export(run, logdir) for run in runs}


STOP_S = 10.0
"""How long TensorBoard is given to exit on SIGTERM before it is killed."""


def serve(
    runs: Callable[[], Iterable[RunDir]], logdir: str | Path, port: int = 6006, every_s: float = 10
) -> int:
    """TensorBoard on ``127.0.0.1:port`` over ``logdir``, exporting ``runs()`` again every
    ``every_s`` seconds so live runs grow, until TensorBoard exits (its exit status) or this
    process is asked to stop (SIGINT, Ctrl-C, or SIGTERM: 0). A stop is taken between two
    exports, never inside one (an event file is never left half written), and TensorBoard is
    then stopped: SIGTERM, SIGKILL after :data:`STOP_S`."""
    stop = threading.Event()
    for asked in (signal.SIGINT, signal.SIGTERM):
        signal.signal(asked, lambda *_: stop.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
    server = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)])
    try:
        while server.poll() is None and not stop.wait(every_s):
            export_all(runs(), logdir)
    finally:
        server.terminate()
        try:
            server.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:  # a TensorBoard busy reloading under load: killed
            server.kill()
            server.wait()
    return 0 if stop.is_set() else server.returncode
