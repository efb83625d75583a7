"""API calls as plain JSON, by RBAC verb and kind: the one path every call of the operator's client takes.

The typed client validates a body into its model classes and serialises it back on every call: 0.16 ms of
CPU for a worker pod's create, against 0.004 ms for the same call as plain JSON (the network aside). A call
outside dtjob.kube.permissions.PERMISSIONS is refused here, so that table is all the operator ever calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from dtjob import API_GROUP, API_VERSION, KIND, PLURAL
from dtjob.kube import wire
from dtjob.kube.connect import ApiClient
from dtjob.kube.errors import ApiError
from dtjob.kube.permissions import COSCHEDULING_GROUP, KUEUE_GROUP, PERMISSIONS, VOLCANO_GROUP

Json = dict[str, Any]
# (apiVersion, kind) -> resource: every kind the client knows. A "<kind>/<subresource>" uses its kind's.
RESOURCES: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "Endpoints"): "endpoints",
    ("v1", "Secret"): "secrets",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Event"): "events",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Namespace"): "namespaces",
    ("v1", "Node"): "nodes",
    ("batch/v1", "Job"): "jobs",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("authentication.k8s.io/v1", "TokenReview"): "tokenreviews",
    ("authorization.k8s.io/v1", "SubjectAccessReview"): "subjectaccessreviews",
    (f"{API_GROUP}/{API_VERSION}", KIND): PLURAL,
    (f"{COSCHEDULING_GROUP}/v1alpha1", "PodGroup"): "podgroups",
    (f"{VOLCANO_GROUP}/v1beta1", "PodGroup"): "podgroups",
    # Kueue's API in the version the cluster serves (dtjob.reconcile.reads.kueue_api): v1beta2 from Kueue
    # v0.15 on (v0.20 serves only it), v1beta1 before.
    (f"{KUEUE_GROUP}/v1beta2", "Workload"): "workloads",
    (f"{KUEUE_GROUP}/v1beta1", "Workload"): "workloads",
    (f"{KUEUE_GROUP}/v1beta2", "WorkloadPriorityClass"): "workloadpriorityclasses",
    (f"{KUEUE_GROUP}/v1beta1", "WorkloadPriorityClass"): "workloadpriorityclasses",
}
# kind -> the apiVersions it is known under (a PodGroup under each gang scheduler's).
_VERSIONS: dict[str, tuple[str, ...]] = {
    kind: tuple(v for v, k in RESOURCES if k == kind) for _, kind in RESOURCES
}
# Items per page of a LIST (each page is decoded, then only what the caller keeps of each item).
LIST_PAGE = 250
# The most of a LIST page read before it is asked again with fewer items: a page is decoded whole before each
# item is cut, and whoever may create an object the LIST selects sizes it, up to the API server's 1.5 MiB. 250
# of the operator's own pods (about 7 KB each, managedFields included) come to under 2 MiB.
LIST_PAGE_BYTES = 8 * 1024 * 1024
# How many times fewer items a page asks for after one came larger than LIST_PAGE_BYTES.
LIST_PAGE_SHRINK = 10
# The content types of the calls' bodies.
JSON = "application/json"
# A LIST answered with each item's metadata alone (the API server's PartialObjectMetadataList).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_METHODS = {
    "create": "POST", "get": "GET", "list": "GET", "watch": "GET", "patch": "PATCH", "update": "PUT",
    "delete": "DELETE",
}  # fmt: skip


def api_version_of(kind: str, api_version: str | None = None) -> str:
    """`kind`'s apiVersion: `api_version` when given (and known), else the only one the client knows."""
    base = kind.partition("/")[0]
    known = _VERSIONS.get(base, ())
    if api_version is not None:
        if api_version not in known:
            raise ValueError(f"{base} ({api_version}) is not among dtjob.kube.rest.RESOURCES")
        return api_version
    if len(known) != 1:
        raise ValueError(f"{base}: name its apiVersion, one of {known}")
    return known[0]


def permission(verb: str, kind: str, api_version: str | None = None) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) of `verb` on `kind`, as RBAC names it."""
    base, _, subresource = kind.partition("/")
    version = api_version_of(kind, api_version)
    group = version.rpartition("/")[0]
    resource = RESOURCES[(version, base)]
    return group, f"{resource}/{subresource}" if subresource else resource, verb


def api_call(
    api_client: ApiClient,
    verb: str,
    kind: str,
    namespace: str | None,
    name: str = "",
    body: Any = None,
    query: Sequence[tuple[str, str]] = (),
    timeout: tuple[float, float] | None = None,
    api_version: str | None = None,
    accept: str = JSON,
) -> Any:
    """`verb` (as RBAC names it) on `kind` (a "<kind>/<subresource>" for a subresource) in `namespace` (None:
    every namespace, or a cluster-scoped kind), `name` for one object. Patches are merge patches (strategic
    for the core group's kinds), JSON patches when `body` is a list."""
    group, resource, _ = granted = permission(verb, kind, api_version)
    if granted not in PERMISSIONS:
        raise ValueError(f"{verb} {kind} is not among dtjob.kube.permissions.PERMISSIONS")
    version = api_version_of(kind, api_version)
    path = f"/apis/{version}" if group else "/api/v1"
    if namespace is not None:
        path += f"/namespaces/{quote(namespace, safe='')}"
    plural, _, subresource = resource.partition("/")
    path += f"/{plural}"
    if name:
        path += f"/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")
    if verb == "watch":
        query = [*query, ("watch", "true")]
    content_type = JSON
    if verb == "patch":
        content_type = JSON_PATCH if isinstance(body, list) else MERGE_PATCH if group else STRATEGIC_MERGE
    return rest_call(api_client, _METHODS[verb], path, body, query, content_type, timeout, accept)


def list_pages(
    api_client: ApiClient,
    kind: str,
    namespace: str | None,
    query: Sequence[tuple[str, str]],
    keep: Callable[[Json], Json],
    accept: str = JSON,
    page_size: int | None = None,
    page_bytes: int = LIST_PAGE_BYTES,
) -> tuple[list[Json], str]:
    """Every item of a LIST, `page_size` (LIST_PAGE) at a time, each passed through `keep` as its page is
    read, and the list's resourceVersion. Whole, the LIST of a namespace with a thousand jobs (five thousand
    pods) was decoded at once: the operator's peak memory. A page whose answer runs past `page_bytes` is
    dropped unread and asked again, from where it started, with LIST_PAGE_SHRINK times fewer items, down to
    one; the rest of the LIST keeps the smaller size."""
    items: list[Json] = []
    token = ""
    limit = page_size or LIST_PAGE
    while True:
        paging = [("limit", str(limit))] + ([("continue", token)] if token else [])
        answer = api_call(api_client, "list", kind, namespace, query=[*query, *paging], accept=accept)
        data = _body_within(answer, page_bytes) if limit > 1 else answer.read()
        if data is None:
            limit = max(1, limit // LIST_PAGE_SHRINK)
            continue
        page = wire.loads(data)
        items.extend(keep(item) for item in page.get("items") or ())
        meta = page.get("metadata") or {}
        token = str(meta.get("continue") or "")
        if not token:
            return items, str(meta.get("resourceVersion") or "")


def _body_within(answer: Any, most: int) -> bytes | None:
    """The whole body of an answer, or None (its connection closed, the rest unread) when it runs past
    `most` bytes. Read as it came: the operator asks for no content encoding, and urllib3's decoding keeps
    a second copy of what it reads."""
    data: bytes = answer.read(most + 1, decode_content=False)
    if len(data) > most:
        answer.close()
        answer.release_conn()
        return None
    end: bytes = answer.read(decode_content=False)  # nothing left; reading the end hands back the connection
    return data + end


def rest_call(
    api_client: ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: Sequence[tuple[str, str]] = (),
    content_type: str = JSON,
    timeout: tuple[float, float] | None = None,
    accept: str = JSON,
) -> Any:
    """One API call with `body` sent as JSON as it is, through the client's auth, deadlines (`timeout`,
    connect and read, or the client's), retries and metrics; the urllib3 answer, unread. ApiError for an
    answer outside 2xx."""
    headers = {"Accept": accept, "Content-Type": content_type}
    response = api_client.request(method, path, query, body, headers, timeout)
    if not 200 <= response.status <= 299:
        raise ApiError.from_response(response)
    return response


def read_json(response: Any) -> Json:
    data: Json = wire.loads(response.data)
    return data


def discard(response: Any) -> None:
    """Reads the rest of an answer whose body is not needed, so that its connection goes back to the pool:
    an unread answer holds its connection until garbage-collected, and the next call opens a new one (a TCP
    connect and a TLS handshake, the operator's largest CPU cost when it created children unread)."""
    response.drain_conn()
    response.release_conn()


def json_or_none(call: Callable[[], Any]) -> Json | None:
    """The answer's object, or None when the API server answered 404."""
    try:
        response = call()
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return read_json(response)
