"""The operator's cache of its children (pods, staging Jobs, the EndpointSlices of its Service),
grouped by the job they belong to.

Watch events keep it current; a LIST from the API server, at start and every resync, corrects it. The LIST
is what makes it heal: after a watch ends with 410 Gone, kopf lists the objects again and watches from
there, but an object deleted while the watch was down simply is not in the new list, and nothing emits its
deletion. An index built from events alone keeps such an object for good (a worker pod that is gone stays
"Running" in the operator's eyes). `replace()` does what client-go's informers do on a re-list: whatever the
LIST no longer holds is forgotten.

Objects are told apart by uid (a name comes back with a new uid; a uid never comes back), and a newer
resourceVersion wins over an older one when both are integers, as the API server's etcd revisions are.
Pure and single-threaded: the controller calls it on the event loop only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dtjob import names
from dtjob.gang import kueue
from dtjob.names import AVOIDED_NODES_ANNOTATION, ROLE_STAGER
from dtjob.runtime.failed_creates import JOB_UID_MAX_CHARS, FailedCreates
from dtjob.state import hosts
from dtjob.state.observed import Children
from dtjob.state.pod_state import PER_CONTAINER_READS

Key = tuple[str, str]  # (namespace, job name)
Json = Mapping[str, Any]
PODS, JOBS, SLICES = "pods", "jobs", "endpointslices"
# The kinds watched, and the cache's name for each.
CHILD_KINDS = {"Pod": PODS, "Job": JOBS, "EndpointSlice": SLICES}
# An EndpointSlice's hosts: it has neither spec nor status. Kept for the operator's own slice only (named as
# the job's Service, dtjob.state.hosts), the one whose hosts are read: any Service of a served namespace with
# the watch's labels gets slices of its own, each as large as the pods it selects.
SLICE_FIELDS = ("addressType", "endpoints", "ports")
# How long a deleted uid is remembered, so that a LIST taken before its deletion cannot bring it back.
TOMBSTONE_S = 600.0
# What of a child's labels, finalizers and scheduling gates anything reads from the cache. Anyone who may make
# pods or Jobs in a served namespace may put the watch's labels on them, and labels, finalizers and gates have
# no count limit short of the object's 1.5 MiB: the rest is never kept.
KEPT_LABELS = frozenset({
    names.JOB_NAME_LABEL, names.ROLE_LABEL, names.ATTEMPT_LABEL, names.WORKER_INDEX_LABEL,
    names.WORLD_SIZE_LABEL, hosts.SERVICE_NAME_LABEL, hosts.MANAGED_BY_LABEL, kueue.POD_GROUP_NAME_LABEL,
})  # fmt: skip
KEPT_FINALIZERS = frozenset({kueue.POD_FINALIZER})
KEPT_GATES = frozenset({kueue.ADMISSION_GATE, names.LAUNCH_GATE})
# The operator sets one owner, the Job controller one; a few more leave room for others' without keeping a
# list as long as the object allows.
OWNERS_KEPT = 4
# The nodes a worker was kept off, comma-separated: a pool's worth of node names, not an annotation's 256 KiB.
AVOIDED_NODES_MAX_CHARS = 16 * 1024
# A job goes ahead of the others (its workers all Ready: the launcher may start) at most once in this long. A
# world turns Ready once; a namespace admin whose pods, labelled as a job's workers, turn Ready and not Ready
# again and again would otherwise keep its jobs ahead of every other tenant's.
URGENT_EVERY_S = 10.0
# And a namespace's jobs, together, at most this many times in URGENT_EVERY_S: an admin's many real jobs would
# otherwise each get a turn, and the lane would be theirs. A job that is not let ahead is reconciled in turn.
URGENT_PER_NAMESPACE = 10


def projection(body: Json) -> dict[str, Any]:
    """The parts of a child the state machine reads, plus its identity; keeps the cache small."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    avoided = (meta.get("annotations") or {}).get(AVOIDED_NODES_ANNOTATION)
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            # Only the owners' UIDs: a job re-created under the same name must not adopt what the old left.
            "ownerReferences": [
                {"uid": uid}
                for ref in (meta.get("ownerReferences") or ())[:OWNERS_KEPT]
                if isinstance(uid := ref.get("uid"), str) and len(uid) <= JOB_UID_MAX_CHARS
            ],
            "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in KEPT_LABELS},
            # The annotations the state machine reads: the nodes a worker was kept off, the size of the
            # Kueue pod group it was made for, and Kueue's mark that the launcher's group may finish.
            "annotations": {
                **(
                    {AVOIDED_NODES_ANNOTATION: avoided}
                    if isinstance(avoided, str) and len(avoided) <= AVOIDED_NODES_MAX_CHARS
                    else {}
                ),
                **({kueue.RETRIABLE_IN_GROUP: kueue.NOT_RETRIABLE} if kueue.not_retriable(body) else {}),
                **({kueue.POD_GROUP_TOTAL_COUNT: str(size)} if (size := kueue.group_size_of(body)) else {}),
            },
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "creationTimestamp": meta.get("creationTimestamp"),
            # Kueue's finalizer, which the operator takes off its own ended pods.
            "finalizers": [f for f in meta.get("finalizers") or () if f in KEPT_FINALIZERS],
        },
        # Kueue's admission gate (a worker that waits for its group's admission) and the operator's own on a
        # launcher pod held until its workers are Ready.
        # ... and the node it is bound to, whose conditions say whether it can keep the pod.
        "spec": {
            "schedulingGates": [g for g in spec.get("schedulingGates") or () if g.get("name") in KEPT_GATES],
            "nodeName": spec.get("nodeName"),
        },
        "status": _status(body.get("status") or {}),
        **({key: body[key] for key in SLICE_FIELDS if key in body} if _the_jobs_slice(meta) else {}),
    }


def _the_jobs_slice(meta: Json) -> bool:
    job = (meta.get("labels") or {}).get(names.JOB_NAME_LABEL)
    return isinstance(job, str) and meta.get("name") == names.service_name(job)


# A pod's status is the kubelet's, but as long as the job's spec makes it: one entry per container, each with
# its image and the kubelet's message (an image that cannot be pulled is named in it). Kept per container:
# what pod_state reads; a terminated container's message to the kubelet's own bound (the stager's outcome is
# read from it), any other text to a line's worth (pod_state names one of them in the job's message).
CONTAINER_STATUS_KEPT = ("name", "ready", "started", "restartCount", "state", "lastState")
CONTAINER_STATUS_LISTS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
TERMINATION_MESSAGE_MAX_CHARS = 4096
STATUS_TEXT_MAX_CHARS = 512
# Of each list, the first this many entries, the operator's own containers' and, past those, only the first
# entry each of pod_state's per-container reads says something of: pod_state reads the same, and a template
# of a thousand sidecars costs the cache a few dozen entries per pod.
CONTAINER_STATUSES_KEPT = 16
OPERATOR_CONTAINERS = frozenset(names.CONTAINER_OF_ROLE.values())


def _status(status: Json) -> dict[str, Any]:
    kept = {k: _cut(v) for k, v in status.items() if k not in CONTAINER_STATUS_LISTS}
    for key in CONTAINER_STATUS_LISTS:
        if isinstance(found := status.get(key), list):
            kept[key] = [_container_status(cs) for cs in _telling(found)]
    return kept


def _telling(found: list[Any]) -> list[Json]:
    entries = [cs for cs in found if isinstance(cs, dict)]
    keep = set(range(min(len(entries), CONTAINER_STATUSES_KEPT)))
    keep |= {i for i, cs in enumerate(entries) if cs.get("name") in OPERATOR_CONTAINERS}
    for read in PER_CONTAINER_READS:
        first = next((i for i, cs in enumerate(entries) if read(cs) is not None), None)
        keep |= {first} if first is not None else set()
    return [entries[i] for i in sorted(keep)]


def _container_status(found: Json) -> dict[str, Any]:
    kept = {k: _cut(found[k]) for k in CONTAINER_STATUS_KEPT if k in found}
    for state in ("state", "lastState"):
        terminated = found[state].get("terminated") if isinstance(found.get(state), dict) else None
        if isinstance(terminated, dict) and isinstance(message := terminated.get("message"), str):
            kept[state]["terminated"]["message"] = message[:TERMINATION_MESSAGE_MAX_CHARS]
    return kept


def _cut(value: Any) -> Any:
    """`value` with every text in it cut to STATUS_TEXT_MAX_CHARS."""
    if isinstance(value, str):
        return value[:STATUS_TEXT_MAX_CHARS]
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def pod_ready(obj: Json) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def job_key(obj: Json) -> Key | None:
    meta = obj.get("metadata") or {}
    namespace, job = meta.get("namespace"), (meta.get("labels") or {}).get(names.JOB_NAME_LABEL)
    return (str(namespace), str(job)) if namespace and job else None


def _version(obj: Json) -> int | None:
    text = (obj.get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


@dataclass(frozen=True)
class _Entry:
    kind: str
    key: Key
    obj: dict[str, Any]
    version: int | None


class ChildCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, _Entry] = {}  # by uid, in the order they were first seen
        self._by_key: dict[Key, dict[str, None]] = {}  # job -> uids of its children, in the same order
        self._tombstones: dict[str, float] = {}  # uid -> when it was deleted
        self._urgent_at: dict[Key, float] = {}  # job -> when its workers last all turned Ready
        self._namespace_turns: dict[str, deque[float]] = {}  # namespace -> its jobs' turns within the bound
        self._clock = clock
        self.failed_creates = FailedCreates()  # why the launcher's or stager's pod was refused

    # --- feeding -------------------------------------------------------------------------------------

    def observe(self, kind: str, body: Json, deleted: bool) -> Key | None:
        """A watch event; returns the key of the job whose children changed (None: nothing changed)."""
        obj = projection(body)
        uid, key = obj["metadata"]["uid"], job_key(obj)
        if not uid or key is None:
            return None
        if deleted:
            self._tombstones[uid] = self._clock()
            return key if self._drop(uid) is not None else None
        if uid in self._tombstones:
            return None  # a late event for an object already gone
        return key if self._put(kind, key, obj) else None

    def turns_ready(self, body: Json) -> bool:
        """Whether this pod, as a watch event shows it, is Ready while the cache holds it not Ready (or not
        at all). Ask before observe()."""
        if not pod_ready(body):
            return False
        old = self._entries.get((body.get("metadata") or {}).get("uid") or "")
        return old is None or not pod_ready(old.obj)

    def uids(self, namespace: str) -> frozenset[str]:
        """The uids cached in `namespace`: take this before a LIST and hand it to replace()."""
        return frozenset(uid for key, uids in self._by_key.items() if key[0] == namespace for uid in uids)

    def replace(self, namespace: str, listed: Iterable[tuple[str, Json]], before: frozenset[str]) -> set[Key]:
        """Correct the cache from a LIST of `namespace` (kind, object) taken after `before` was read: what
        was cached before the LIST and is not in it is gone; what the LIST holds and the cache lacks (or
        holds older) is put in. Objects seen only after the LIST began are left alone. Returns the keys
        of the jobs whose children changed."""
        now = self._clock()
        self._tombstones = {uid: at for uid, at in self._tombstones.items() if now - at < TOMBSTONE_S}
        changed: set[Key] = set()
        seen: set[str] = set()
        for kind, body in listed:
            obj = projection(body)
            uid, key = obj["metadata"]["uid"], job_key(obj)
            if not uid or key is None or key[0] != namespace:
                continue
            seen.add(uid)
            if uid not in self._tombstones and self._put(kind, key, obj):
                changed.add(key)
        for uid in before - seen:
            entry = self._drop(uid)
            if entry is not None:
                self._tombstones[uid] = now
                changed.add(entry.key)
        return changed

    def _put(self, kind: str, key: Key, obj: dict[str, Any]) -> bool:
        uid = obj["metadata"]["uid"]
        version = _version(obj)
        old = self._entries.get(uid)
        if old is not None:
            if old.version is not None and version is not None and version < old.version:
                return False  # older than what the cache holds
            if old.obj == obj:
                return False
        if old is not None and old.key != key:
            self._drop(uid)
        self._entries[uid] = _Entry(kind, key, obj, version)
        self._by_key.setdefault(key, {})[uid] = None
        return True

    def _drop(self, uid: str) -> _Entry | None:
        entry = self._entries.pop(uid, None)
        if entry is not None:
            siblings = self._by_key.get(entry.key, {})
            siblings.pop(uid, None)
            if not siblings:
                self._by_key.pop(entry.key, None)
                self._urgent_at.pop(entry.key, None)
        return entry

    # --- reading -------------------------------------------------------------------------------------

    def observe_failed_create(self, body: Json, deleted: bool) -> Key | None:
        """A watch event of a FailedCreate Event; returns the job whose Job it names, if cached."""
        changed = self.failed_creates.observe(body, deleted)
        return None if changed is None else self.job_of(*changed)

    def replace_failed_creates(self, scope: str | None, listed: Iterable[Json]) -> set[Key]:
        """A LIST of the FailedCreate Events of `scope`; returns the cached jobs whose refusals changed."""
        changed = self.failed_creates.replace(scope, listed)
        return {key for namespace, uid in changed if (key := self.job_of(namespace, uid)) is not None}

    def job_of(self, namespace: str, uid: str) -> Key | None:
        """The job whose child in `namespace` has this uid, if cached."""
        entry = self._entries.get(uid)
        return entry.key if entry is not None and entry.key[0] == namespace else None

    def namespaces(self) -> set[str]:
        return {namespace for namespace, _ in self._by_key}

    def children(self, key: Key) -> Children:
        pods: list[dict[str, Any]] = []
        slices: list[dict[str, Any]] = []
        launcher = staging = None
        # The batch Jobs by the names the operator gives them, not by their labels alone: a namespace admin
        # may make a Job under other names with the job's labels, which would hide the launcher or stand in
        # for the staging run. A name holds one Job at a time.
        launcher_name, staging_name = names.launcher_name(key[1]), names.staging_job_name(key[1])
        for uid in self._by_key.get(key, {}):
            entry = self._entries[uid]
            if entry.kind in (PODS, SLICES):
                (pods if entry.kind == PODS else slices).append(entry.obj)
                continue
            meta = entry.obj["metadata"]
            role, name = meta["labels"].get(names.ROLE_LABEL), meta.get("name")
            if role == names.ROLE_LAUNCHER and name == launcher_name:
                launcher = entry.obj
            elif role == ROLE_STAGER and name == staging_name:
                staging = entry.obj
        uids = [str(job["metadata"].get("uid") or "") for job in (launcher, staging) if job]
        return Children(
            pods=tuple(pods), launcher=launcher, staging=staging, endpoint_slices=tuple(slices),
            failed_creates=self.failed_creates.messages(key[0], uids),
        )  # fmt: skip

    def workers_all_ready(self, key: Key) -> bool:
        """Whether the job has worker pods cached and every one of them is Ready."""
        workers = [
            entry.obj
            for uid in self._by_key.get(key, {})
            if (entry := self._entries[uid]).kind == PODS
            and entry.obj["metadata"]["labels"].get(names.ROLE_LABEL) == names.ROLE_WORKER
        ]
        return bool(workers) and all(pod_ready(pod) for pod in workers)

    def goes_ahead(self, key: Key) -> bool:
        """Whether the job's workers are all Ready, and neither it nor URGENT_PER_NAMESPACE jobs of its
        namespace went ahead within URGENT_EVERY_S: ask once a pod of it turned Ready. A yes counts as a turn
        of both."""
        now = self._clock()
        last = self._urgent_at.get(key)
        for namespace in [ns for ns, past in self._namespace_turns.items() if _spent(past, now)]:
            del self._namespace_turns[namespace]  # no turn within the bound: forgotten (a deleted namespace)
        turns = self._namespace_turns.setdefault(key[0], deque())
        while turns and now - turns[0] >= URGENT_EVERY_S:
            turns.popleft()
        spent = (last is not None and now - last < URGENT_EVERY_S) or len(turns) >= URGENT_PER_NAMESPACE
        if spent or not self.workers_all_ready(key):
            return False
        self._urgent_at[key] = now
        turns.append(now)
        return True

    def __len__(self) -> int:
        return len(self._entries)


def _spent(turns: deque[float], now: float) -> bool:
    """Whether a namespace's last turn is past the bound (or it has none)."""
    return not turns or now - turns[-1] >= URGENT_EVERY_S
