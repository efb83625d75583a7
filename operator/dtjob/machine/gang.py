"""Gang scheduling as the job reports it: the job's scheduler (dtjob.gang) says what condition GangScheduled
holds for the current world's workers, and the state machine writes it, with its event, requeue and message.
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from dtjob import gang
from dtjob.machine.builder import Builder
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import Event
from dtjob.state.observed import Observed, PodState
from dtjob.state.status import ConditionType, JobStatus

GANG_SCHEDULED = ConditionType.GANG_SCHEDULED


def current_workers(observed: Observed, attempt: int) -> list[PodState]:
    return [p for p in observed.workers() if p.attempt == attempt and not p.deleting]


def wants_pool_room(spec: JobSpec, observed: Observed, prev: JobStatus, now: datetime) -> bool:
    """Whether the observer should read the pool's free GPUs: for a GPU gang whose timeout just passed."""
    workers = current_workers(observed, prev.restarts)
    return gang.wants_pool_room(spec, workers, prev.condition(GANG_SCHEDULED), now)


def report_gang(
    b: Builder, spec: JobSpec, observed: Observed, workers: Mapping[int, PodState], size: int
) -> None:
    """GangScheduled for the current world's workers (`workers` by index, `size` of them wanted)."""
    scheduler = gang.gang_scheduler(spec)
    if scheduler is None:
        return
    prev = b.prev.condition(GANG_SCHEDULED)
    said = scheduler.gang_scheduled(spec, workers, size, prev, observed.pool_room, b.now)
    if said is None:
        return
    b.cond(GANG_SCHEDULED, said.placed, said.reason, said.message)
    if said.event is not None:
        kind, text = said.event
        b.events.append(Event(kind, said.reason, text))
    if said.requeue_s is not None:
        b.requeue(said.requeue_s)
    if said.job_message:
        b.status = replace(b.status, message=said.message)
