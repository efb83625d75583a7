"""A launcher or stager pod that admission refuses. Pure.

The operator creates those two as Jobs, and Pod Security admission and ResourceQuota refuse the Job's pod,
not the Job: the Job waits without a word, and the job would sit in Starting (or Staging) holding every
worker's GPUs. The observer reads the Job controller's FailedCreate Event instead (a CreateRefusal):
- a Pod Security refusal is decided by the pod and the namespace's label: no retry heals it, so the job fails
  at once, naming the field behind the pod;
- anything else (a quota used up by the workers) can heal as other pods end: the job says so and waits, and
  fails once runPolicy.startupDeadlineSeconds has passed since the Job was created.
Failing frees the workers (cleanPodPolicy).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from dtjob.machine.builder import Builder
from dtjob.machine.world import WorldFailure
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import Event
from dtjob.state.failed_create import CreateRefusal

POD_SECURITY = "violates PodSecurity"
REFUSED = "PodRefused"


def refused_pod(
    spec: JobSpec, role: str, refusal: CreateRefusal, now: datetime
) -> tuple[WorldFailure | None, str, float | None]:
    """(the failure, or None while it may still heal; the message meanwhile; seconds to the deadline)."""
    what = f"the {role}'s pod (Job {refusal.job})"
    if POD_SECURITY in refusal.message:
        field = _field(spec, role, refusal.message)
        message = f"{field}: {what} is refused by Pod Security admission: {refusal.message}"
        return WorldFailure(REFUSED, message, permanent=True), message, None
    waiting = f"{what} is refused: {refusal.message}"
    deadline = spec.run_policy.startup_deadline_seconds
    if deadline is None or refusal.job_created is None:
        return None, f"{waiting}; waiting for room (set runPolicy.startupDeadlineSeconds to bound it)", None
    left = (refusal.job_created + timedelta(seconds=deadline) - now).total_seconds()
    if left <= 0:
        late = f"still refused {deadline}s after its Job was created (runPolicy.startupDeadlineSeconds)"
        message = f"{waiting}; {late}"
        return WorldFailure("StartupDeadlineExceeded", message, permanent=True), message, None
    bound = f"at most runPolicy.startupDeadlineSeconds ({deadline}s) from its creation"
    message = f"{waiting}; waiting for room, {bound}"
    return None, message, left


def wait_refused(
    b: Builder, condition: str, phase: str, waiting: str, due: float | None, poll_s: float
) -> None:
    """A refusal that may still heal: `condition` False quoting it (an event when it first says so), the
    phase kept, and another look within `poll_s` or at the deadline."""
    b.cond(condition, False, REFUSED, waiting)
    if b.prev.message != waiting:
        b.events.append(Event("Warning", REFUSED, waiting))
    b.phase(phase, waiting)
    b.requeue(min(due, poll_s) if due is not None else poll_s)


def _field(spec: JobSpec, role: str, message: str) -> str:
    """The spec field behind a refused pod: an inline NFS volume, or the launcher's template."""
    if 'volume type "nfs"' in message and '"data"' in message:
        return "spec.dataset.volume.nfs"
    return "spec.launcher.template" if role == "launcher" else "spec.dataset.stageFrom"
