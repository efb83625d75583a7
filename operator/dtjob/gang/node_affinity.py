"""A job's required node affinity, as the scheduler reads it, matched against nodes by the operator's own
checks (the GPUs of the job's pool). Pure.

The affinity is the editor's, bounded by Kubernetes only through the object's size, and it is matched against
every node of the pool at every new job and every 15 s while one waits: it is compiled once per check (each
operator's values a set), and one past AFFINITY_CHECK_MAX expressions and values is not matched at all (the
check is left to the scheduler), so that a megabyte of NotIn values, or of empty terms, costs the operator
nothing per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

AFFINITY_CHECK_MAX = 1_000


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]
    bound: int | None  # Gt and Lt: the first value as an integer (None: matches no node)

    def holds(self, found: Mapping[str, str]) -> bool:
        present = self.key in found
        value = found.get(self.key)
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt") and self.bound is not None:
            try:
                have = int(str(value))
            except ValueError:
                return False
            return have > self.bound if self.operator == "Gt" else have < self.bound
        return False


@dataclass(frozen=True)
class Term:
    labels: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, node: Mapping[str, Any]) -> bool:
        if not self.labels and not self.fields:
            return False  # an empty term matches no node (as the scheduler reads it)
        meta = node.get("metadata") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}
        fields = {"metadata.name": str(meta.get("name") or "")}
        return all(r.holds(labels) for r in self.labels) and all(r.holds(fields) for r in self.fields)


class Unmatched(Exception):
    """The affinity is not matched here: it holds more terms, expressions and values than AFFINITY_CHECK_MAX,
    or it is no affinity the API server would take for a pod (which then refuses the pod itself)."""


def required_terms(affinity: Any) -> tuple[Term, ...]:
    """The compiled `requiredDuringSchedulingIgnoredDuringExecution` terms (none: any node); Unmatched."""
    try:
        node_affinity = (affinity or {}).get("nodeAffinity") or {}
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        raw = list(required.get("nodeSelectorTerms") or ())
        size = sum(1 + sum(1 + len(r.get("values") or ()) for kind in ("matchExpressions", "matchFields")
                           for r in t.get(kind) or ()) for t in raw)  # fmt: skip
        if size > AFFINITY_CHECK_MAX:
            raise Unmatched(f"{size} terms, expressions and values")
        return tuple(
            Term(tuple(map(_requirement, t.get("matchExpressions") or ())),
                 tuple(map(_requirement, t.get("matchFields") or ())))
            for t in raw
        )  # fmt: skip
    except (AttributeError, TypeError) as err:  # a list where a map belongs, a number where a list does
        raise Unmatched(f"not a node affinity: {err}") from err


def _requirement(raw: Mapping[str, Any]) -> Requirement:
    if not isinstance(raw.get("values") or [], list):
        raise TypeError(f"values is a {type(raw.get('values')).__name__}, not a list")
    values = [str(v) for v in raw.get("values") or ()]
    try:
        bound = int(values[0]) if values else None
    except ValueError:
        bound = None
    return Requirement(str(raw.get("key") or ""), str(raw.get("operator")), frozenset(values), bound)
