"""A worker's node lost while the world runs: the world restarts promptly, and the restart is counted once.

Two ways a node goes, both played by the real control plane:
- deleted (a VM the cloud removed): the pod garbage collector deletes the pods bound to it;
- NotReady with its kubelet gone (a hung or cut-off VM, cued by sim.dtjob.io/node-lost, see
  hack/kwok/stages.yaml): the node lifecycle controller taints the node, the taint eviction controller evicts
  the workers after their 30 s toleration, and nothing confirms the deletion, so the pods stay Terminating.

The test bed's controller manager runs kwokctl's node monitoring (--node-monitor-period=25s,
--node-monitor-grace-period=200s, for kwok's slow heartbeats): a node that only stops its heartbeats turns
Unknown after more than three minutes, so these tests have the node report NotReady instead, which the
controller acts on at its next pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import REPO, Jobs, OperatorProcess, kubectl

pytestmark = pytest.mark.integration

LOST = "sim.dtjob.io/node-lost"
LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
NODE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@pytest.fixture
def pool_restored(core_v1: client.CoreV1Api, kubeconfig: str) -> Iterator[None]:
    """After the test, the simulated pool as hack/cluster.sh made it: every node back, Ready, untainted."""
    yield
    for node in core_v1.list_node(label_selector="type=kwok").items:
        if LOST in (node.metadata.annotations or {}):
            core_v1.patch_node(str(node.metadata.name), {"metadata": {"annotations": {LOST: None}}})
    nodes = subprocess.run(
        [sys.executable, str(REPO / "hack" / "sim_nodes.py")], check=True, capture_output=True, text=True
    ).stdout
    done = kubectl(kubeconfig, "apply", "-f", "-", stdin=nodes)
    assert done.returncode == 0, done.stderr
    wanted = {item["metadata"]["name"] for item in json.loads(nodes)["items"]}

    def healthy() -> bool:
        found = {n.metadata.name: n for n in core_v1.list_node(label_selector="type=kwok").items}
        return set(found) >= wanted and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            and not any(t.key in NODE_TAINTS for t in n.spec.taints or [])
            for n in found.values()
        )

    wait_for(healthy, timeout=120, interval=1, what="the simulated pool Ready and untainted again")


def _node_of(jobs: Jobs, pod: str) -> str:
    return str(jobs.core.read_namespaced_pod(pod, jobs.ns).spec.node_name)


def _lost_events(jobs: Jobs, name: str) -> list[str]:
    """The Warning events that say why the world broke (the phase's own event and force deletions aside)."""
    aside = ("Restarting", "PodForceDeleted")
    warnings = [e for e in jobs.events(name) if e.type == "Warning" and e.reason not in aside]
    return [f"{e.reason}: {e.message}" for e in warnings]


def _running_again(jobs: Jobs, name: str, old: dict[str, str]) -> dict[str, Any] | None:
    """The status once a new world runs: launcher running, both workers new."""
    status = jobs.status(name)
    workers = {p.metadata.name: p.metadata.uid for p in jobs.live_workers(name)}
    fresh = len(workers) == 2 and not set(workers.values()) & set(old.values())
    return status if status.get("phase") == "Running" and fresh else None


def _assert_counted_once(jobs: Jobs, operator: OperatorProcess, name: str, reason: str, pod: str) -> str:
    # Let the operator look again (a resync, pod events of the new world): nothing may count the loss twice.
    seen = operator.reconciles()
    wait_for(lambda: operator.reconciles() >= seen + 3, timeout=60, what="more reconciles")
    status = jobs.status(name)
    assert status["restarts"] == 1, status
    restarting = jobs.condition(name, "Restarting")
    assert restarting and restarting["status"] == "False" and restarting["reason"] == "Recovered"
    lost = _lost_events(jobs, name)
    assert len(lost) == 1 and lost[0].startswith(f"{reason}: worker pod {pod} "), lost
    return lost[0]


def test_a_deleted_node_restarts_the_world_once(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, pool_restored: None
) -> None:
    jobs.create("gone", launcher=LONG_LAUNCHER)
    jobs.wait_phase("gone", "Running", timeout=120)
    old = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("gone")}
    node = _node_of(jobs, "gone-worker-1")
    lost_at = time.monotonic()
    core_v1.delete_node(node)

    wait_for(lambda: jobs.status("gone").get("restarts") == 1, timeout=120, what="the world restarted")
    restarted_after = time.monotonic() - lost_at
    status = wait_for(lambda: _running_again(jobs, "gone", old), timeout=120, what="a new world running")
    running_after = time.monotonic() - lost_at
    assert status["restarts"] == 1
    assert node not in {_node_of(jobs, f"gone-worker-{i}") for i in range(2)}
    said = _assert_counted_once(jobs, operator, "gone", "WorkerLost", "gone-worker-1")
    print(f"node deleted: restarted after {restarted_after:.0f}s, running after {running_after:.0f}s; {said}")


def test_a_node_gone_not_ready_restarts_the_world_once(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, pool_restored: None
) -> None:
    jobs.create("adrift", launcher=LONG_LAUNCHER)
    jobs.wait_phase("adrift", "Running", timeout=120)
    old = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("adrift")}
    node = _node_of(jobs, "adrift-worker-1")
    lost_at = time.monotonic()
    # The kubelet of the node is gone: its pods are not finalized any more, and the node reports NotReady.
    jobs.annotate_pod("adrift-worker-1", {LOST: "true"})
    core_v1.patch_node(node, {"metadata": {"annotations": {LOST: "true"}}})

    def not_ready() -> bool:
        conditions = core_v1.read_node(node).status.conditions or []
        return any(c.type == "Ready" and c.status == "False" for c in conditions)

    wait_for(not_ready, timeout=30, what=f"{node} NotReady")
    wait_for(lambda: jobs.status("adrift").get("restarts") == 1, timeout=120, what="the world restarted")
    restarted_after = time.monotonic() - lost_at
    # The evicted worker cannot finish terminating on a node without a kubelet; the new world must not wait
    # for it forever.
    status = wait_for(lambda: _running_again(jobs, "adrift", old), timeout=150, what="a new world running")
    running_after = time.monotonic() - lost_at
    assert status["restarts"] == 1
    assert node not in {_node_of(jobs, f"adrift-worker-{i}") for i in range(2)}
    said = _assert_counted_once(jobs, operator, "adrift", "WorkerLost", "adrift-worker-1")
    assert old["adrift-worker-1"] not in {p.metadata.uid for p in jobs.pods("adrift")}
    forced = [e.message for e in jobs.events("adrift") if e.reason == "PodForceDeleted"]
    assert len(forced) == 1 and forced[0].startswith("adrift-worker-1 was still terminating"), forced
    print(f"NotReady: restarted after {restarted_after:.0f}s, running after {running_after:.0f}s; {said}")
