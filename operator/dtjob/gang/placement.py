"""GangScheduled read from the pods, as the PodGroup schedulers (coscheduling, Volcano) report it: whether the
world's workers were placed together, and once scheduleTimeoutSeconds has passed without that, a Warning
event and the job's message saying what is short. Pure.

The pods say it all, as for runPolicy.startupDeadlineSeconds: a worker is placed once it is bound to a node
(PodScheduled), and the clock runs from the first worker's creation. The PodGroup's own status is not read:
scheduler-plugins fills it in only when its controller runs, Volcano in its own words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from dtjob.gang.base import ConditionView, GangReport, PodView
from dtjob.gang.pool_room import PoolRoom
from dtjob.spec.parse import JobSpec
from dtjob.spec.validators import GPU_RESOURCE

PLACED = "GangScheduled"
WAITING = "GangWaiting"
TIMED_OUT = "GangScheduleTimeout"


def domain_wait(spec: JobSpec, size: int) -> str | None:
    """What the workers wait for under runPolicy.scheduling.topology required (None without it): one domain
    of its key with room for all of them, never a world split across domains."""
    topology = spec.run_policy.scheduling.topology
    if topology is None or not topology.required:
        return None
    return (
        f"the {size} workers wait for one {topology.key} domain with room for all of them "
        "(runPolicy.scheduling.topology required)"
    )


def seconds_left(spec: JobSpec, workers: Iterable[PodView], now: datetime) -> float | None:
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


def wants_pool_room(
    spec: JobSpec, workers: Iterable[PodView], prev: ConditionView | None, now: datetime
) -> bool:
    """Whether the observer should read the pool's free GPUs: only for a GPU gang whose timeout has just
    passed (once; the message then stands until the gang is placed)."""
    left = seconds_left(spec, workers, now)
    if spec.gpus_per_worker == 0 or left is None or left > 0:
        return False
    return prev is None or prev.reason != TIMED_OUT


def report(
    spec: JobSpec,
    scheduler: str,
    workers: Mapping[int, PodView],
    size: int,
    prev: ConditionView | None,
    room: PoolRoom | None,
    now: datetime,
) -> GangReport | None:
    """GangScheduled for the current world's workers (`workers` by index, `size` of them wanted), placed by
    `scheduler` (its name, for the messages)."""
    if spec.run_policy.scheduling.gang is None or not workers:
        return None
    placed = sum(1 for p in workers.values() if p.scheduled)
    if placed == size:
        if prev is not None and prev.status == "True":
            return None
        text = f"all {size} workers placed together by {scheduler}"
        if prev is not None and prev.reason == TIMED_OUT:
            event = f"{text}, after the schedule timeout had passed"
            return GangReport(True, PLACED, text, event=("Normal", event))
        return GangReport(True, PLACED, text)
    left = seconds_left(spec, workers.values(), now)
    if left is None:
        return None
    if left > 0:
        text = f"waiting for {scheduler} to place all {size} workers together ({placed} placed)"
        return GangReport(False, WAITING, text, requeue_s=left)
    if prev is not None and prev.reason == TIMED_OUT:
        # Said once; it stands until the gang is placed.
        return GangReport(False, TIMED_OUT, prev.message, job_message=True)
    text = shortfall(spec, size, workers.values(), room, scheduler)
    return GangReport(False, TIMED_OUT, text, event=("Warning", text), job_message=True)


def shortfall(
    spec: JobSpec, size: int, workers: Iterable[PodView], room: PoolRoom | None, scheduler: str
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
            f"{len(room.free)} nodes " + (f"matching {room.selector})" if room.selector else "it may use)")
        )
    else:
        text += f"; {sum(1 for p in pods if p.scheduled)} of {size} placed"
    text += (
        f"; not placed together within runPolicy.scheduling.gang.scheduleTimeoutSeconds "
        f"({gang.schedule_timeout_seconds}s), still waiting"
    )
    domain = domain_wait(spec, size)
    if domain is not None:
        text += f"; {domain}"
    if fit is None or fit >= size:
        # The GPUs are there (or unknown): the pods' own verdicts say what else is missing.
        verdict = next((p for p in pods if not p.scheduled and p.reason), None)
        if verdict is not None:
            text += f"; {verdict.name}: {verdict.reason}"
        else:
            text += f"; no verdict from {scheduler} on any worker: is it running?"
    return text
