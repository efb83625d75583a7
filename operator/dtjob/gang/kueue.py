"""Kueue's pod-group integration, as the operator speaks it: the labels and annotation that make a job's
workers one Workload, and what Kueue writes back on the pods (its scheduling gate, the condition of a pod it
stops). Names follow sigs.k8s.io/kueue pkg/controller/jobs/pod and pkg/controller/jobframework. Pure."""

from __future__ import annotations

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


def evicted_reason(reason: str) -> str:
    """The eviction's own reason (Preempted, InactiveWorkload, ...) from the stop reason on the pod."""
    rest = reason.removeprefix(EVICTED_REASON_PREFIX).removeprefix("DueTo")
    return rest or "Evicted"
