"""Get-or-create over the thin client (dtjob.kube.client.Kube), as mpi-operator's controller keeps its
getOrCreate: create; when the name is taken, read it, check that it is ours (an ownerReference with our job's
UID) and bring the fields the operator owns back in line (dtjob.desired.owned).

Creates are create-if-absent (409 AlreadyExists means another reconcile got there first: fine), so running
any action twice changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from enum import StrEnum
from typing import Any

from dtjob.desired.owned import drift, is_ours
from dtjob.kube.client import Conflict, Kube

log = logging.getLogger(__name__)
Json = dict[str, Any]
# The creates of one ensure_all() in flight at once, across all reconciles: a world's objects, then its pods,
# go out together instead of one round trip after another.
PARALLEL_CREATES = 16
# Where ensure_all() runs its ensures (a pool of PARALLEL_CREATES threads, started as they are needed).
CREATES: Executor = ThreadPoolExecutor(PARALLEL_CREATES, thread_name_prefix="create")


class Applied(StrEnum):
    """What ensure() found and did."""

    CREATED = "Created"
    UNCHANGED = "Unchanged"
    UPDATED = "Updated"
    # An object of that name exists and is another owner's (say, an older job's of that name).
    NOT_OURS = "NotOurs"


def create_if_absent(kube: Kube, obj: Json) -> bool:
    """Create obj; False when it already exists (whoever's it is)."""
    return kube.create(obj) is not None


def ensure(kube: Kube, obj: Json) -> Applied:
    """Create obj; or, when it exists, check that it is ours and bring the fields the operator owns back in
    line. A create answered 409 for an object that is gone again, or on its way out, raises Conflict: the
    world that needs it must not go on without it, so the job is retried shortly instead of at the next
    event."""
    if kube.create(obj) is not None:
        return Applied.CREATED
    kind, meta, version = obj["kind"], obj["metadata"], obj.get("apiVersion")
    existing = kube.get(kind, meta["namespace"], meta["name"], version)
    if existing is None or (existing.get("metadata") or {}).get("deletionTimestamp"):
        state = "gone" if existing is None else "being deleted"
        raise Conflict(f"{kind} {meta['namespace']}/{meta['name']} already exists, but is {state}; retrying")
    if not is_ours(existing, obj):
        return Applied.NOT_OURS
    patch = drift(obj, existing)
    if patch is None:
        return Applied.UNCHANGED
    kube.patch(kind, meta["namespace"], meta["name"], patch, version)
    return Applied.UPDATED


def ensure_all(kube: Kube, objs: Sequence[Json]) -> list[Applied]:
    """ensure() each, all at once (in CREATES); when some fail, the first one's error (in `objs` order) once
    all have ended, so nothing is left running behind the caller."""
    if len(objs) < 2:
        return [ensure(kube, obj) for obj in objs]
    futures = [CREATES.submit(ensure, kube, obj) for obj in objs]
    errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        raise errors[0]
    return [future.result() for future in futures]
