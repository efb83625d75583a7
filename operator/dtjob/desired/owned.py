"""Which child objects are ours, and which of their fields the operator keeps in line. Pure.

A child is ours when one of its ownerReferences names our job's UID: a job deleted and re-created under the
same name never adopts what the old one left behind (the garbage collector removes that). Of an object that is
ours, only the fields the operator owns are compared, as mpi-operator's getOrCreate does, so defaults the API
server fills in never count as drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob.state.hosts import slice_hosts

Json = Mapping[str, Any]


def owner_uids(obj: Json) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return {str(ref.get("uid")) for ref in refs if ref.get("uid")}


def is_ours(existing: Json, desired: Json) -> bool:
    """Whether `existing` belongs to the owner `desired` names."""
    return bool(owner_uids(existing) & owner_uids(desired))


def _ports(spec: Json) -> list[tuple[Any, ...]]:
    return sorted(
        (p.get("name"), p.get("port"), p.get("targetPort", p.get("port")), p.get("protocol", "TCP"))
        for p in spec.get("ports") or ()
    )


def drift(desired: Json, existing: Json) -> dict[str, Any] | None:
    """A merge patch that brings the fields the operator owns back to `desired`, or None when they match.
    Pods, Jobs and Secrets are never patched: pods and Jobs are immutable where it matters (a new world makes
    new ones) and a Secret's keys must not change under a running world."""
    kind = desired.get("kind")
    if kind == "ConfigMap":
        want = dict(desired.get("data") or {})
        return None if dict(existing.get("data") or {}) == want else {"data": want}
    if kind == "Service":
        want_spec, have_spec = desired.get("spec") or {}, existing.get("spec") or {}
        same = dict(have_spec.get("selector") or {}) == dict(want_spec.get("selector") or {}) and _ports(
            have_spec
        ) == _ports(want_spec)
        patch = {"selector": want_spec.get("selector"), "ports": want_spec.get("ports")}
        return None if same else {"spec": patch}
    if kind == "EndpointSlice":  # the Service's MPI hosts (dtjob.desired.hosts)
        same = slice_hosts(existing) == slice_hosts(desired) and _ports(existing) == _ports(desired)
        return None if same else {"endpoints": desired.get("endpoints"), "ports": desired.get("ports")}
    if kind == "NetworkPolicy":
        want_spec = dict(desired.get("spec") or {})
        return None if dict(existing.get("spec") or {}) == want_spec else {"spec": want_spec}
    if kind == "PodGroup":
        # Only the fields the operator sets: a scheduler's webhook may default others (Volcano's queue).
        want_spec = dict(desired.get("spec") or {})
        have_spec = existing.get("spec") or {}
        same = all(have_spec.get(key) == value for key, value in want_spec.items())
        return None if same else {"spec": _replacing(want_spec, have_spec)}
    return None


def _replacing(want: Json, have: Json) -> dict[str, Any]:
    """A merge patch setting `want`'s keys, where a map in `want` also drops the keys only `have` holds."""
    patch: dict[str, Any] = {}
    for key, value in want.items():
        old = have.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            patch[key] = {**{k: None for k in old if k not in value}, **value}
        else:
            patch[key] = value
    return patch
