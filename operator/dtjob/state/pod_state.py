"""One pod as the state machine sees it (PodState), parsed once from the raw Pod the watch cache holds: its
role, attempt, phase, readiness, why it fails or waits, and what Kueue and the operator's gate say of it.
Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dtjob import names
from dtjob.gang import kueue
from dtjob.printable import printable
from dtjob.spec.parse import MAX_WORKERS
from dtjob.state.node_health import NodeProblem
from dtjob.timefmt import parse_time_or_none

Json = Mapping[str, Any]
# A container waiting for these is only being started: nothing to say of it.
STARTING_REASONS = ("ContainerCreating", "PodInitializing")


@dataclass(frozen=True)
class PodState:
    name: str
    role: str
    attempt: int | None
    index: int | None
    phase: str
    scheduled: bool
    ready: bool
    deleting: bool
    # Why the pod failed or waits (e.g. "Error, exit code 1", "ImagePullBackOff: ..."), for messages.
    reason: str | None = None
    uid: str = ""
    # When a deleting pod's grace period ends (metadata.deletionTimestamp): its kubelet confirms the end by
    # then, unless the node is lost and no kubelet is left to confirm anything.
    deletion_deadline: datetime | None = None
    # Why the cluster took the pod away (its DisruptionTarget condition): an eviction from a NotReady node,
    # the pod garbage collector after its node was deleted, a preemption. None: no disruption.
    disruption: str | None = None
    created: datetime | None = None  # metadata.creationTimestamp
    # Why a container has not started (ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ...).
    waiting: str | None = None
    unschedulable: bool = False  # PodScheduled False: no node can take it (now)
    # How the container ended when it failed: its exit code and reason (Error, OOMKilled, ...).
    exit_code: int | None = None
    termination_reason: str | None = None
    # Kueue: the pod waits for its group's admission (its scheduling gate is on) ...
    gated: bool = False
    # ... Kueue stopped it, its Workload evicted (`<reason>: <message>`, e.g. "Preempted: ...") ...
    kueue_eviction: str | None = None
    # ... and its finalizer is still on the pod.
    kueue_finalizer: bool = False
    # A member of a Kueue pod group whose Workload still waits for all its pods to succeed before it finishes
    # (not yet marked kueue.RETRIABLE_IN_GROUP false).
    kueue_group_open: bool = False
    # The size of the Kueue pod group it was made for (kueue.POD_GROUP_TOTAL_COUNT), if any.
    kueue_group_size: int | None = None
    # A launcher pod the operator still holds (names.LAUNCH_GATE is on): it waits for every worker Ready.
    held: bool = False
    address: str = ""  # status.podIP: where the pod's name resolves once the operator publishes it
    node: str = ""  # spec.nodeName, once bound
    avoided_nodes: tuple[str, ...] = ()  # the nodes the operator kept it off when it made it
    # Its node's condition that says it cannot keep the pod (read only for the workers of an active job).
    node_problem: NodeProblem | None = None
    world_size: int | None = None  # a torchrun worker's: the workers its torchrun was started for (--nnodes)
    ended: datetime | None = None  # when its failed container ended (to tell the first failure of several)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def int_label(labels: Json, key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None


def world_size_label(labels: Json) -> int | None:
    """The world size the operator wrote on a launcher or worker, or None for one it cannot have written: a
    namespace admin may label a pod of the job, and a size past spec.workers' bound would have the operator
    make that many workers (a million pods' worth of memory, every reconcile, for every tenant)."""
    size = int_label(labels, names.WORLD_SIZE_LABEL)
    return size if size is not None and 1 <= size <= MAX_WORKERS else None


def _condition(conditions: Iterable[Json] | None, kind: str) -> Json | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


def true_condition(conditions: Iterable[Json] | None, kind: str) -> Json | None:
    found = _condition(conditions, kind)
    return found if found is not None and found.get("status") == "True" else None


def pod_state(pod: Json) -> PodState:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    conditions = status.get("conditions")
    ready = _condition(conditions, "Ready")
    scheduled = _condition(conditions, "PodScheduled")
    role = str(labels.get(names.ROLE_LABEL, ""))
    exit_code, termination_reason, ended = _failed_termination(status, names.CONTAINER_OF_ROLE.get(role))
    return PodState(
        name=str(meta.get("name", "")),
        role=role,
        attempt=int_label(labels, names.ATTEMPT_LABEL),
        index=int_label(labels, names.WORKER_INDEX_LABEL),
        phase=str(status.get("phase") or "Pending"),
        scheduled=bool(scheduled and scheduled.get("status") == "True"),
        ready=bool(ready and ready.get("status") == "True"),
        deleting=bool(meta.get("deletionTimestamp")),
        reason=pod_reason(pod),
        uid=str(meta.get("uid") or ""),
        deletion_deadline=parse_time_or_none(meta.get("deletionTimestamp")),
        disruption=pod_disruption(pod),
        created=parse_time_or_none(meta.get("creationTimestamp")),
        waiting=_waiting_reason(status),
        unschedulable=bool(scheduled and scheduled.get("status") == "False"),
        exit_code=exit_code,
        termination_reason=termination_reason,
        gated=_has_gate(pod, kueue.ADMISSION_GATE),
        kueue_eviction=kueue.eviction(pod),
        kueue_finalizer=kueue.holds(pod),
        kueue_group_open=kueue.in_group(pod) and not kueue.not_retriable(pod),
        kueue_group_size=kueue.group_size_of(pod),
        held=_has_gate(pod, names.LAUNCH_GATE),
        address=str(status.get("podIP") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        avoided_nodes=_avoided_nodes(meta),
        world_size=world_size_label(labels),
        ended=ended,
    )


def _has_gate(pod: Json, gate: str) -> bool:
    """The pod still carries scheduling gate `gate` (Kueue's admission, or the operator's launch hold)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == gate for g in gates)


def _avoided_nodes(meta: Json) -> tuple[str, ...]:
    text = (meta.get("annotations") or {}).get(names.AVOIDED_NODES_ANNOTATION)
    return tuple(sorted(n for n in text.split(",") if n)) if isinstance(text, str) else ()


def _statuses(status: Json) -> list[Json]:
    """Every container's status: init containers (a job's template may add them, native sidecars too) first,
    as they run first."""
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def _waiting_reason(status: Json) -> str | None:
    return next((r for r in map(container_waiting, _statuses(status)) if r is not None), None)


def container_waiting(cs: Json) -> str | None:
    """Why a container waits, unless it is only being created."""
    reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
    return str(reason) if reason and reason not in STARTING_REASONS else None


def _failed_termination(
    status: Json, main: str | None = None
) -> tuple[int | None, str | None, datetime | None]:
    """(exit code, reason, end) of the first container that ended with a nonzero code, the pod's own
    container (`main`, e.g. the launcher's, whose code the restart policy judges) before a sidecar; or
    (None, None, None)."""
    statuses = sorted(_statuses(status), key=lambda cs: cs.get("name") != main)
    return next((f for f in map(container_failure, statuses) if f is not None), (None, None, None))


def container_failure(cs: Json) -> tuple[int, str | None, datetime | None] | None:
    """(exit code, reason, end) of a container that ended with a nonzero code, or None."""
    term = (cs.get("state") or {}).get("terminated")
    if term and isinstance(term.get("exitCode"), int) and term["exitCode"] != 0:
        return int(term["exitCode"]), term.get("reason"), parse_time_or_none(term.get("finishedAt"))
    return None


def pod_disruption(pod: Json) -> str | None:
    """`<reason>: <message>` of a True DisruptionTarget condition (the cluster, not the container, ended the
    pod), or None."""
    found = true_condition((pod.get("status") or {}).get("conditions"), "DisruptionTarget")
    if found is None:
        return None
    return printable(
        f"{found.get('reason') or 'DisruptionTarget'}: {found.get('message') or ''}".rstrip(": ")
    )


def pod_reason(pod: Json) -> str | None:
    """The most telling reason a pod is not healthy, or None."""
    status = pod.get("status") or {}
    telling = next((r for r in map(container_reason, _statuses(status)) if r is not None), None)
    if telling is not None:
        return telling
    scheduled = _condition(status.get("conditions"), "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return printable(
            f"{scheduled.get('reason', 'Unschedulable')}: {scheduled.get('message', '')}".rstrip(": ")
        )
    disruption = pod_disruption(pod)
    if disruption is not None:
        return disruption
    if status.get("reason"):
        return printable(f"{status['reason']}: {status.get('message', '')}".rstrip(": "))
    return None


def container_reason(cs: Json) -> str | None:
    """What a container says is wrong: it ended with a nonzero code (now, or before its last restart), or it
    waits for more than its creation. The message is the container's own, made printable."""
    state = cs.get("state") or {}
    term = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
    if term and (term.get("exitCode") or 0) != 0:
        text = f"{term.get('reason') or 'Terminated'}, exit code {term.get('exitCode')}"
        return printable(f"{text}: {term['message']}") if term.get("message") else text
    waiting = state.get("waiting")
    if waiting and waiting.get("reason") not in (None, *STARTING_REASONS):
        return printable(f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": "))
    return None


# What pod_state reads of each container's status, one container at a time: a pod's reason, its waiting
# reason and its failure are each the first container (in order) of which one of these says something.
PER_CONTAINER_READS = (container_reason, container_waiting, container_failure)
