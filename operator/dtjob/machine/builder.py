"""The decision being built: status, actions, events and the earliest wake-up. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from dtjob.contract.training_progress import without_eta
from dtjob.state.conditions import with_kstatus_conditions
from dtjob.state.decision import (
    Action,
    Decision,
    Event,
)
from dtjob.state.status import (
    PENDING,
    RUNNING,
    STARTING,
    SUCCEEDED,
    JobStatus,
    set_condition,
)

MAX_REQUEUE_SECONDS = 24 * 3600.0
# Every start passes through these on its way to Running: an event each would be two writes per job on a
# shared API server for what the phase, the message and the conditions already say. A Warning (a blocker
# named as the reason) still posts in them.
ROUTINE_PHASES = frozenset({PENDING, STARTING})


class Builder:
    """Accumulates one reconcile's decision; keeps decide() readable."""

    def __init__(self, prev: JobStatus, now: datetime) -> None:
        self.prev = prev
        self.now = now
        self.status = prev
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue_after: float | None = None

    def cond(self, kind: str, status: bool, reason: str, message: str) -> None:
        conds = set_condition(self.status.conditions, kind, status, reason, message, self.now)
        self.status = replace(self.status, conditions=conds)

    def cond_false_if_present(self, kind: str, reason: str, message: str = "") -> None:
        if self.status.condition(kind) is not None:
            self.cond(kind, False, reason, message)

    def phase(self, phase: str, message: str, event_type: str = "Normal", reason: str | None = None) -> None:
        if phase != self.prev.phase and (event_type != "Normal" or phase not in ROUTINE_PHASES):
            self.events.append(Event(event_type, reason or phase, message or phase))
        self.status = replace(self.status, phase=phase, message=message)

    def requeue(self, seconds: float) -> None:
        seconds = min(max(seconds, 1.0), MAX_REQUEUE_SECONDS)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def decision(self) -> Decision:
        status = with_kstatus_conditions(eta_while_training(self.status), self.now)
        return Decision(status, self.actions, self.events, self.requeue_after)


def eta_while_training(status: JobStatus) -> JobStatus:
    """status.progress's ETA belongs to the world that measured it, while it trains (and stays at 0 once the
    job succeeded): restarting, suspended or preempted, no world trains and the next one, resumed from a
    checkpoint and maybe of another size, has a pace of its own; failed, nothing will finish. Percent done
    stays, true in every phase."""
    progress = status.training_progress
    if progress is None or status.phase in (RUNNING, SUCCEEDED) or "etaSeconds" not in progress:
        return status
    return replace(status, training_progress=without_eta(progress))
