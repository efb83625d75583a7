"""The operator's Kubernetes client: generic verbs (create, get, list, patch, replace, delete) over the kinds
of dtjob.kube.rest.RESOURCES, a container's log, and Events. It knows nothing of jobs, worlds or owners:
get-or-create, owner checks and drift live in dtjob.reconcile.ensure, the caches in dtjob.runtime.

Every call has a deadline and bounded retries (dtjob.kube.connect), and is refused unless
dtjob.kube.permissions grants it. Every write goes through the client's fence: with leader election, a replica
that does not hold the Lease raises NotLeader (dtjob.runtime.lease) instead of writing, whatever asked; and a
write's tries, retries included, start only while it holds the Lease and each is cut off when its hold runs
out, so no write of a deposed leader is still being tried once another replica may lead.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Generator, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import urllib3

from dtjob import API_GROUP, API_VERSION, KIND
from dtjob.fence import Fence, NotLeader, Unfenced
from dtjob.kube.connect import RETRIED_STATUSES, ApiClient, retries_of, single_try
from dtjob.kube.errors import (
    ApiError,
    ApiNotServed,
    Conflict,
    Forbidden,
    LogUnavailable,
    NotOurs,
    Rejected,
    api_message,
    refusal,
)
from dtjob.kube.events import post_event, reference
from dtjob.kube.rest import (
    Json,
    api_call,
    api_version_of,
    discard,
    json_or_none,
    list_pages,
    read_json,
    rest_call,
)

__all__ = [
    "ApiNotServed",
    "Conflict",
    "Forbidden",
    "Keep",
    "Kube",
    "KubeClient",
    "LogUnavailable",
    "NotOurs",
    "Rejected",
    "identity_of",
]
log = logging.getLogger(__name__)
# What of each listed object a caller keeps (dtjob.kube.rest.list_pages).
Keep = Callable[[Json], Json]


def _whole(item: Json) -> Json:
    return item


def identity_of(item: Json) -> Json:
    """What a delete by UID reads of a listed object: its name, UID and owners, not what its writer put in
    it (a namespace admin's pod may carry megabytes of annotations)."""
    meta = item.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "ownerReferences") if k in meta}
    return {"metadata": kept}


# API groups the API server itself serves: a create answered 404 there means the namespace is gone, while
# for any other group it means the CRD behind the kind is not installed.
BUILT_IN_GROUPS = frozenset({"", "batch", "networking.k8s.io", "coordination.k8s.io", "discovery.k8s.io"})


class Kube(Protocol):
    """The Kubernetes API as the operator uses it. KubeClient talks to a real API server; unit tests use an
    in-memory recording implementation (tests/unit/recording_kube.py) with the same contract."""

    def create(self, obj: Json) -> Json | None:
        """Create `obj`; the object as created, None when an object of its name exists. Rejected (400, 422),
        Forbidden (403), ApiNotServed (404 for a kind no CRD serves)."""

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        """The object, or None when there is none (nor any API serving its kind). Forbidden (403)."""

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> builtins.list[Json]:  # fmt: skip
        """Every match (at most `limit`, else page by page); `cached`: the API server may answer from its
        watch cache; `keep`: what of each match is kept, as its page is read (objects that others write may
        be large: keep what is read of them). Forbidden (403), Rejected (400: a selector it cannot parse)."""

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None
    ) -> Json | None:
        """A merge patch (a JSON patch when `body` is a list); the object after it, None when there is no such
        object. Conflict (409: a resourceVersion in the body, or a JSON patch's test, no longer holds)."""

    def replace(self, obj: Json, resource_version: str) -> None:
        """Replace `obj` in place while it is at `resource_version`; Conflict when it moved on."""

    def delete(
        self, kind: str, namespace: str, name: str, api_version: str | None = None, uid: str | None = None,
        grace_period_s: int | None = None, background: bool = False,
    ) -> bool:  # fmt: skip
        """Delete it (only while it is the object `uid`, when given); False when it is gone already or
        was replaced. `background`: its dependents go after it (the garbage collector's)."""

    def read_log(
        self, namespace: str, pod: str, container: str, tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:  # fmt: skip
        """A container's log (pods/log); LogUnavailable when the kubelet cannot serve it."""

    def stream_log(self, namespace: str, pod: str, container: str) -> Generator[bytes, None, None]:
        """A container's whole log in chunks as they arrive; the request starts at the first next()."""

    def served_versions(self, group: str) -> builtins.list[str]:
        """The versions of API group `group` the API server serves (its discovery), the preferred one first;
        empty when it serves none (e.g. Kueue not installed)."""

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        """An Event about `obj` (a DistributedTrainingJob unless it names its kind), best effort."""

    def check_leader(self) -> None:
        """NotLeader unless this replica may write (Blob Storage writes ask before they start)."""


T = TypeVar("T")
# The pause before a write's next try: 0.2 s, 0.4 s, 0.8 s..., at most BACKOFF_MAX_S (as connect()'s retries).
BACKOFF_S = 0.2
BACKOFF_MAX_S = 5.0


def _within(api_client: ApiClient, left_s: float) -> tuple[float, float]:
    """The client's (connect, read) deadlines, each cut to the `left_s` seconds the fence still allows."""
    connect_s, read_s = api_client.timeout
    return min(connect_s, left_s), min(read_s, left_s)


class KubeClient:
    """Kube over the operator's own connection (dtjob.kube.connect), against a real API server."""

    def __init__(self, api_client: ApiClient, fence: Fence | None = None) -> None:
        self.api_client = api_client
        self.fence: Fence = fence or Unfenced()
        # Writes are tried by _write(), which retries them as `api_client` would, each try within the fence.
        self.write_client = single_try(api_client)
        self.write_retries = retries_of(api_client)

    def _write(self, call: Callable[[ApiClient, tuple[float, float]], T]) -> T:
        """`call(client, timeout)`, tried again as connect() retries a call (a 429 or 5xx answer, a broken
        connection; a timed-out read once), but every try starts only while the fence allows a write and is
        cut off when it no longer does: NotLeader instead of a try that could land after the Lease is lost."""
        timed_out = False
        for attempt in range(self.write_retries + 1):
            timeout = _within(self.write_client, self.fence.remaining_s())
            last = attempt == self.write_retries
            try:
                return call(self.write_client, timeout)
            except ApiError as err:
                if err.status not in RETRIED_STATUSES or last:
                    raise
            except urllib3.exceptions.ReadTimeoutError:
                if last or timed_out:
                    raise
                timed_out = True
            except (urllib3.exceptions.HTTPError, OSError):
                if last:
                    raise
            pause = min(BACKOFF_S * 2**attempt, BACKOFF_MAX_S)
            if pause >= self.fence.remaining_s():
                raise NotLeader("the leader Lease would run out before the write could be tried again")
            time.sleep(pause)
        raise AssertionError("unreachable: the last try returns or raises")

    def create(self, obj: Json) -> Json | None:
        kind, meta, version = obj["kind"], obj["metadata"], obj.get("apiVersion")
        try:
            answer = self._write(
                lambda api, timeout: api_call(
                    api, "create", kind, meta["namespace"], body=obj, timeout=timeout, api_version=version
                )
            )
        except ApiError as err:
            if err.status == 409:
                return None
            api_version = api_version_of(kind, version)
            if err.status == 404 and api_version.rpartition("/")[0] not in BUILT_IN_GROUPS:
                raise ApiNotServed(f"{kind} ({api_version})") from err
            refused = refusal(err, f"{kind} {meta['name']}")
            if refused is None:
                raise
            raise refused from err
        log.info("created %s %s/%s", kind, meta["namespace"], meta["name"])
        return read_json(answer)

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        try:
            return json_or_none(
                lambda: api_call(self.api_client, "get", kind, namespace, name, api_version=api_version)
            )
        except ApiError as err:
            if err.status == 403:
                raise Forbidden(f"get {kind} {name} refused by the API server: {api_message(err)}") from err
            raise

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> builtins.list[Json]:  # fmt: skip
        query = [
            (key, value) for key, value in (("labelSelector", labels), ("fieldSelector", fields)) if value
        ]
        if cached:  # resourceVersion 0: the API server answers from its watch cache, as informers' lists do
            query.append(("resourceVersion", "0"))
        try:
            if limit is not None:
                page = api_call(
                    self.api_client, "list", kind, namespace, query=[*query, ("limit", str(limit))]
                )
                return [(keep or _whole)(item) for item in read_json(page).get("items") or ()]
            return list_pages(self.api_client, kind, namespace, query, keep or _whole)[0]
        except ApiError as err:
            if err.status == 403:
                raise Forbidden(f"list {kind} refused by the API server: {api_message(err)}") from err
            if err.status == 400:
                raise Rejected(api_message(err)) from err
            raise

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None
    ) -> Json | None:
        try:
            answer = self._write(
                lambda api, timeout: api_call(
                    api, "patch", kind, namespace, name, body, timeout=timeout, api_version=api_version
                )
            )
        except ApiError as err:
            if err.status == 404:
                return None
            if err.status == 409 or (err.status == 422 and isinstance(body, list)):  # a JSON patch's test
                raise Conflict(f"{kind} {namespace}/{name} changed; retrying") from err
            raise
        log.info("patched %s %s/%s", kind, namespace, name)
        return read_json(answer)

    def replace(self, obj: Json, resource_version: str) -> None:
        kind, meta = obj["kind"], obj["metadata"]
        body = {**obj, "metadata": {**meta, "resourceVersion": resource_version}}
        version = obj.get("apiVersion")
        try:
            self._write(
                lambda api, timeout: discard(
                    api_call(
                        api, "update", kind, meta["namespace"], meta["name"], body, timeout=timeout,
                        api_version=version,
                    )
                )
            )  # fmt: skip
        except ApiError as err:
            if err.status == 409:
                raise Conflict(f"{kind} {meta['namespace']}/{meta['name']} changed; retrying") from err
            raise
        log.info("replaced %s %s/%s", kind, meta["namespace"], meta["name"])

    def delete(
        self, kind: str, namespace: str, name: str, api_version: str | None = None, uid: str | None = None,
        grace_period_s: int | None = None, background: bool = False,
    ) -> bool:  # fmt: skip
        options: Json = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if background:  # the object goes at once; the garbage collector removes its dependents
            options["propagationPolicy"] = "Background"
        try:
            self._write(
                lambda api, timeout: discard(
                    api_call(
                        api,
                        "delete",
                        kind,
                        namespace,
                        name,
                        options,
                        timeout=timeout,
                        api_version=api_version,
                    )
                )
            )
        except ApiError as err:
            if err.status in (404, 409):  # gone, or the name now belongs to another object
                return False
            raise
        log.info("deleted %s %s/%s", kind, namespace, name)
        return True

    def read_log(
        self, namespace: str, pod: str, container: str, tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:  # fmt: skip
        query = [("container", container)]
        query += [("tailLines", str(tail_lines))] if tail_lines is not None else []
        query += [("limitBytes", str(limit_bytes))] if limit_bytes is not None else []
        try:
            response = api_call(self.api_client, "get", "Pod/log", namespace, pod, query=query)
        except ApiError as err:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): {err.status} {err.reason}") from err
        data: bytes = response.data
        return data.decode(errors="replace")

    def stream_log(
        self, namespace: str, pod: str, container: str, chunk_bytes: int = 64 * 1024,
        connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0,
    ) -> Generator[bytes, None, None]:  # fmt: skip
        """Never held whole. LogUnavailable also when the stream breaks or stalls for `read_timeout_s` part
        way through. Closing the iterator early drops the connection (unread data must not go back to the
        pool)."""
        where = f"{namespace}/{pod} ({container})"
        timeout = (connect_timeout_s, read_timeout_s)
        try:
            response = api_call(
                self.api_client,
                "get",
                "Pod/log",
                namespace,
                pod,
                query=[("container", container)],
                timeout=timeout,
            )
        except ApiError as err:
            raise LogUnavailable(f"{where}: {err.status} {err.reason}") from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise LogUnavailable(f"{where}: {type(err).__name__}: {err}") from err
        complete, received = False, 0
        try:
            for chunk in response.stream(chunk_bytes, decode_content=True):
                received += len(chunk)
                yield chunk
            complete = True
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise LogUnavailable(
                f"{where}: the log stream broke after {received} bytes: {type(err).__name__}: {err}"
            ) from err
        finally:
            if not complete:
                response.close()
            response.release_conn()

    def served_versions(self, group: str) -> builtins.list[str]:
        path = f"/apis/{quote(group, safe='')}"  # discovery: every authenticated user may read it
        answer = json_or_none(lambda: rest_call(self.api_client, "GET", path))
        if answer is None:
            return []
        preferred = (answer.get("preferredVersion") or {}).get("version")
        versions = [str(v["version"]) for v in answer.get("versions") or () if v.get("version")]
        return sorted(versions, key=lambda version: version != preferred)

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        involved = reference(obj, f"{API_GROUP}/{API_VERSION}", KIND)
        self._write(
            lambda api, timeout: post_event(api, involved, kind, reason, message, now, timeout=timeout)
        )

    def check_leader(self) -> None:
        self.fence.check()
