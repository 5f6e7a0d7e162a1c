"""``horovodrun``, as the launcher starts it: Horovod's own command line, without its build probe.

Before every ``--gloo`` launch, Horovod's launcher asks whether it was built with Gloo by
importing its TensorFlow extension in a forked process, and so TensorFlow itself: about 6 s on
two cores, a third of a quickstart's launch to its first step (``experiments/bench_startup.py``
measures both). The lab's build answered that once for good: ``scripts/setup.sh`` builds Horovod
with Gloo and fails unless ``horovodrun --check-build`` lists it. So ``python -m
toolkit.launching.horovodrun ARGS`` is ``horovodrun ARGS`` with that answer given instead of
probed. Everything else (the rendezvous, ssh to other hosts, elastic discovery and resets) is
Horovod's, unchanged. A Horovod whose launcher no longer asks by that name fails here, at
once, saying so (:func:`answers`); ``horovodrun`` itself still works.

A stop is not an error: horovodrun ends its workers on SIGTERM or SIGINT (``stop`` sends it),
then raises ``RuntimeError: Horovod detected that one or more processes exited with non-zero
status`` with a traceback. Here it says one line instead and exits ``128 + signal``
(:func:`main`); a worker's own failure still raises as before.
"""

from __future__ import annotations

import signal
import sys
import threading

COMMAND = [sys.executable, "-m", "toolkit.launching.horovodrun"]
"""This launcher's command line: what goes where ``horovodrun`` would (the run's workers, the
tests' and the benchmarks'). Importing this module imports no Horovod."""

PROBES = {"gloo_built": True}
"""The launcher's probes of its build (``--gloo`` asks only this one) and the lab's answers."""


def answers() -> None:
    """Give Horovod's launcher :data:`PROBES`' answers in place of probing."""
    from horovod.runner import launch

    missing = [name for name in PROBES if not callable(getattr(launch, name, None))]
    if missing:
        raise RuntimeError(
            f"horovod.runner.launch has no {', '.join(missing)}: this Horovod probes its build "
            "another way; launch with horovodrun, and update toolkit/launching/horovodrun.py"
        )
    for name, answer in PROBES.items():
        setattr(launch, name, lambda verbose=False, answer=answer: answer)


SIGNALLED: list[int] = []
"""The signals horovodrun took to end its workers (a stop)."""


def _shutdown_event() -> threading.Event:
    """``gloo_run.register_shutdown_event``: its event set on SIGINT or SIGTERM, as Horovod's
    is, and the signal noted in :data:`SIGNALLED`."""
    event = threading.Event()

    def on_signal(signum, frame):
        SIGNALLED.append(signum)
        event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return event


def main(argv: list[str] | None = None) -> int | None:
    from horovod.runner import gloo_run, launch

    answers()
    gloo_run.register_shutdown_event = _shutdown_event
    sys.argv = ["horovodrun", *(sys.argv[1:] if argv is None else argv)]
    try:
        return launch.run_commandline()
    except RuntimeError:
        if not SIGNALLED:
            raise
    name = signal.Signals(SIGNALLED[0]).name
    print(f"horovodrun: {name} received, its workers were ended", file=sys.stderr)
    return 128 + SIGNALLED[0]


if __name__ == "__main__":
    sys.exit(main())
