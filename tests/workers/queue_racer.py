"""One racer of tests/test_queue.py's race for slots, in a process of its own:

    python tests/workers/queue_racer.py RUNS_ROOT RUN_ID START_AT REPORT

From the time ``START_AT``, CYCLES times: enqueue the run, take its slot when granted, hold it
briefly and give it back, as a run's supervisor does. Each cycle appends to ``REPORT`` a JSON
line ``[run_id, granted, taken, given_back]``: the interval it held the slot, from after
try_start returned to before it recorded the release, so inside the real holding.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from toolkit.launching import slots
from toolkit.runs import processes
from toolkit.runs.rundir import RunDir

CYCLES = 10


def race(root: str, name: str, start_at: float, report: str) -> None:
    run = RunDir(Path(root) / name)
    time.sleep(max(0.0, start_at - time.time()))
    for _ in range(CYCLES):
        slots.enqueue(run, {"localhost": 1})
        deadline = time.time() + 30
        while (granted := slots.try_start(run)) is False and time.time() < deadline:
            time.sleep(random.uniform(0, 0.002))
        taken = time.time()
        if granted:  # what a supervisor does: record the slots it holds, leave the line
            record = processes.record("supervisor")
            run.record_processes(record, launched=taken, released=None, slots={"localhost": 1})
            slots.leave_line(run)
            time.sleep(random.uniform(0, 0.01))
        given_back = time.time()
        run.finish("completed", released=given_back)  # training ends; the slot is free
        run.set_status("queued")  # and the next cycle queues it again
        with open(report, "a") as out:
            out.write(json.dumps([name, granted, taken, given_back]) + "\n")


if __name__ == "__main__":
    root, name, start_at, report = sys.argv[1:]
    race(root, name, float(start_at), report)
