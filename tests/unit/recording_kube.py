"""An in-memory Kube that records every call, for unit tests of a reconcile's exact API traffic.

It keeps objects by (kind, namespace, name) and answers as the API server would where the reconcile depends
on it: 409-style `False` from create_if_absent, ownership and owned-field drift in ensure() (the same pure
rules as KubeClient), resourceVersions that move on every write. Faults are set per test: `conflict_next`
makes the next status patch raise Conflict, `reject` makes creates of a kind raise Rejected, `not_served`
makes creates of an apiVersion raise ApiNotServed (a CRD not installed), `leading` False makes check_leader()
raise NotLeader (a replica standing by).
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dtjob.desired.owned import drift, is_ours, owner_uids
from dtjob.fence import NotLeader
from dtjob.kube.client import ApiNotServed, Applied, Conflict, LogUnavailable, Rejected

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


@dataclass
class RecordingKube:
    objects: dict[tuple[str, str, str], Json] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name)
    events: list[tuple[str, str]] = field(default_factory=list)  # (type, reason)
    logs: dict[str, str] = field(default_factory=dict)  # pod name -> log text
    failed_creates: dict[str, str] = field(default_factory=dict)  # Job uid -> its FailedCreate message
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
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def writes(self) -> list[tuple[str, str, str]]:
        """The calls that change something, in order."""
        return [c for c in self.calls if not c[0].startswith(("get", "read", "list"))]

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _get(self, kind: str, namespace: str, name: str, verb: str) -> Json | None:
        self.calls.append((verb, kind, name))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    # --- Kube ----------------------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> Json | None:
        return self._get(JOB_KIND, namespace, name, "get")

    def get_secret(self, namespace: str, name: str) -> Json | None:
        return self._get("Secret", namespace, name, "get")

    def get_pvc(self, namespace: str, name: str) -> Json | None:
        return self._get("PersistentVolumeClaim", namespace, name, "get")

    def get_namespace(self, name: str) -> Json | None:
        return self._get("Namespace", "", name, "get")

    def read_pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:
        self.calls.append(("read-log", "Pod", pod))
        if pod not in self.logs:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): 404")
        lines = self.logs[pod].splitlines(keepends=True)
        return "".join(lines[-tail_lines:] if tail_lines else lines)

    def poll_pod_log(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
    ) -> str | None:
        """Never throttled here: each poll reads (KubeClient's interval has its own test)."""
        return self.read_pod_log(namespace, pod, container, tail_lines, limit_bytes)

    def stream_pod_log(self, namespace: str, pod: str, container: str) -> Generator[bytes, None, None]:
        # A generator, as KubeClient's: the call happens at the first next().
        self.calls.append(("stream-log", "Pod", pod))
        if pod not in self.logs:
            raise LogUnavailable(f"{namespace}/{pod} ({container}): 404")
        yield self.logs[pod].encode()

    def list_nodes(self, label_selector: str, fresh: bool = False) -> list[Json]:
        self.calls.append(("list", "Node", label_selector))
        return copy.deepcopy(self.nodes)

    def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
    ) -> str:
        self.calls.append(("patch-status", JOB_KIND, name))
        job = self.objects[(JOB_KIND, namespace, name)]
        if self.conflict_next or job["metadata"]["resourceVersion"] != resource_version:
            self.conflict_next = False
            raise Conflict(f"{namespace}/{name} changed; retrying")
        job["status"] = merge_patch(job.get("status") or {}, status)
        job["metadata"]["resourceVersion"] = self._next_version()
        return str(job["metadata"]["resourceVersion"])

    def create_if_absent(self, obj: Json) -> bool:
        kind, meta = obj["kind"], obj["metadata"]
        self.calls.append(("create", kind, meta["name"]))
        if kind in self.reject:
            raise Rejected(f"{kind} {meta['name']} rejected by the API server: refused by the test")
        if obj.get("apiVersion") in self.not_served:
            raise ApiNotServed(f"{kind} ({obj['apiVersion']})")
        if (kind, meta["namespace"], meta["name"]) in self.objects:
            return False
        self.put(obj)
        return True

    def ensure(self, obj: Json) -> Applied:
        if self.create_if_absent(obj):
            return Applied.CREATED
        meta = obj["metadata"]
        existing = self.objects[(obj["kind"], meta["namespace"], meta["name"])]
        if not is_ours(existing, obj):
            return Applied.NOT_OURS
        patch = drift(obj, existing)
        if patch is None:
            return Applied.UNCHANGED
        self.calls.append(("patch", obj["kind"], meta["name"]))
        existing.update(copy.deepcopy(patch))
        return Applied.UPDATED

    def ensure_all(self, objs: Sequence[Json]) -> list[Applied]:
        """One after another, in order, so that the calls recorded are deterministic; like KubeClient's,
        every one is tried before the first error is raised."""
        applied: list[Applied] = []
        errors: list[Exception] = []
        for obj in objs:
            try:
                applied.append(self.ensure(obj))
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]
        return applied

    def replace_secret(self, obj: Json, resource_version: str) -> None:
        self.calls.append(("replace", "Secret", obj["metadata"]["name"]))
        self.put(obj)

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        self.calls.append(("delete", kind, name))
        self.objects.pop((kind, namespace, name), None)

    def delete_secret(self, namespace: str, name: str, owner_uid: str) -> None:
        found = self.objects.get(("Secret", namespace, name))
        if found is None or owner_uid in owner_uids(found):
            self._delete("Secret", namespace, name)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._delete("Pod", namespace, name)

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        found = self.objects.get(("Pod", namespace, name))
        self.calls.append(("force-delete", "Pod", name))
        if found is None or found["metadata"].get("uid") != uid:
            return False
        del self.objects[("Pod", namespace, name)]
        return True

    def remove_pod_finalizer(self, namespace: str, name: str, uid: str, finalizer: str) -> bool:
        found = self.objects.get(("Pod", namespace, name))
        self.calls.append(("remove-finalizer", "Pod", name))
        held = (found or {}).get("metadata", {}).get("finalizers") or []
        if found is None or found["metadata"].get("uid") != uid or finalizer not in held:
            return False
        held.remove(finalizer)
        return True

    def delete_batch_job(self, namespace: str, name: str) -> None:
        self._delete("Job", namespace, name)

    def delete_pods(self, namespace: str, label_selector: str, owner_uid: str) -> None:
        key, _, value = label_selector.partition("=")
        for kind, ns, name in list(self.objects):
            meta = self.objects[(kind, ns, name)]["metadata"]
            owned = owner_uid in owner_uids(self.objects[(kind, ns, name)])
            if kind == "Pod" and ns == namespace and (meta.get("labels") or {}).get(key) == value and owned:
                self._delete("Pod", ns, name)

    def delete_training_job(self, namespace: str, name: str) -> None:
        self._delete(JOB_KIND, namespace, name)

    def check_leader(self) -> None:
        if not self.leading:
            raise NotLeader("standing by")

    def delete_pod_group(self, api_version: str, namespace: str, name: str, owner_uid: str) -> None:
        found = self.objects.get(("PodGroup", namespace, name))
        if found is None or owner_uid in owner_uids(found):
            self._delete("PodGroup", namespace, name)

    def failed_create(self, namespace: str, job_uid: str) -> str | None:
        self.calls.append(("list", "Event", job_uid))
        return self.failed_creates.get(job_uid)

    def list_node_pods(self, node: str) -> list[Json] | None:
        self.calls.append(("list", "Pod", f"spec.nodeName={node}"))
        return None if self.node_pods is None else copy.deepcopy(self.node_pods.get(node, []))

    def emit_event(self, job: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        self.events.append((kind, reason))
