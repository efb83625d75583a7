"""Which nodes are a job's pool: those its workers may land on (its nodeSelector picked the list; its required
node affinity and the taints it tolerates narrow it). The operator's checks count only these, so that what
they say of a pool (its sizes, its free GPUs) tells nothing of another tenant's. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dtjob.gang.node_affinity import Term

# The prefix of the taints Kubernetes sets from a node's conditions.
CONDITION_TAINTS = "node.kubernetes.io/"


def in_pool(
    node: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]], terms: tuple[Term, ...]
) -> bool:
    """Whether a worker may be placed on the node: its required node affinity (`terms`) matches and it
    tolerates the node's NoSchedule/NoExecute taints. The taints the node's conditions set (not ready,
    unreachable, pressure) come and go, and say nothing of whose pool it is."""
    if terms and not any(term.matches(node) for term in terms):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = tuple(tolerations)
    return all(
        t.get("effect") not in ("NoSchedule", "NoExecute")
        or str(t.get("key") or "").startswith(CONDITION_TAINTS)
        or _tolerated(t, tolerations)
        for t in taints
    )


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration.get("key") == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def describe_pool(node_selector: Mapping[str, str], terms: tuple[Term, ...]) -> str:
    """The job's pool in the job's own words: its selector, and whether its affinity narrows it ("" for
    neither)."""
    parts = [",".join(f"{k}={v}" for k, v in sorted(node_selector.items()))] if node_selector else []
    if terms:
        parts.append("spec.placement.affinity")
    return " and ".join(parts)
