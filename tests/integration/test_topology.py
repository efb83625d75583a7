"""runPolicy.scheduling.topology under the real kube-scheduler: the simulated GPU pool's four kwok nodes (4
GPUs each) labelled as two racks of two nodes, so each rack holds 8 GPUs.

- A world of 4 workers x 2 GPUs fits one rack exactly. The default scheduler spreads pods over the least
  loaded nodes, so without the affinity it would use all four nodes; with `required` every worker lands in one
  rack and the job runs to the end.
- A world of 3 workers x 4 GPUs fits no single rack: the workers that are bound share one rack, the rest stay
  Pending (no split world, no launcher), and the job's message says they wait for one rack with room for all.
- Through a real Kueue whose ResourceFlavor names a Topology with the rack level (Topology-Aware Scheduling):
  the world that fits no rack is not admitted (its workers stay gated, bound nowhere, and the job says why),
  while one that fits a rack is admitted into one rack and runs there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.kueue import KUEUE, KueueProcess
from testbed.operator_harness import Jobs, OperatorProcess
from tests.integration.test_kueue import (
    condition,
    created,
    gated,
    join_kueue,
    kueue,
    kueue_release,
    wait_queues_active,
    workload,
)

pytestmark = pytest.mark.integration
# The fixtures shared with test_kueue: one Kueue per release for the module.
__all__ = ["kueue", "kueue_release"]
RACK = "topology.dtjob.io/rack"
REQUIRED = {"scheduling": {"topology": {"key": RACK, "mode": "required"}}}
LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "2s"}}


@pytest.fixture
def racks(core_v1: client.CoreV1Api, simulated_pool: list[client.V1Node]) -> Iterator[dict[str, str]]:
    """The pool's nodes labelled rack-a (first two by name) and rack-b; the label removed again at the end.
    Yields each node's rack."""
    nodes = sorted(str(n.metadata.name) for n in simulated_pool)
    assert len(nodes) == 4, nodes
    rack_of = {name: ("rack-a" if i < 2 else "rack-b") for i, name in enumerate(nodes)}
    for name, rack in rack_of.items():
        core_v1.patch_node(name, {"metadata": {"labels": {RACK: rack}}})
    try:
        yield rack_of
    finally:
        for name in rack_of:
            core_v1.patch_node(name, {"metadata": {"labels": {RACK: None}}})


def bound(jobs: Jobs, name: str) -> dict[str, str]:
    """The job's workers bound to a node: pod name -> node."""
    return {
        str(p.metadata.name): str(p.spec.node_name) for p in jobs.pods(name, "worker") if p.spec.node_name
    }


def all_bound(jobs: Jobs, name: str, count: int) -> dict[str, str] | None:
    placed = bound(jobs, name)
    return placed if len(placed) == count else None


def explain(jobs: Jobs, name: str, operator: OperatorProcess) -> str:
    verdicts = {
        p.metadata.name: (
            p.spec.node_name,
            [(c.type, c.status, c.message) for c in p.status.conditions or []],
        )
        for p in jobs.pods(name, "worker")
    }
    return (
        f"status: {json.dumps(jobs.status(name), indent=1)}\nworkers: {verdicts}\n"
        f"operator log:\n{operator.log_tail(30)}"
    )


def test_a_required_rack_holds_every_worker_of_the_world(
    jobs: Jobs, operator: OperatorProcess, racks: dict[str, str]
) -> None:
    jobs.create("onerack", workers=4, gpusPerWorker=2, runPolicy=REQUIRED, launcher=LAUNCHER)

    try:
        placed = wait_for(partial(all_bound, jobs, "onerack", 4), timeout=90, what="4 workers bound")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{explain(jobs, 'onerack', operator)}") from None
    assert len({racks[node] for node in placed.values()}) == 1, placed
    # The pods carry what the scheduler acted on, and the index label every restart keeps.
    pods = jobs.pods("onerack", "worker")
    for pod in pods:
        terms = pod.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
        assert [(t.topology_key, t.label_selector.match_labels) for t in terms] == [
            (RACK, {"dtjob.io/job-name": "onerack", "dtjob.io/role": "worker"})
        ]
    assert sorted(p.metadata.labels["dtjob.io/worker-index"] for p in pods) == ["0", "1", "2", "3"]
    jobs.wait_phase("onerack", "Succeeded", timeout=120)


def test_a_world_that_fits_no_single_rack_waits_and_says_why(
    jobs: Jobs, operator: OperatorProcess, racks: dict[str, str]
) -> None:
    jobs.create("toobig", workers=3, gpusPerWorker=4, runPolicy=REQUIRED, launcher=LAUNCHER)
    wanted = f"the 3 workers wait for one {RACK} domain with room for all of them"

    def says_so() -> dict[str, Any] | None:
        status = jobs.status("toobig")
        return status if wanted in str(status.get("message") or "") else None

    try:
        status = wait_for(says_so, timeout=90, interval=0.5, what="the job's message naming the rack")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{explain(jobs, 'toobig', operator)}") from None
    assert status["phase"] == "Pending", status
    assert "didn't match pod affinity rules" in status["message"], status["message"]
    # The rack with room is full; the other rack, free, takes no worker of this world.
    placed = bound(jobs, "toobig")
    assert len(placed) == 2 and len({racks[node] for node in placed.values()}) == 1, placed
    pending = [p for p in jobs.pods("toobig", "worker") if not p.spec.node_name]
    assert len(pending) == 1 and pending[0].status.phase == "Pending"
    # Its launcher's pod, made with the world, stays held off every node: no worker there is Ready for it.
    assert all(p.spec.scheduling_gates and not p.spec.node_name for p in jobs.pods("toobig", "launcher"))


def domains(assignment: dict[str, Any]) -> list[list[str]]:
    """The values of each domain a v1beta2 TopologyAssignment names, per level: its slices give a level's
    value once for the slice (`universal`) or one per domain (`individual`: prefix, root, suffix)."""
    found = []
    for piece in assignment["slices"]:
        for i in range(piece["domainCount"]):
            values = []
            for level in piece["valuesPerLevel"]:
                each = level.get("individual")
                if each is None:
                    values.append(level["universal"])
                else:
                    values.append(f"{each.get('prefix') or ''}{each['roots'][i]}{each.get('suffix') or ''}")
            found.append(values)
    return found


@pytest.fixture
def tas_queue(
    api_client: client.ApiClient, namespace: str, kueue: KueueProcess, racks: dict[str, str]
) -> Iterator[str]:
    """A Topology whose one level is the rack label, a ResourceFlavor of the GPU pool that names it and one
    of the system pool for the launchers (a member of their world's group, on the CPU pool), a ClusterQueue
    with quota for the whole GPU pool and a LocalQueue on it; yields the LocalQueue's name."""
    join_kueue(api_client, namespace, kueue)
    custom = client.CustomObjectsApi(api_client)
    names = {k: f"{k}-{namespace}" for k in ("topology", "flavor", "cpu-flavor", "cq")}
    pool = {"kubernetes.azure.com/agentpool": "gpu"}
    quota = [{"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "10000Gi"},
             {"name": "nvidia.com/gpu", "nominalQuota": "16"}]  # fmt: skip
    cpu_quota = [{"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "1000Gi"},
                 {"name": "nvidia.com/gpu", "nominalQuota": "0"}]  # fmt: skip
    objects = [
        ("topologies", "topology", "Topology", {"levels": [{"nodeLabel": RACK}]}),
        ("resourceflavors", "flavor", "ResourceFlavor",
         {"nodeLabels": pool, "topologyName": names["topology"]}),
        ("resourceflavors", "cpu-flavor", "ResourceFlavor",
         {"nodeLabels": {"kubernetes.azure.com/mode": "system"}}),
        ("clusterqueues", "cq", "ClusterQueue", {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": names["flavor"], "resources": quota},
                        {"name": names["cpu-flavor"], "resources": cpu_quota}]}]}),
    ]  # fmt: skip
    for plural, role, kind, spec in objects:
        body = {"apiVersion": "/".join(KUEUE), "kind": kind, "metadata": {"name": names[role]},
                "spec": spec}  # fmt: skip
        create = partial(custom.create_cluster_custom_object, *KUEUE, plural, body)
        wait_for(partial(created, create), timeout=30, what=f"{kind} created")
    local = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "racks"},
             "spec": {"clusterQueue": names["cq"]}}  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local)
    wait_queues_active(custom, namespace, names["cq"], "racks", kueue)
    try:
        yield "racks"
    finally:
        for plural, role, _, _ in reversed(objects):
            try:
                custom.delete_cluster_custom_object(*KUEUE, plural, names[role])
            except ApiException as err:
                if err.status != 404:
                    raise


def test_kueue_admits_a_world_only_into_one_rack(
    jobs: Jobs, operator: OperatorProcess, tas_queue: str, racks: dict[str, str],
    api_client: client.ApiClient, namespace: str,
) -> None:  # fmt: skip
    scheduling = {"queueName": tas_queue, "topology": {"key": RACK}}
    jobs.create("kbig", workers=3, gpusPerWorker=4, runPolicy={"scheduling": scheduling}, launcher=LAUNCHER)
    wanted = f"3 worker pod(s) wait for admission by Kueue; the 3 workers wait for one {RACK} domain"

    def says_so() -> dict[str, Any] | None:
        status = jobs.status("kbig")
        return status if wanted in str(status.get("message") or "") else None

    try:
        wait_for(says_so, timeout=90, interval=0.5, what="the queued job's message naming the rack")
        reserved = wait_for(
            lambda: (c := condition(workload(api_client, namespace, "kbig"), "QuotaReserved")) and c,
            timeout=60, what="Kueue's verdict on the world",
        )  # fmt: skip
    except AssertionError as err:
        raise AssertionError(f"{err}\n{explain(jobs, 'kbig', operator)}") from None
    # Quota there is (16 GPUs for 12); one rack with room for all is not.
    assert reserved["status"] == "False" and "topology" in reserved["message"].lower(), reserved
    pods = jobs.pods("kbig", "worker")
    assert len(pods) == 3 and all(gated(p) and not p.spec.node_name for p in pods)
    assert {p.metadata.annotations.get("kueue.x-k8s.io/podset-required-topology") for p in pods} == {RACK}

    # A world that fits one rack is admitted beside it, into one rack, and runs.
    jobs.create("kfit", workers=4, gpusPerWorker=2, runPolicy={"scheduling": scheduling}, launcher=LAUNCHER)
    try:
        placed = wait_for(
            partial(all_bound, jobs, "kfit", 4), timeout=120, what="4 workers admitted and bound"
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{explain(jobs, 'kfit', operator)}") from None
    assert len({racks[node] for node in placed.values()}) == 1, placed
    assignments = workload(api_client, namespace, "kfit")["status"]["admission"]["podSetAssignments"]
    assignment = next(a for a in assignments if a.get("count") == 4)  # the workers' (the launcher's is 1)
    assert domains(assignment["topologyAssignment"]) in (
        [["rack-a"]],
        [["rack-b"]],
    ), assignment
    jobs.wait_phase("kfit", "Succeeded", timeout=120)
    assert not bound(jobs, "kbig") and jobs.status("kbig")["phase"] == "Pending"


def test_kueue_puts_a_launcher_that_runs_ranks_in_its_workers_rack(
    jobs: Jobs, operator: OperatorProcess, tas_queue: str, racks: dict[str, str]
) -> None:
    """A launcher that runs ranks is a PodSet of its own (its pod is unlike the workers'); one PodSet group
    gives it the workers' rack, where Kueue pins every host of the world."""
    scheduling = {"queueName": tas_queue, "topology": {"key": RACK}}
    launcher = {**LAUNCHER, "runAsWorker": True}
    jobs.create("khosts", workers=3, gpusPerWorker=2, runPolicy={"scheduling": scheduling}, launcher=launcher)
    try:
        placed = wait_for(
            partial(all_bound, jobs, "khosts", 3), timeout=120, what="3 workers admitted and bound"
        )
        pod = wait_for(
            lambda: (p := jobs.launcher("khosts")) is not None and p.spec.node_name and p,
            timeout=120, what="the launcher bound once its workers are Ready",
        )  # fmt: skip
    except AssertionError as err:
        raise AssertionError(f"{err}\n{explain(jobs, 'khosts', operator)}") from None
    hosts = {**placed, "launcher": pod.spec.node_name}
    assert len({racks[node] for node in hosts.values()}) == 1, hosts
    jobs.wait_phase("khosts", "Succeeded", timeout=120)
