"""The launcher pod is made with its world and held by the scheduling gate `dtjob.io/workers-ready` until
every worker is Ready, when the operator takes the gate off. A namespace admin may create pods with that gate
and the launcher's labels: the operator releases only its own launcher pod, found by name
(`<job>-launcher`) and owner (the job), and the admin's look-alike neither stands in for the launch nor is
touched, whether under another name or under the launcher's own. A world size the admin writes on the held
launcher makes no workers."""

from __future__ import annotations

import time
from typing import Any

from dtjob import names
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
SLOW_WORKERS = {"podAnnotations": {"sim.dtjob.io/ready-after": "8s"}}


def gates(pod: client.V1Pod) -> list[str]:
    return [g.name for g in (pod.spec.scheduling_gates or ())]


def test_a_gated_pod_labelled_as_the_launcher_is_neither_released_nor_taken_for_the_launch(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    labels = {**names.labels("mine", names.ROLE_LAUNCHER, names.ROLE_LAUNCHER), names.ATTEMPT_LABEL: "0"}
    lookalike: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine-launcher-extra", "labels": labels},
        "spec": {
            "schedulingGates": [{"name": names.LAUNCH_GATE}],
            "containers": [{"name": "launcher", "image": "busybox"}],
        },
    }
    core = client.CoreV1Api(tenant_a.api(ADMIN))
    core.create_namespaced_pod(tenant_a.namespace, lookalike)
    tenant_a.jobs().create("mine", worker=SLOW_WORKERS, launcher=LONG_LAUNCHER)
    mine = Jobs(api_client, tenant_a.namespace)

    # While the workers are not Ready, the job's own launcher pod exists and is held.
    def held_launcher() -> client.V1Pod | None:
        own = [p for p in mine.pods("mine", names.ROLE_LAUNCHER) if p.metadata.name != "mine-launcher-extra"]
        return own[0] if own and names.LAUNCH_GATE in gates(own[0]) else None

    wait_for(held_launcher, timeout=60, what="the job's launcher pod, held")
    assert mine.status("mine")["phase"] in ("Pending", "Starting")

    status = mine.wait_phase("mine", "Running", timeout=120)
    assert status["restarts"] == 0, status
    own = [p for p in mine.pods("mine", names.ROLE_LAUNCHER) if p.metadata.name != "mine-launcher-extra"]
    assert len(own) == 1 and gates(own[0]) == [], [(p.metadata.name, gates(p)) for p in own]
    assert own[0].metadata.name == names.launcher_name("mine")
    job_uid = (mine.get("mine") or {})["metadata"]["uid"]
    owners = [(r.kind, r.name, r.uid) for r in own[0].metadata.owner_references or ()]
    assert owners == [("DistributedTrainingJob", "mine", job_uid)], owners
    extra = core.read_namespaced_pod("mine-launcher-extra", tenant_a.namespace)
    assert gates(extra) == [names.LAUNCH_GATE], "the operator released a pod that is not its launcher"
    assert status["launcher"] == {"state": "Running", "pod": own[0].metadata.name}, status


def test_a_gated_pod_under_the_launchers_own_name_is_neither_released_nor_taken_for_the_launch(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """The admin's look-alike holds the very name the launcher is made under, before the job exists: the name
    alone never makes a pod the launcher. The job waits, saying which pod holds the name, until it is gone."""
    name = names.launcher_name("mine")
    labels = {**names.labels("mine", names.ROLE_LAUNCHER, names.ROLE_LAUNCHER), names.ATTEMPT_LABEL: "0"}
    lookalike: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulingGates": [{"name": names.LAUNCH_GATE}],
            "containers": [{"name": "launcher", "image": "busybox"}],
        },
    }
    core = client.CoreV1Api(tenant_a.api(ADMIN))
    planted = core.create_namespaced_pod(tenant_a.namespace, lookalike)
    tenant_a.jobs().create("mine", launcher=LONG_LAUNCHER)
    mine = Jobs(api_client, tenant_a.namespace)

    def held_off() -> dict[str, str] | None:
        created = mine.condition("mine", "Created")
        return created if created and created["reason"] == "ChildNotOwned" else None

    created = wait_for(held_off, timeout=60, what="Created=False ChildNotOwned")
    assert created["message"].startswith(f"Pod {name} exists and belongs to another owner"), created

    # Every worker Ready, and still the admin's pod is neither released nor taken for the launch.
    def ready(pod: client.V1Pod) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())

    wait_for(lambda: [ready(p) for p in mine.live_workers("mine")] == [True, True], timeout=60,
             what="both workers Ready")  # fmt: skip
    time.sleep(3)  # a few more reconciles, each of which would release a pod it took for its launcher
    status = mine.status("mine")
    assert status["phase"] == "Pending" and status.get("launcher", {}).get("state") != "Running", status
    pod = core.read_namespaced_pod(name, tenant_a.namespace)
    assert pod.metadata.uid == planted.metadata.uid and not pod.metadata.owner_references
    assert gates(pod) == [names.LAUNCH_GATE], "the operator released a pod that is not its launcher"

    # Once the admin's pod is gone, the operator makes its own under that name, and the job runs.
    core.delete_namespaced_pod(name, tenant_a.namespace, grace_period_seconds=0)
    status = mine.wait_phase("mine", "Running", timeout=120)
    own = core.read_namespaced_pod(name, tenant_a.namespace)
    assert own.metadata.uid != planted.metadata.uid and gates(own) == []
    job_uid = (mine.get("mine") or {})["metadata"]["uid"]
    assert [r.uid for r in own.metadata.owner_references or ()] == [job_uid]
    assert status["restarts"] == 0, status


def test_a_world_size_an_admin_writes_on_the_held_launcher_makes_no_workers_and_stalls_no_one(
    tenant_a: Tenant, tenant_b: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """A namespace admin labels its held launcher `dtjob.io/world-size: 1000000000` and puts Kueue's finalizer
    on a worker, so that the world reads as admitted by Kueue (an admitted world keeps its launcher's size).
    The operator would have made a billion workers, its memory and every other tenant's jobs with it. It
    makes none: the world stays the spec's two, and another tenant's job still runs."""
    never_ready = {"podAnnotations": {"sim.dtjob.io/ready-after": "600s"}}
    tenant_a.jobs().create("mine", worker=never_ready, launcher=LONG_LAUNCHER)
    mine = Jobs(api_client, tenant_a.namespace)
    wait_for(lambda: len(mine.pods("mine", names.ROLE_WORKER)) == 2 and mine.launcher("mine"), timeout=60,
             what="mine's two workers and its held launcher")  # fmt: skip
    core = client.CoreV1Api(tenant_a.api(ADMIN))
    worker = names.worker_name("mine", 0)
    label = {"metadata": {"labels": {names.WORLD_SIZE_LABEL: "1000000000"}}}
    core.patch_namespaced_pod(names.launcher_name("mine"), tenant_a.namespace, label)
    kueues = {"metadata": {"finalizers": ["kueue.x-k8s.io/managed"]}}
    core.patch_namespaced_pod(worker, tenant_a.namespace, kueues)
    try:
        tenant_b.jobs().create("theirs", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "5s"}})
        theirs = Jobs(api_client, tenant_b.namespace)
        status = theirs.wait_phase("theirs", "Succeeded", timeout=120)
        assert status["restarts"] == 0, status
        made = sorted(str(p.metadata.name) for p in mine.pods("mine", names.ROLE_WORKER))
        assert made == [names.worker_name("mine", i) for i in (0, 1)], made[:5]
        assert mine.status("mine")["phase"] in ("Pending", "Starting"), mine.status("mine")
    finally:
        core.patch_namespaced_pod(worker, tenant_a.namespace, {"metadata": {"finalizers": None}})
