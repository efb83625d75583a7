"""An in-memory Kube (dtjob.kube.client.Kube, the thin client's generic verbs) that records every call, for
unit tests of a reconcile's exact API traffic.

It keeps objects by (kind, namespace, name) and answers as the API server does where a reconcile depends on
it: False from create() for a name that is taken, None from get() for one that is not, merge patches,
resourceVersions that move on every write (and guard status patches and replaces), UID preconditions on
deletes, finalizers that keep a deleted object until they are off, and only the calls the client's
permission table grants. tests/integration/test_kube_contract.py runs the same scenarios against it and
against a real API server, so the two cannot drift. Faults are set per test: `conflict_next` makes the next
status patch raise Conflict, `reject` makes creates of a kind raise Rejected, `not_served` makes creates of
an apiVersion raise ApiNotServed (a CRD not installed), `leading` False makes check_leader() raise
NotLeader (a replica standing by), `node_pods` None makes listing a node's pods Forbidden (a
namespace-scoped install).
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dtjob.fence import NotLeader
from dtjob.kube.client import Keep
from dtjob.kube.connect import ApiClient
from dtjob.kube.credentials import Credentials
from dtjob.kube.errors import ApiNotServed, Conflict, Forbidden, LogUnavailable, Rejected
from dtjob.kube.permissions import PERMISSIONS
from dtjob.kube.rest import RESOURCES, permission

Json = dict[str, Any]
JOB_KIND = "DistributedTrainingJob"


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> Json:
    """RFC 7386 JSON merge patch, as the API server applies a merge-patch+json body: null removes a field."""
    out: Json = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = merge_patch({}, value) if isinstance(value, Mapping) else copy.deepcopy(value)
    return out


def _selected(obj: Mapping[str, Any], selector: str, fields: bool) -> bool:
    """Whether `obj` matches a label selector (or, `fields`, a field selector) of `k=v` and `k!=v` terms."""
    for term in filter(None, selector.split(",")):
        negated = "!=" in term
        key, _, value = term.partition("!=" if negated else "=")
        if fields:
            found: Any = obj
            for part in key.split("."):
                found = (found or {}).get(part) if isinstance(found, Mapping) else None
        else:
            found = ((obj.get("metadata") or {}).get("labels") or {}).get(key)
        if (str(found) == value) == negated:
            return False
    return True


@dataclass
class RecordingKube:
    objects: dict[tuple[str, str, str], Json] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name or selector)
    events: list[tuple[str, str]] = field(default_factory=list)  # (type, reason)
    logs: dict[str, str] = field(default_factory=dict)  # pod name -> log text
    failed_creates: dict[str, str] = field(default_factory=dict)  # Job uid -> its FailedCreate message
    settled: dict[tuple[str, str], str] = field(default_factory=dict)  # job -> the version it was settled at
    nodes: list[Json] = field(default_factory=list)
    conflict_next: bool = False
    reject: set[str] = field(default_factory=set)  # kinds whose creates the "API server" refuses
    leading: bool = True
    not_served: set[str] = field(default_factory=set)  # apiVersions the "API server" does not serve
    node_pods: dict[str, list[Json]] | None = field(default_factory=dict)  # None: listing them is forbidden
    _version: int = 1

    # --- test setup ----------------------------------------------------------------------------------

    def put(self, obj: Json) -> Json:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = self._next_version()
        meta.setdefault(
            "uid", f"uid-{meta['name']}-{meta['resourceVersion']}"
        )  # the API server names each one
        self.objects[(obj["kind"], meta.get("namespace") or "", meta["name"])] = obj
        return obj

    def writes(self) -> list[tuple[str, str, str]]:
        """The calls that change something, in order."""
        return [c for c in self.calls if not c[0].startswith(("get", "read", "list"))]

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    # --- Kube ----------------------------------------------------------------------------------------

    def create(self, obj: Json) -> Json | None:
        self.check_leader()
        kind, meta = obj["kind"], obj["metadata"]
        _permitted("create", kind, obj.get("apiVersion"))
        self.calls.append(("create", kind, meta["name"]))
        if kind in self.reject:
            raise Rejected(f"{kind} {meta['name']} rejected by the API server: refused by the test")
        if obj.get("apiVersion") in self.not_served:
            raise ApiNotServed(f"{kind} ({obj['apiVersion']})")
        if (kind, meta["namespace"], meta["name"]) in self.objects:
            return None
        self.put(obj)
        return copy.deepcopy(self.objects[(kind, meta["namespace"], meta["name"])])

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        _permitted("get", kind, api_version)
        self.calls.append(("get", kind, name))
        found = self.objects.get((kind, namespace or "", name))
        return copy.deepcopy(found) if found is not None else None

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> builtins.list[Json]:  # fmt: skip
        _permitted("list", kind)
        self.calls.append(("list", kind, labels or fields))
        found = self._listed(kind, namespace, labels, fields, limit)
        return [keep(obj) for obj in found] if keep is not None else found

    def _listed(
        self, kind: str, namespace: str | None, labels: str, fields: str, limit: int | None
    ) -> builtins.list[Json]:
        if kind == "Node":
            return copy.deepcopy(self.nodes)
        if kind == "Pod" and fields.startswith("spec.nodeName="):
            if self.node_pods is None:
                raise Forbidden("list Pod refused by the API server: forbidden by the test")
            node = fields.split(",")[0].removeprefix("spec.nodeName=")
            return copy.deepcopy(self.node_pods.get(node, []))
        found = [
            copy.deepcopy(obj)
            for (k, ns, _), obj in self.objects.items()
            if k == kind and namespace in (None, ns) and _selected(obj, labels, False)
        ]
        if kind == "Event":
            found += [{"reason": "FailedCreate", "involvedObject": {"uid": uid}, "message": message}
                      for uid, message in self.failed_creates.items()]  # fmt: skip
        found = [obj for obj in found if _selected(obj, fields, True)]
        return found[:limit] if limit is not None else found

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None
    ) -> Json | None:
        self.check_leader()
        _permitted("patch", kind, api_version)
        base, _, subresource = kind.partition("/")
        self.calls.append(("patch-status" if subresource == "status" else "patch", base, name))
        found = self.objects.get((base, namespace, name))
        if found is None:
            return None
        version = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, Mapping) else None
        moved_on = version not in (None, found["metadata"]["resourceVersion"])
        if (subresource == "status" and self.conflict_next) or moved_on:
            self.conflict_next = False
            raise Conflict(f"{kind} {namespace}/{name} changed; retrying")
        if isinstance(body, builtins.list):
            patched = _json_patch(found, body, f"{kind} {namespace}/{name}")
        elif subresource == "status":
            patched = {**found, "status": merge_patch(found.get("status") or {}, body.get("status") or {})}
        else:
            patched = merge_patch(found, {k: v for k, v in body.items() if k != "status"})
        patched["metadata"]["resourceVersion"] = self._next_version()
        self.objects[(base, namespace, name)] = patched
        if patched["metadata"].get("deletionTimestamp") and not patched["metadata"].get("finalizers"):
            del self.objects[(base, namespace, name)]  # its last finalizer was what kept it
        return copy.deepcopy(patched)

    def replace(self, obj: Json, resource_version: str) -> None:
        self.check_leader()
        kind, meta = obj["kind"], obj["metadata"]
        _permitted("update", kind, obj.get("apiVersion"))
        self.calls.append(("replace", kind, meta["name"]))
        found = self.objects.get((kind, meta["namespace"], meta["name"]))
        if found is None or found["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"{kind} {meta['namespace']}/{meta['name']} changed; retrying")
        self.put({**obj, "metadata": {**meta, "uid": found["metadata"].get("uid")}})

    def delete(
        self, kind: str, namespace: str, name: str, api_version: str | None = None, uid: str | None = None,
        grace_period_s: int | None = None, background: bool = False,
    ) -> bool:  # fmt: skip
        self.check_leader()
        _permitted("delete", kind, api_version)
        self.calls.append(("force-delete" if grace_period_s == 0 else "delete", kind, name))
        found = self.objects.get((kind, namespace, name))
        if found is None or (uid is not None and found["metadata"].get("uid") != uid):
            return False
        if found["metadata"].get("finalizers"):  # it stays, being deleted, until they are all off
            found["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
        else:
            del self.objects[(kind, namespace, name)]
        return True

    def read_log(
        self, namespace: str, pod: str, container: str, tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:  # fmt: skip
        _permitted("get", "Pod/log")
        self.calls.append(("read-log", "Pod", pod))
        if pod not in self.logs:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): 404")
        lines = self.logs[pod].splitlines(keepends=True)
        return "".join(lines[-tail_lines:] if tail_lines else lines)

    def stream_log(self, namespace: str, pod: str, container: str) -> Generator[bytes, None, None]:
        # A generator, as KubeClient's: the call happens at the first next().
        _permitted("get", "Pod/log")
        self.calls.append(("stream-log", "Pod", pod))
        if pod not in self.logs:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): 404")
        yield self.logs[pod].encode()

    def served_versions(self, group: str) -> builtins.list[str]:
        """Every version of `group` the client knows (the newest first), but those of `not_served`."""
        known = sorted(
            {v.rpartition("/")[2] for v, _ in RESOURCES if v.rpartition("/")[0] == group}, reverse=True
        )
        return [v for v in known if f"{group}/{v}" not in self.not_served]

    def job_settled(self, namespace: str, name: str, version: str) -> None:
        self.settled[namespace, name] = version

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        self.events.append((kind, reason))

    def check_leader(self) -> None:
        if not self.leading:
            raise NotLeader("standing by")


def _permitted(verb: str, kind: str, api_version: str | None = None) -> None:
    """As the client's every call: refused unless the permission table grants it."""
    if permission(verb, kind, api_version) not in PERMISSIONS:
        raise ValueError(f"{verb} {kind} is not among dtjob.kube.permissions.PERMISSIONS")


def _json_patch(obj: Json, ops: builtins.list[Json], what: str) -> Json:
    """The `test`, `remove`, `add` and `replace` operations of an RFC 6902 JSON patch (`add` of a member, not
    into a list); Conflict when a test fails."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        holder: Any = out
        for part in parents:
            holder = holder[int(part)] if isinstance(holder, builtins.list) else holder.get(part)
        key: Any = int(last) if isinstance(holder, builtins.list) else last
        listed = isinstance(holder, builtins.list) and key < len(holder)
        present = listed or (isinstance(holder, dict) and key in holder)
        if op["op"] == "test" and (not present or holder[key] != op["value"]):
            raise Conflict(f"{what} changed; retrying")
        if op["op"] == "remove":
            del holder[key]
        if op["op"] in ("add", "replace"):
            if op["op"] == "replace" and not present:
                raise ValueError(f"{what}: replace of {op['path']}, which is not there")
            holder[key] = copy.deepcopy(op["value"])
    return out


def unused_api() -> ApiClient:
    """An API client that the code under test holds but never calls here (nothing listens at its address)."""
    return ApiClient(Credentials(server="http://127.0.0.1:9"), (1.0, 1.0), retries=False)
