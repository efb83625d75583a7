"""What an action the API server or Azure refused means for the job (act's Refused results). Pure.

Admission refuses creates with 403 for two kinds of cause:
- Pod Security admission: the namespace enforces a level the pod does not meet. The operator's own settings
  meet `restricted`, so the cause is something the spec asked for (an inline NFS volume, or what a pod
  template adds: hostIPC, capabilities...): the job fails with a message naming the field, and nothing of its
  world is left.
- A ResourceQuota, or the operator's own RBAC: room or permission may come later. The job waits in Pending
  with condition Created=False (reason CreateForbidden) quoting the API server, and tries again; with
  runPolicy.startupDeadlineSeconds, it fails once the refusals have lasted that long (the workers made before
  a refused launcher would otherwise hold their GPUs for good). So does a name held by another owner, below.
A child whose name an object of another owner holds (an older job of the same name) is never adopted: the job
waits the same way (reason ChildNotOwned) until the garbage collector removes it. So does a gang-scheduled job
on a cluster that does not serve its scheduler's PodGroup API (reason GangSchedulerMissing) until the
scheduler is installed; nothing of its world is created meanwhile. A child the API server rejects as invalid,
or credentials Azure refuses for good, fail the job and leave no half world.
The operator refuses its own creates too (dtjob.desired.pod_trust): a pod that would name another job's
Secret, an account key or the operator's ServiceAccount fails the job the same way, naming the spec field; one
that would name a Secret not there yet waits (reason SecretNotFound) and is built again at the next look, as
does one that mounts an NFS share while the operator may not read the Namespace's list (NfsSharesUnreadable).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from dtjob import names
from dtjob.gang import gang_scheduler
from dtjob.machine.finish import invalid_spec
from dtjob.spec.parse import JobSpec
from dtjob.state.conditions import with_kstatus_conditions
from dtjob.state.decision import Decision, DeleteWorld, Event, RefusalKind, Refused
from dtjob.state.status import (
    CHILD_NOT_OURS,
    CREATE_FORBIDDEN,
    FINISHED,
    GANG_API_MISSING,
    PENDING,
    RESTARTING,
    SECRET_NOT_FOUND,
    JobStatus,
    set_condition,
)
from dtjob.timefmt import parse_time_or_none

POD_SECURITY_VIOLATION = "PodSecurityViolation"
CHILD_REJECTED = "ChildRejected"
STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"
RETRY_SECONDS = 30.0
# Pod volumes built from the spec (dtjob.desired.pods), by name.
_VOLUME_FIELDS = {"data": "spec.dataset.volume", "checkpoints": "spec.checkpoints"}
# The template behind a refused pod, by its role (`Pod <job>-worker-<i>`, `Pod <job>-launcher`).
_TEMPLATE_FIELDS = {names.ROLE_WORKER: "spec.worker.template", names.ROLE_LAUNCHER: "spec.launcher.template"}


def refused(prev: JobStatus, refusal: Refused, spec: JobSpec | None, now: datetime) -> Decision:
    """The decision after `refusal`, from the status recorded before the actions ran (`prev`): a wait that
    tries again, or Failed with a DeleteWorld. `spec` is needed only when the gang's API is not served."""
    generation, message = prev.observed_generation, refusal.message
    match refusal.kind:
        case RefusalKind.FORBIDDEN:
            decision = create_forbidden(prev, message, now, generation, _deadline(spec))
        case RefusalKind.NOT_OURS:
            decision = child_not_ours(prev, message, now, generation, _deadline(spec))
        case RefusalKind.API_NOT_SERVED:
            assert spec is not None, "only a parsed spec's gang creates a PodGroup"
            return gang_api_missing(prev, spec, message, now, generation)
        case RefusalKind.REJECTED:
            decision = invalid_spec(prev, "spec", message, now, generation, reason=CHILD_REJECTED)
        case RefusalKind.STORAGE:
            decision = invalid_spec(prev, "spec", message, now, generation, reason=refusal.reason)
        case RefusalKind.UNTRUSTED:
            decision = invalid_spec(prev, refusal.field, message, now, generation, reason=refusal.reason)
        case RefusalKind.SECRET_MISSING:
            text = f"{refusal.field}: {message}; retrying every {RETRY_SECONDS:.0f}s"
            return _wait(prev, refusal.reason or SECRET_NOT_FOUND, text, now, generation)
    waits = refusal.kind in (RefusalKind.FORBIDDEN, RefusalKind.NOT_OURS)
    if not waits or decision.status.phase in FINISHED:
        decision.actions.append(DeleteWorld())  # something the spec asked for: no half world is left
    return decision


def _deadline(spec: JobSpec | None) -> int | None:
    return spec.run_policy.startup_deadline_seconds if spec is not None else None


def is_pod_security(message: str) -> bool:
    return "violates PodSecurity" in message


def pod_security_field(message: str) -> str:
    """The spec field behind a Pod Security refusal. The operator's own pods meet `restricted`: what breaks a
    level is an inline NFS volume, or what a pod template adds (host namespaces, capabilities, ...)."""
    fields: list[str] = []
    if 'volume type "nfs"' in message:
        fields += [f"{field}.nfs" for volume, field in _VOLUME_FIELDS.items() if f'"{volume}"' in message]
    violations = message.split('violates PodSecurity "', 1)[-1].split(": ", 1)[-1]
    if not fields or any(not v.startswith("restricted volume types") for v in _violations(violations)):
        kind, _, rest = message.partition(" ")
        launcher = rest.split(" ", 1)[0].endswith(f"-{names.ROLE_LAUNCHER}")
        role = names.ROLE_LAUNCHER if launcher else names.ROLE_WORKER
        fields.append(_TEMPLATE_FIELDS[role] if kind == "Pod" else "spec")
    return " and ".join(dict.fromkeys(fields))


def _violations(text: str) -> list[str]:
    """Pod Security's list of what a pod violates: `host namespaces (hostIPC=true), non-default ...`."""
    found, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            found.append(text[start:i].strip())
            start = i + 1
    return [*found, text[start:].strip()]


def create_forbidden(
    prev: JobStatus, message: str, now: datetime, generation: int | None, deadline_s: int | None = None
) -> Decision:
    """The decision after a create was refused with 403 (`message` names the object and quotes the API);
    `deadline_s`: runPolicy.startupDeadlineSeconds, counted from the first of the refusals in a row."""
    if is_pod_security(message):
        hint = ""
        if 'volume type "nfs"' in message:
            hint = "; give the share to the job as a persistentVolumeClaim instead"
        return invalid_spec(
            prev, pod_security_field(message), message + hint, now, generation, reason=POD_SECURITY_VIOLATION
        )
    return _bounded_wait(prev, CREATE_FORBIDDEN, message, now, generation, deadline_s)


def _bounded_wait(
    prev: JobStatus, reason: str, message: str, now: datetime, generation: int | None, deadline_s: int | None
) -> Decision:
    """Created=False with `reason` and another try later; with `deadline_s` (startupDeadlineSeconds), Failed
    once the creates have been refused for that long, counted from the first refusal of that reason in a row:
    the workers made before a refused pod or a name another owner holds would otherwise keep their GPUs."""
    text = f"{message}; retrying every {RETRY_SECONDS:.0f}s"
    since = _refused_since(prev, reason)
    if since is None:
        # The first refusal of a row: Created starts over from now, whatever it waited for before (its time
        # would otherwise stay that of an earlier wait, which moves only when the status flips).
        prev = replace(prev, conditions=tuple(c for c in prev.conditions if c.type != "Created"))
        since = now
    if deadline_s is None:
        return _wait(prev, reason, text, now, generation)
    left = (since + timedelta(seconds=deadline_s) - now).total_seconds()
    if left <= 0:
        late = f"still refused {deadline_s}s after the first refusal (runPolicy.startupDeadlineSeconds)"
        return invalid_spec(prev, "", f"{message}; {late}", now, generation, reason=STARTUP_DEADLINE_EXCEEDED)
    bounded = f"{text}, at most runPolicy.startupDeadlineSeconds ({deadline_s}s)"
    decision = _wait(prev, reason, bounded, now, generation)
    return replace(decision, requeue_after=min(RETRY_SECONDS, left))


def _refused_since(prev: JobStatus, reason: str) -> datetime | None:
    """When the creates began to be refused for `reason`: the Created condition's transition, while it says
    so."""
    created = prev.condition("Created")
    if created is None or created.status != "False" or created.reason != reason:
        return None
    return parse_time_or_none(created.last_transition_time)


def child_not_ours(
    prev: JobStatus, child: str, now: datetime, generation: int | None, deadline_s: int | None = None
) -> Decision:
    """A child's name is held by another owner's object (`child`, e.g. "ConfigMap rn50-hostfile"): most often
    an older job of the same name whose children the garbage collector has not removed yet."""
    text = (
        f"{child} exists and belongs to another owner (an older job of the same name?); waiting for it to be "
        "deleted"
    )
    return _bounded_wait(prev, CHILD_NOT_OURS, text, now, generation, deadline_s)


def gang_api_missing(
    prev: JobStatus, spec: JobSpec, api: str, now: datetime, generation: int | None
) -> Decision:
    """The cluster does not serve the PodGroup API (`api`, e.g. "PodGroup (scheduling.x-k8s.io/v1alpha1)")
    of the job's gang scheduler."""
    scheduler = gang_scheduler(spec)
    assert scheduler is not None
    text = f"{scheduler.api_not_served(spec, api)}; retrying every {RETRY_SECONDS:.0f}s"
    return _wait(prev, GANG_API_MISSING, text, now, generation)


def _wait(prev: JobStatus, reason: str, text: str, now: datetime, generation: int | None) -> Decision:
    """Created=False with the reason, the phase kept (Pending or Restarting), another try later."""
    conditions = set_condition(prev.conditions, "Created", False, reason, text, now)
    phase = RESTARTING if prev.phase == RESTARTING else PENDING
    status = replace(prev, conditions=conditions, observed_generation=generation, phase=phase, message=text)
    status = with_kstatus_conditions(status, now)
    events = [] if prev.message == text else [Event("Warning", reason, text)]
    return Decision(status, [], events, RETRY_SECONDS)
