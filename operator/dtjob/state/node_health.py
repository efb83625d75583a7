"""Whether a worker's node can keep it, as the node's own conditions say. AKS's node problem detector marks a
sick GPU node with conditions (GPUMissing, XIDErrors, ...) set True, and a node about to be taken for
maintenance or a spot eviction with VMEventScheduled: the kubelet stays Ready on both, so nothing else in
Kubernetes moves the pods. Which condition types count is the operator's setting (dtjob.config). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dtjob.config import DRAIN_GRACE_SECONDS, NodeHealthPolicy
from dtjob.timefmt import parse_time_or_none

Json = Mapping[str, Any]

# The reason a worker's world restarts, or the worker is replaced, when its node cannot keep it.
NODE_UNHEALTHY = "NodeUnhealthy"


@dataclass(frozen=True)
class NodeProblem:
    node: str
    condition: str  # the condition's type, e.g. XIDErrors
    message: str  # the condition's message ("" when it has none)
    since: datetime | None  # its lastTransitionTime
    drain: bool  # about to go (VMEventScheduled), not broken now
    # A rank of an elastic world on a node about to go leaves the world at its next commit (its host is no
    # longer published); its pod is deleted, and replaced on another node, this long after the condition
    # appeared (the operator's setting, NodeHealthPolicy.drain_grace_seconds).
    grace: timedelta = timedelta(seconds=DRAIN_GRACE_SECONDS)

    def describe(self) -> str:
        text = f"node {self.node} reports {self.condition}"
        return f"{text}: {self.message}" if self.message else text

    def leave_at(self) -> datetime | None:
        """When a rank on a node about to go should be gone (None: at once)."""
        return self.since + self.grace if self.drain and self.since is not None else None


def node_problems(nodes: Iterable[Json], policy: NodeHealthPolicy) -> dict[str, NodeProblem]:
    """Node name -> its problem, for the nodes with a condition of the policy set True. A broken node's
    problem outranks one about to go; among several, the first type by name, so the answer is stable."""
    found: dict[str, NodeProblem] = {}
    watched = policy.unhealthy | policy.drain  # once: every reconcile of an active job reads its whole pool
    for node in nodes:
        true = [
            c for c in (node.get("status") or {}).get("conditions") or ()
            if c.get("type") in watched and c.get("status") == "True"
        ]  # fmt: skip
        name = str((node.get("metadata") or {}).get("name") or "") if true else ""
        if not name:
            continue
        worst = min(true, key=lambda c: (c["type"] not in policy.unhealthy, c["type"]))
        kind = str(worst["type"])
        found[name] = NodeProblem(
            node=name,
            condition=kind,
            message=" ".join(str(worst.get("message") or "").split()),
            since=parse_time_or_none(worst.get("lastTransitionTime")),
            drain=kind not in policy.unhealthy,
            grace=timedelta(seconds=policy.drain_grace_seconds),
        )
    return found
