"""The apply layer: the only module that talks to the Kubernetes API (Kube, the Protocol the reconcile uses,
and KubeClient, its implementation over the official client; LeaseClient, the leader Lease's reads and
writes; AccessReviews, the token and access reviews behind the secure metrics endpoint).

Creates are create-if-absent (409 AlreadyExists means another reconcile got there first: fine), deletes are
delete-if-present (404 is success), so running any action twice changes nothing. Every write first checks
the client's fence: with leader election, a replica that does not hold the Lease raises NotLeader
(dtjob.runtime.lease) instead of writing, whatever asked for the write.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import quote

import urllib3
from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from dtjob import API_GROUP, API_VERSION, KIND, PLURAL, metrics
from dtjob.desired.owned import drift, is_ours, owner_uids
from dtjob.fence import Fence, Unfenced
from dtjob.gang.coscheduling import Coscheduling
from dtjob.gang.pod_groups import POD_GROUP_KIND
from dtjob.gang.volcano import Volcano
from dtjob.runtime.child_cache import projection
from dtjob.runtime.job_cache import JobCache
from dtjob.runtime.metrics_access import Identity
from dtjob.runtime.ttl_cache import TtlCache
from dtjob.timefmt import format_micro_time, format_time

log = logging.getLogger(__name__)
# A refused pod's Events: the Job controller records one per try (merged into a count), so a few are plenty;
# their message quotes the admission's answer, which can be long.
FAILED_CREATE_EVENTS = 20
FAILED_CREATE_MESSAGE_CHARS = 1000
Json = dict[str, Any]


class Conflict(Exception):
    """The object changed since it was read (HTTP 409 on an update): read again and retry."""


class LogUnavailable(Exception):
    """A container's log cannot be read (yet, or any more)."""


class Rejected(Exception):
    """The API server (or the client's own schema check) refused an object built from the spec."""


class Forbidden(Exception):
    """The API server refused a create with 403: admission (Pod Security, a ResourceQuota) or RBAC."""


class ApiNotServed(Exception):
    """The cluster does not serve an API a child needs: a gang scheduler's PodGroup, its CRD not installed."""


class NotOurs(Exception):
    """A child's name is taken by an object another owner holds (an older job of the same name, not yet
    garbage collected): the job waits instead of adopting it."""


class Applied(StrEnum):
    """What ensure() found and did."""

    CREATED = "Created"
    UNCHANGED = "Unchanged"
    UPDATED = "Updated"
    NOT_OURS = (
        "NotOurs"  # an object of that name exists and another owner's (say, an older job's of that name)
    )


class Kube(Protocol):
    """The Kubernetes API as a reconcile uses it. KubeClient talks to a real API server; unit tests use an
    in-memory recording implementation to check the exact calls of a reconcile."""

    def get_job(self, namespace: str, name: str) -> Json | None: ...
    def get_secret(self, namespace: str, name: str) -> Json | None: ...
    def get_pvc(self, namespace: str, name: str) -> Json | None: ...
    def get_namespace(self, name: str) -> Json | None: ...
    def failed_create(self, namespace: str, job_uid: str) -> str | None: ...
    def read_pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str: ...
    def poll_pod_log(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
    ) -> str | None: ...
    def stream_pod_log(self, namespace: str, pod: str, container: str) -> Generator[bytes, None, None]: ...
    def list_nodes(self, label_selector: str, fresh: bool = False) -> list[Json]: ...
    def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
    ) -> str: ...
    def create_if_absent(self, obj: Json) -> bool: ...
    def ensure(self, obj: Json) -> Applied: ...
    def ensure_all(self, objs: Sequence[Json]) -> list[Applied]: ...
    def replace_secret(self, obj: Json, resource_version: str) -> None: ...
    def delete_secret(self, namespace: str, name: str, owner_uid: str) -> None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...
    def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool: ...
    def remove_pod_finalizer(self, namespace: str, name: str, uid: str, finalizer: str) -> bool: ...
    def delete_batch_job(self, namespace: str, name: str) -> None: ...
    def delete_pods(self, namespace: str, label_selector: str, owner_uid: str) -> None: ...
    def delete_training_job(self, namespace: str, name: str) -> None: ...
    def delete_pod_group(self, api_version: str, namespace: str, name: str, owner_uid: str) -> None: ...
    def list_node_pods(self, node: str) -> list[Json] | None: ...
    def emit_event(
        self, job: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime
    ) -> None: ...
    def check_leader(self) -> None:
        """NotLeader unless this replica may write (Blob Storage writes ask before they start)."""


class ControllerKube(Kube, Protocol):
    """What the controller calls besides what its reconciles call: the LIST that corrects its cache."""

    def list_children(self, namespace: str, label_selector: str) -> list[tuple[str, Json]]: ...
    def remember_job(self, body: Mapping[str, Any]) -> None:
        """A job as a watch event showed it: get_job may answer with it."""

    def forget_job(self, namespace: str, name: str) -> None: ...


# Answers worth another try: the API server's "try again" (429, with Retry-After) and its transient failures.
# Every write the operator makes is safe to repeat: creates of fixed names (409 means it exists), status
# patches guarded by resourceVersion (409 means retry from a fresh read), deletes (404 means gone).
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
# How long a node list may be reused: nodes come and go in minutes (the autoscaler), jobs in bursts.
NODE_LIST_TTL_S = 10.0
# Locks that keep a burst of jobs from listing the same pool at once, shared by the selectors of a stripe.
NODE_LIST_LOCK_STRIPES = 64
# Items per page of the LISTs of children (each page is decoded, then only the cache's projection kept).
LIST_PAGE = 250
# The content types of the calls' bodies.
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
# How long a job's cached copy serves without a watch event or a write confirming it
# (dtjob.runtime.job_cache).
JOB_COPY_MAX_AGE_S = 60.0
# The creates of one ensure_all() in flight at once, across all reconciles: a world's objects, then its pods,
# go out together instead of one round trip after another.
PARALLEL_CREATES = 16


class _DeadlineApiClient(client.ApiClient):
    """An ApiClient whose every call has a deadline: `timeout` (connect, read) unless the call names its own,
    so that an API server that never answers cannot hold a reconcile's thread forever. Every call passes
    here, so here its latency and failure are recorded (dtjob.metrics), once for all call sites."""

    def __init__(self, configuration: client.Configuration, timeout: tuple[float, float]) -> None:
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        timeout = _request_timeout or self.timeout
        start = time.perf_counter()
        try:
            response = super().call_api(
                method, url, header_params, body, post_params, _request_timeout=timeout
            )
        except Exception as error:
            metrics.api_call_done(method, url, time.perf_counter() - start, None, error)
            raise
        metrics.api_call_done(method, url, time.perf_counter() - start, response.status, None)
        return response


def connect(
    connect_timeout: float, read_timeout: float, retries: int, pool_size: int | None = None
) -> client.ApiClient:
    """A client for the in-cluster API server (or the kubeconfig's), with a deadline on every call and
    bounded retries: `retries` for connection failures and 429/5xx answers, one for a read that timed out
    (so a hung call ends after twice the read timeout), backing off 0.2 s, 0.4 s, 0.8 s..."""
    configuration = client.Configuration()
    if pool_size is not None:  # one kept-alive connection per thread that calls: no handshake per call
        configuration.connection_pool_maxsize = pool_size
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)
    configuration.retries = Retry(
        total=retries + 1,
        connect=retries,
        read=min(retries, 1),
        status=retries,
        other=0,
        allowed_methods=None,  # every verb: see RETRIED_STATUSES
        status_forcelist=RETRIED_STATUSES,
        backoff_factor=0.2,
        backoff_max=5,
        raise_on_status=False,  # the last answer reaches the caller as an ApiException
    )
    return _DeadlineApiClient(configuration, (connect_timeout, read_timeout))


class KubeClient:
    """Kube over the official client, against a real API server."""

    def __init__(self, api_client: client.ApiClient, fence: Fence | None = None) -> None:
        self.api_client = api_client
        self.fence: Fence = fence or Unfenced()
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        # The gang schedulers' PodGroups, one client each (so that each API group's verbs are spelt out).
        self.coscheduling = client.CustomObjectsApi(api_client)
        self.volcano = client.CustomObjectsApi(api_client)
        # Node lists by selector: every new job's preflight reads its pool, and a burst of jobs would list
        # (and decode) the same nodes once each.
        self._node_lists: TtlCache[str, list[Json]] = TtlCache(NODE_LIST_TTL_S)
        # One lock per stripe of selectors, not per selector: selectors come from jobs' specs, and a lock
        # kept for every selector ever seen would grow without end.
        self._node_list_locks: tuple[threading.Lock, ...] = tuple(
            threading.Lock() for _ in range(NODE_LIST_LOCK_STRIPES)
        )
        self.jobs = JobCache(JOB_COPY_MAX_AGE_S)
        # When each log tail was last read, by (namespace, pod, container): progress polls read it at most
        # once per interval however many events reconcile the job.
        self._log_polls: dict[tuple[str, str, str], float] = {}
        self._log_polls_lock = threading.Lock()
        self.clock: Callable[[], float] = time.monotonic  # for the polls' intervals
        self._creates = ThreadPoolExecutor(PARALLEL_CREATES, thread_name_prefix="create")

    # --- reads ---------------------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> Json | None:
        """The job from the watch's copy when it holds a recent one (dtjob.runtime.job_cache), else from a
        GET."""
        cached = self.jobs.get(namespace, name)
        if cached is not None:
            return cached
        job = _raw_or_none(lambda: self._call("get", KIND, namespace, name))
        if job is None:
            self.jobs.forget(namespace, name)
        else:
            self.jobs.put(job)
        return job

    def remember_job(self, body: Mapping[str, Any]) -> None:
        self.jobs.put(body)

    def forget_job(self, namespace: str, name: str) -> None:
        self.jobs.forget(namespace, name)

    def get_secret(self, namespace: str, name: str) -> Json | None:
        return self._read("Secret", namespace, name)

    def get_pvc(self, namespace: str, name: str) -> Json | None:
        return _raw_or_none(
            lambda: self.core.read_namespaced_persistent_volume_claim(name, namespace, _preload_content=False)
        )

    def get_namespace(self, name: str) -> Json | None:
        """The Namespace object (its annotations carry the namespace's storage allowlists)."""
        return _raw_or_none(lambda: self.core.read_namespace(name, _preload_content=False))

    def failed_create(self, namespace: str, job_uid: str) -> str | None:
        """What the API server answered the Job controller when it refused the pod of the Job `job_uid` (its
        newest FailedCreate Event: Pod Security, a ResourceQuota), or None. Admission refuses the pod, not
        the Job, so the Job itself never says why it has no pod."""
        selector = f"involvedObject.uid={job_uid},reason=FailedCreate"
        response: Any = self.core.list_namespaced_event(
            namespace, field_selector=selector, limit=FAILED_CREATE_EVENTS, _preload_content=False
        )
        items = json.loads(response.data).get("items") or []
        if not items:
            return None
        newest = max(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return str(newest.get("message") or "")[:FAILED_CREATE_MESSAGE_CHARS] or None

    def read_pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:
        """A container's log through the API server (pods/log); LogUnavailable when the kubelet cannot serve
        it (pod gone, container not started yet, node unreachable)."""
        kwargs: dict[str, Any] = {"container": container, "_preload_content": False}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        if limit_bytes is not None:
            kwargs["limit_bytes"] = limit_bytes
        try:
            response: Any = self.core.read_namespaced_pod_log(pod, namespace, **kwargs)
        except ApiException as err:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): {err.status} {err.reason}") from err
        data: bytes = response.data
        return data.decode(errors="replace")

    def poll_pod_log(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
    ) -> str | None:
        """read_pod_log()'s tail, or None when this pod's container was polled less than `every_s` ago."""
        key, now = (namespace, pod, container), self.clock()
        with self._log_polls_lock:
            last = self._log_polls.get(key)
            if last is not None and now - last < every_s:
                return None
            if len(self._log_polls) > 4096:  # pods come and go: drop what is past its interval
                self._log_polls = {k: at for k, at in self._log_polls.items() if now - at < every_s}
            self._log_polls[key] = now
        return self.read_pod_log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes)

    def stream_pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        chunk_bytes: int = 64 * 1024,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
    ) -> Generator[bytes, None, None]:
        """A container's whole log through the API server (pods/log), in chunks of at most `chunk_bytes` as
        they arrive, never held whole. The request starts at the first `next()`. LogUnavailable when the
        kubelet cannot serve it, or when the stream breaks or stalls for `read_timeout_s` part way through.
        Closing the iterator early drops the connection (unread data must not go back to the pool)."""
        try:
            response: Any = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                _preload_content=False,
                _request_timeout=(connect_timeout_s, read_timeout_s),
            )
        except ApiException as err:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): {err.status} {err.reason}") from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): {type(err).__name__}: {err}") from err
        complete = False
        received = 0
        try:
            for chunk in response.stream(chunk_bytes, decode_content=True):
                received += len(chunk)
                yield chunk
            complete = True
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise LogUnavailable(
                f"{namespace}/{pod} ({container}): the log stream broke after {received} bytes: "
                f"{type(err).__name__}: {err}"
            ) from err
        finally:
            if not complete:
                response.close()
            response.release_conn()

    def list_children(self, namespace: str, label_selector: str) -> list[tuple[str, Json]]:
        """Every pod and batch Job in `namespace` matching the selector, as ("pods" | "jobs", the cache's
        projection of it): one consistent read each, for the children cache's resync."""
        query = [("labelSelector", label_selector)]
        pods, _ = list_pages(self.api_client, "Pod", namespace, query, projection)
        jobs, _ = list_pages(self.api_client, "Job", namespace, query, projection)
        return [*(("pods", item) for item in pods), *(("jobs", item) for item in jobs)]

    def list_nodes(self, label_selector: str, fresh: bool = False) -> list[Json]:
        """Nodes matching the selector; empty when RBAC forbids listing nodes (a namespace-scoped install).
        Rejected when the API server refuses the selector itself (400: a key or value it cannot parse).
        The answer may be up to NODE_LIST_TTL_S old unless `fresh`. Only what the checks read is kept of each
        node: its name, labels, schedulability, taints and resources. Callers must not change the nodes."""
        # One list per selector at a time: a burst of new jobs would otherwise list the same pool once per
        # reconcile thread before the first answer is cached.
        stripe = zlib.crc32(label_selector.encode()) % len(self._node_list_locks)
        with self._node_list_locks[stripe]:
            if not fresh and (cached := self._node_lists.get(label_selector)) is not None:
                return list(cached)
            return list(self._list_nodes(label_selector, fresh))

    def _list_nodes(self, label_selector: str, fresh: bool) -> list[Json]:
        # resourceVersion 0: the API server answers from its watch cache, as informers' lists do.
        version = None if fresh else "0"
        try:
            response: Any = self.core.list_node(
                label_selector=label_selector, resource_version=version, _preload_content=False
            )
        except ApiException as err:
            if err.status == 403:
                log.warning("cannot list nodes (forbidden): skipping the GPUs-per-node check")
                self._node_lists.put(label_selector, [])
                return []
            if err.status == 400:
                raise Rejected(f"node selector {label_selector!r} refused: {_api_message(err)}") from err
            raise
        nodes = [_node_projection(node) for node in json.loads(response.data).get("items") or []]
        self._node_lists.put(label_selector, nodes)
        return nodes

    # --- writes: each checks the fence first --------------------------------------------------------

    def check_leader(self) -> None:
        self.fence.check()

    def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
    ) -> str:
        """Merge-patch status, guarded by resourceVersion so a stale read never overwrites newer status.
        Returns the job's resourceVersion after the patch."""
        self.fence.check()
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        try:
            response = self._call("patch", f"{KIND}/status", namespace, name, body)
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{namespace}/{name} changed; retrying") from err
            raise
        job = json.loads(response.data)
        self.jobs.put(job)  # the next reconcile decides from this status, not from the watch's older one
        return str(job["metadata"]["resourceVersion"])

    def create_if_absent(self, obj: Json) -> bool:
        """Create obj; False when it already exists."""
        self.fence.check()
        kind = obj["kind"]
        namespace = obj["metadata"]["namespace"]
        if kind == POD_GROUP_KIND:
            return self._create_pod_group(obj)
        name = obj["metadata"]["name"]
        try:
            _discard(self._call("create", kind, namespace, body=obj))
        except ApiException as err:
            if err.status == 409:
                return False
            if err.status in (400, 422):
                raise Rejected(f"{kind} {name} rejected by the API server: {_api_message(err)}") from err
            if err.status == 403:
                raise Forbidden(f"{kind} {name} refused by the API server: {_api_message(err)}") from err
            raise
        log.info("created %s %s/%s", kind, namespace, name)
        return True

    def ensure(self, obj: Json) -> Applied:
        """Create obj; or, when it exists, check that it is ours (an ownerReference with our UID) and bring
        the fields the operator owns back in line (dtjob.desired.owned). A create answered 409 for an
        object that is gone again, or on its way out, raises Conflict: the world that needs it must not
        go on without it, so the job is retried shortly instead of at the next event."""
        if self.create_if_absent(obj):
            return Applied.CREATED
        kind, meta = obj["kind"], obj["metadata"]
        existing = self._read(kind, meta["namespace"], meta["name"], obj["apiVersion"])
        if existing is None or (existing.get("metadata") or {}).get("deletionTimestamp"):
            state = "gone" if existing is None else "being deleted"
            raise Conflict(
                f"{kind} {meta['namespace']}/{meta['name']} already exists, but is {state}; retrying"
            )
        if not is_ours(existing, obj):
            return Applied.NOT_OURS
        patch = drift(obj, existing)
        if patch is None:
            return Applied.UNCHANGED
        if kind == POD_GROUP_KIND:
            self._pod_group_call(obj["apiVersion"], "patch", meta["namespace"], meta["name"], patch)
        else:
            self._patch(kind, meta["namespace"], meta["name"], patch)
        log.info("updated %s %s/%s", kind, meta["namespace"], meta["name"])
        return Applied.UPDATED

    def ensure_all(self, objs: Sequence[Json]) -> list[Applied]:
        """ensure() each, all at once; when some fail, the first one's error (in `objs` order) once all
        have ended, so nothing is left running behind the caller."""
        if len(objs) < 2:
            return [self.ensure(obj) for obj in objs]
        futures = [self._creates.submit(self.ensure, obj) for obj in objs]
        errors = [error for future in futures if (error := future.exception()) is not None]
        if errors:
            raise errors[0]
        return [future.result() for future in futures]

    def _read(self, kind: str, namespace: str, name: str, api_version: str = "v1") -> Json | None:
        if kind == POD_GROUP_KIND:
            return _raw_or_none(lambda: self._pod_group_call(api_version, "get", namespace, name))
        return _raw_or_none(lambda: self._call("get", kind, namespace, name))

    def _patch(self, kind: str, namespace: str, name: str, body: Json) -> None:
        self.fence.check()
        _discard(self._call("patch", kind, namespace, name, body))

    def _call(
        self,
        verb: str,
        kind: str,
        namespace: str,
        name: str = "",
        body: Any = None,
        query: Sequence[tuple[str, str]] = (),
    ) -> Any:
        return api_call(self.api_client, verb, kind, namespace, name, body, query)

    def replace_secret(self, obj: Json, resource_version: str) -> None:
        """Replace a Secret's content in place (mounted copies follow); guarded by resourceVersion."""
        self.fence.check()
        meta = obj["metadata"]
        body: Any = {**obj, "metadata": {**meta, "resourceVersion": resource_version}}
        try:
            replace = self.core.replace_namespaced_secret
            _discard(replace(meta["name"], meta["namespace"], body, _preload_content=False))
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"Secret {meta['namespace']}/{meta['name']} changed; retrying") from err
            raise
        log.info("replaced Secret %s/%s", meta["namespace"], meta["name"])

    def delete_secret(self, namespace: str, name: str, owner_uid: str) -> None:
        """Delete the Secret only while `owner_uid` owns it: the name alone may be another owner's (an older
        job of the same name, or anything a namespace editor put there). The delete is conditional on the UID
        that was read, so nothing created in between is ever deleted."""
        self.fence.check()
        secret = self.get_secret(namespace, name)
        if secret is None:
            return
        meta = secret.get("metadata") or {}
        if owner_uid not in owner_uids(secret):
            log.warning("left Secret %s/%s alone: it is not owned by %s", namespace, name, owner_uid)
            return
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta.get("uid")))
        try:
            _discard(self.core.delete_namespaced_secret(name, namespace, body=body, _preload_content=False))
        except ApiException as err:
            if err.status in (404, 409):  # gone, or replaced since the read
                return
            raise
        log.info("deleted Secret %s/%s", namespace, name)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.fence.check()
        _ignore_404(lambda: self.core.delete_namespaced_pod(name, namespace, _preload_content=False))
        log.info("deleted Pod %s/%s", namespace, name)

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete a pod at once, without its kubelet's confirmation (grace period 0), and only while it is the
        pod with `uid`. False when it is gone already or was replaced."""
        self.fence.check()
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            _discard(self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False))
        except ApiException as err:
            if err.status in (404, 409):  # gone, or the name now belongs to another pod
                return False
            raise
        log.warning("force-deleted Pod %s/%s (uid %s): still terminating past its grace period", namespace,
                    name, uid)  # fmt: skip
        return True

    def remove_pod_finalizer(self, namespace: str, name: str, uid: str, finalizer: str) -> bool:
        """Take `finalizer` off the pod while it is the pod with `uid` (a JSON patch whose tests fail on any
        other pod, or on a list changed since the read). False: gone, replaced, or the finalizer is off."""
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        meta = pod.metadata
        present = list((meta.finalizers if meta else None) or ())
        if meta is None or meta.uid != uid or finalizer not in present:
            return False
        at = present.index(finalizer)
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": f"/metadata/finalizers/{at}", "value": finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{at}"},
        ]
        try:
            self.core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
        except ApiException as err:
            if err.status in (
                404,
                409,
                422,
            ):  # gone, or changed since the read: the next reconcile looks again
                return False
            raise
        log.info("removed finalizer %s from Pod %s/%s", finalizer, namespace, name)
        return True

    def delete_batch_job(self, namespace: str, name: str) -> None:
        self.fence.check()
        # Background: the Job object goes at once and the garbage collector removes its pods.
        _ignore_404(
            lambda: self.batch.delete_namespaced_job(
                name, namespace, propagation_policy="Background", _preload_content=False
            )
        )
        log.info("deleted Job %s/%s", namespace, name)

    def delete_pods(self, namespace: str, label_selector: str, owner_uid: str) -> None:
        """Delete the pods the selector finds that `owner_uid` owns (a label is anyone's to set), each only
        while it is the pod that was listed."""
        self.fence.check()
        response: Any = self.core.list_namespaced_pod(
            namespace, label_selector=label_selector, _preload_content=False
        )
        for pod in json.loads(response.data).get("items") or []:
            meta = pod["metadata"]
            if owner_uid not in owner_uids(pod):
                continue
            body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta.get("uid")))
            try:
                _discard(
                    self.core.delete_namespaced_pod(
                        meta["name"], namespace, body=body, _preload_content=False
                    )
                )
            except ApiException as err:
                if err.status not in (404, 409):
                    raise
            log.info("deleted Pod %s/%s", namespace, meta["name"])

    def delete_training_job(self, namespace: str, name: str) -> None:
        self.fence.check()
        _ignore_404(
            lambda: self.custom.delete_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, PLURAL, name, propagation_policy="Background"
            )
        )

    def list_node_pods(self, node: str) -> list[Json] | None:
        """The pods bound to `node` that have not ended, in every namespace; None when that is forbidden (a
        namespace-scoped install)."""
        selector = f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
        try:
            response: Any = self.core.list_pod_for_all_namespaces(
                field_selector=selector, _preload_content=False
            )
        except ApiException as err:
            if err.status == 403:
                return None
            raise
        return list(json.loads(response.data).get("items") or [])

    # --- the gang schedulers' PodGroups ----------------------------------------------------------------

    def _create_pod_group(self, obj: Json) -> bool:
        meta = obj["metadata"]
        try:
            self._pod_group_call(obj["apiVersion"], "create", meta["namespace"], meta["name"], obj)
        except ApiException as err:
            if err.status == 409:
                return False
            if err.status == 404:  # no such API (the namespace exists: its job is in it)
                raise ApiNotServed(f"{POD_GROUP_KIND} ({obj['apiVersion']})") from err
            if err.status in (400, 422):
                raise Rejected(
                    f"{POD_GROUP_KIND} {meta['name']} rejected by the API server: {_api_message(err)}"
                ) from err
            if err.status == 403:
                raise Forbidden(
                    f"{POD_GROUP_KIND} {meta['name']} refused by the API server: {_api_message(err)}"
                ) from err
            raise
        log.info("created %s %s/%s (%s)", POD_GROUP_KIND, meta["namespace"], meta["name"], obj["apiVersion"])
        return True

    def delete_pod_group(self, api_version: str, namespace: str, name: str, owner_uid: str) -> None:
        """Delete-if-present and only while `owner_uid` owns it (the name alone may be another owner's), on
        the condition of the UID that was read; a cluster that no longer serves the API has none to delete."""
        self.fence.check()
        group = _raw_or_none(lambda: self._pod_group_call(api_version, "get", namespace, name))
        if group is None:
            return
        if owner_uid not in owner_uids(group):
            log.warning(
                "left %s %s/%s alone: it is not owned by %s", POD_GROUP_KIND, namespace, name, owner_uid
            )
            return
        precondition = {"preconditions": {"uid": (group.get("metadata") or {}).get("uid")}}
        try:
            _discard(self._pod_group_call(api_version, "delete", namespace, name, precondition))
        except ApiException as err:
            if err.status in (404, 409):  # gone, or replaced since the read
                return
            raise
        log.info("deleted %s %s/%s (%s)", POD_GROUP_KIND, namespace, name, api_version)

    def _pod_group_call(
        self, api_version: str, verb: str, namespace: str, name: str, body: Json | None = None
    ) -> Any:
        """One call on a PodGroup of either gang scheduler's API; each client's calls are spelt out."""
        group, version = api_version.split("/", 1)
        plural = "podgroups"
        payload: Any = body or {}  # a delete's body is its DeleteOptions
        if api_version == Coscheduling.pod_group_api:
            calls: dict[str, Any] = {
                "create": lambda: self.coscheduling.create_namespaced_custom_object(
                    group, version, namespace, plural, payload, _preload_content=False
                ),
                "get": lambda: self.coscheduling.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                ),
                "patch": lambda: self.coscheduling.patch_namespaced_custom_object(
                    group, version, namespace, plural, name, payload, _preload_content=False
                ),
                "delete": lambda: self.coscheduling.delete_namespaced_custom_object(
                    group, version, namespace, plural, name, body=payload, _preload_content=False
                ),
            }
        elif api_version == Volcano.pod_group_api:
            calls = {
                "create": lambda: self.volcano.create_namespaced_custom_object(
                    group, version, namespace, plural, payload, _preload_content=False
                ),
                "get": lambda: self.volcano.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                ),
                "patch": lambda: self.volcano.patch_namespaced_custom_object(
                    group, version, namespace, plural, name, payload, _preload_content=False
                ),
                "delete": lambda: self.volcano.delete_namespaced_custom_object(
                    group, version, namespace, plural, name, body=payload, _preload_content=False
                ),
            }
        else:
            raise ValueError(f"no PodGroup API {api_version}")
        return calls[verb]()

    def emit_event(self, job: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        self.fence.check()
        meta = job["metadata"]
        involved = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND}
        _post_event(self.api_client, {**involved, **_reference(meta)}, kind, reason, message, now)


def _reference(meta: Mapping[str, Any]) -> Json:
    return {key: meta.get(key) for key in ("name", "namespace", "uid", "resourceVersion")}


def _post_event(
    api_client: client.ApiClient,
    involved: Json,
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    instance: str = "dtjob-operator",
) -> None:
    """An Event about `involved` (an object reference), best effort: a failure is logged, never raised."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": format_time(now),
        "lastTimestamp": format_time(now),
        "eventTime": format_micro_time(now),
        "count": 1,
        "reportingComponent": "dtjob-operator",
        "reportingInstance": instance[:128],
        "action": reason,
        "source": {"component": "dtjob-operator"},
    }
    try:
        body: Any = event
        _discard(api_call(api_client, "create", "Event", involved["namespace"], body=body))
    except ApiException as err:  # events are best effort: never fail a reconcile over one
        log.warning("could not post event %s on %s: %s", reason, involved["name"], err.reason)


class AccessReviews:
    """Who is behind a bearer token (a TokenReview) and whether that user may use a non-resource URL (a
    SubjectAccessReview): the API server's own answers, for dtjob.runtime.metrics_access. Needs `create` on
    tokenreviews and subjectaccessreviews (authentication.k8s.io, authorization.k8s.io)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.authentication = client.AuthenticationV1Api(api_client)
        self.authorization = client.AuthorizationV1Api(api_client)

    def authenticate(self, token: str) -> Identity | None:
        body: Any = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        response: Any = self.authentication.create_token_review(body, _preload_content=False)
        status = (json.loads(response.data).get("status")) or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return None
        extra = {str(k): tuple(str(v) for v in vs or ()) for k, vs in (user.get("extra") or {}).items()}
        groups = tuple(str(g) for g in user.get("groups") or ())
        return Identity(str(user["username"]), str(user.get("uid") or ""), groups, extra)

    def may(self, who: Identity, verb: str, path: str) -> bool:
        spec: Json = {
            "user": who.user,
            "groups": list(who.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra.items()}
        body: Any = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        response: Any = self.authorization.create_subject_access_review(body, _preload_content=False)
        return bool((json.loads(response.data).get("status") or {}).get("allowed"))


class LeaseClient:
    """The leader Lease (coordination.k8s.io/v1) of the operator's replicas: read, created, replaced under
    its resourceVersion, and the Event that tells of a new holder. Not fenced: these writes are how a replica
    gets to write at all. Its own client, with deadlines of the election's retry period and no retries of
    its own, so that a slow API server costs one round of the election loop, not its renew deadline."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self.api_client = api_client
        self.coordination = client.CoordinationV1Api(api_client)

    def read(self) -> Json | None:
        return _raw_or_none(
            lambda: self.coordination.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        )

    def create(self, spec: Json) -> Json | None:
        """The Lease created with `spec`; None when one exists already (another replica was first)."""
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            response: Any = self.coordination.create_namespaced_lease(
                self.namespace, body, _preload_content=False
            )
        except ApiException as err:
            if err.status == 409:
                return None
            raise
        data: Json = json.loads(response.data)
        return data

    def replace(self, spec: Json, resource_version: str) -> Json:
        """The Lease with `spec`, only if it is still at `resource_version`; Conflict if it moved on."""
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": resource_version},
            "spec": spec,
        }
        try:
            response: Any = self.coordination.replace_namespaced_lease(
                self.name, self.namespace, body, _preload_content=False
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"Lease {self.namespace}/{self.name} changed since it was read") from err
            raise
        data: Json = json.loads(response.data)
        return data

    def announce(
        self, lease: Mapping[str, Any], reason: str, message: str, now: datetime, instance: str
    ) -> None:
        involved = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **_reference(lease["metadata"])}
        _post_event(self.api_client, involved, "Normal", reason, message, now, instance)


# The calls the operator makes as plain JSON (api_call), by RBAC verb, and the kinds each verb is used on. A
# call outside this table is refused, so the table is what the chart must grant for them (tests' test_rbac).
# The typed client validates a body into its model classes and serialises it back on every call: 0.16 ms of
# CPU for a worker pod's create, against 0.004 ms for the same call as plain JSON (the network aside).
PLAIN_CALLS: dict[str, frozenset[str]] = {
    "create": frozenset({"Pod", "Service", "Secret", "ConfigMap", "Job", "NetworkPolicy", "Event"}),
    "get": frozenset({"Pod", "Service", "Secret", "ConfigMap", "Job", "NetworkPolicy", KIND}),
    "patch": frozenset({"Service", "ConfigMap", "NetworkPolicy", f"{KIND}/status"}),
    "list": frozenset({"Pod", "Job"}),
    "watch": frozenset({"Pod", "Job"}),
}
# kind -> (API group, version, resource); a "<kind>/<subresource>" uses its kind's.
RESOURCES: dict[str, tuple[str, str, str]] = {
    "Pod": ("", "v1", "pods"),
    "Service": ("", "v1", "services"),
    "Secret": ("", "v1", "secrets"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Event": ("", "v1", "events"),
    "Job": ("batch", "v1", "jobs"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    KIND: (API_GROUP, API_VERSION, PLURAL),
}
_METHODS = {"create": "POST", "get": "GET", "list": "GET", "watch": "GET", "patch": "PATCH"}


def api_call(
    api_client: client.ApiClient,
    verb: str,
    kind: str,
    namespace: str | None,
    name: str = "",
    body: Any = None,
    query: Sequence[tuple[str, str]] = (),
    timeout: tuple[float, float] | None = None,
) -> Any:
    """`verb` (as RBAC names it) on `kind` (a "<kind>/<subresource>" for a subresource) in `namespace` (None:
    every namespace), `name` for one object. Patches are merge patches (strategic for built-in kinds)."""
    if kind not in PLAIN_CALLS.get(verb, ()):
        raise ValueError(f"{verb} {kind} is not among dtjob.kube.client.PLAIN_CALLS")
    base, _, subresource = kind.partition("/")
    group, version, plural = RESOURCES[base]
    path = "/api/v1" if not group else f"/apis/{group}/{version}"
    if namespace is not None:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")
    if verb == "watch":
        query = [*query, ("watch", "true")]
    content_type = JSON
    if verb == "patch":
        content_type = STRATEGIC_MERGE if not group else MERGE_PATCH
    return rest_call(api_client, _METHODS[verb], path, body, query, content_type, timeout)


def list_pages(
    api_client: client.ApiClient,
    kind: str,
    namespace: str | None,
    query: Sequence[tuple[str, str]],
    keep: Callable[[Json], Json],
) -> tuple[list[Json], str]:
    """Every item of a LIST, LIST_PAGE at a time, each passed through `keep` as its page is read, and the
    list's resourceVersion. Whole, the LIST of a namespace with a thousand jobs (five thousand pods) was
    decoded at once: the operator's peak memory."""
    items: list[Json] = []
    token = ""
    while True:
        paging = [("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
        page = json.loads(api_call(api_client, "list", kind, namespace, query=[*query, *paging]).data)
        items.extend(keep(item) for item in page.get("items") or ())
        meta = page.get("metadata") or {}
        token = str(meta.get("continue") or "")
        if not token:
            return items, str(meta.get("resourceVersion") or "")


def rest_call(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: Sequence[tuple[str, str]] = (),
    content_type: str = JSON,
    timeout: tuple[float, float] | None = None,
) -> Any:
    """One API call with `body` sent as JSON as it is, through the client's auth, deadlines (`timeout`,
    connect and read, or the client's), retries and metrics (its call_api); the urllib3 answer, unread.
    ApiException for an answer outside 2xx, as the typed client raises it."""
    headers = {"Accept": JSON, "Content-Type": content_type}
    _, url, headers, _, _ = api_client.param_serialize(
        method, path, query_params=list(query), header_params=headers, auth_settings=["BearerToken"]
    )
    response = api_client.call_api(method, url, headers, body, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()  # type: ignore[no-untyped-call]
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def _node_projection(node: Mapping[str, Any]) -> Json:
    meta, spec, status = (node.get(part) or {} for part in ("metadata", "spec", "status"))
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {"allocatable": status.get("allocatable") or {}, "capacity": status.get("capacity") or {}},
    }


def _raw_or_none(call: Any) -> Json | None:
    try:
        response = call()
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    data: Json = json.loads(response.data)
    return data


def _discard(response: Any) -> None:
    """Reads the rest of an answer whose body is not needed, so that its connection goes back to the pool:
    an unread answer holds its connection until garbage-collected, and the next call opens a new one (a TCP
    connect and a TLS handshake, the operator's largest CPU cost when it created children unread)."""
    response.drain_conn()
    response.release_conn()


def _ignore_404(call: Any) -> None:
    try:
        _discard(call())
    except ApiException as err:
        if err.status != 404:
            raise


def _api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(err.reason)
