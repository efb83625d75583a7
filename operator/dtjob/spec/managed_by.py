"""spec.managedBy: which controller reconciles a job. As batch/v1 Job's field of that name, and mpi-operator's
and Kubeflow Trainer's: empty or this operator's name, this operator; any other value, another controller,
and this operator leaves the job alone. Kueue's MultiKueue (`kueue.x-k8s.io/multikueue`) is that other
controller on a manager cluster: it dispatches the job to a worker cluster and mirrors its status back. There
this operator does one thing for such a job, which Kueue leaves to the job's own controller: it creates the
job's Workload (dtjob.reconcile.dispatch). On the worker, Kueue's copy of the job has no managedBy and names
the Workload that holds its quota there (PREBUILT_WORKLOAD_LABEL, or from Kueue v0.18 with its default
WorkloadIdentifierAnnotations gate, an annotation of the same key): it runs as any job, outside Kueue's pod
groups, since that Workload already admitted it.

The CRD checks managedBy's format and keeps it immutable, so a job never changes hands. The label and the
annotation are anyone's who may edit a job, so they are input: a job may name only its own Workload (the
manager's operator names it after the job, and MultiKueue copies it under that name), and its world exists
only while that Workload, as read, is MultiKueue's and admitted (dtjob.machine.prebuilt). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dtjob import API_GROUP
from dtjob.spec import validators as rules
from dtjob.spec.model import JobSpec

# The value that names this operator (setting it is the same as leaving the field out).
THIS_OPERATOR = f"{API_GROUP}/operator"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
# Kueue's label on the copy of a job that MultiKueue created on a worker cluster: the name of the Workload
# (a copy of the manager's) that reserved the job's quota there.
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
PREBUILT_WORKLOAD_FIELD = f"metadata.labels[{PREBUILT_WORKLOAD_LABEL}]"
# Kueue v0.18+ (its WorkloadIdentifierAnnotations gate, on by default) names it in an annotation of that key
# instead, and reads the annotation first: both are read, and each one set must name the job's own Workload.
PREBUILT_WORKLOAD_ANNOTATION = PREBUILT_WORKLOAD_LABEL
PREBUILT_WORKLOAD_ANNOTATION_FIELD = f"metadata.annotations[{PREBUILT_WORKLOAD_ANNOTATION}]"
# MultiKueue's label on every object it creates on a worker, the copy of the Workload included (its value
# names the manager, which a worker cannot know); nothing else of Kueue sets it.
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
WORKLOAD_PREFIX = "dtjob-"
# The CRD's own check: a domain-prefixed path of at most 63 characters (as batch/v1 Job's managedBy).
MANAGED_BY = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"  # the domain
    r"/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"  # its path
)
MANAGED_BY_MAX = 63


def managed_by(job: Mapping[str, Any]) -> str:
    """The controller a job names; this operator's name when it names none."""
    spec = job.get("spec")
    value = spec.get("managedBy") if isinstance(spec, Mapping) else None
    return value if isinstance(value, str) and value else THIS_OPERATOR


def reconciled_here(job: Mapping[str, Any]) -> bool:
    return managed_by(job) == THIS_OPERATOR


def dispatched(job: Mapping[str, Any]) -> bool:
    """MultiKueue dispatches the job: this operator only creates its Workload."""
    return managed_by(job) == MULTIKUEUE


def handled_here(job: Mapping[str, Any]) -> bool:
    """The operator has something to do for the job: reconcile it, or create its Workload."""
    return reconciled_here(job) or dispatched(job)


def workload_name(job_name: str) -> str:
    """The Workload of a dispatched job: short enough for a label value (Kueue's prebuilt-workload label on
    the copy)."""
    return f"{WORKLOAD_PREFIX}{job_name}"


def prebuilt_workload(job: Mapping[str, Any]) -> str | None:
    """The Workload this copy of a dispatched job names, when it is the job's own; else None (and
    prebuilt_workload_problem says why a name was refused)."""
    named = _prebuilt_names(job)
    if not named or prebuilt_workload_problem(job) is not None:
        return None
    return named[0][1]


def prebuilt_workload_problem(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the field, why) the job's prebuilt-workload label or annotation is refused, or None. MultiKueue's copy
    always names the Workload made for the job of its name (workload_name): any other name is another job's
    Workload."""
    metadata = job.get("metadata")
    own = workload_name(str(metadata.get("name", "")) if isinstance(metadata, Mapping) else "")
    for field, value in _prebuilt_names(job):
        if value != own:
            why = f"names Workload {value!r}, not this job's own {own!r}"
            return field, f"{why}: a job runs only on its own Workload's quota"
    return None


def prebuilt_workload_field(job: Mapping[str, Any]) -> str:
    """The field that names the job's prebuilt Workload (the annotation's when both do); "" when none does."""
    named = _prebuilt_names(job)
    return named[0][0] if named else ""


def _prebuilt_names(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, value) of the prebuilt-workload annotation and label the job carries, the annotation first."""
    metadata = job.get("metadata")
    if not isinstance(metadata, Mapping):
        return []
    found = []
    for field, key, where in (
        (PREBUILT_WORKLOAD_ANNOTATION_FIELD, PREBUILT_WORKLOAD_ANNOTATION, "annotations"),
        (PREBUILT_WORKLOAD_FIELD, PREBUILT_WORKLOAD_LABEL, "labels"),
    ):
        values = metadata.get(where)
        value = values.get(key) if isinstance(values, Mapping) else None
        if isinstance(value, str) and value:
            found.append((field, value))
    return found


def unqueued(spec: JobSpec) -> JobSpec:
    """`spec` with no LocalQueue: its world joins no Kueue pod group (a Workload of its own admitted it)."""
    scheduling = replace(spec.run_policy.scheduling, queue_name=None, kueue_pod_group=False)
    return replace(spec, run_policy=replace(spec.run_policy, scheduling=scheduling))


def managed_by_problem(value: str) -> str | None:
    """Why `value` names no controller, or None."""
    if len(value) <= MANAGED_BY_MAX and rules.matches(MANAGED_BY, value):
        return None
    return (
        f"{value!r} is not a controller name: a domain-prefixed path of at most {MANAGED_BY_MAX} characters, "
        f"e.g. {MULTIKUEUE}"
    )
