"""Kueue's pod-group integration, as the operator speaks it: the labels and annotation that make a job's
world (its workers and its launcher) one Workload, and what Kueue writes back on the pods (its scheduling
gate, the condition of a pod it stops). Names follow sigs.k8s.io/kueue pkg/controller/jobs/pod and
pkg/controller/jobframework. Pure.

The launcher is a member of the group, as an MPIJob's launcher is of its Workload: Kueue admits, counts and
evicts the world as one unit, and a namespace's default LocalQueue (Kueue's LocalQueue defaulting, on by
default since v0.12) never makes the launcher a Workload of its own, to be admitted or preempted apart from
its workers. Every world is such a group, queued or not (world_labels), so that a namespace's default
LocalQueue queues a job that names no queue whole too.

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
# Kueue's label that names a job's WorkloadPriorityClass (constants.WorkloadPriorityClassLabel), as on its
# own Jobs: the class's value is the Workload's priority. A pod group's is its pods'; the workers carry it
# (spec.worker.podLabels), and the launcher carries theirs, so that the group has one.
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
GROUP_SIZE_DIGITS = 9  # more than any world's pods, fewer than anything but a number
# Kueue's webhook adds this gate to every pod it manages; its controller removes it once the group's Workload
# is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Kueue's webhook adds this finalizer to every pod it manages. For a pod group it drops it only once a
# replacement pod exists (or the group is finished); the operator reuses pod names, so it drops it itself
# from a pod of its own that is deleted and has ended.
POD_FINALIZER = "kueue.x-k8s.io/managed"
# A group with a member so marked is finished once none of its pods is active, and no longer waits for all
# of them to succeed: put on the launcher, which stays after its job ends (its log), once the job has ended,
# so that the world's Workload finishes and its quota is free (MPI workers never succeed: they are deleted).
# Kueue allows the mark to be added, never taken off.
RETRIABLE_IN_GROUP = "kueue.x-k8s.io/retriable-in-group"
NOT_RETRIABLE = "false"
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
# PodSets that name the same PodSet group get one flavor and one topology domain together: the workers and a
# launcher that runs ranks (a PodSet of its own, its pod unlike theirs) are the world's hosts, in one domain.
PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
HOSTS_PODSET_GROUP = "hosts"


class Kueue(GangScheduler):
    """Kueue's admission of the world, on the job's LocalQueue: the queue label beside the world's pod group
    (world_labels), and the TAS request of its hosts."""

    name = "kueue"
    places_by_topology = True

    def pod_labels(self, spec: JobSpec, role: str) -> dict[str, str]:
        queue = spec.run_policy.scheduling.queue_name
        return {QUEUE_NAME_LABEL: queue} if queue else {}

    def pod_annotations(self, spec: JobSpec, role: str) -> dict[str, str]:
        topology = spec.run_policy.scheduling.topology
        host = role == names.ROLE_WORKER or spec.launcher.run_as_worker
        # The world's hosts share one domain; a launcher on the CPU pool asks for none.
        return topology_annotations(topology, spec.launcher.run_as_worker) if host else {}


def world_labels(spec: JobSpec, role: str) -> dict[str, str]:
    """Every world is one Kueue pod group, on a queue or not: a namespace's LocalQueue `default` (Kueue's
    LocalQueue defaulting) or manageJobsWithoutQueueName then queues the world whole, as one Workload, never
    pod by pod. Where Kueue manages nothing the labels do nothing. One group, one priority: the workers'."""
    if not spec.run_policy.scheduling.kueue_pod_group:
        return {}
    labels = {POD_GROUP_NAME_LABEL: spec.name}
    priority = spec.worker.pod_labels.get(PRIORITY_CLASS_LABEL)
    if priority is not None and role != names.ROLE_WORKER:
        labels[PRIORITY_CLASS_LABEL] = priority
    return labels


def world_annotations(spec: JobSpec) -> dict[str, str]:
    """Kueue makes the group's Workload once it sees this many pods: the launcher is made with its workers,
    so the whole world is there to be counted."""
    grouped = spec.run_policy.scheduling.kueue_pod_group
    return {POD_GROUP_TOTAL_COUNT: str(group_size(spec))} if grouped else {}


def evicted_message(eviction: str) -> str:
    """What the job says once Kueue evicted its world (`eviction` as eviction() reads it off a pod)."""
    return f"Kueue evicted the world ({eviction}): not counted as a restart; it waits to be admitted again"


ADMITTED_AGAIN = "Kueue admitted the world again"


def waiting_message(queue_name: str | None, old_pods_left: bool) -> str:
    """The suspended job's message while its evicted world waits (`queue_name`: the spec's, if it names one;
    else Kueue's defaulting chose it)."""
    where = f"in LocalQueue {queue_name}" if queue_name else "by Kueue"
    waiting = "waiting for the old pods to go" if old_pods_left else f"waiting for admission {where}"
    return f"preempted by Kueue; {waiting}"


def gated_message(count: int) -> str:
    """What a world says while Kueue's admission gate holds `count` of its worker pods."""
    return f"{count} worker pod(s) wait for admission by Kueue"


# Why a MultiKueue copy's pods are in a queue of this cluster's, and what to change.
_TAKEN_BY_THIS_KUEUE = (
    "though the Workload MultiKueue copied here holds the job's quota: this cluster's Kueue took them "
    "(a LocalQueue named default in the namespace, or manageJobsWithoutQueueName); on a MultiKueue worker, "
    "queue jobs on a LocalQueue of another name, with manageJobsWithoutQueueName off"
)


def gated_copy_message(count: int) -> str:
    """What a MultiKueue copy's world says while Kueue gates `count` of its worker pods: this cluster's Kueue
    took pods that name no queue and asks their quota again."""
    return f"{gated_message(count)}, {_TAKEN_BY_THIS_KUEUE}"


def counted_twice_message(count: int) -> str:
    """What a running MultiKueue copy adds while this cluster's Kueue manages `count` of its pods (they carry
    its finalizer): it admitted them again, each on a Workload of its own, so their quota counts twice.
    Nothing stops, so without a word nobody would know."""
    return f"this cluster's Kueue counts {count} of its pods' quota a second time, {_TAKEN_BY_THIS_KUEUE}"


def edit_waits_message(edited: int, admitted: int) -> str:
    """What a running world Kueue admitted as one pod group adds while spec.workers says `edited`: Kueue
    keeps the group at the size it admitted (it has no elastic pod groups)."""
    return f" (spec.workers={edited} applies at the next world: Kueue admitted this one at {admitted})"


def group_size(spec: JobSpec) -> int:
    """The pods of the world's group: its workers, and the launcher a Horovod world has (a torchrun world's
    launch is a worker's)."""
    return spec.workers + (0 if spec.torchrun is not None else 1)


def topology_annotations(topology: Topology | None, launcher_hosts: bool = False) -> dict[str, str]:
    """Kueue's TAS request for the world's hosts: one domain of `topology.key`, required or preferred; with a
    launcher among the hosts (`launcher_hosts`), its PodSet and the workers' share it as one PodSet group."""
    if topology is None:
        return {}
    request = {REQUIRED_TOPOLOGY if topology.required else PREFERRED_TOPOLOGY: topology.key}
    return {**request, PODSET_GROUP: HOSTS_PODSET_GROUP} if launcher_hosts else request


def evicted_reason(reason: str) -> str:
    """The eviction's own reason (Preempted, InactiveWorkload, ...) from the stop reason on the pod."""
    rest = reason.removeprefix(EVICTED_REASON_PREFIX).removeprefix("DueTo")
    return rest or "Evicted"


def holds(pod: Json) -> bool:
    """Kueue's finalizer is still on the pod."""
    return POD_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or ())


def group_size_of(pod: Json) -> int | None:
    """The size of the pod group the pod was made for (its POD_GROUP_TOTAL_COUNT), if it names one."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_GROUP_TOTAL_COUNT)
    return int(text) if isinstance(text, str) and text.isdigit() and len(text) <= GROUP_SIZE_DIGITS else None


def in_group(pod: Json) -> bool:
    """The pod is a member of a Kueue pod group."""
    return bool(((pod.get("metadata") or {}).get("labels") or {}).get(POD_GROUP_NAME_LABEL))


def not_retriable(pod: Json) -> bool:
    """The pod's group is marked to finish once none of its pods is active."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(RETRIABLE_IN_GROUP) == NOT_RETRIABLE


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
