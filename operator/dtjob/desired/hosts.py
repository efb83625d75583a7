"""The EndpointSlice of a job's headless Service: the operator's own MPI hosts, and nothing else. Pure.

The Service selects no pods (dtjob.desired.world.workers_service), so Kubernetes publishes nothing for it;
the cluster DNS answers `<host>.<job>-workers.<ns>.svc` (the hostfile's names) and the Service's own name (the
elastic discovery script's lookup) from this slice alone. Its hosts come from the pods the operator observed
as its own (dtjob.state.observed.observe_children checks their owner): a pod that only carries the job's
labels, hostname and subdomain is never among them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dtjob import names
from dtjob.desired.common import Json, metadata
from dtjob.desired.torchrun import service_port
from dtjob.spec.parse import JobSpec
from dtjob.state.hosts import MANAGED_BY_LABEL, SERVICE_NAME_LABEL, MpiHost
from dtjob.state.observed import PodState

# Kube-proxy skips the slices of headless Services (as the EndpointSlice controller labels them).
HEADLESS_LABEL = "service.kubernetes.io/headless"


def mpi_hosts(spec: JobSpec, pods: Iterable[PodState]) -> tuple[MpiHost, ...]:
    """The endpoints for `pods`, the current world's MPI hosts (its workers, and its launcher when it runs
    ranks), sorted: each pod that has an address and has neither ended nor is being deleted. Ready, so that
    its name resolves, as soon as it has an address (the launcher waits for every name before it starts);
    in an elastic world only once the pod is Ready: the Service's name lists the hosts Horovod trains on."""
    hosts = [
        MpiHost(_hostname(spec, pod), pod.address, pod.name, pod.uid, spec.elastic is None or pod.ready)
        for pod in pods
        if pod.address and not pod.deleting and not pod.finished
    ]
    return tuple(sorted(hosts))


def _hostname(spec: JobSpec, pod: PodState) -> str:
    """The pod's hostname as the operator set it: a worker's is its name, the launcher's the Job's name."""
    return names.launcher_name(spec.name) if pod.role == names.ROLE_LAUNCHER else pod.name


def hosts_slice(spec: JobSpec, owner: Json, hosts: Iterable[MpiHost]) -> Json:
    """The EndpointSlice named after the Service, listing `hosts` on the Service's port."""
    name = names.service_name(spec.name)
    listed = list(hosts)
    labels = {
        **names.labels(spec.name, "workers"),
        SERVICE_NAME_LABEL: name,
        MANAGED_BY_LABEL: names.SLICE_MANAGER,
        HEADLESS_LABEL: "",
    }
    port = service_port(spec)  # the Service's: sshd's, or a torchrun world's rendezvous
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata(name, spec.namespace, labels, owner),
        # A cluster gives every pod an address of its primary family (status.podIP).
        "addressType": "IPv6" if any(":" in host.address for host in listed) else "IPv4",
        "endpoints": [_endpoint(spec, host) for host in listed],
        "ports": [{"name": port[0], "port": port[1], "protocol": "TCP"}],
    }


def _endpoint(spec: JobSpec, host: MpiHost) -> dict[str, Any]:
    return {
        "addresses": [host.address],
        "hostname": host.hostname,
        "targetRef": {"kind": "Pod", "namespace": spec.namespace, "name": host.pod, "uid": host.uid},
        "conditions": {"ready": host.ready},
    }
