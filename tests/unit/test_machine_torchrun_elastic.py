"""The state machine on an elastic torchrun world (spec.torchrun with spec.elastic). It forms as a fixed one
does; then a worker the cluster takes away is replaced while its peers re-rendezvous (no counted restart),
worker 0 (the rendezvous store) is the world, a worker whose agent failed fails the world, and too few
workers for too long is spec.elastic's minimum to judge."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from dtjob.machine import decide
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import CreateWorker, DeletePod
from dtjob.state.observed import Observed, observe_children
from dtjob.state.status import JobStatus
from dtjob.state.torchrun import torchrun_launch
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_machine_torchrun import NOW, no_launcher_actions, raw_worker, running


def elastic(**spec: Any) -> JobSpec:
    return job_spec(workers=3, torchrun={}, elastic={"minWorkers": 2, "maxWorkers": 3}, **spec)


def observed(spec: JobSpec, prev: JobStatus, *pods: dict[str, Any]) -> Observed:
    """As dtjob.reconcile.observe builds it for an elastic world: formed once a status saw its launch."""
    seen = observe_children(list(pods), None, "uid-1")
    launch = torchrun_launch(seen.workers(), 0, spec.workers, prev.launcher_pod is not None)
    return replace(seen, launcher=launch, uid="uid-1")


def evicted(index: int) -> dict[str, Any]:
    pod = raw_worker(index, "Failed", size=3, exit_code=143)
    reason = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    pod["status"]["conditions"].append(reason)
    return pod


def formed() -> JobStatus:
    return running(workers_total=3, workers_ready=3)


def test_an_elastic_world_forms_as_a_fixed_one_once_every_worker_runs() -> None:
    spec = elastic()
    two = (raw_worker(0, size=3), raw_worker(1, size=3))
    d = decide(spec, observed(spec, JobStatus(phase="Pending"), *two), JobStatus(phase="Pending"), NOW)
    assert d.status.phase != "Running" and CreateWorker(2, 0) in d.actions
    three = (*two, raw_worker(2, size=3))
    d = decide(spec, observed(spec, JobStatus(phase="Starting"), *three), JobStatus(phase="Starting"), NOW)
    assert d.status.phase == "Running" and d.status.launcher_pod == "rn50-worker-0"
    no_launcher_actions(d)


def test_a_worker_deleted_is_replaced_while_the_others_train_on_uncounted() -> None:
    spec, prev = elastic(), formed()
    d = decide(spec, observed(spec, prev, raw_worker(0, size=3), raw_worker(2, size=3)), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert CreateWorker(1, 0) in d.actions
    assert "WorkerLost" in [e.reason for e in d.events]
    no_launcher_actions(d)


def test_an_evicted_worker_is_deleted_and_replaced_not_a_failure() -> None:
    spec, prev = elastic(), formed()
    pods = (raw_worker(0, size=3), evicted(1), raw_worker(2, size=3))
    seen = observed(spec, prev, *pods)
    assert seen.launcher is not None and seen.launcher.running and not seen.launcher.failed
    d = decide(spec, seen, prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert DeletePod("rn50-worker-1", "uid-w1-a0") in d.actions
    # The same eviction in a fixed world ends the launch with that worker.
    fixed = torchrun_launch(observe_children(list(pods), None).workers(), 0, 3)
    assert fixed is not None and fixed.failed and fixed.pod_name == "rn50-worker-1"


def test_worker_0_hosts_the_rendezvous_so_losing_it_restarts_the_world() -> None:
    spec, prev = elastic(), formed()
    d = decide(spec, observed(spec, prev, raw_worker(1, size=3), raw_worker(2, size=3)), prev, NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost" and "rn50-worker-0" in cond.message
    pods = (evicted(0), raw_worker(1, size=3), raw_worker(2, size=3))
    d = decide(spec, observed(spec, prev, *pods), prev, NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1


def test_a_worker_whose_agent_failed_fails_the_world() -> None:
    spec, prev = elastic(), formed()
    pods = (raw_worker(0, size=3), raw_worker(1, "Failed", size=3, exit_code=1), raw_worker(2, size=3))
    d = decide(spec, observed(spec, prev, *pods), prev, NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and "rn50-worker-1" in cond.message


def test_too_few_workers_for_too_long_restarts_the_world() -> None:
    spec, prev = elastic(), formed()
    d = decide(spec, observed(spec, prev, raw_worker(0, size=3)), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    below = d.status.condition("WorkersBelowMinimum")
    assert below is not None and below.status == "True"
    later = NOW + timedelta(seconds=spec.elastic.timeout_seconds + 1) if spec.elastic else NOW
    stale = replace(below, last_transition_time=format_time(NOW))
    prev = replace(d.status, conditions=(*[c for c in d.status.conditions if c.type != stale.type], stale))
    d = decide(spec, observed(spec, prev, raw_worker(0, size=3)), prev, later)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
