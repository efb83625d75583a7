"""The Workload a job's prebuilt-workload label names (on a worker cluster, the one MultiKueue made for
Kueue's copy of a dispatched job), as read: the facts that say whose it is and whether it holds quota now.
Pure.

The names are Kueue's (sigs.k8s.io/kueue apis/kueue/v1beta1 workload_types.go): a Workload holds quota once
its status.admission is set with QuotaReserved, and its job may run once Admitted is True too (its admission
checks passed); Evicted and Finished give the quota back. Its podSets are what it admitted: so many pods, each
container of one requesting so much.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dtjob.gang.resources import container_requests
from dtjob.spec.managed_by import MULTIKUEUE_ORIGIN_LABEL

Json = Mapping[str, Any]

QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"


@dataclass(frozen=True)
class PodSetShape:
    """A pod set as quota counts it: its pods, and what each container of one requests (by name)."""

    count: int
    containers: tuple[tuple[str, Mapping[str, Decimal]], ...]


@dataclass(frozen=True)
class PrebuiltWorkload:
    name: str
    found: bool = False
    from_multikueue: bool = False  # it carries MultiKueue's origin label
    controller: str | None = None  # `<Kind> <name>` of a controller ownerReference to another object
    admitted: bool = False  # status.admission set, QuotaReserved and Admitted True
    evicted: bool = False
    finished: bool = False
    pod_sets: Mapping[str, PodSetShape] | None = None  # by name; None: unreadable
    # Pods admitted of each pod set, where Kueue admitted fewer than asked (partial admission, down to the pod
    # set's minCount); a pod set it admitted whole is not here.
    admitted_counts: Mapping[str, int] = field(default_factory=dict)


def prebuilt_state(name: str, workload: Json | None, job_uid: str) -> PrebuiltWorkload:
    """The facts of Workload `name` as read (None: there is none) for the job of UID `job_uid`."""
    if workload is None:
        return PrebuiltWorkload(name)
    meta = workload.get("metadata") or {}
    status = workload.get("status") or {}
    conditions = status.get("conditions") or ()
    refs = meta.get("ownerReferences") or ()
    controller = next((r for r in refs if r.get("controller") and r.get("uid") != job_uid), None)
    reserved = bool(status.get("admission")) and _true(conditions, QUOTA_RESERVED)
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    return PrebuiltWorkload(
        name=name,
        found=True,
        from_multikueue=bool((meta.get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL)),
        controller=None if controller is None else f"{controller.get('kind')} {controller.get('name')}",
        admitted=reserved and _true(conditions, ADMITTED),
        evicted=_true(conditions, EVICTED),
        finished=_true(conditions, FINISHED),
        pod_sets=pod_set_shapes(pod_sets),
        admitted_counts=_admitted_counts(status.get("admission"), pod_sets),
    )


def pod_set_shapes(pod_sets: Iterable[Json]) -> dict[str, PodSetShape] | None:
    """Kueue's podSets by name; None when one cannot be read (a quantity that is none)."""
    try:
        return {str(p.get("name")): _shape(p) for p in pod_sets}
    except (TypeError, ValueError):
        return None


def _shape(pod_set: Json) -> PodSetShape:
    return PodSetShape(int(pod_set.get("count") or 0), container_requests(pod_set.get("template") or {}))


def _admitted_counts(admission: Any, pod_sets: Any) -> dict[str, int]:
    """status.admission.podSetAssignments' counts that are below their pod set's count (by name)."""
    if not isinstance(admission, Mapping) or not isinstance(pod_sets, list):
        return {}
    asked = {str(p.get("name")): p.get("count") for p in pod_sets if isinstance(p, Mapping)}
    counts = {}
    for assignment in admission.get("podSetAssignments") or ():
        if not isinstance(assignment, Mapping):
            continue
        name, count = str(assignment.get("name")), assignment.get("count")
        wanted = asked.get(name)
        if type(count) is int and type(wanted) is int and 0 <= count < wanted:  # not a bool
            counts[name] = count
    return counts


def _true(conditions: Iterable[Json], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
