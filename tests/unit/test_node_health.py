"""A worker's node reports that it cannot keep it (AKS's node problem detector: a GPU fault, or a VM event
ahead): a fixed world restarts on other nodes without spending runPolicy.backoffLimit, an elastic world
replaces the worker (after its ranks had time to leave, on a node about to go), and new workers keep off
the node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.config import (
    DRAIN_CONDITIONS,
    DRAIN_GRACE_SECONDS,
    UNHEALTHY_CONDITIONS,
    NodeHealthPolicy,
    load_config,
)
from dtjob.desired.pods import off_nodes, worker_pod
from dtjob.machine import decide
from dtjob.machine.hosts import world_hosts
from dtjob.state.decision import CreateWorker, DeletePod, PublishHosts
from dtjob.state.node_health import NodeProblem, node_problems
from dtjob.state.observed import LauncherState, Observed, PodState, pod_state
from dtjob.state.status import JobStatus, status_from_dict
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
XID = NodeProblem("aks-gpu-3", "XIDErrors", "XID 79 on GPU 2", NOW - timedelta(seconds=5), drain=False)
SINCE = NOW - timedelta(seconds=5)
VM_EVENT = NodeProblem("aks-gpu-3", "VMEventScheduled", "Reboot at 12:10", SINCE, drain=True)
DRAIN_GRACE = timedelta(seconds=DRAIN_GRACE_SECONDS)
ELASTIC = {"minWorkers": 2, "maxWorkers": 4}


def node(name: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": list(conditions)}}


def condition(kind: str, status: str = "True", message: str = "", since: str = "2026-11-29T11:59:55Z") -> Any:
    return {"type": kind, "status": status, "message": message, "lastTransitionTime": since}


def worker(i: int, attempt: int = 0, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": f"rn50-worker-{i}", "role": "worker", "attempt": attempt, "index": i, "phase": "Running",
        "scheduled": True, "ready": True, "deleting": False, "uid": f"uid-w{i}", "node": f"aks-gpu-{i}",
        "address": f"10.0.0.{i + 10}",
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


def launcher(attempt: int = 0, **kw: Any) -> LauncherState:
    fields: dict[str, Any] = {"deleting": False, "running": True, "succeeded": False, "failed": False}
    fields.update(kw)
    return LauncherState(attempt, pod_name="rn50-launcher-x", **fields)


def running(**kw: Any) -> JobStatus:
    return JobStatus(**{"phase": "Running", "start_time": format_time(NOW - timedelta(minutes=5)), **kw})


def test_the_conditions_set_true_in_the_policy_name_the_problem() -> None:
    policy = NodeHealthPolicy()
    found = node_problems(
        [
            node("a", condition("Ready"), condition("XIDErrors", "False")),
            node("b", condition("VMEventScheduled", message="Freeze  at\n12:10"), condition("GPUMissing")),
            node("c", condition("VMEventScheduled", message="Reboot")),
            node("d", condition("GPUClockThrottling")),  # not in the default policy: slow, not broken
        ],
        policy,
    )
    assert sorted(found) == ["b", "c"]
    # A broken GPU outranks a VM event; the drain flag says which it is.
    assert found["b"].condition == "GPUMissing" and not found["b"].drain
    assert found["c"] == NodeProblem("c", "VMEventScheduled", "Reboot", SINCE, drain=True)
    assert found["c"].describe() == "node c reports VMEventScheduled: Reboot"
    assert found["c"].leave_at() == NOW - timedelta(seconds=5) + DRAIN_GRACE
    assert XID.leave_at() is None


def test_the_operator_setting_picks_the_conditions_or_none() -> None:
    assert load_config({}).node_health == NodeHealthPolicy(UNHEALTHY_CONDITIONS, DRAIN_CONDITIONS)
    custom = load_config({"DTJOB_NODE_UNHEALTHY_CONDITIONS": "XIDErrors, GPUClockThrottling"}).node_health
    assert custom.unhealthy == {"XIDErrors", "GPUClockThrottling"} and custom.drain == DRAIN_CONDITIONS
    off = load_config({"DTJOB_NODE_UNHEALTHY_CONDITIONS": "", "DTJOB_NODE_DRAIN_CONDITIONS": ""}).node_health
    assert not off.enabled
    assert node_problems([node("b", condition("GPUMissing"))], off) == {}


def test_the_drain_grace_is_the_operators_setting() -> None:
    """A spot pool's eviction comes about 30 s after its notice: an installer can replace sooner."""
    assert load_config({}).node_health.drain_grace_seconds == DRAIN_GRACE_SECONDS == 60
    spot = load_config({"DTJOB_NODE_DRAIN_GRACE_SECONDS": "20"}).node_health
    found = node_problems([node("c", condition("VMEventScheduled"))], spot)
    assert found["c"].leave_at() == SINCE + timedelta(seconds=20)
    at_once = load_config({"DTJOB_NODE_DRAIN_GRACE_SECONDS": "0"}).node_health
    assert node_problems([node("c", condition("VMEventScheduled"))], at_once)["c"].leave_at() == SINCE
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(ValueError, match="DTJOB_NODE_DRAIN_GRACE_SECONDS"):
            load_config({"DTJOB_NODE_DRAIN_GRACE_SECONDS": bad})


def test_a_fixed_world_restarts_on_other_nodes_without_spending_the_backoff_limit() -> None:
    spec = job_spec(runPolicy={"backoffLimit": 0})
    pods = (worker(0), worker(1, node="aks-gpu-3", node_problem=XID))
    d = decide(spec, Observed(pods=pods, launcher=launcher(), avoid_nodes=("aks-gpu-3",)), running(), NOW)
    assert d.status.phase == "Restarting"
    assert (d.status.restarts, d.status.infrastructure_restarts) == (1, 1)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "NodeUnhealthy"
    assert cond.message == (
        "worker pod rn50-worker-1's node aks-gpu-3 reports XIDErrors: XID 79 on GPU 2; "
        "restarting the world on other nodes (not counted against runPolicy.backoffLimit)"
    )
    assert [e.message for e in d.events if e.reason == "NodeUnhealthy"] == [cond.message]
    assert {a.name for a in d.actions if isinstance(a, DeletePod)} == {"rn50-worker-0", "rn50-worker-1"}
    # The next world's workers are created off the node.
    prev = d.status
    d = decide(spec, Observed(avoid_nodes=("aks-gpu-3",)), prev, NOW + timedelta(seconds=10))
    assert [a for a in d.actions if isinstance(a, CreateWorker)] == [
        CreateWorker(0, 1, ("aks-gpu-3",)), CreateWorker(1, 1, ("aks-gpu-3",))
    ]  # fmt: skip


def test_an_ordinary_failure_still_counts_against_the_backoff_limit_after_a_node_restart() -> None:
    spec = job_spec(runPolicy={"backoffLimit": 1})
    prev = running(restarts=1, infrastructure_restarts=1)
    crashed = worker(1, attempt=1, phase="Failed", ready=False, reason="Error, exit code 1")
    d = decide(spec, Observed(pods=(worker(0, attempt=1), crashed), launcher=launcher(1)), prev, NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 2
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.message.endswith("restarting the world (restart 1 of 1)")
    crashed_again = worker(1, attempt=2, phase="Failed", ready=False, reason="Error, exit code 1")
    again = Observed(pods=(worker(0, attempt=2), crashed_again), launcher=launcher(2))
    d = decide(spec, again, d.status, NOW)
    assert d.status.phase == "Failed"
    assert d.status.message.endswith("runPolicy.backoffLimit (1) reached after 1 restarts")


def test_an_edited_status_cannot_count_more_node_restarts_than_restarts() -> None:
    assert status_from_dict({"restarts": 1, "infrastructureRestarts": 9}).infrastructure_restarts == 1
    assert "infrastructureRestarts" not in JobStatus(restarts=2).to_dict()


def test_a_launcher_that_fails_with_its_gpu_is_the_nodes_failure() -> None:
    spec = job_spec(runPolicy={"backoffLimit": 0})
    failed = launcher(running=False, failed=True, reason="Error, exit code 1")
    pods = (worker(0), worker(1, node="aks-gpu-3", node_problem=XID))
    d = decide(spec, Observed(pods=pods, launcher=failed), running(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "NodeUnhealthy" and d.status.infrastructure_restarts == 1


def test_an_elastic_world_replaces_a_worker_on_a_broken_node_and_trains_on() -> None:
    spec = job_spec(workers=3, elastic=ELASTIC)
    pods = (worker(0), worker(1), worker(2, node="aks-gpu-3", node_problem=XID))
    observed = Observed(pods=pods, launcher=launcher(), avoid_nodes=("aks-gpu-3",))
    d = decide(spec, observed, running(workers_ready=3), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert DeletePod("rn50-worker-2", "uid-w2") in d.actions
    moved = [e for e in d.events if e.reason == "NodeUnhealthy"]
    assert [e.message for e in moved] == [
        "worker pod rn50-worker-2's node aks-gpu-3 reports XIDErrors: XID 79 on GPU 2: "
        "replacing it on another node"
    ]
    # Its host is no longer published: Horovod's discovery drops it.
    published = [a for a in d.actions if isinstance(a, PublishHosts)]
    assert published and all("rn50-worker-2" not in str(a.hosts) for a in published)


def test_on_a_node_about_to_go_the_ranks_leave_first_and_the_pod_after_the_grace() -> None:
    spec = job_spec(workers=3, elastic=ELASTIC)
    pods = (worker(0), worker(1), worker(2, node="aks-gpu-3", node_problem=VM_EVENT))
    observed = Observed(pods=pods, launcher=launcher(), avoid_nodes=("aks-gpu-3",))
    assert [p.name for p in world_hosts(spec, observed, dict(enumerate(pods)), 0)] == [
        "rn50-worker-0", "rn50-worker-1"
    ]  # fmt: skip
    d = decide(spec, observed, running(workers_ready=3), NOW)
    assert not any(isinstance(a, DeletePod) for a in d.actions)
    assert d.requeue_after is not None and d.requeue_after <= (SINCE + DRAIN_GRACE - NOW).total_seconds()
    later = NOW + DRAIN_GRACE
    d = decide(spec, observed, running(workers_ready=3), later)
    assert DeletePod("rn50-worker-2", "uid-w2") in d.actions and d.status.restarts == 0


def test_a_fixed_world_leaves_a_node_about_to_go_at_once() -> None:
    pods = (worker(0), worker(1, node="aks-gpu-3", node_problem=VM_EVENT))
    d = decide(job_spec(), Observed(pods=pods, launcher=launcher()), running(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "NodeUnhealthy"
    assert "node aks-gpu-3 reports VMEventScheduled: Reboot at 12:10" in cond.message


def test_new_workers_keep_off_the_nodes_in_every_term_of_their_affinity() -> None:
    away = {"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}
    assert off_nodes({}, ["n2", "n1"])["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [away]}]}
    }
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}]}
    rack = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}
    preferred = [{"weight": 1, "preference": zone}]
    pod_spec = {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone, rack]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred,
    }}}  # fmt: skip
    placed = off_nodes(pod_spec, ["n1", "n2"])["affinity"]["nodeAffinity"]
    assert placed["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {**zone, "matchFields": [away]}, {**rack, "matchFields": [away]}
    ]  # fmt: skip
    assert placed["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [zone, rack], "the job's own spec is left as it was"  # fmt: skip
    assert off_nodes(pod_spec, []) is pod_spec
    # The worker pod itself, with the job's own affinity.
    spec = job_spec(placement={"affinity": {"nodeAffinity": pod_spec["affinity"]["nodeAffinity"]}})
    pod = worker_pod(spec, {}, 0, 0, ("n1", "n2"))
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms["nodeSelectorTerms"]) == 2
    assert all(away in t["matchFields"] for t in terms["nodeSelectorTerms"])


def test_a_worker_kept_off_a_node_that_recovered_is_made_again_while_unplaced() -> None:
    spec = job_spec()
    pod = worker_pod(spec, {}, 1, 0, ("aks-gpu-3",))
    assert pod["metadata"]["annotations"]["dtjob.io/avoided-nodes"] == "aks-gpu-3"
    assert pod_state(pod).avoided_nodes == ("aks-gpu-3",)
    waiting = worker(1, node="", scheduled=False, ready=False, phase="Pending", avoided_nodes=("aks-gpu-3",))
    placed = worker(0, avoided_nodes=("aks-gpu-3",))
    # Still flagged: it waits as it is.
    d = decide(
        spec, Observed(pods=(placed, waiting), avoid_nodes=("aks-gpu-3",)), running(phase="Pending"), NOW
    )
    assert not any(isinstance(a, DeletePod) for a in d.actions)
    # Recovered: the unplaced worker is made again (free to go there); the placed one stays.
    d = decide(spec, Observed(pods=(placed, waiting)), running(phase="Pending"), NOW)
    assert [a for a in d.actions if isinstance(a, DeletePod)] == [DeletePod("rn50-worker-1", "uid-w1")]


def test_a_jobs_own_avoided_nodes_annotation_never_reaches_a_worker() -> None:
    forged = {"dtjob.io/avoided-nodes": "aks-gpu-0"}
    spec = job_spec(worker={"podAnnotations": forged, "template": {"metadata": {"annotations": forged}}})
    assert "dtjob.io/avoided-nodes" not in worker_pod(spec, {}, 0, 0)["metadata"].get("annotations", {})
    pod = worker_pod(spec, {}, 0, 0, ("aks-gpu-3",))
    assert pod["metadata"]["annotations"]["dtjob.io/avoided-nodes"] == "aks-gpu-3"
