"""spec.managedBy: which controller reconciles a job. As batch/v1 Job's field of that name, and mpi-operator's
and Kubeflow Trainer's: empty or this operator's name, this operator; any other value, another controller,
and this operator leaves the job alone. Kueue's MultiKueue (`kueue.x-k8s.io/multikueue`) is that other
controller on a manager cluster: it dispatches the job to a worker cluster and mirrors its status back.

The CRD checks the value's format and keeps it immutable, so a job never changes hands. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob import API_GROUP
from dtjob.spec import validators as rules

# The value that names this operator (setting it is the same as leaving the field out).
THIS_OPERATOR = f"{API_GROUP}/operator"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
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


def managed_by_problem(value: str) -> str | None:
    """Why `value` names no controller, or None."""
    if len(value) <= MANAGED_BY_MAX and rules.matches(MANAGED_BY, value):
        return None
    return (
        f"{value!r} is not a controller name: a domain-prefixed path of at most {MANAGED_BY_MAX} characters, "
        f"e.g. {MULTIKUEUE}"
    )
