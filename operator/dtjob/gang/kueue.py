"""Kueue's pod-group integration, as the operator speaks it: the labels and annotation that make a job's
workers one Workload, and what Kueue writes back on the pods (its scheduling gate, the condition of a pod it
stops). Names follow sigs.k8s.io/kueue pkg/controller/jobs/pod and pkg/controller/jobframework. Pure.

A job joins Kueue by runPolicy.scheduling.queueName, beside or without a gang scheduler: Kueue admits the
world (its quota) and leaves placing it to the pods' scheduler. It creates the group's Workload itself, so
the operator creates no PodGroup for it and reports no GangScheduled; an evicted Workload is the state
machine's (dtjob.machine.admission), read from the pods (eviction() below). With runPolicy.scheduling.topology
the workers also carry Kueue's Topology-Aware Scheduling request, and Kueue picks the domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dtjob import names
from dtjob.gang.base import GangScheduler
from dtjob.spec.model import Topology
from dtjob.spec.parse import JobSpec

Json = Mapping[str, Any]

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
# Kueue's webhook adds this gate to every pod it manages; its controller removes it once the group's Workload
# is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Kueue's webhook adds this finalizer to every pod it manages. For a pod group it drops it only once a
# replacement pod exists (or the group is finished); the operator reuses pod names, so it drops it itself
# from a pod of its own that is deleted and has ended.
POD_FINALIZER = "kueue.x-k8s.io/managed"
# Before deleting the pods of a Workload it stops (evicted: preempted, its LocalQueue or ClusterQueue stopped,
# its admission check rejected), Kueue marks each with this condition; its reason is the stop reason,
# "WorkloadEvictedDueTo<Evicted reason>" (e.g. WorkloadEvictedDueToPreempted), its message the eviction's.
TERMINATION_TARGET = "TerminationTarget"
EVICTED_REASON_PREFIX = "WorkloadEvicted"
# Topology-Aware Scheduling: Kueue reads these from the pods of a PodSet (a pod group's pods) and admits the
# group only where one domain of the named level (a node label of its Topology) has room for all of them
# (required), or as few domains as it can (preferred); it then pins each pod there by its node selector.
# Kueue acts on them only for a ClusterQueue whose ResourceFlavor names a Topology (spec.topologyName).
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"


class Kueue(GangScheduler):
    """Kueue's admission of the world: its workers are one pod group on the job's LocalQueue."""

    name = "kueue"
    places_by_topology = True

    def pod_labels(self, spec: JobSpec, role: str) -> dict[str, str]:
        if role != names.ROLE_WORKER:
            return {}
        return worker_labels(spec.run_policy.scheduling.queue_name, spec.name)

    def pod_annotations(self, spec: JobSpec, role: str) -> dict[str, str]:
        if role != names.ROLE_WORKER:
            return {}
        scheduling = spec.run_policy.scheduling
        return {
            **worker_annotations(scheduling.queue_name, spec.workers),
            **topology_annotations(scheduling.topology),
        }


def evicted_message(eviction: str) -> str:
    """What the job says once Kueue evicted its world (`eviction` as eviction() reads it off a pod)."""
    return f"Kueue evicted the world ({eviction}): not counted as a restart; it waits to be admitted again"


ADMITTED_AGAIN = "Kueue admitted the world again"


def waiting_message(queue_name: str | None, old_pods_left: bool) -> str:
    """The suspended job's message while its evicted world waits."""
    waiting = (
        "waiting for the old pods to go"
        if old_pods_left
        else f"waiting for admission in LocalQueue {queue_name}"
    )
    return f"preempted by Kueue; {waiting}"


def gated_message(count: int) -> str:
    """What a world says while Kueue's admission gate holds `count` of its worker pods."""
    return f"{count} worker pod(s) wait for admission by Kueue"


def worker_labels(queue_name: str | None, group: str) -> dict[str, str]:
    """The labels that put a worker in its job's pod group on `queue_name`; none without a queue."""
    if not queue_name:
        return {}
    return {QUEUE_NAME_LABEL: queue_name, POD_GROUP_NAME_LABEL: group}


def worker_annotations(queue_name: str | None, workers: int) -> dict[str, str]:
    """Kueue admits a group once it sees this many pods: the workers. The launcher (created only after every
    worker is Ready) is no member: a group that counted it could never be admitted."""
    if not queue_name:
        return {}
    return {POD_GROUP_TOTAL_COUNT: str(workers)}


def topology_annotations(topology: Topology | None) -> dict[str, str]:
    """Kueue's TAS request for the workers: one domain of `topology.key`, required or preferred."""
    if topology is None:
        return {}
    return {REQUIRED_TOPOLOGY if topology.required else PREFERRED_TOPOLOGY: topology.key}


def evicted_reason(reason: str) -> str:
    """The eviction's own reason (Preempted, InactiveWorkload, ...) from the stop reason on the pod."""
    rest = reason.removeprefix(EVICTED_REASON_PREFIX).removeprefix("DueTo")
    return rest or "Evicted"


def holds(pod: Json) -> bool:
    """Kueue's finalizer is still on the pod."""
    return POD_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or ())


def eviction(pod: Json) -> str | None:
    """`<reason>: <message>` when Kueue stopped the pod because it evicted its Workload, else None."""
    found = _true_condition((pod.get("status") or {}).get("conditions"), TERMINATION_TARGET)
    reason = str((found or {}).get("reason") or "")
    if not reason.startswith(EVICTED_REASON_PREFIX):
        return None
    return f"{evicted_reason(reason)}: {(found or {}).get('message') or ''}".rstrip(": ")


def _true_condition(conditions: Iterable[Json] | None, kind: str) -> Json | None:
    found = next((c for c in conditions or () if c.get("type") == kind), None)
    return found if found is not None and found.get("status") == "True" else None
