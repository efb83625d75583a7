"""Elastic jobs (spec.elastic) on a simulated AKS spot pool of this file's own: kwok nodes labelled and
tainted as AKS labels and taints spot nodes, under the real control plane (scheduler, pod garbage collector).

- A worker's pod deleted: a replacement of the same name joins, the launcher is untouched, `restarts` stays 0,
  and the job says so in events (WorkerLost, WorkerJoined).
- Spot at scale: nodes tainted, then deleted, as AKS does when Azure takes spot VMs back, across many jobs.
  Every job keeps training (no restart, its launcher the same), its lost workers wait for room, and they
  are refilled once nodes return. The workers on surviving nodes are never touched, and deleting the jobs
  leaves nothing behind.
- Below the floor: a world that loses more workers than minWorkers allows restarts after
  spec.elastic.timeoutSeconds, counted once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.sim_nodes import node
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

POOL, POOL_VM = "spotel", "Standard_NC12s_v3"  # 2 GPUs per node
SPOT = "kubernetes.azure.com/scalesetpriority"
SPOT_TOLERATION = {"key": SPOT, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "900s"}}


def spot_node(index: int) -> dict[str, Any]:
    body = node(POOL, index, POOL_VM, gpu=True)
    body["metadata"]["labels"][SPOT] = "spot"
    body["spec"]["taints"].append({"key": SPOT, "value": "spot", "effect": "NoSchedule"})
    return body


class SpotPool:
    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def add(self, indexes: range) -> None:
        for index in indexes:
            self.core.create_node(cast(Any, spot_node(index)))
        wait_for(lambda: self._ready() >= len(indexes), timeout=60, what=f"the {POOL} pool Ready")

    def _ready(self) -> int:
        found = self.core.list_node(label_selector=f"kubernetes.azure.com/agentpool={POOL}").items
        ready = [
            n
            for n in found
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        return len(ready)

    def names(self) -> list[str]:
        found = self.core.list_node(label_selector=f"kubernetes.azure.com/agentpool={POOL}").items
        return sorted(str(n.metadata.name) for n in found)

    def evict(self, name: str) -> None:
        """What AKS does to a spot VM Azure takes back: taint the node so nothing new lands, delete it."""
        taints = [t.to_dict() for t in self.core.read_node(name).spec.taints or []]
        taints.append({"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"})
        self.core.patch_node(name, {"spec": {"taints": taints}})
        self.core.delete_node(name)

    def remove_all(self) -> None:
        for name in self.names():
            try:
                self.core.delete_node(name)
            except ApiException as err:
                if err.status != 404:
                    raise


@pytest.fixture
def spot_pool(core_v1: client.CoreV1Api) -> Iterator[SpotPool]:
    pool = SpotPool(core_v1)
    try:
        yield pool
    finally:
        pool.remove_all()


def elastic_job(jobs: Jobs, name: str, workers: int = 3, **elastic: Any) -> None:
    bounds = {"minWorkers": 1, "maxWorkers": workers, **elastic}
    jobs.create(
        name, workers=workers, gpusPerWorker=1, elastic=bounds, launcher=LONG_LAUNCHER,
        placement={"nodePool": POOL, "tolerations": [SPOT_TOLERATION]},
    )  # fmt: skip


def worker_uids(jobs: Jobs, name: str) -> dict[str, str]:
    return {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers(name)}


def launcher_pod_uid(jobs: Jobs, name: str) -> str:
    pods = jobs.pods(name, "launcher")
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return str(pods[0].metadata.uid)


def all_ready(jobs: Jobs, name: str, count: int) -> dict[str, Any] | None:
    status = jobs.status(name)
    return (
        status
        if status.get("workersReady") == f"{count}/{count}" and status.get("phase") == "Running"
        else None
    )


def reasons(jobs: Jobs, name: str) -> list[str]:
    return [str(e.reason) for e in jobs.events(name)]


def test_a_deleted_worker_is_replaced_while_the_launcher_runs_on(
    jobs: Jobs, operator: OperatorProcess, spot_pool: SpotPool
) -> None:
    spot_pool.add(range(2))
    elastic_job(jobs, "keep", minWorkers=2)
    wait_for(lambda: all_ready(jobs, "keep", 3), timeout=120, what="3 workers Ready, launcher running")
    launcher, before = launcher_pod_uid(jobs, "keep"), worker_uids(jobs, "keep")
    jobs.core.delete_namespaced_pod("keep-worker-1", jobs.ns, grace_period_seconds=0)

    def replaced() -> dict[str, str] | None:
        now = worker_uids(jobs, "keep")
        fresh = now.get("keep-worker-1") not in (None, before["keep-worker-1"])
        return now if fresh and all_ready(jobs, "keep", 3) else None

    after = wait_for(replaced, timeout=90, what="keep-worker-1 replaced and Ready")
    status = jobs.status("keep")
    assert status["restarts"] == 0 and status["phase"] == "Running", status
    assert launcher_pod_uid(jobs, "keep") == launcher, "the launcher must run on untouched"
    assert {k: v for k, v in after.items() if k != "keep-worker-1"} == {
        k: v for k, v in before.items() if k != "keep-worker-1"
    }
    # Waited for: on busy cores the events can follow the Ready count by seconds. WorkerLost was posted by an
    # earlier pass than WorkerJoined.
    jobs.wait_event("keep", "WorkerJoined", timeout=30)
    said = reasons(jobs, "keep")
    assert "WorkerLost" in said and "WorkerJoined" in said and "Restarting" not in said, said


def test_spot_nodes_taken_back_across_many_jobs_restart_nothing_and_are_refilled(
    jobs: Jobs, operator: OperatorProcess, spot_pool: SpotPool
) -> None:
    names = [f"spot{i}" for i in range(6)]
    spot_pool.add(range(9))  # 18 GPUs for 6 jobs x 3 one-GPU workers: no spare room
    for name in names:
        elastic_job(jobs, name)
    for name in names:
        wait_for(partial(all_ready, jobs, name, 3), timeout=180, what=f"{name} running with 3 workers")
    launchers = {n: launcher_pod_uid(jobs, n) for n in names}
    before = {n: worker_uids(jobs, n) for n in names}
    nodes_of = {str(p.metadata.name): str(p.spec.node_name) for n in names for p in jobs.live_workers(n)}
    taken = spot_pool.names()[:3]
    lost = {pod for pod, where in nodes_of.items() if where in taken}
    assert len(lost) == 6, nodes_of
    for name in taken:
        spot_pool.evict(name)

    def shrunk() -> bool:  # every lost worker gone; their replacements wait for room
        live = {str(p.metadata.name): p for n in names for p in jobs.live_workers(n)}
        return all(
            pod not in live or live[pod].metadata.uid not in before[pod.rsplit("-worker-", 1)[0]].values()
            for pod in lost
        )

    evicted_at = time.monotonic()
    wait_for(shrunk, timeout=150, interval=1, what="the workers of the taken nodes gone")
    for name in names:
        status = jobs.status(name)
        assert status["restarts"] == 0 and status["phase"] == "Running", (name, status)
    spot_pool.add(range(9, 12))  # Azure has spot capacity again: the pool scales back up
    for name in names:
        wait_for(partial(all_ready, jobs, name, 3), timeout=180, what=f"{name} refilled to 3 workers")
    refilled_after = time.monotonic() - evicted_at
    for name in names:
        status = jobs.status(name)
        assert status["restarts"] == 0, (name, status)
        assert launcher_pod_uid(jobs, name) == launchers[name], f"{name}'s launcher was replaced"
        now = worker_uids(jobs, name)
        kept = {pod: uid for pod, uid in before[name].items() if pod not in lost}
        assert {pod: now[pod] for pod in kept} == kept, f"{name}: a worker on a surviving node was touched"
        assert "Restarting" not in reasons(jobs, name)
    print(f"6 workers on 3 spot nodes lost across {len(names)} jobs: refilled after {refilled_after:.0f}s")
    for name in names:
        jobs.delete(name)
    wait_for(lambda: not any(jobs.pods(n) for n in names), timeout=120, what="every pod of the jobs gone")


def test_below_min_workers_for_the_timeout_restarts_the_world_counted(
    jobs: Jobs, operator: OperatorProcess, spot_pool: SpotPool
) -> None:
    spot_pool.add(range(1))  # one node with both workers
    elastic_job(jobs, "floor", workers=2, minWorkers=2, timeoutSeconds=3)
    wait_for(lambda: all_ready(jobs, "floor", 2), timeout=120, what="2 workers Ready, launcher running")
    spot_pool.evict(spot_pool.names()[0])
    below = wait_for(
        lambda: jobs.condition("floor", "WorkersBelowMinimum"), timeout=120, what="below the floor"
    )
    assert below["status"] == "True", below
    wait_for(lambda: jobs.status("floor").get("restarts") == 1, timeout=60, what="the world restarted")
    restarting = jobs.condition("floor", "Restarting")
    assert restarting is not None and restarting["reason"] == "WorkersBelowMinimum", restarting
    assert "below spec.elastic.minWorkers (2)" in restarting["message"]
    spot_pool.add(range(1, 2))
    wait_for(lambda: all_ready(jobs, "floor", 2), timeout=120, what="a new world running")
    assert jobs.status("floor")["restarts"] == 1
