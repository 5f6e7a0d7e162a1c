"""What ``lost_worker_after_s`` (Gloo's timeout) bounds, measured under real horovodrun.

Two workers on this machine, Gloo's timeout ``T`` (``--timeout``, 10 s), and rank 1 doing one
of three things while rank 0 waits for it:

- ``slow``: rank 1 computes (sleeps in Python) for 2.5 T between two allreduces, a slow step;
- ``stopped``: rank 1 stops itself (SIGSTOP) before the second allreduce, a hung worker;
- ``late``: rank 1 starts 2.5 T after rank 0 (it sleeps before Horovod's init).

For each repeat it prints how the run ended (``completed``, or ``failed`` with Gloo's words)
and how long rank 0 waited from its call (the allreduce, or the init) to its end; the table
gives the median and range over repeats. Raw rows go to ``gloo_timeout.csv`` beside this
script. A slow worker must complete whatever T; a stopped one must fail at T; a late one at T.

    python experiments/gloo_timeout.py [--timeout 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
CASES = ("slow", "stopped", "late")
STRETCH = 2.5  # how many timeouts rank 1 makes rank 0 wait


def worker(case: str, timeout_s: float) -> None:
    """One worker of ``case``: prints ``WAITED <s> <outcome>`` on rank 0."""
    rank = int(os.environ["HOROVOD_RANK"])
    if case == "late" and rank == 1:
        time.sleep(STRETCH * timeout_s)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    started = time.monotonic()
    if rank == 0 and case == "late":  # the init itself waits for rank 1; it aborts on failure
        print(f"INIT {time.time():.3f}", flush=True)
    hvd.init()
    hvd.allreduce(tf.constant([1.0]), name="before")
    if case == "late":
        print(f"WAITED {time.monotonic() - started:.2f} completed", flush=True)
        return
    started = time.monotonic()
    if rank == 1 and case == "slow":
        time.sleep(STRETCH * timeout_s)
    if rank == 1 and case == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        hvd.allreduce(tf.constant([1.0]), name="after")
    except Exception:
        print(f"WAITED {time.monotonic() - started:.2f} failed", flush=True)
        raise
    if rank == 0:
        print(f"WAITED {time.monotonic() - started:.2f} completed", flush=True)


def one(case: str, timeout_s: int, repeat: int) -> dict:
    """Run ``case`` under horovodrun; its row: outcome, rank 0's wait, Gloo's words."""
    argv = [
        str(Path(sys.executable).with_name("horovodrun")),
        "--gloo",
        "-np",
        "2",
        "--gloo-timeout-seconds",
        str(timeout_s),
        sys.executable,
        __file__,
        "--worker",
        case,
        "--timeout",
        str(timeout_s),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    ended = time.time()
    log = done.stdout + done.stderr
    waited = re.search(r"\[0\]<stdout>:WAITED ([\d.]+) (\w+)", log)
    init = re.search(r"\[0\]<stdout>:INIT ([\d.]+)", log)
    gloo = re.search(r"(Timed out waiting \d+ms[^\n]*?complete|Wait timeout after [^.]*)", log)
    if waited:
        seconds, outcome = float(waited.group(1)), waited.group(2)
    else:  # rank 0 aborted inside Horovod's init (late): timed from its start to horovodrun's end
        seconds, outcome = (ended - float(init.group(1)) if init else float("nan")), "failed"
    if done.returncode != 0:
        outcome = "failed"
    return {
        "case": case,
        "timeout_s": timeout_s,
        "repeat": repeat,
        "outcome": outcome,
        "rank0_waited_s": round(seconds, 2),
        "gloo_said": gloo.group(1) if gloo else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.timeout)
        return
    rows = []
    for repeat in range(args.repeats):
        for case in CASES:
            rows.append(one(case, args.timeout, repeat))
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(HERE / "gloo_timeout.csv", index=False)
    table = frame.groupby("case", sort=False).agg(
        outcomes=("outcome", lambda o: ", ".join(sorted(set(o)))),
        waited_median_s=("rank0_waited_s", "median"),
        waited_min_s=("rank0_waited_s", "min"),
        waited_max_s=("rank0_waited_s", "max"),
        gloo_said=("gloo_said", "first"),
    )
    print(f"\nGloo's timeout {args.timeout} s, rank 1 holding rank 0 for {STRETCH} x that:")
    print(table.to_markdown())


if __name__ == "__main__":
    main()
