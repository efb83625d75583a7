"""MultiKueue, both ends. On the manager cluster, a job whose spec.managedBy is kueue.x-k8s.io/multikueue gets
its Kueue Workload from the operator and nothing else: no pods, no Secrets, no status (Kueue copies the status
of the job's copy on the worker cluster that runs it). On a worker, the copy's Workload is marked Finished
once the copy ends, so that Kueue finishes the manager's Workload and copies the last status over.

What the operator cannot write to the status (a missing queue, an invalid spec) it says in a Warning Event,
posted once per job and reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.workload import (
    WORKLOAD_KIND,
    Priority,
    dispatch_queue,
    dispatch_workload,
    finished_conditions,
    priority_class,
)
from dtjob.gang.kueue import PRIORITY_CLASS_LABEL
from dtjob.kube.client import Forbidden, Kube
from dtjob.machine.prebuilt import prebuilt_problem
from dtjob.reconcile import reads
from dtjob.spec.managed_by import MULTIKUEUE, prebuilt_workload, workload_name
from dtjob.spec.parse import SpecError, parse_spec
from dtjob.state.prebuilt import prebuilt_state
from dtjob.state.status import FINISHED, JobStatus

log = logging.getLogger(__name__)

NO_QUEUE = "NoQueue"
INVALID_SPEC = "InvalidSpec"
NO_PRIORITY_CLASS = "NoPriorityClass"
WORKLOAD_CREATED = "WorkloadCreated"
# How often a job whose priority class cannot be read looks again (the operator watches no classes).
PRIORITY_RETRY_S = 30.0


def dispatch(kube: Kube, config: OperatorConfig, job: Mapping[str, Any], now: datetime) -> float | None:
    """The manager's part for a job MultiKueue dispatches: its Workload, created once, in the Kueue API the
    cluster serves. Returns when to look again (a priority class to wait for), or None."""
    meta = job["metadata"]
    name = meta["name"]
    queue = dispatch_queue(job)
    if queue is None:
        _warn_once(kube, job, NO_QUEUE, (
            f"spec.managedBy is {MULTIKUEUE}, but the job names no LocalQueue (runPolicy.scheduling."
            "queueName or the label kueue.x-k8s.io/queue-name): no Workload, so it is never dispatched"
        ), now)  # fmt: skip
        return None
    try:
        spec = parse_spec(job, config)
    except SpecError as err:
        _warn_once(kube, job, INVALID_SPEC, f"not dispatched: {err.path}: {err.message}", now)
        return None
    api = reads.kueue_api(kube)
    priority = _priority(kube, job, api)
    if isinstance(priority, str):
        if reads.get_workload(kube, meta["namespace"], workload_name(name)) is not None:
            return None  # made while the class could be read: its priority stays what it was then
        _warn_once(kube, job, NO_PRIORITY_CLASS, (
            f"metadata.labels[{PRIORITY_CLASS_LABEL}] names WorkloadPriorityClass {priority_class(job)!r}: "
            f"{priority}; no Workload until it can be read (looked at again every {PRIORITY_RETRY_S:.0f} s)"
        ), now)  # fmt: skip
        return PRIORITY_RETRY_S
    owner = owner_reference(name, str(meta["uid"]))
    created = kube.create(dispatch_workload(spec, owner, queue, api, priority))
    if created is not None:
        kube.emit_event(job, "Normal", WORKLOAD_CREATED, (
            f"Workload {workload_name(name)} in LocalQueue {queue}: MultiKueue runs the job on a worker "
            "cluster once one admits it; its status is copied here from there"
        ), now)  # fmt: skip
    return None


def _priority(kube: Kube, job: Mapping[str, Any], api: str) -> Priority | str | None:
    """The WorkloadPriorityClass the job's label names, as read (None: it names none), or why it cannot be
    read: then, as Kueue does for its own jobs, no Workload until the class exists, rather than one queued at
    a priority the job did not ask for."""
    name = priority_class(job)
    if name is None:
        return None
    try:
        found = reads.get_priority_class(kube, name, api)
    except Forbidden:
        return "the operator may not read WorkloadPriorityClasses (a namespace-scoped install)"
    if found is None:
        return "there is no such WorkloadPriorityClass"
    value = found.get("value")
    if isinstance(value, int) and not isinstance(value, bool):
        return Priority(name, value)
    return "its value is not a number"


def finish_prebuilt(
    kube: Kube, job: Mapping[str, Any], status: JobStatus, now: datetime, wound_down: bool = True
) -> None:
    """On a worker cluster: the Workload that admitted Kueue's copy of a job, marked Finished once the job
    has ended and `wound_down` (dtjob.machine.wound_down: Kueue then deletes the copy, pods and all, and
    copies its status to the manager one last time). Only the job's own Workload, read again here and made by
    MultiKueue and admitted (dtjob.machine.prebuilt): a label is anyone's to set, and Finished frees the
    quota. A JSON patch guarded by the resourceVersion it was read with (Kueue writes it too)."""
    name = prebuilt_workload(job)
    if name is None or status.phase not in FINISHED or not wound_down:
        return
    meta = job["metadata"]
    namespace = meta["namespace"]
    workload = reads.get_workload(kube, namespace, name)
    if workload is None:
        return
    conditions = finished_conditions(workload, str(status.phase), status.message, now)
    if conditions is None:
        return
    problem = prebuilt_problem(prebuilt_state(name, workload, str(meta["uid"])))
    if problem is not None:
        log.warning("%s/%s: Workload %s not marked Finished: %s", namespace, meta["name"], name, problem)
        return
    version = str(workload["metadata"]["resourceVersion"])
    patch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/status/conditions", "value": conditions},
    ]
    api = str(workload.get("apiVersion") or reads.kueue_api(kube))
    kube.patch(f"{WORKLOAD_KIND}/status", namespace, name, patch, api)
    log.info("Workload %s/%s marked Finished: the job %s", namespace, name, str(status.phase).lower())


def _warn_once(kube: Kube, job: Mapping[str, Any], reason: str, message: str, now: datetime) -> None:
    """A Warning Event, unless the job already has one of this reason: each resync would post it again."""
    meta = job["metadata"]
    fields = f"involvedObject.uid={meta['uid']},reason={reason}"
    if kube.list("Event", meta["namespace"], fields=fields, limit=1):
        return
    log.warning("%s/%s: %s", meta["namespace"], meta["name"], message)
    kube.emit_event(job, "Warning", reason, message, now)
