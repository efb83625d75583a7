"""runPolicy.scheduling.topology under the real kube-scheduler: the simulated GPU pool's four kwok nodes (4
GPUs each) labelled as two racks of two nodes, so each rack holds 8 GPUs.

- A world of 4 workers x 2 GPUs fits one rack exactly. The default scheduler spreads pods over the least
  loaded nodes, so without the affinity it would use all four nodes; with `required` every worker lands in one
  rack and the job runs to the end.
- A world of 3 workers x 4 GPUs fits no single rack: the workers that are bound share one rack, the rest stay
  Pending (no split world, no launcher), and the job's message says they wait for one rack with room for all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration
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

    def all_bound() -> dict[str, str] | None:
        placed = bound(jobs, "onerack")
        return placed if len(placed) == 4 else None

    try:
        placed = wait_for(all_bound, timeout=90, what="4 workers bound")
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
    assert jobs.launcher("toobig") is None
