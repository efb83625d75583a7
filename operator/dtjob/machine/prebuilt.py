"""Kueue's copy of a dispatched job on a worker cluster runs outside Kueue's pod groups, on the quota of the
Workload its label or annotation names (dtjob.spec.managed_by). Anyone who may edit a job may set those, so
the world exists only while that Workload, as read, is the job's own, made by MultiKueue, admitted, and
admitted the world the spec asks for (a spec edited on the worker would ask for more than the manager's
Workload holds). Otherwise the job waits (Pending, reason PrebuiltWorkloadNotAdmitted, naming the field) with
no pod of its world left, as Kueue keeps the jobs it manages suspended while their Workload is not admitted.
The same check, but for the world, guards the one write to that Workload: its Finished condition
(dtjob.reconcile.dispatch). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dtjob.desired.common import owner_reference
from dtjob.desired.workload import world_pod_sets
from dtjob.machine.builder import Builder
from dtjob.machine.finish import delete_world_pods
from dtjob.names import ROLE_WORKER
from dtjob.spec.managed_by import MULTIKUEUE_ORIGIN_LABEL, PREBUILT_WORKLOAD_FIELD
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import Observed
from dtjob.state.prebuilt import PodSetShape, PrebuiltWorkload, pod_set_shapes
from dtjob.state.status import PENDING

PREBUILT_NOT_ADMITTED = "PrebuiltWorkloadNotAdmitted"
# The operator watches no Workloads: a waiting copy reads its Workload again this often.
POLL_SECONDS = 15.0


def prebuilt_problem(workload: PrebuiltWorkload) -> str | None:
    """Why the job may not run on `workload`'s quota (nor mark it Finished), or None."""
    name = f"Workload {workload.name}"
    if not workload.found:
        return f"{name} does not exist in the job's namespace"
    if workload.controller is not None:
        return f"{name} is controlled by {workload.controller}, not by this job"
    if not workload.from_multikueue:
        return f"{name} was not made by MultiKueue (it has no {MULTIKUEUE_ORIGIN_LABEL} label)"
    if workload.finished:
        return f"{name} has finished"
    if workload.evicted or not workload.admitted:
        return f"{name} is not admitted"
    return None


def admitted_world(spec: JobSpec, workload: PrebuiltWorkload | None) -> JobSpec:
    """The world a copy runs: an elastic one that Kueue admitted in part (its workers' minCount is
    spec.elastic.minWorkers) aims for the workers admitted; any other, the spec's."""
    admitted = None if workload is None else workload.admitted_counts.get(ROLE_WORKER)
    if spec.elastic is None or admitted is None or not spec.elastic.min_workers <= admitted < spec.workers:
        return spec
    return replace(spec, workers=admitted, workload_workers=spec.workers)


def world_problem(workload: PrebuiltWorkload, spec: JobSpec, uid: str) -> str | None:
    """Why `workload` did not admit the world `spec` asks for (more pods, other requests, fewer workers than
    the world runs), or None."""
    wanted = pod_set_shapes(world_pod_sets(spec, owner_reference(spec.name, uid)))
    admitted_workers = workload.admitted_counts.get(ROLE_WORKER)
    if workload.pod_sets == wanted:
        if admitted_workers is None or admitted_workers >= spec.workers:
            return None
        return f"Workload {workload.name} admitted only {admitted_workers} of the {spec.workers} workers"
    admitted, asked = _pods(workload.pod_sets or {}), _pods(wanted or {})
    if admitted == asked:
        return f"Workload {workload.name} admitted {admitted} with other resource requests than the spec's"
    return f"Workload {workload.name} admitted {admitted}, not the {asked} the spec asks for"


def _pods(pod_sets: Mapping[str, PodSetShape]) -> str:
    return " and ".join(f"{p.count} {name}" for name, p in sorted(pod_sets.items(), reverse=True)) + " pods"


def wait_for_prebuilt(b: Builder, spec: JobSpec, observed: Observed) -> bool:
    """While the Workload a copy names does not hold its quota: no world (what exists of one is deleted),
    Pending with the reason; True then."""
    if spec.prebuilt_workload is None:
        return False
    workload = observed.prebuilt or PrebuiltWorkload(spec.prebuilt_workload)
    problem = prebuilt_problem(workload) or world_problem(workload, spec, observed.uid)
    if problem is None:
        return False
    field = spec.prebuilt_field or PREBUILT_WORKLOAD_FIELD
    text = f"{field}: {problem}; the job runs only on what MultiKueue's Workload admitted"
    delete_world_pods(b, observed)
    b.cond("Created", False, PREBUILT_NOT_ADMITTED, text)
    b.cond_false_if_present("Running", PREBUILT_NOT_ADMITTED, text)
    b.phase(PENDING, text, "Warning", PREBUILT_NOT_ADMITTED)
    b.requeue(POLL_SECONDS)
    return True
