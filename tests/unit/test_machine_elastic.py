"""An elastic world (spec.elastic): a lost worker is replaced while the launcher trains on, with no restart;
a world below minWorkers restarts only after spec.elastic.timeoutSeconds, counted; membership changes are
events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dtjob.machine import decide
from dtjob.state.decision import CreateLauncher, CreateWorker, DeleteLauncher, DeletePod, EnsureWorld
from dtjob.state.observed import Observed
from dtjob.state.status import Condition, JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_machine_node_lost import COLLECTED, EVICTED, NOW, running, running_launcher, worker

ELASTIC = {"minWorkers": 2, "maxWorkers": 4, "timeoutSeconds": 120}


def elastic(**spec: Any) -> Any:
    return job_spec(workers=3, elastic=ELASTIC, **spec)


def trained(ready: int = 3, **kw: Any) -> JobStatus:
    return running(workers_ready=ready, launcher_state="Running", launcher_pod="rn50-launcher", **kw)


def three(*replaced: Any) -> tuple[Any, ...]:
    pods = {p.index: p for p in replaced}
    return tuple(pods.get(i) or worker(i) for i in range(3))


def test_a_deleted_worker_is_recreated_while_the_world_trains_on() -> None:
    # Its pod is gone (deleted by hand, or taken with a spot node): no restart, the same name again.
    pods = (worker(0), worker(2))
    d = decide(elastic(), Observed(pods=pods, launcher=running_launcher()), trained(), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert d.actions == [EnsureWorld(), CreateWorker(1, 0)]
    assert not any(
        isinstance(a, DeleteLauncher) or getattr(a, "name", "") == "rn50-launcher" for a in d.actions
    )
    lost = [e for e in d.events if e.reason == "WorkerLost"]
    assert len(lost) == 1 and "rn50-worker-1" in lost[0].message and lost[0].type == "Warning"
    assert "2 of 3 workers Ready (elastic 2..4 workers)" in d.status.message


def test_an_evicted_worker_is_deleted_then_replaced_not_restarted() -> None:
    evicted = worker(1, phase="Failed", ready=False, disruption=COLLECTED)
    d = decide(elastic(), Observed(pods=three(evicted), launcher=running_launcher()), trained(), NOW)
    assert d.status.restarts == 0 and d.status.phase == "Running"
    assert d.actions == [DeletePod("rn50-worker-1", "uid-w1-a0")]
    # One going away gracefully (as at a spot eviction's notice) holds its name until it is gone.
    going = worker(1, deleting=True, deletion_deadline=NOW + timedelta(seconds=30), disruption=EVICTED)
    d = decide(elastic(), Observed(pods=three(going), launcher=running_launcher()), trained(), NOW)
    assert d.status.restarts == 0 and not any(isinstance(a, CreateWorker) for a in d.actions)


def test_a_worker_that_fails_on_its_own_still_restarts_the_world() -> None:
    crashed = worker(1, phase="Failed", ready=False, reason="Error, exit code 1")
    d = decide(elastic(), Observed(pods=three(crashed), launcher=running_launcher()), trained(), NOW)
    assert d.status.restarts == 1 and d.status.phase == "Restarting"


def test_the_replacement_joining_is_an_event_and_no_second_launcher() -> None:
    d = decide(elastic(), Observed(pods=three(), launcher=running_launcher()), trained(ready=2), NOW)
    assert [e.reason for e in d.events] == ["WorkerJoined"]
    assert not any(isinstance(a, CreateLauncher) for a in d.actions)


def test_rank_zeros_world_size_changing_is_a_resize_event() -> None:
    prev = trained(training_progress={"worldSize": 3})
    observed = Observed(pods=three(), launcher=running_launcher(), training_progress={"worldSize": 2})
    d = decide(elastic(), observed, prev, NOW)
    resized = [e for e in d.events if e.reason == "WorldResized"]
    assert len(resized) == 1 and resized[0].message == "the world trains with 2 ranks (was 3)"
    assert d.status.message.startswith("training: 2 ranks, 3 of 3 workers Ready")


def test_below_min_workers_waits_the_timeout_then_restarts_counted() -> None:
    pods = (worker(0),)  # 1 of 3 Ready, minWorkers 2
    d = decide(elastic(), Observed(pods=pods, launcher=running_launcher()), trained(), NOW)
    cond = d.status.condition("WorkersBelowMinimum")
    assert cond is not None and cond.status == "True" and d.status.restarts == 0
    assert "1 of 3 workers Ready, below spec.elastic.minWorkers (2)" in cond.message
    assert d.requeue_after == 120
    # Still below when the timeout has passed since the condition turned True: the world restarts.
    since = Condition("WorkersBelowMinimum", "True", "WorkersBelowMinimum", "", format_time(NOW))
    later = NOW + timedelta(seconds=121)
    d = decide(
        elastic(), Observed(pods=pods, launcher=running_launcher()), trained(1, conditions=(since,)), later
    )
    assert d.status.restarts == 1 and d.status.phase == "Restarting"
    restarting = d.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "WorkersBelowMinimum"
    assert "for 120s (spec.elastic.timeoutSeconds)" in restarting.message


def test_a_hand_edited_clock_below_the_minimum_starts_again_rather_than_raising() -> None:
    """A WorkersBelowMinimum condition whose lastTransitionTime an admin blanked or garbled: the world is
    timed from now (the stamp is written back readable), never a reconcile that raises on every pass."""
    pods = (worker(0),)
    for edited in ("", "yesterday"):
        since = Condition("WorkersBelowMinimum", "True", "WorkersBelowMinimum", "", edited)
        prev = trained(1, conditions=(since,))
        d = decide(elastic(), Observed(pods=pods, launcher=running_launcher()), prev, NOW)
        cond = d.status.condition("WorkersBelowMinimum")
        assert cond is not None and cond.status == "True" and cond.last_transition_time == format_time(NOW)
        assert d.status.restarts == 0 and d.requeue_after == 120


def test_back_above_the_minimum_clears_the_clock() -> None:
    since = Condition("WorkersBelowMinimum", "True", "WorkersBelowMinimum", "", format_time(NOW))
    later = NOW + timedelta(seconds=500)
    prev = trained(1, conditions=(since,))
    d = decide(elastic(), Observed(pods=three(), launcher=running_launcher()), prev, later)
    cond = d.status.condition("WorkersBelowMinimum")
    assert cond is not None and cond.status == "False" and d.status.restarts == 0


def test_an_edit_of_workers_resizes_the_running_elastic_world() -> None:
    spec = job_spec(workers=4, elastic=ELASTIC)
    d = decide(spec, Observed(pods=three(), launcher=running_launcher()), trained(), NOW)
    assert CreateWorker(3, 0) in d.actions and d.status.restarts == 0
    shrunk = job_spec(workers=2, elastic=ELASTIC)
    d = decide(shrunk, Observed(pods=three(), launcher=running_launcher()), trained(), NOW)
    assert DeletePod("rn50-worker-2", "uid-w2-a0") in d.actions and d.status.restarts == 0


def test_a_non_elastic_world_still_restarts_when_a_worker_vanishes() -> None:
    d = decide(job_spec(workers=3), Observed(pods=(worker(0), worker(2)), launcher=running_launcher()),
               trained(), NOW)  # fmt: skip
    assert d.status.restarts == 1


def test_a_replacement_waiting_for_a_node_past_the_startup_deadline_does_not_fail_the_job() -> None:
    spec = elastic(runPolicy={"startupDeadlineSeconds": 60})
    waiting = worker(1, phase="Pending", ready=False, scheduled=False, unschedulable=True,
                     created=NOW - timedelta(minutes=30), reason="0/3 nodes are available")  # fmt: skip
    d = decide(spec, Observed(pods=three(waiting), launcher=running_launcher()), trained(ready=2), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    # The same pod before the world ever ran is a world that cannot start: the deadline fails the job.
    d = decide(spec, Observed(pods=three(waiting)), running(phase="Starting"), NOW)
    assert (
        d.status.phase == "Failed"
        and (d.status.condition("Failed") or d.status).reason == "StartupDeadlineExceeded"
    )
