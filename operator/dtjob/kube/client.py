"""The operator's Kubernetes client: generic verbs (create, get, list, patch, replace, delete) over the kinds
of dtjob.kube.rest.RESOURCES, a container's log, and Events. It knows nothing of jobs, worlds or owners:
get-or-create, owner checks and drift live in dtjob.reconcile.ensure, the caches in dtjob.runtime.

Every call has a deadline and bounded retries (dtjob.kube.connect), and is refused unless
dtjob.kube.permissions grants it. Every write first checks the client's fence: with leader election, a replica
that does not hold the Lease raises NotLeader (dtjob.runtime.lease) instead of writing, whatever asked.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Generator, Mapping
from datetime import datetime
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dtjob import API_GROUP, API_VERSION, KIND
from dtjob.fence import Fence, Unfenced
from dtjob.kube.errors import (
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
from dtjob.kube.rest import Json, api_call, api_version_of, discard, json_or_none, list_pages, read_json

__all__ = [
    "ApiNotServed",
    "Conflict",
    "Forbidden",
    "Kube",
    "KubeClient",
    "LogUnavailable",
    "NotOurs",
    "Rejected",
]
log = logging.getLogger(__name__)
# API groups the API server itself serves: a create answered 404 there means the namespace is gone, while
# for any other group it means the CRD behind the kind is not installed.
BUILT_IN_GROUPS = frozenset({"", "batch", "networking.k8s.io", "coordination.k8s.io"})


class Kube(Protocol):
    """The Kubernetes API as the operator uses it. KubeClient talks to a real API server; unit tests use an
    in-memory recording implementation (tests/unit/recording_kube.py) with the same contract."""

    def create(self, obj: Json) -> Json | None:
        """Create `obj`; the object as created, None when an object of its name exists. Rejected (400, 422),
        Forbidden (403), ApiNotServed (404 for a kind no CRD serves)."""

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        """The object, or None when there is none (nor any API serving its kind)."""

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False,
    ) -> builtins.list[Json]:  # fmt: skip
        """Every match (at most `limit`, else page by page); `cached`: the API server may answer from its
        watch cache. Forbidden (403), Rejected (400: a selector it cannot parse)."""

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

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        """An Event about `obj` (a DistributedTrainingJob unless it names its kind), best effort."""

    def check_leader(self) -> None:
        """NotLeader unless this replica may write (Blob Storage writes ask before they start)."""


class KubeClient:
    """Kube over the official client's connection, against a real API server."""

    def __init__(self, api_client: client.ApiClient, fence: Fence | None = None) -> None:
        self.api_client = api_client
        self.fence: Fence = fence or Unfenced()

    def create(self, obj: Json) -> Json | None:
        self.fence.check()
        kind, meta, version = obj["kind"], obj["metadata"], obj.get("apiVersion")
        try:
            answer = api_call(
                self.api_client, "create", kind, meta["namespace"], body=obj, api_version=version
            )
        except ApiException as err:
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
        return json_or_none(
            lambda: api_call(self.api_client, "get", kind, namespace, name, api_version=api_version)
        )

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False,
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
                return builtins.list(read_json(page).get("items") or [])
            return list_pages(self.api_client, kind, namespace, query, lambda item: item)[0]
        except ApiException as err:
            if err.status == 403:
                raise Forbidden(f"list {kind} refused by the API server: {api_message(err)}") from err
            if err.status == 400:
                raise Rejected(api_message(err)) from err
            raise

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None
    ) -> Json | None:
        self.fence.check()
        try:
            answer = api_call(self.api_client, "patch", kind, namespace, name, body, api_version=api_version)
        except ApiException as err:
            if err.status == 404:
                return None
            if err.status == 409 or (err.status == 422 and isinstance(body, list)):  # a JSON patch's test
                raise Conflict(f"{kind} {namespace}/{name} changed; retrying") from err
            raise
        log.info("patched %s %s/%s", kind, namespace, name)
        return read_json(answer)

    def replace(self, obj: Json, resource_version: str) -> None:
        self.fence.check()
        kind, meta = obj["kind"], obj["metadata"]
        body = {**obj, "metadata": {**meta, "resourceVersion": resource_version}}
        version = obj.get("apiVersion")
        try:
            discard(
                api_call(
                    self.api_client,
                    "update",
                    kind,
                    meta["namespace"],
                    meta["name"],
                    body,
                    api_version=version,
                )
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{kind} {meta['namespace']}/{meta['name']} changed; retrying") from err
            raise
        log.info("replaced %s %s/%s", kind, meta["namespace"], meta["name"])

    def delete(
        self, kind: str, namespace: str, name: str, api_version: str | None = None, uid: str | None = None,
        grace_period_s: int | None = None, background: bool = False,
    ) -> bool:  # fmt: skip
        self.fence.check()
        options: Json = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if background:  # the object goes at once; the garbage collector removes its dependents
            options["propagationPolicy"] = "Background"
        try:
            discard(
                api_call(self.api_client, "delete", kind, namespace, name, options, api_version=api_version)
            )
        except ApiException as err:
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
        except ApiException as err:
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
        except ApiException as err:
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

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        self.fence.check()
        involved = reference(obj, f"{API_GROUP}/{API_VERSION}", KIND)
        post_event(self.api_client, involved, kind, reason, message, now)

    def check_leader(self) -> None:
        self.fence.check()
