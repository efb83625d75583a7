"""bench.versus_mpi_operator's watch: what a pod's events stamp."""

from __future__ import annotations

from typing import Any

from bench.versus_mpi_operator import Watched


def pod(name: str, node: str = "", phase: str = "Pending", ready: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": name, "labels": {"job": "j"}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_a_pod_is_stamped_when_first_seen_bound_running_and_ready_and_never_again() -> None:
    seen = Watched("job")
    seen.pod(pod("j-worker-0"), 1.0)
    seen.pod(pod("j-worker-0", node="n1"), 2.0)
    seen.pod(pod("j-worker-0", node="n1", phase="Running", ready=True), 4.0)
    seen.pod(pod("j-worker-0", node="n1", phase="Running", ready=True), 9.0)  # a later event keeps the stamps
    seen.pod(pod("j-launcher-x", node="n2", phase="Running"), 5.0)
    assert seen.pods == {"j-worker-0": 1.0, "j-launcher-x": 5.0}
    assert seen.bound == {"j-worker-0": 2.0, "j-launcher-x": 5.0}
    assert seen.running == {"j": {"j-worker-0": 4.0, "j-launcher-x": 5.0}}
    assert seen.ready == {"j": {"j-worker-0": 4.0}}  # only workers count towards the launcher's latency
    assert seen.last_pod_at == 5.0


def test_a_held_launcher_pods_launch_is_when_it_was_first_seen_without_the_gate() -> None:
    seen = Watched("job")
    seen.job({"metadata": {"name": "j-launcher"}}, 1.0)  # made with the world
    held = pod("j-launcher-x")
    held["spec"]["schedulingGates"] = [{"name": "dtjob.io/workers-ready"}]
    seen.pod(held, 2.0)
    assert seen.launches() == {"j": 1.0}  # not launched yet: the Job alone
    seen.pod(pod("j-launcher-x"), 6.0)
    seen.pod(pod("j-launcher-x", node="n2"), 7.0)
    assert seen.launches() == {"j": 6.0}
    # An MPIJob's launcher pod, never gated: its launch is its Job's creation.
    other = Watched("job")
    other.job({"metadata": {"name": "j-launcher"}}, 5.0)
    other.pod(pod("j-launcher-x"), 6.0)
    assert other.launches() == {"j": 5.0}


def test_dtjobs_own_launcher_pod_is_its_launcher_made_and_a_jobs_pod_is_not() -> None:
    seen = Watched("job")
    held = pod("j-launcher")  # dtjob's: the operator's own pod, named after the job
    held["spec"]["schedulingGates"] = [{"name": "dtjob.io/workers-ready"}]
    seen.pod(held, 2.0)
    seen.pod(pod("j-launcher"), 6.0)
    assert seen.launchers == {"j": 2.0} and seen.launches() == {"j": 6.0}
    # An MPIJob's launcher pod, made by the Job controller under a generated name, is no launcher made.
    other = Watched("job")
    other.pod(pod("j-launcher-x"), 3.0)
    assert other.launchers == {}
