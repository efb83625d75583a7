"""An elastic world (spec.elastic, Horovod Elastic) while its launcher runs. A worker the cluster takes away
(evicted, its node lost, its pod deleted) is no world failure: the others train on, the operator creates a
replacement, and Horovod's host discovery adds it once Ready. Only a world that stays below
spec.elastic.minWorkers for spec.elastic.timeoutSeconds restarts, counted. Membership changes are events:
WorkerLost, WorkerJoined, WorldResized. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from dtjob import names
from dtjob.machine.builder import Builder
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import Event
from dtjob.state.node_health import NODE_UNHEALTHY
from dtjob.state.observed import LauncherState, PodState
from dtjob.state.status import WORKERS_BELOW_MINIMUM
from dtjob.timefmt import parse_time

BELOW_MINIMUM = "WorkersBelowMinimum"


def replaces_lost_workers(spec: JobSpec, launcher: LauncherState | None) -> bool:
    """Whether a lost worker is replaced instead of failing the world: an elastic job whose launcher lives."""
    return spec.elastic is not None and launcher is not None and launcher.launched and not launcher.finished


def lost(pod: PodState, now: datetime) -> bool:
    """A worker the cluster took away (its pod failed by a disruption), or one its node cannot keep (a GPU
    fault now; a node about to go, once its ranks had the drain grace to leave): replaced in an elastic
    world."""
    if pod.phase == "Failed" and pod.disruption is not None:
        return True
    problem = pod.node_problem
    if problem is None or pod.phase == "Succeeded":
        return False
    leave_at = problem.leave_at()
    return pod.phase == "Failed" or leave_at is None or now >= leave_at


def replaced_now(b: Builder, pod: PodState) -> bool:
    """An elastic world's worker the cluster took away, or one its node cannot keep: deleted, and replaced
    on another node. On a node about to go it is out of the published hosts already (its ranks leave the
    world at their next commit) and goes the drain grace after the node said so: looked at again then."""
    problem = pod.node_problem
    if not lost(pod, b.now):
        leave_at = problem.leave_at() if problem is not None and pod.phase != "Succeeded" else None
        if leave_at is not None:
            b.requeue((leave_at - b.now).total_seconds())
        return False
    if problem is not None:
        text = f"worker pod {pod.name}'s {problem.describe()}: replacing it on another node"
        b.events.append(Event("Warning", NODE_UNHEALTHY, text))
    return True


def ready_workers(workers: Mapping[int, PodState]) -> int:
    return sum(1 for p in workers.values() if p.ready and p.phase == "Running")


def elastic_world(
    b: Builder, spec: JobSpec, workers: Mapping[int, PodState], launcher: LauncherState | None
) -> str | None:
    """Membership events and the minimum's clock of a running elastic world. Returns why the world must
    restart (it stayed below minWorkers too long), or None."""
    if spec.elastic is None:
        return None
    if launcher is None or not launcher.running:
        b.cond_false_if_present(WORKERS_BELOW_MINIMUM, "WorldRestarted")
        return None
    _membership_events(b, spec, workers)
    ready, floor = ready_workers(workers), spec.elastic.min_workers
    if ready >= floor:
        b.cond_false_if_present(WORKERS_BELOW_MINIMUM, "WorkersReady", f"{ready} workers Ready")
        return None
    timeout = spec.elastic.timeout_seconds
    text = f"{ready} of {spec.workers} workers Ready, below spec.elastic.minWorkers ({floor})"
    b.cond(WORKERS_BELOW_MINIMUM, True, BELOW_MINIMUM, f"{text}; the world restarts after {timeout}s")
    condition = b.status.condition(WORKERS_BELOW_MINIMUM)
    since = parse_time(condition.last_transition_time) if condition is not None else b.now
    due = since + timedelta(seconds=timeout)
    if b.now >= due:
        return f"{text} for {timeout}s (spec.elastic.timeoutSeconds)"
    b.requeue((due - b.now).total_seconds())
    return None


def _membership_events(b: Builder, spec: JobSpec, workers: Mapping[int, PodState]) -> None:
    """WorkerLost/WorkerJoined as the Ready workers change, WorldResized as rank 0's world size does."""
    before, now = b.prev.workers_ready, ready_workers(workers)
    if now < before:
        away = [
            names.worker_name(spec.name, i)
            for i in range(spec.workers)
            if i not in workers or not (workers[i].ready and workers[i].phase == "Running")
        ]
        text = f"{before - now} worker(s) left the world ({', '.join(away)}); the others train on"
        b.events.append(Event("Warning", "WorkerLost", text))
    elif now > before > 0:
        b.events.append(Event("Normal", "WorkerJoined", f"{now - before} worker(s) Ready to join the world"))
    old = (b.prev.training_progress or {}).get("worldSize")
    new = (b.status.training_progress or {}).get("worldSize")
    if isinstance(old, int) and isinstance(new, int) and old != new:
        b.events.append(Event("Normal", "WorldResized", f"the world trains with {new} ranks (was {old})"))


def elastic_ranks(spec: JobSpec, ready: int, progress: Mapping[str, Any] | None) -> str:
    """What the running elastic world trains with: rank 0's world size once it reported one."""
    assert spec.elastic is not None
    bounds = f"elastic {spec.elastic.min_workers}..{spec.elastic.max_workers} workers"
    ranks = (progress or {}).get("worldSize")
    counted = f"{ranks} ranks, " if isinstance(ranks, int) else ""
    return f"{counted}{ready} of {spec.workers} workers Ready ({bounds})"
