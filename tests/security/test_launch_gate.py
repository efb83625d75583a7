"""The launcher Job is made with its world and its pod held by the scheduling gate `dtjob.io/workers-ready`
until every worker is Ready, when the operator takes the gate off. A namespace admin may create pods with that
gate and the launcher's labels: the operator releases only the pod its own launcher Job made, and the admin's
look-alike neither stands in for the launch nor is touched."""

from __future__ import annotations

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
    assert own[0].metadata.owner_references[0].name == names.launcher_name("mine")
    extra = core.read_namespaced_pod("mine-launcher-extra", tenant_a.namespace)
    assert gates(extra) == [names.LAUNCH_GATE], "the operator released a pod its launcher Job did not make"
    assert status["launcher"] == {"state": "Running", "pod": own[0].metadata.name}, status
