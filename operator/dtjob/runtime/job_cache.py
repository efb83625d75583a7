"""The operator's copy of its DistributedTrainingJobs: each as its watch last showed it, or as the operator's
own status patch returned it. A reconcile reads its job here instead of GETting it (a burst of a hundred new
jobs reconciled five times each would otherwise read and decode five hundred of them).

Stale copies are safe, only slower: every status write is guarded by the resourceVersion it was decided from,
so a decision made on an old copy ends in a Conflict and a retry. Two rules keep that rare:
- the operator's own writes go in at once (write-through), so the next reconcile never decides from the
  status before its own last patch;
- a newer resourceVersion is never replaced by an older one (the watch may deliver an event from before the
  write after it), comparing them as integers, as the API server's etcd revisions are.

A copy not confirmed for `max_age_s` is not used: a job deleted while the watch was down sends no DELETED,
and its copy must not live on. A LIST of the jobs' metadata confirms every copy it shows at its version or an
older one (`confirm`), and tells which copies the API server no longer holds: one read for all the jobs of a
namespace, where each running job, reconciled at least every progress poll, would otherwise be read again
once a minute. Copies are kept as compact JSON (managedFields and kubectl's last-applied copy dropped), a
few KB each.

It also keeps, per job, the version of the operator's last status write after which the job was settled (a
pass deciding again from that status would change nothing: dtjob.reconcile.job), so that the controller can
drop that write's own watch event instead of reconciling the job once more for it.

Pure and thread-safe: the watch feeds it on the event loop, reconciles read it in worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dtjob.kube import wire

Key = tuple[str, str]  # (namespace, name)
Json = dict[str, Any]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class _Copy:
    uid: str
    version: int | None
    raw: bytes
    confirmed_at: float


def _slim(body: Mapping[str, Any], meta: Mapping[str, Any]) -> Json:
    """The job without what nothing of the operator reads: managedFields, and kubectl's copy of the whole
    object as last applied (each as large as the spec again)."""
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**body, "metadata": kept}


def _key(meta: Mapping[str, Any]) -> Key:
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(meta: Mapping[str, Any]) -> int | None:
    text = meta.get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


class JobCache:
    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._copies: dict[Key, _Copy] = {}
        # Per job, the version of the operator's last own status write that left it settled.
        self._settled: dict[Key, str] = {}
        self._lock = threading.Lock()

    def put(self, body: Mapping[str, Any]) -> None:
        """The job as the API server just showed it (a watch event, a GET, a patch's answer)."""
        meta = body.get("metadata") or {}
        key = _key(meta)
        uid, version = str(meta.get("uid") or ""), _version(meta)
        raw = wire.dumps(_slim(body, meta))
        with self._lock:
            old = self._copies.get(key)
            if old is not None and old.uid == uid and _older(version, old.version):
                return  # an event from before a write already here
            self._copies[key] = _Copy(uid, version, raw, self._clock())

    def get(self, namespace: str, name: str) -> Json | None:
        """A fresh dict of the job, or None: not held, or not confirmed for max_age_s."""
        with self._lock:
            copy = self._copies.get((namespace, name))
        if copy is None or self._clock() - copy.confirmed_at >= self._max_age_s:
            return None
        job: Json = wire.loads(copy.raw)
        return job

    def now(self) -> float:
        return self._clock()

    def confirm(self, namespace: str | None, listed: Iterable[Mapping[str, Any]], since: float) -> list[Key]:
        """A LIST of the jobs of `namespace` (None: every namespace), each item's metadata, begun at
        `since` (this cache's clock): each copy of the same uid at the listed version or a newer one is
        confirmed as of `since`; one at an older version is left to age (its watch event is on the way).
        Returns the jobs whose copies, put before the LIST began, it does not hold: deleted while no watch
        said so."""
        shown: dict[Key, tuple[str, int | None]] = {}
        for item in listed:
            meta = item.get("metadata") or {}
            shown[_key(meta)] = (str(meta.get("uid") or ""), _version(meta))
        gone: list[Key] = []
        with self._lock:
            for key, copy in list(self._copies.items()):
                if namespace is not None and key[0] != namespace:
                    continue
                seen = shown.get(key)
                if copy.confirmed_at >= since:
                    continue  # put while the LIST ran: at least as new as what it shows
                if seen is None:
                    gone.append(key)
                elif seen[0] != copy.uid:
                    del self._copies[key]  # created again under its name: read the new one
                elif not _older(copy.version, seen[1]):
                    self._copies[key] = replace(copy, confirmed_at=since)
        return gone

    def settle(self, namespace: str, name: str, version: str) -> None:
        """The job at `version` is the operator's own status write after which it needed no other pass."""
        with self._lock:
            self._settled[(namespace, name)] = version

    def settled(self, namespace: str, name: str, version: str) -> bool:
        """Whether the job at `version` is such a write: its watch event (the echo) brings nothing new."""
        with self._lock:
            return self._settled.get((namespace, name)) == version

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._copies.pop((namespace, name), None)
            self._settled.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._copies)


def _older(version: int | None, than: int | None) -> bool:
    return version is not None and than is not None and version < than
