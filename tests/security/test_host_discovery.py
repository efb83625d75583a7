"""The MPI world's names under attack: a pod that merely looks like a job's worker must not become one of its
hosts.

The hostfile names `<job>-worker-<i>.<job>-workers.<ns>.svc` and an elastic job's discovery script asks the
cluster DNS for `<job>-workers.<ns>.svc`: whatever the Service's EndpointSlices list gets the launcher's ssh,
the ranks' traffic and, through them, the weights. A tenant's admin (Kubernetes' built-in `admin` role, which
may create pods) labels a pod like the victim's worker, with its hostname and subdomain; the operator's slice
must list only the operator's own pods, and the tenant may not write slices of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "900s"}}
# Kubernetes' EndpointSlice controller publishes a pod its Service selects within moments of its address.
CONTROLLER_GRACE_S = 8.0
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def endpoints(api_client: client.ApiClient, namespace: str, service: str) -> list[tuple[str, str, bool]]:
    """(address, hostname, ready) of every endpoint the Service's EndpointSlices list: what the cluster DNS
    answers its names with (the ready ones)."""
    slices = client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(
        namespace, label_selector=f"{SERVICE_NAME_LABEL}={service}"
    )
    found = []
    for endpoint_slice in slices.items:
        for endpoint in endpoint_slice.endpoints or []:
            ready = endpoint.conditions is None or endpoint.conditions.ready is not False
            found += [(address, str(endpoint.hostname or ""), ready) for address in endpoint.addresses]
    return sorted(found)


def operator_hosts(admin: Jobs, job: str) -> list[tuple[str, str, bool]]:
    """The job's own worker pods (owned by the job) as (address, hostname, ready): what may be published."""
    uid = (admin.get(job) or {})["metadata"]["uid"]
    own = [p for p in admin.live_workers(job) if any(r.uid == uid for r in p.metadata.owner_references or [])]
    return sorted((str(p.status.pod_ip), str(p.spec.hostname), True) for p in own if p.status.pod_ip)


def impersonate(tenant: Tenant, worker: client.V1Pod, name: str) -> str:
    """As the tenant's admin: a pod with the worker's labels, hostname, subdomain and placement (so that it
    lands on a node and gets an address). Returns its name."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(worker.metadata.labels or {})},
        "spec": {
            "hostname": worker.spec.hostname,
            "subdomain": worker.spec.subdomain,
            "nodeSelector": dict(worker.spec.node_selector or {}),
            "tolerations": [t.to_dict() for t in worker.spec.tolerations or []],
            "containers": [{"name": "sshd", "image": "example.com/impostor:latest"}],
        },
    }
    tenant.core(ADMIN).create_namespaced_pod(tenant.namespace, cast(Any, body))
    return name


def address_of(admin: Jobs, pod: str) -> str | None:
    found = admin.core.read_namespaced_pod(pod, admin.ns)
    ready = any(c.type == "Ready" and c.status == "True" for c in found.status.conditions or [])
    return str(found.status.pod_ip) if ready and found.status.pod_ip else None


def never(predicate: Callable[[], bool], seconds: float, what: Callable[[], str]) -> None:
    """`predicate` stays false for `seconds` (the time the controller would take to act)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not predicate(), what()
        time.sleep(0.25)


def settles(problem: Callable[[], str | None], seconds: float) -> None:
    """`problem()` (what is still wrong, or None) becomes None within `seconds`."""
    deadline = time.monotonic() + seconds
    while (found := problem()) is not None:
        assert time.monotonic() < deadline, found
        time.sleep(0.25)


# An elastic MPI job, whose discovery script lists the Service's Ready endpoints; a torchrun job, whose
# workers all meet at worker 0's name (the rendezvous store, which asks for no credential); an elastic one,
# whose agents meet there again after every loss and whose replacement workers join there.
VICTIMS: dict[str, dict[str, Any]] = {
    "elastic-mpi": {"elastic": {"minWorkers": 1, "maxWorkers": 2}, "launcher": LONG_LAUNCHER},
    "torchrun": {"torchrun": {}},
    "elastic-torchrun": {"torchrun": {}, "elastic": {"minWorkers": 1, "maxWorkers": 2}},
}


@pytest.mark.parametrize("kind", sorted(VICTIMS))
def test_a_pod_labelled_like_a_jobs_worker_is_never_published_under_its_names(
    api_client: client.ApiClient, tenant_a: Tenant, operator: OperatorProcess, kind: str
) -> None:
    """A job and an impostor of its worker 0, Ready, on a node, with an address: the Service's slices list
    only the operator's pods, so neither the MPI hosts' names nor the torchrun rendezvous reach it."""
    victim = f"victim-{kind}"
    service = f"{victim}-workers"
    tenant_a.jobs().create(victim, workers=2, gpusPerWorker=1, **VICTIMS[kind])
    admin = Jobs(api_client, tenant_a.namespace)
    admin.wait_phase(victim, "Running", timeout=120)
    ours = wait_for(
        lambda: hosts if len(hosts := operator_hosts(admin, victim)) == 2 else None,
        timeout=30, what="both workers with an address",
    )  # fmt: skip
    wait_for(
        lambda: endpoints(api_client, admin.ns, service) == ours, timeout=30, what="the workers published"
    )

    worker = admin.core.read_namespaced_pod(f"{victim}-worker-0", admin.ns)
    impostor = impersonate(tenant_a, worker, f"impostor-{kind}")
    rogue = wait_for(
        lambda: address_of(admin, impostor), timeout=60, what="the impostor Ready with an address"
    )
    never(
        lambda: rogue in {address for address, _, _ in endpoints(api_client, admin.ns, service)},
        CONTROLLER_GRACE_S,
        lambda: (
            f"the impostor's {rogue} is published for {service}: {endpoints(api_client, admin.ns, service)}"
        ),
    )
    assert endpoints(api_client, admin.ns, service) == operator_hosts(admin, victim)
    found = admin.core.read_namespaced_service(service, admin.ns)
    assert found.spec.selector is None, f"the Service selects pods by label: {found.spec.selector}"


def test_a_tenant_may_not_publish_hosts_and_a_selector_put_back_is_taken_off_again(
    api_client: client.ApiClient, tenant_a: Tenant, operator: OperatorProcess
) -> None:
    """The tenant's admin cannot write EndpointSlices or Endpoints (Kubernetes' admin and edit roles lost them
    in 1.22, CVE-2021-25740). It may edit Services: a selector put back on the job's Service (as an older
    operator created it) is taken off again, and the slices Kubernetes' controller made for it deleted."""
    victim, service = "victim", "victim-workers"
    tenant_a.jobs().create(victim, workers=2, gpusPerWorker=1, launcher=LONG_LAUNCHER)
    admin = Jobs(api_client, tenant_a.namespace)
    admin.wait_phase(victim, "Running", timeout=120)
    worker = admin.core.read_namespaced_pod(f"{victim}-worker-0", admin.ns)
    impostor = impersonate(tenant_a, worker, "impostor")
    rogue = wait_for(
        lambda: address_of(admin, impostor), timeout=60, what="the impostor Ready with an address"
    )

    own_slice: Any = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-extra", "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [rogue], "hostname": f"{victim}-worker-0"}],
        "ports": [{"name": "ssh", "port": 2222, "protocol": "TCP"}],
    }
    for write in (
        lambda: client.DiscoveryV1Api(tenant_a.api(ADMIN)).create_namespaced_endpoint_slice(
            admin.ns, own_slice
        ),
        lambda: client.DiscoveryV1Api(tenant_a.api(ADMIN)).patch_namespaced_endpoint_slice(
            service, admin.ns, {"endpoints": own_slice["endpoints"]}
        ),
        lambda: tenant_a.core(ADMIN).create_namespaced_endpoints(
            admin.ns, cast(Any, {"metadata": {"name": service}, "subsets": [{"addresses": [{"ip": rogue}]}]})
        ),
    ):
        with pytest.raises(ApiException) as refused:
            write()
        assert refused.value.status == 403, refused.value

    # As an older operator created it. A headless Service without a selector is given both IP families, which
    # a single-stack cluster refuses for one with a selector: one family then.
    selector = {"dtjob.io/job-name": victim, "dtjob.io/mpi-host": "true"}
    families = {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]}
    tenant_a.core(ADMIN).patch_namespaced_service(
        service, admin.ns, {"spec": {"selector": selector, **families}}
    )

    def problem() -> str | None:
        found = admin.core.read_namespaced_service(service, admin.ns).spec.selector
        published, ours = endpoints(api_client, admin.ns, service), operator_hosts(admin, victim)
        if found is None and published == ours:
            return None
        return f"selector {found}; published {published}; the operator's pods {ours}; the impostor {rogue}"

    settles(problem, 30)
