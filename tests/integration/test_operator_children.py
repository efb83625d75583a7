"""Children changed behind the operator's back, against a real API server: a job re-created under the same
name, a launcher pod deleted by hand (after it ran, and before), world objects deleted by hand, spec edits
while the world runs.

Pods are simulated by kwok; sim.dtjob.io/run-duration keeps the launcher running.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
SELECTOR = "dtjob.io/job-name={}"


def _owner_uids(obj: object) -> set[str]:
    refs = getattr(obj, "metadata").owner_references or []  # noqa: B009
    return {r.uid for r in refs}


def _children(jobs: Jobs, name: str) -> list[object]:
    selector = SELECTOR.format(name)
    return [
        *jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items,
        *jobs.core.list_namespaced_secret(jobs.ns, label_selector=selector).items,
        *jobs.core.list_namespaced_config_map(jobs.ns, label_selector=selector).items,
        *jobs.core.list_namespaced_service(jobs.ns, label_selector=selector).items,
        *jobs.batch.list_namespaced_job(jobs.ns, label_selector=selector).items,
        *client.DiscoveryV1Api(jobs.core.api_client)
        .list_namespaced_endpoint_slice(jobs.ns, label_selector=selector)
        .items,
    ]


def test_a_job_recreated_under_the_same_name_never_adopts_the_old_ones_children(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("same", launcher=LONG_LAUNCHER)
    jobs.wait_phase("same", "Running", timeout=120)
    old_uid = (jobs.get("same") or {})["metadata"]["uid"]
    # Orphan: the garbage collector strips the ownerReferences and leaves the old world standing.
    jobs.custom.delete_namespaced_custom_object(
        "dtjob.io", "v1alpha1", jobs.ns, "distributedtrainingjobs", "same",
        body=client.V1DeleteOptions(propagation_policy="Orphan"),
    )  # fmt: skip
    wait_for(lambda: jobs.get("same") is None, timeout=60, what="old job gone")
    # Every child, the launcher pod too (the job owns it directly), loses its owner: nothing names the
    # deleted job any more.
    wait_for(lambda: all(old_uid not in _owner_uids(c) for c in _children(jobs, "same")), timeout=60,
             what="orphaned")  # fmt: skip
    orphans = {(type(c).__name__, c.metadata.name) for c in _children(jobs, "same")}  # type: ignore[attr-defined]
    assert {("V1Pod", "same-worker-0"), ("V1Pod", "same-launcher")} <= orphans
    # No batch Job: the launcher is a pod the operator makes itself.
    assert not any(kind == "V1Job" for kind, _ in orphans), orphans

    jobs.create("same", launcher=LONG_LAUNCHER)
    new_uid = (jobs.get("same") or {})["metadata"]["uid"]
    assert new_uid != old_uid

    def held() -> dict[str, str] | None:
        created = jobs.condition("same", "Created")
        return created if created and created["reason"] == "ChildNotOwned" else None

    created = wait_for(held, timeout=60, what="Created=False ChildNotOwned")
    assert "same-ssh" in created["message"] and "another owner" in created["message"]
    time.sleep(3)  # a few more reconciles: still nothing adopted or created beside the orphans
    assert {(type(c).__name__, c.metadata.name) for c in _children(jobs, "same")} == orphans  # type: ignore[attr-defined]
    assert all(new_uid not in _owner_uids(c) for c in _children(jobs, "same"))
    assert jobs.status("same").get("phase") == "Pending"

    # Once the leftovers are gone, the new job builds its own world.
    for child in _children(jobs, "same"):
        meta = child.metadata  # type: ignore[attr-defined]
        kind = type(child).__name__.removeprefix("V1")
        api = {"Job": jobs.batch, "EndpointSlice": client.DiscoveryV1Api(jobs.core.api_client)}.get(
            kind, jobs.core
        )
        delete = getattr(api, f"delete_namespaced_{'_'.join(_snake(kind))}")
        delete(meta.name, jobs.ns, propagation_policy="Background", grace_period_seconds=0)
    jobs.wait_phase("same", "Running", timeout=120)
    # Every child is the new job's own, its launcher pod (named as the orphan was) among them.
    built = _children(jobs, "same")
    assert "same-launcher" in {c.metadata.name for c in built}  # type: ignore[attr-defined]
    for child in built:
        assert _owner_uids(child) == {new_uid}, child.metadata.name  # type: ignore[attr-defined]


def _snake(kind: str) -> list[str]:
    return {"ConfigMap": ["config", "map"], "EndpointSlice": ["endpoint", "slice"]}.get(kind, [kind.lower()])


def test_a_launcher_deleted_by_hand_restarts_the_world_once_and_a_workers_edit_waits_for_it(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("edit", launcher=LONG_LAUNCHER)
    jobs.wait_phase("edit", "Running", timeout=120)
    # spec.workers edited while the world runs: no third worker beside it, no restart, and status says why.
    jobs.patch_spec("edit", {"workers": 3})
    running = wait_for(
        lambda: (
            (c := jobs.condition("edit", "Running")) and "applies at the next world" in c["message"] and c
        ),
        timeout=60,
        what="Running condition naming the pending edit",
    )
    assert "spec.workers=3" in running["message"]
    assert jobs.status("edit")["restarts"] == 0
    assert len(jobs.live_workers("edit")) == 2 and jobs.status("edit")["phase"] == "Running"

    # The launcher pod deleted by hand after it ran: the world restarts, counted and said once, at the new
    # size.
    old_uid = jobs.core.read_namespaced_pod("edit-launcher", jobs.ns).metadata.uid
    jobs.core.delete_namespaced_pod("edit-launcher", jobs.ns)
    wait_for(lambda: jobs.status("edit").get("restarts") == 1, timeout=60, what="restart counted")
    restarting = jobs.condition("edit", "Restarting")
    assert restarting and restarting["reason"] in ("LauncherLost", "Recovered"), restarting
    jobs.wait_phase("edit", "Running", timeout=120)
    wait_for(lambda: len(jobs.live_workers("edit")) == 3, timeout=60, what="the next world has 3 workers")
    time.sleep(3)
    assert jobs.status("edit")["restarts"] == 1
    lost = [e for e in jobs.events("edit") if e.reason == "LauncherLost"]
    assert len(lost) == 1, [e.reason for e in jobs.events("edit")]
    assert "launcher pod edit-launcher disappeared (it was deleted)" in lost[0].message, lost[0].message
    # The next world's launcher: a new pod under the same name, of the next attempt and the new size.
    launcher = jobs.launcher("edit")
    assert launcher is not None and launcher.metadata.uid != old_uid
    labels = launcher.metadata.labels
    assert (labels["dtjob.io/attempt"], labels["dtjob.io/world-size"]) == ("1", "3"), labels


def test_a_launcher_pod_deleted_by_hand_before_it_ran_is_made_again_without_a_restart(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    # Workers slow to turn Ready: the launcher pod, made with them, is still held by the gate when it goes.
    slow = {"podAnnotations": {"sim.dtjob.io/ready-after": "8s"}}
    jobs.create("early", worker=slow, launcher=LONG_LAUNCHER)
    held = wait_for(lambda: jobs.launcher("early"), timeout=60, what="the held launcher pod")
    assert [g.name for g in held.spec.scheduling_gates or ()] == ["dtjob.io/workers-ready"]
    jobs.core.delete_namespaced_pod("early-launcher", jobs.ns)
    # Nothing had run: the same world gets a new launcher pod under the same name, and no restart is counted.
    jobs.wait_phase("early", "Running", timeout=120)
    launcher = jobs.launcher("early")
    assert launcher is not None and launcher.metadata.uid != held.metadata.uid
    assert launcher.metadata.labels["dtjob.io/attempt"] == "0"
    time.sleep(3)
    assert jobs.status("early")["restarts"] == 0
    assert "LauncherLost" not in [e.reason for e in jobs.events("early")]


def test_world_objects_deleted_by_hand_are_recreated_for_the_next_world(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("byhand", launcher=LONG_LAUNCHER)
    jobs.wait_phase("byhand", "Running", timeout=120)
    old_key = jobs.core.read_namespaced_secret("byhand-ssh", jobs.ns).data["authorized_keys"]
    jobs.core.delete_namespaced_secret("byhand-ssh", jobs.ns)
    jobs.core.delete_namespaced_config_map("byhand-hostfile", jobs.ns)
    jobs.core.delete_namespaced_service("byhand-workers", jobs.ns)
    # A worker lost: the world restarts once, and the next world gets all three back.
    jobs.core.delete_namespaced_pod("byhand-worker-1", jobs.ns, grace_period_seconds=0)
    wait_for(lambda: jobs.status("byhand").get("restarts") == 1, timeout=60, what="restart counted")
    jobs.wait_phase("byhand", "Running", timeout=120)
    # A new key pair: the old private key left with the old Secret.
    assert jobs.core.read_namespaced_secret("byhand-ssh", jobs.ns).data["authorized_keys"] not in (
        "",
        old_key,
    )
    assert jobs.core.read_namespaced_config_map("byhand-hostfile", jobs.ns).data["hostfile"]
    assert jobs.core.read_namespaced_service("byhand-workers", jobs.ns).spec.cluster_ip == "None"
    assert jobs.status("byhand")["restarts"] == 1
