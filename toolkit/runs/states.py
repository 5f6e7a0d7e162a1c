"""A run's state, one closed set: :class:`State`.

A run is ``queued`` while it waits for slots (or in a scheduler's queue), ``starting`` once it
has them until its workers train, ``running``, and ends ``completed``, ``failed`` or
``stopped``; a search's trial that its pruner judged not worth finishing ends ``pruned`` (it
does not resume). A member is its string (a :class:`~enum.StrEnum`): ``status.json`` holds the same
words it always has, and a state read back from disk compares equal to its member.
``unreadable`` is not a state a run is put in: it is how a reader reports a ``status.json`` it
cannot read (:meth:`toolkit.runs.rundir.RunDir.recorded_status`).
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    PRUNED = "pruned"
    UNREADABLE = "unreadable"


STATES = (
    State.QUEUED,
    State.STARTING,
    State.RUNNING,
    State.COMPLETED,
    State.FAILED,
    State.STOPPED,
    State.PRUNED,
)
"""The states a run is put in, in the order a run goes through them."""
LIVE = (State.QUEUED, State.STARTING, State.RUNNING)
TERMINAL = (State.COMPLETED, State.FAILED, State.STOPPED, State.PRUNED)
RESUMABLE = (State.STOPPED, State.FAILED)
"""The ends a run resumes from (from its latest checkpoint)."""
