"""The Kueue Workload of a job that MultiKueue dispatches (spec.managedBy kueue.x-k8s.io/multikueue), and the
Finished condition its copy on a worker cluster ends with. Pure.

Kueue creates the Workloads of the jobs it knows; for a kind of its `externalFrameworks` that is the job's
own controller's part (sigs.k8s.io/kueue pkg/controller/admissionchecks/multikueue: the adapter is found
through the Workload's controller ownerReference). Its podSets are what the world asks for: the workers,
and the launcher. On the worker cluster nothing of Kueue's marks the copy of that Workload Finished for a
custom kind either: the operator does once the copy has ended and wound down; only then does Kueue finish the
manager's Workload (and free its quota), copy the status a last time and delete the copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dtjob import names
from dtjob.desired.common import Json, metadata
from dtjob.desired.pods import launcher_pod, worker_pod
from dtjob.gang.kueue import PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL
from dtjob.spec.managed_by import unqueued, workload_name
from dtjob.spec.parse import JobSpec
from dtjob.state.prebuilt import FINISHED
from dtjob.state.status import SUCCEEDED
from dtjob.timefmt import format_time

# Kueue's API versions the operator speaks, the newest first: it takes the first the cluster serves
# (v1beta2 from Kueue v0.15 on, its storage version from v0.16; v0.20 serves no v1beta1).
KUEUE_APIS = ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")
WORKLOAD_KIND = "Workload"
PRIORITY_CLASS_KIND = "WorkloadPriorityClass"
# How a v1beta1 Workload says where its priority came from (v1beta2: spec.priorityClassRef).
V1BETA1_PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
# The reasons of Kueue's Finished condition (kueue.WorkloadFinishedReason*).
FINISHED_SUCCEEDED = "Succeeded"
FINISHED_FAILED = "Failed"


def dispatch_queue(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue a dispatched job names: runPolicy.scheduling.queueName, else Kueue's queue label."""
    spec = job.get("spec") or {}
    scheduling = ((spec.get("runPolicy") or {}).get("scheduling") or {}) if isinstance(spec, Mapping) else {}
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = scheduling.get("queueName") or labels.get(QUEUE_NAME_LABEL)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Priority:
    """A WorkloadPriorityClass as read: its name and value."""

    name: str
    value: int


def priority_class(job: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass the job's kueue.x-k8s.io/priority-class label names, if any."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = labels.get(PRIORITY_CLASS_LABEL) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) and value else None


def dispatch_workload(
    spec: JobSpec, owner: Json, queue: str, api_version: str, priority: Priority | None = None
) -> Json:
    """The job's Workload on `queue` in Kueue's `api_version`, owned by the job as its controller, asking for
    its world, at `priority` (as Kueue's own jobs: the class named and its value)."""
    labels = names.labels(spec.name, "workload")
    body: Json = {"queueName": queue, "podSets": world_pod_sets(spec, owner)}
    if priority is not None:
        body["priority"] = priority.value
        if api_version.endswith("/v1beta1"):
            body |= {"priorityClassName": priority.name, "priorityClassSource": V1BETA1_PRIORITY_SOURCE}
        else:
            group = api_version.rpartition("/")[0]
            body["priorityClassRef"] = {"group": group, "kind": PRIORITY_CLASS_KIND, "name": priority.name}
    return {
        "apiVersion": api_version,
        "kind": WORKLOAD_KIND,
        "metadata": metadata(workload_name(spec.name), spec.namespace, labels, owner),
        "spec": body,
    }


def world_pod_sets(spec: JobSpec, owner: Json) -> list[Json]:
    """Kueue's podSets of the job's world: its workers (each as desired.worker_pod builds them) and its
    launcher, which the world needs once its workers are Ready (a torchrun world has none). An elastic world's
    workers may be admitted in part (Kueue's partial admission): down to spec.elastic.minWorkers."""
    world = unqueued(spec)  # the pods' own Kueue labels belong to a pod group, which a Workload replaces
    workers = spec.workload_workers or spec.workers
    worker = _pod_set(names.ROLE_WORKER, workers, worker_pod(world, owner, 0, 0))
    if spec.elastic is not None and spec.elastic.min_workers < workers:
        worker["minCount"] = spec.elastic.min_workers
    if spec.torchrun is not None:
        return [worker]
    launcher = launcher_pod(world, owner, 0)
    # The world's size is the operator's record on the pod, not part of what Kueue admits.
    launcher["metadata"]["labels"].pop(names.WORLD_SIZE_LABEL, None)
    return [worker, _pod_set(names.ROLE_LAUNCHER, 1, launcher)]


def _pod_set(name: str, count: int, pod: Json) -> Json:
    meta = pod.get("metadata") or {}
    template_meta = {k: dict(meta[k]) for k in ("labels", "annotations") if meta.get(k)}
    return {"name": name, "count": count, "template": {"metadata": template_meta, "spec": pod["spec"]}}


def finished_conditions(
    workload: Mapping[str, Any], phase: str, message: str, now: datetime
) -> list[Json] | None:
    """The Workload's conditions with Finished True for a job that ended in `phase`; None when it says so
    already."""
    conditions: Iterable[Json] = (workload.get("status") or {}).get("conditions") or ()
    if any(c.get("type") == FINISHED and c.get("status") == "True" for c in conditions):
        return None
    finished = {
        "type": FINISHED,
        "status": "True",
        "reason": FINISHED_SUCCEEDED if phase == SUCCEEDED else FINISHED_FAILED,
        "message": message or f"the job {phase.lower()}",
        "lastTransitionTime": format_time(now),
        "observedGeneration": int((workload.get("metadata") or {}).get("generation") or 0),
    }
    return [*(c for c in conditions if c.get("type") != FINISHED), finished]
