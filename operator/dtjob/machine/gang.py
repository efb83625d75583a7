"""Gang scheduling as the job reports it (runPolicy.scheduling.gang): condition GangScheduled says whether the
world's workers were placed together, and once scheduleTimeoutSeconds has passed without that, a Warning
event and the job's message say what is short. Pure.

The pods say it all, as for runPolicy.startupDeadlineSeconds: a worker is placed once it is bound to a node
(PodScheduled), and the clock runs from the first worker's creation. The PodGroup's own status is not read:
scheduler-plugins fills it in only when its controller runs, Volcano in its own words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from dtjob.desired.gang import scheduler_name
from dtjob.desired.pods import GPU_RESOURCE
from dtjob.machine.builder import Builder
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import Event
from dtjob.state.observed import Observed, PodState, PoolRoom
from dtjob.state.status import ConditionType, JobStatus

GANG_SCHEDULED = ConditionType.GANG_SCHEDULED
PLACED = "GangScheduled"
WAITING = "GangWaiting"
TIMED_OUT = "GangScheduleTimeout"


def current_workers(observed: Observed, attempt: int) -> list[PodState]:
    return [p for p in observed.workers() if p.attempt == attempt and not p.deleting]


def seconds_left(spec: JobSpec, workers: Iterable[PodState], now: datetime) -> float | None:
    """Seconds until the gang's schedule timeout (zero or less: passed), or None when nothing waits for
    placement (no gang, no worker yet, or every worker placed)."""
    gang = spec.run_policy.scheduling.gang
    pods = list(workers)
    if gang is None or not pods or all(p.scheduled for p in pods):
        return None
    created = [p.created for p in pods if p.created is not None]
    if not created:
        return None
    due = min(created) + timedelta(seconds=gang.schedule_timeout_seconds)
    return (due - now).total_seconds()


def wants_pool_room(spec: JobSpec, observed: Observed, prev: JobStatus, now: datetime) -> bool:
    """Whether the observer should read the pool's free GPUs: only for a GPU gang whose timeout has just
    passed (once; the message then stands until the gang is placed)."""
    left = seconds_left(spec, current_workers(observed, prev.restarts), now)
    if spec.gpus_per_worker == 0 or left is None or left > 0:
        return False
    cond = prev.condition(GANG_SCHEDULED)
    return cond is None or cond.reason != TIMED_OUT


def report_gang(
    b: Builder, spec: JobSpec, observed: Observed, workers: Mapping[int, PodState], size: int
) -> None:
    """GangScheduled for the current world's workers (`workers` by index, `size` of them wanted)."""
    gang = spec.run_policy.scheduling.gang
    if gang is None or not workers:
        return
    scheduler = scheduler_name(spec) or "the default scheduler"
    prev = b.prev.condition(GANG_SCHEDULED)
    placed = sum(1 for p in workers.values() if p.scheduled)
    if placed == size:
        if not b.status.is_true(GANG_SCHEDULED):
            text = f"all {size} workers placed together by {scheduler}"
            b.cond(GANG_SCHEDULED, True, PLACED, text)
            if prev is not None and prev.reason == TIMED_OUT:
                b.events.append(Event("Normal", PLACED, f"{text}, after the schedule timeout had passed"))
        return
    left = seconds_left(spec, workers.values(), b.now)
    if left is None:
        return
    if left > 0:
        b.cond(
            GANG_SCHEDULED, False, WAITING,
            f"waiting for {scheduler} to place all {size} workers together ({placed} placed)",
        )  # fmt: skip
        b.requeue(left)
        return
    if prev is not None and prev.reason == TIMED_OUT:
        text = prev.message  # said once; it stands until the gang is placed
    else:
        text = shortfall(spec, size, workers.values(), observed.pool_room, scheduler)
        b.events.append(Event("Warning", TIMED_OUT, text))
    b.cond(GANG_SCHEDULED, False, TIMED_OUT, text)
    b.status = replace(b.status, message=text)


def shortfall(
    spec: JobSpec, size: int, workers: Iterable[PodState], room: PoolRoom | None, scheduler: str
) -> str:
    """What keeps the gang from being placed, e.g. "gang of 4 workers needs 16 nvidia.com/gpu (4 per
    worker); 2 of 4 could be placed (8 free on the 4 nodes matching ...)"."""
    gang = spec.run_policy.scheduling.gang
    assert gang is not None
    pods = sorted(workers, key=lambda p: p.index if p.index is not None else -1)
    gpus = spec.gpus_per_worker
    text = f"gang of {size} workers"
    if gpus:
        text += f" needs {size * gpus} {GPU_RESOURCE} ({gpus} per worker)"
    fit: int | None = None
    if room is not None and gpus:
        fit = min(size, sum(free // gpus for free in room.free))
        text += (
            f"; {fit} of {size} could be placed ({sum(room.free)} {GPU_RESOURCE} free on the "
            f"{len(room.free)} nodes matching {room.selector})"
        )
    else:
        text += f"; {sum(1 for p in pods if p.scheduled)} of {size} placed"
    text += (
        f"; not placed together within runPolicy.scheduling.gang.scheduleTimeoutSeconds "
        f"({gang.schedule_timeout_seconds}s), still waiting"
    )
    if fit is None or fit >= size:
        # The GPUs are there (or unknown): the pods' own verdicts say what else is missing.
        verdict = next((p for p in pods if not p.scheduled and p.reason), None)
        if verdict is not None:
            text += f"; {verdict.name}: {verdict.reason}"
        else:
            text += f"; no verdict from {scheduler} on any worker: is it running?"
    return text
