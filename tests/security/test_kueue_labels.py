"""Attacks through Kueue's kueue.x-k8s.io/prebuilt-workload-name label on a job, made with a tenant's own
token against a real Kueue (testbed/kueue.py) and the operator running as the chart runs it.

On a MultiKueue worker, Kueue's copy of a dispatched job carries that label: the Workload MultiKueue copied
from the manager, which reserved the job's quota on the worker, so the copy's world joins no pod group of
Kueue's, and the operator marks that Workload Finished as the copy ends. The cluster admin's setup here is
what MultiKueue makes on a worker: in tenant A, the Workload `dtjob-victim` (the manager's labels and podSets,
MultiKueue's origin label, no owner) that Kueue admits, and Kueue's copy of the job `victim`, running on it.
Then tenant A's editor, and tenant B's, label jobs of their own with a Workload name:

- a job naming the victim's Workload gets no pod outside Kueue (it fails, naming the label), though its queue
  has no quota left; named on its pods (podLabels, podAnnotations, a template's metadata), the name is refused
  at create and at edit, naming the field;
- a job naming another job's Workload, or a Workload Kueue made for a job's pod group (named as the job is),
  with a spec the operator rejects (so it ends at once) never marks that Workload Finished: Kueue keeps its
  quota (the ClusterQueue's reservation is what it was) while its pods run;
- a job in tenant B named as the victim, labelled with its Workload's name, cannot reach tenant A's Workload
  (Workloads are namespaced): it waits, with no pod, saying why;
- tenant A's admin, who may patch its pods, marks a running job's launcher pod as the operator marks it once
  the job has ended (`kueue.x-k8s.io/retriable-in-group: "false"`): the job runs on, its Workload stays
  admitted with its quota until the job ends, and is finished (the quota free) once it has.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import pytest
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.workload import world_pod_sets
from dtjob.gang import kueue as kq
from dtjob.gang.kueue import PRIORITY_CLASS_LABEL
from dtjob.reconcile.dispatch import NO_PRIORITY_CLASS
from dtjob.spec.managed_by import (
    MULTIKUEUE,
    MULTIKUEUE_ORIGIN_LABEL,
    PREBUILT_WORKLOAD_ANNOTATION_FIELD,
    PREBUILT_WORKLOAD_FIELD,
    PREBUILT_WORKLOAD_LABEL,
)
from dtjob.spec.parse import parse_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.kueue import KUEUE, KueueProcess, releases
from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant
from tests.integration.test_kueue import condition, created, gated, gpus_reserved, wait_queues_active

QUEUE = "team"
VICTIM = "victim"
VICTIM_WORKLOAD = f"dtjob-{VICTIM}"
GPUS_PER_WORLD = 2
LONG_RUN = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
# A spec the CRD accepts and the operator rejects: the job ends (Failed) in its first reconcile.
OPERATORS_OWN = [{"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "false"}]
REJECTED = {"template": {"spec": {"containers": [{"name": "launcher", "env": OPERATORS_OWN}]}}}
SELECTOR_LABEL = "security.dtjob.io/kueue"
STAYS_SECONDS = 8.0  # how long a Workload is watched for a change an attack would make at once


def world(**spec: Any) -> dict[str, Any]:
    return {"workers": 2, "gpusPerWorker": 1, "runPolicy": {"scheduling": {"queueName": QUEUE}}, **spec}


@pytest.fixture(scope="module")
def kueue_selector() -> dict[str, str]:
    return {SELECTOR_LABEL: f"k{uuid.uuid4().hex[:8]}"}  # never a number (1e123456) to Kueue's YAML


@pytest.fixture(scope="module")
def kueue(
    kubeconfig: str, tmp_path_factory: pytest.TempPathFactory, kueue_selector: dict[str, str]
) -> Iterator[KueueProcess]:
    """One Kueue for the module, the newest release (v1beta2 only); it manages the pods of the namespaces
    labelled with `kueue_selector`."""
    proc = KueueProcess(kubeconfig, tmp_path_factory.mktemp("kueue"), kueue_selector, release=releases()[-1])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def create_job(
    jobs: Jobs, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A DistributedTrainingJob with `labels` (and `annotations`), created with `jobs`' credentials."""
    meta = {"name": name, "labels": labels, "annotations": annotations or {}}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob",
        "metadata": meta, "spec": {"framework": "pytorch", **spec},
    }  # fmt: skip
    return cast(
        dict[str, Any], jobs.custom.create_namespaced_custom_object(GROUP, VERSION, jobs.ns, PLURAL, body)
    )


def get_workload(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], custom.get_namespaced_custom_object(*KUEUE, namespace, "workloads", name))


def stays_empty(found: Callable[[], list[str]], seconds: float = STAYS_SECONDS) -> None:
    """What `found` lists stays empty for `seconds`: an attack's effect follows the job's first reconcile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert found() == []
        time.sleep(0.5)


def admitted_and_not_finished(workload: dict[str, Any]) -> bool:
    return (
        condition(workload, "Admitted").get("status") == "True"
        and condition(workload, "Finished").get("status") != "True"
    )


def outside_kueue(pods: list[client.V1Pod]) -> list[str]:
    """The pods that skip Kueue's admission: neither gated nor in a LocalQueue."""
    return [
        str(p.metadata.name)
        for p in pods
        if not gated(p) and kq.QUEUE_NAME_LABEL not in (p.metadata.labels or {})
    ]


def decided(jobs: Jobs, name: str) -> dict[str, Any]:
    """Waits until the operator has acted on job `name`: it has pods, or its status refuses the label (the job
    failed, or waits for the Workload)."""

    def acted() -> dict[str, Any] | None:
        status = jobs.status(name)
        waits = condition({"status": status}, "Created").get("reason") == "PrebuiltWorkloadNotAdmitted"
        return status if jobs.pods(name) or status.get("phase") == "Failed" or waits else None

    return wait_for(acted, timeout=60, what=f"the operator acting on {name}")


@pytest.fixture
def victim(
    api_client: client.ApiClient,
    kueue: KueueProcess,
    kueue_selector: dict[str, str],
    tenant_a: Tenant,
    tenant_b: Tenant,
    operator: OperatorProcess,
) -> Iterator[dict[str, str]]:
    """The cluster admin's setup: both tenants under Kueue with a LocalQueue `team` on a ClusterQueue with GPU
    quota for two worlds; in tenant A, the victim's Workload as MultiKueue makes it on a worker, admitted,
    and Kueue's copy of the victim job running on it (outside Kueue's pod groups)."""
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    for tenant in (tenant_a, tenant_b):
        core.patch_namespace(tenant.namespace, {"metadata": {"labels": kueue_selector}})
    made = {k: f"{k}-{tenant_a.namespace}" for k in ("flavor", "cq")}
    cluster_objects: list[tuple[str, dict[str, Any]]] = [
        ("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": made["flavor"]}, "spec": {}}),
        ("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": made["cq"]}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": made["flavor"], "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": "memory", "nominalQuota": "10000Gi"},
                    {"name": "nvidia.com/gpu", "nominalQuota": str(2 * GPUS_PER_WORLD)},
                ]}],
            }],
        }}),
    ]  # fmt: skip
    for plural, body in cluster_objects:
        create = partial(
            custom.create_cluster_custom_object, *KUEUE, plural, {"apiVersion": "/".join(KUEUE), **body}
        )
        wait_for(partial(created, create), timeout=30, what=f"{body['kind']} created")
    try:
        for tenant in (tenant_a, tenant_b):
            local = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": QUEUE},
                     "spec": {"clusterQueue": made["cq"]}}  # fmt: skip
            custom.create_namespaced_custom_object(*KUEUE, tenant.namespace, "localqueues", local)
            wait_queues_active(custom, tenant.namespace, made["cq"], QUEUE, kueue)
        _the_victims_workload(custom, tenant_a.namespace)
        admin = Jobs(api_client, tenant_a.namespace)
        copied = {PREBUILT_WORKLOAD_LABEL: VICTIM_WORKLOAD, MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
        create_job(admin, VICTIM, copied, **world(launcher=LONG_RUN))
        admin.wait_phase(VICTIM, "Running", timeout=120)
        pods = admin.pods(VICTIM, "worker")
        assert len(pods) == 2 and all(p.spec.node_name for p in pods), (
            "the victim's copy runs on its Workload"
        )
        yield made
    finally:
        for plural, body in reversed(cluster_objects):
            custom.delete_cluster_custom_object(*KUEUE, plural, body["metadata"]["name"])


def _the_victims_workload(custom: client.CustomObjectsApi, namespace: str) -> None:
    """What MultiKueue creates on a worker: the manager's Workload (its labels and podSets), with its origin
    label and no owner; Kueue there admits it."""
    spec = parse_spec({"metadata": {"name": VICTIM, "namespace": namespace}, "spec": {
        "framework": "pytorch", **world()}}, OperatorConfig())  # fmt: skip
    workload = {
        "apiVersion": "/".join(KUEUE), "kind": "Workload",
        "metadata": {"name": VICTIM_WORKLOAD, "labels": {
            "dtjob.io/job-name": VICTIM, "dtjob.io/role": "workload", MULTIKUEUE_ORIGIN_LABEL: "multikueue"}},
        "spec": {"queueName": QUEUE, "podSets": world_pod_sets(spec, owner_reference(VICTIM, "manager-uid"))},
    }  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, namespace, "workloads", workload)
    wait_for(
        lambda: admitted_and_not_finished(get_workload(custom, namespace, VICTIM_WORKLOAD)),
        timeout=60, what="the victim's Workload admitted",
    )  # fmt: skip


def test_a_job_naming_another_jobs_workload_gets_no_pod_outside_kueue(
    victim: dict[str, str], tenant_a: Tenant, api_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api_client)
    admin = Jobs(api_client, tenant_a.namespace)
    assert gpus_reserved(custom, victim["cq"]) == str(GPUS_PER_WORLD)

    # The queue has quota for one more world: a first world takes it through Kueue.
    tenant_a.jobs().create("fair", **world(launcher=LONG_RUN))
    admin.wait_phase("fair", "Running", timeout=120)
    assert gpus_reserved(custom, victim["cq"]) == str(2 * GPUS_PER_WORLD)

    # No quota is left: a job that names the victim's Workload asks for none of Kueue's, whether by the label
    # or by the annotation Kueue v0.18+ writes instead.
    named = {PREBUILT_WORKLOAD_LABEL: VICTIM_WORKLOAD}
    create_job(tenant_a.jobs(), "thief", named, **world(launcher=LONG_RUN))
    create_job(tenant_a.jobs(), "thief-a", {}, named, **world(launcher=LONG_RUN))
    for thief, field in (("thief", PREBUILT_WORKLOAD_FIELD), ("thief-a", PREBUILT_WORKLOAD_ANNOTATION_FIELD)):
        status = decided(admin, thief)
        assert outside_kueue(admin.pods(thief)) == [], f"pods outside Kueue's admission: {status}"
        status = admin.wait_phase(thief, "Failed", timeout=30)
        failed = admin.condition(thief, "Failed") or {}
        assert failed.get("reason") == "InvalidSpec", status
        assert status["message"].startswith(f"{field}: names Workload '{VICTIM_WORKLOAD}'"), status
    stays_empty(lambda: [str(p.metadata.name) for p in admin.pods("thief") + admin.pods("thief-a")])

    # The same name on the job's pods (podLabels, podAnnotations, a template's labels or annotations) is
    # refused at create and at edit, naming the field: Kueue's keys on the pods are the operator's.
    on_pods = {
        "podLabels": {"podLabels": named}, "podAnnotations": {"podAnnotations": named},
        "template.metadata.labels": {"template": {"metadata": {"labels": named}}},
        "template.metadata.annotations": {"template": {"metadata": {"annotations": named}}},
    }  # fmt: skip
    editor = tenant_a.jobs()
    for role in ("worker", "launcher"):
        for field, extras in on_pods.items():
            create = partial(editor.create, f"thief-{role[0]}", **world(**{role: extras}))
            refused_naming(f"spec.{role}.{field}", create)
            refused_naming(f"spec.{role}.{field}", partial(editor.patch_spec, "fair", {role: extras}))
    assert admin.pods("thief-w") == admin.pods("thief-l") == []
    assert admitted_and_not_finished(get_workload(custom, tenant_a.namespace, VICTIM_WORKLOAD))
    assert admin.status(VICTIM)["phase"] == "Running"


def refused_naming(field: str, attempt: Callable[[], object]) -> None:
    """`attempt`, a create or an edit that puts Kueue's keys in `field`, is refused, naming it."""
    try:
        attempt()
    except ApiException as err:
        assert err.status == 422, err
        body = " ".join(str(err.body).split())
        assert field in body and "keys under kueue.x-k8s.io/ are set by the operator" in body, body
    else:
        raise AssertionError(f"Kueue's Workload name in {field} was allowed")


def test_a_job_that_ends_at_once_never_finishes_a_workload_it_names(
    victim: dict[str, str], tenant_a: Tenant, api_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api_client)
    admin = Jobs(api_client, tenant_a.namespace)
    # A job of the tenant queued as any: Kueue's pod group Workload is named as the job.
    tenant_a.jobs().create("dtjob-grouped", **world(launcher=LONG_RUN))
    admin.wait_phase("dtjob-grouped", "Running", timeout=120)
    reserved = gpus_reserved(custom, victim["cq"])
    assert reserved == str(2 * GPUS_PER_WORLD)

    # Rejected specs: each job ends in its first reconcile, naming a Workload that holds quota.
    editor = tenant_a.jobs()
    create_job(editor, "ender", {PREBUILT_WORKLOAD_LABEL: VICTIM_WORKLOAD}, **world(launcher=REJECTED))
    create_job(editor, "grouped", {PREBUILT_WORKLOAD_LABEL: "dtjob-grouped"}, **world(launcher=REJECTED))
    for name in ("ender", "grouped"):
        admin.wait_phase(name, "Failed", timeout=60)

    def touched() -> list[str]:
        found = [
            f"Workload {name} no longer admitted, or Finished"
            for name in (VICTIM_WORKLOAD, "dtjob-grouped")
            if not admitted_and_not_finished(get_workload(custom, tenant_a.namespace, name))
        ]
        now = gpus_reserved(custom, victim["cq"])
        return found + ([f"{now} GPUs reserved, not {reserved}"] if now != reserved else [])

    stays_empty(touched)
    assert admin.status(VICTIM)["phase"] == "Running" and admin.status("dtjob-grouped")["phase"] == "Running"
    assert admin.pods("ender") == [] and admin.pods("grouped") == []


def test_an_early_mark_on_the_launcher_neither_ends_the_job_nor_frees_its_quota(
    victim: dict[str, str], tenant_a: Tenant, api_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api_client)
    admin = Jobs(api_client, tenant_a.namespace)
    tenant_a.jobs().create(
        "marked", **world(launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "25s"}})
    )
    status = admin.wait_phase("marked", "Running", timeout=120)
    assert gpus_reserved(custom, victim["cq"]) == str(2 * GPUS_PER_WORLD), status
    mark = {"metadata": {"annotations": {kq.RETRIABLE_IN_GROUP: kq.NOT_RETRIABLE}}}
    tenant_a.core(ADMIN).patch_namespaced_pod("marked-launcher", tenant_a.namespace, mark)

    def touched() -> list[str]:
        found = [] if admin.status("marked")["phase"] == "Running" else ["the job no longer Running"]
        if not admitted_and_not_finished(get_workload(custom, tenant_a.namespace, "marked")):
            found.append("its Workload no longer admitted, or Finished")
        now = gpus_reserved(custom, victim["cq"])
        return found + ([f"{now} GPUs reserved"] if now != str(2 * GPUS_PER_WORLD) else [])

    stays_empty(touched)
    admin.wait_phase("marked", "Succeeded", timeout=120)

    def freed() -> bool:
        finished = condition(get_workload(custom, tenant_a.namespace, "marked"), "Finished")
        return finished.get("status") == "True" and gpus_reserved(custom, victim["cq"]) == str(GPUS_PER_WORLD)

    wait_for(
        freed, timeout=60, what="the ended job's Workload Finished, its quota free (the victim's alone held)"
    )
    assert admin.status(VICTIM)["phase"] == "Running"


def test_a_job_in_another_namespace_cannot_reach_a_tenants_workload(
    victim: dict[str, str], tenant_a: Tenant, tenant_b: Tenant, api_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api_client)
    admin_b = Jobs(api_client, tenant_b.namespace)
    # Named as the victim, so its label names its own Workload: which exists only in tenant A.
    create_job(
        tenant_b.jobs(), VICTIM, {PREBUILT_WORKLOAD_LABEL: VICTIM_WORKLOAD}, **world(launcher=LONG_RUN)
    )
    status = decided(admin_b, VICTIM)
    assert outside_kueue(admin_b.pods(VICTIM)) == [], f"pods outside Kueue's admission: {status}"
    created_cond = admin_b.condition(VICTIM, "Created") or {}
    assert created_cond.get("reason") == "PrebuiltWorkloadNotAdmitted", status
    assert status["phase"] == "Pending" and status["message"].startswith(
        f"{PREBUILT_WORKLOAD_FIELD}: Workload {VICTIM_WORKLOAD} does not exist in the job's namespace"
    ), status
    stays_empty(lambda: [str(p.metadata.name) for p in admin_b.pods(VICTIM)])
    assert admitted_and_not_finished(get_workload(custom, tenant_a.namespace, VICTIM_WORKLOAD))
    assert gpus_reserved(custom, victim["cq"]) == str(GPUS_PER_WORLD)
    assert Jobs(api_client, tenant_a.namespace).status(VICTIM)["phase"] == "Running"


def test_a_priority_class_label_gives_a_dispatched_job_only_what_a_workloadpriorityclass_says(
    kueue: KueueProcess, tenant_a: Tenant, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    """The label kueue.x-k8s.io/priority-class on a job MultiKueue dispatches: its Workload (made here, by the
    operator) queues at the value of the cluster admin's WorkloadPriorityClass of that name. A tenant that
    names a pod PriorityClass instead (system-node-critical: on every cluster, two billion) gets no Workload
    at all, and one naming a class that is not there neither."""
    custom = client.CustomObjectsApi(api_client)
    admin = Jobs(api_client, tenant_a.namespace)
    high = f"high-{tenant_a.namespace}"
    wpc = {"apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass", "metadata": {"name": high},
           "value": 1000, "description": "the cluster admin's"}  # fmt: skip
    custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", wpc)
    try:
        dispatched = {"managedBy": MULTIKUEUE, **world()}
        create_job(tenant_a.jobs(), "prio", {PRIORITY_CLASS_LABEL: high}, **dispatched)
        create_job(tenant_a.jobs(), "critical", {PRIORITY_CLASS_LABEL: "system-node-critical"}, **dispatched)
        create_job(tenant_a.jobs(), "missing", {PRIORITY_CLASS_LABEL: f"none-{high}"}, **dispatched)
        workload = wait_for(
            lambda: _workload_or_none(custom, tenant_a.namespace, "dtjob-prio"), timeout=60,
            what="the dispatched job's Workload",
        )  # fmt: skip
        assert workload["spec"]["priority"] == 1000, workload["spec"]
        ref = workload["spec"].get("priorityClassRef") or {"name": workload["spec"].get("priorityClassName")}
        assert ref["name"] == high, workload["spec"]
        for name in ("critical", "missing"):
            admin.wait_event(name, NO_PRIORITY_CLASS)
        stays_empty(lambda: [
            n for n in ("dtjob-critical", "dtjob-missing")
            if _workload_or_none(custom, tenant_a.namespace, n) is not None
        ])  # fmt: skip
    finally:
        custom.delete_cluster_custom_object(*KUEUE, "workloadpriorityclasses", high)


def _workload_or_none(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return get_workload(custom, namespace, name)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
