"""The conditions GitOps tools read to tell whether a job is done: Ready, Reconciling and Stalled, after the
kstatus conventions (sigs.k8s.io/cli-utils/pkg/kstatus, which Flux and kpt use; docs/gitops.md has Argo CD's
counterpart). Derived from the phase and the job's own conditions on every decision, never decided on their
own. Pure.

- Reconciling=True while the job works toward its goal: Pending, Staging, Starting, Running, Restarting.
- Stalled=True when it cannot get there by itself: Failed, or a world whose create is refused or blocked
  (Created=False: a quota, RBAC, a missing PVC or credentials; the job retries, but someone has to act).
- Ready=True once it is where its spec asks it to be: Succeeded, or Suspended (runPolicy.suspend: it rests,
  neither working nor stuck; kstatus reads Ready=False as InProgress, which would hold a GitOps sync that
  waits for health until the job is resumed).
Together with status.observedGeneration (kstatus reads a job whose generation is ahead of it as InProgress)
this gives InProgress while a job runs, Current when it succeeded or is suspended, and Failed when it failed
or is stuck.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from dtjob.state.status import (
    FAILED,
    SUCCEEDED,
    SUSPENDED,
    ConditionType,
    JobStatus,
    set_condition,
)


def with_kstatus_conditions(status: JobStatus, now: datetime) -> JobStatus:
    """`status` with Ready, Reconciling and Stalled set to what its phase and conditions say."""
    reconciling, stalled, ready = _verdict(status)
    conditions = status.conditions
    for kind, (value, reason, message) in (
        (ConditionType.READY, ready),
        (ConditionType.RECONCILING, reconciling),
        (ConditionType.STALLED, stalled),
    ):
        conditions = set_condition(conditions, kind.value, value, reason, message, now)
    return replace(status, conditions=conditions)


Verdict = tuple[bool, str, str]


def _verdict(status: JobStatus) -> tuple[Verdict, Verdict, Verdict]:
    """(Reconciling, Stalled, Ready), each as (status, reason, message)."""
    phase = status.phase or "Pending"
    message = status.message or phase
    if phase == SUCCEEDED:
        reason = _reason_of(status, ConditionType.SUCCEEDED, phase)
        return (False, reason, message), (False, reason, message), (True, reason, message)
    if phase == FAILED:
        reason = _reason_of(status, ConditionType.FAILED, phase)
        return (False, reason, message), (True, reason, message), (False, reason, message)
    if phase == SUSPENDED:
        return (False, phase, message), (False, phase, message), (True, phase, message)
    created = status.condition(ConditionType.CREATED)
    if created is not None and created.status == "False":
        held = created.message or message
        return (False, created.reason, held), (True, created.reason, held), (False, created.reason, held)
    return (True, phase, message), (False, phase, message), (False, phase, message)


def _reason_of(status: JobStatus, kind: str, default: str) -> str:
    condition = status.condition(kind)
    return condition.reason if condition is not None and condition.reason else default
