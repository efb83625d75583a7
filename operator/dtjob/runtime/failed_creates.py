"""The FailedCreate Events of batch Jobs, as a watch of their own brings them (dtjob.runtime.child_watch), by
the Job they name: why admission refused a launcher's or stager's pod, known without a LIST of the namespace's
Events at each reconcile of a job whose launcher has no pod yet (a read per job start, filtered in etcd over
every Event of the namespace).

Kept by (the Event's own namespace, the uid of the Job it names): an Event counts only for a Job of the
namespace it was written in, so an Event written in one namespace that names another namespace's Job says
nothing about that Job, however the whole cluster's watch delivers it.

A namespace is served once a LIST of it (or of the whole cluster) has been taken in; until then, and where
the operator may not watch Events, reconciles read them from the API server. So they do while more than
MAX_KEPT Events would be kept (anyone who may post Events can post these): the store takes no more in, and
serves a namespace it missed one in again from the next LIST that fits. Nothing an Event's poster sizes is
kept whole: the message is cut, and an Event whose Job uid is longer than any uid the API server gives names
no Job and is not kept (the API server takes any string there, up to the object's 1.5 MiB). Pure and
single-threaded: the controller calls it on the event loop only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dtjob.state.failed_create import FAILED_CREATE_MESSAGE_CHARS, newest_failed_create

Json = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, the uid of the Job the Event names)
FIELD_SELECTOR = "involvedObject.kind=Job,reason=FailedCreate"
# At most about 2 KiB each (the message cut, the uid bounded): 4 MiB in all. A refused Job has one, its count
# merged.
MAX_KEPT = 2000
# The API server's uids are UUIDs (36 characters); a longer one is not a Job's.
JOB_UID_MAX_CHARS = 64


def event_projection(body: Json) -> dict[str, Any]:
    """The parts of an Event kept: who it is, which Job it names, its message and when."""
    meta = body.get("metadata") or {}
    job_uid = (body.get("involvedObject") or {}).get("uid")
    if not isinstance(job_uid, str) or len(job_uid) > JOB_UID_MAX_CHARS:
        job_uid = None  # names no Job: not kept (_identity)
    return {
        "metadata": {key: meta.get(key) for key in ("name", "namespace", "uid", "resourceVersion")},
        "involvedObject": {"uid": job_uid},
        "message": str(body.get("message") or "")[:FAILED_CREATE_MESSAGE_CHARS],
        "lastTimestamp": body.get("lastTimestamp"),
        "eventTime": body.get("eventTime"),
    }


def _identity(body: Json) -> tuple[str, Key] | None:
    meta = body.get("metadata") or {}
    uid, namespace = meta.get("uid"), meta.get("namespace")
    job_uid = (body.get("involvedObject") or {}).get("uid")
    if not (uid and namespace and job_uid):
        return None
    return str(uid), (str(namespace), str(job_uid))


class FailedCreates:
    def __init__(self) -> None:
        self._events: dict[Key, dict[str, Json]] = {}  # (namespace, Job uid) -> Event uid -> its projection
        self._keys: dict[str, Key] = {}  # Event uid -> the key it is kept under
        self._listed: set[str | None] = set()  # namespaces listed; None: the whole cluster
        self._missed: set[str] = set()  # namespaces with an Event not kept (MAX_KEPT): not served

    def observe(self, body: Json, deleted: bool) -> Key | None:
        """A watch event; returns the (namespace, Job uid) whose refusals changed, None if none did."""
        identity = _identity(body)
        if identity is None:
            return None
        uid, key = identity
        if deleted:
            return key if self._drop(uid) else None
        self._put(uid, key, body)
        return key

    def replace(self, scope: str | None, listed: Iterable[Json]) -> set[Key]:
        """A LIST of `scope` (a namespace, or None for the whole cluster): what it no longer holds was deleted
        while no watch ran. Returns the (namespace, Job uid) pairs whose refusals changed."""
        fresh = [(identity, body) for body in listed if (identity := _identity(body)) is not None]
        kept = {uid for (uid, _), _ in fresh}
        changed: set[Key] = set()
        for uid, key in list(self._keys.items()):
            if (scope is None or key[0] == scope) and uid not in kept:
                self._drop(uid)
                changed.add(key)
        self._missed = set() if scope is None else self._missed - {scope}
        for (uid, key), body in fresh:
            if self._events.get(key, {}).get(uid) != body:
                self._put(uid, key, body)
                changed.add(key)
        self._listed.add(scope)
        return changed

    def serves(self, namespace: str) -> bool:
        return namespace not in self._missed and (None in self._listed or namespace in self._listed)

    def messages(self, namespace: str, job_uids: Iterable[str]) -> dict[str, str] | None:
        """The newest FailedCreate message of each of these Jobs of `namespace` that has one; None when the
        namespace is not served yet."""
        if not self.serves(namespace):
            return None
        kept = self._events
        found = {uid: newest_failed_create(kept.get((namespace, uid), {}).values()) for uid in job_uids}
        return {uid: message for uid, message in found.items() if message is not None}

    def _put(self, uid: str, key: Key, body: Json) -> None:
        if uid not in self._keys and len(self._keys) >= MAX_KEPT:
            self._missed.add(key[0])
            return
        old = self._keys.get(uid)
        if old is not None and old != key:
            self._drop(uid)
        self._events.setdefault(key, {})[uid] = body
        self._keys[uid] = key

    def _drop(self, uid: str) -> bool:
        key = self._keys.pop(uid, None)
        if key is None:
            return False
        events = self._events.get(key, {})
        events.pop(uid, None)
        if not events:
            self._events.pop(key, None)
        return True
