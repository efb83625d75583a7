"""The MPI hosts a job's headless Service publishes, as its EndpointSlices say. Pure.

The Service has no selector: Kubernetes' EndpointSlice controller would publish every pod labelled like the
job's MPI hosts, and a label is anyone's to set who may create pods in the namespace. The operator publishes
its own pods in one EndpointSlice of its own (dtjob.desired.hosts); the cluster DNS answers the hostfile's
names and the elastic discovery script's lookup from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dtjob import names

Json = Mapping[str, Any]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
# Kubernetes' EndpointSlice controller, which publishes the pods a Service's selector matches, and its
# mirroring controller, which publishes a selectorless Service's Endpoints object (as the Endpoints controller
# left it when the Service had a selector).
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
SLICE_MIRROR = "endpointslicemirroring-controller.k8s.io"
STALE_MANAGERS = (SLICE_CONTROLLER, SLICE_MIRROR)


@dataclass(frozen=True, order=True)
class MpiHost:
    """One endpoint of the job's headless Service: the name `<hostname>.<job>-workers.<ns>.svc` resolves to
    `address` while `ready` (the cluster DNS leaves out endpoints that are not ready)."""

    hostname: str
    address: str
    pod: str
    uid: str
    ready: bool


@dataclass(frozen=True)
class StaleSlice:
    """An EndpointSlice Kubernetes' controllers made for the Service because it had a selector (as an older
    operator created it): the pods it selected by label, directly or mirrored from the Endpoints object the
    Endpoints controller left. It publishes them until it is deleted."""

    name: str
    uid: str
    owners: frozenset[str]  # its ownerReferences' UIDs: the Service, or the Endpoints object it mirrors
    # Made by the mirroring controller, from the Endpoints object of the Service's name.
    mirrored: bool = False


@dataclass(frozen=True)
class PublishedHosts:
    """The Service's EndpointSlices as the watch cache holds them."""

    hosts: tuple[MpiHost, ...] | None = None  # the operator's slice's endpoints; None: it has none
    stale: tuple[StaleSlice, ...] = ()


def published_hosts(slices: Iterable[Json], job: str, job_uid: str) -> PublishedHosts:
    """What the Service of `job` (whose UID is `job_uid`) publishes: the endpoints of the operator's slice
    (named after the Service, owned by the job), and the slices Kubernetes' controllers made for it."""
    service = names.service_name(job)
    hosts: tuple[MpiHost, ...] | None = None
    stale: list[StaleSlice] = []
    for found in slices:
        meta = found.get("metadata") or {}
        labels = meta.get("labels") or {}
        owners = frozenset(str(ref.get("uid")) for ref in meta.get("ownerReferences") or () if ref.get("uid"))
        if meta.get("name") == service and job_uid in owners:
            hosts = slice_hosts(found)
        elif labels.get(SERVICE_NAME_LABEL) == service and labels.get(MANAGED_BY_LABEL) in STALE_MANAGERS:
            mirrored = labels.get(MANAGED_BY_LABEL) == SLICE_MIRROR
            stale.append(
                StaleSlice(str(meta.get("name") or ""), str(meta.get("uid") or ""), owners, mirrored)
            )
    return PublishedHosts(hosts, tuple(stale))


def slice_hosts(endpoint_slice: Json) -> tuple[MpiHost, ...]:
    """Every address of an EndpointSlice as a host, sorted; an endpoint without a ready condition is ready
    (as the API documents it, and the cluster DNS reads it)."""
    hosts: list[MpiHost] = []
    for endpoint in endpoint_slice.get("endpoints") or ():
        ref = endpoint.get("targetRef") or {}
        pod, uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
        ready = (endpoint.get("conditions") or {}).get("ready") is not False
        hostname = str(endpoint.get("hostname") or "")
        hosts.extend(
            MpiHost(hostname, str(address), pod, uid, ready) for address in endpoint.get("addresses") or ()
        )
    return tuple(sorted(hosts))
