"""The job state machine: (spec, observed children, previous status, now) -> new status + actions.

Pure. Phases: Pending -> [Staging ->] Starting -> Running -> Succeeded | Failed, plus Suspended and
Restarting.
Staging (spec.dataset.stageFrom) copies the dataset onto the job's volume with a staging Job before any
worker exists; the `Staged` condition remembers it, so world restarts never stage again.
A world attempt is numbered by `status.restarts`; pods carry it as a label, so pods of an older attempt are
recognised as stale after a restart (also after an operator restart: nothing is kept in memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob import names
from dtjob.observed import LauncherState, Observed, PodState
from dtjob.spec import JobSpec
from dtjob.stager.job import StagingOutcome, staging_job_name

PENDING = "Pending"
STAGING = "Staging"
STARTING = "Starting"
RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
FINISHED = (SUCCEEDED, FAILED)
# How long a finished job waits for its pod logs to reach the output container before cleaning up anyway.
LOG_UPLOAD_GRACE = timedelta(minutes=5)
STAGING_POLL_SECONDS = 10.0
# The longest a decision asks to wait for a timer; a far deadline is simply looked at again later.
MAX_REQUEUE_SECONDS = 24 * 3600.0

# Condition Created=False with this reason: the API server refused a create with 403 (dtjob.refusals); the
# job waits and tries again, and keeps saying why instead of "creating N worker pod(s)".
CREATE_FORBIDDEN = "CreateForbidden"

CONDITION_TYPES = ("Staged", "Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str

    def to_dict(self) -> dict[str, str]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }


@dataclass(frozen=True)
class JobStatus:
    phase: str | None = None
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    restarts: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    workers_total: int = 0
    workers_ready: int = 0
    total_gpus: int = 0
    launcher_state: str = "Absent"
    launcher_pod: str | None = None
    staging: Mapping[str, Any] | None = None  # ProgressSnapshot.to_status() of the staging Job
    output_url: str | None = None  # the run's results URL, never with a SAS
    logs_uploaded: bool = False
    logs_missing: tuple[str, ...] = ()  # pods whose log could not be read
    logs_error: str | None = None  # why the last log upload failed (redacted)
    sas_secrets_deleted: bool = False

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def is_true(self, kind: str) -> bool:
        cond = self.condition(kind)
        return cond is not None and cond.status == "True"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "message": self.message,
            "conditions": [c.to_dict() for c in self.conditions],
            "restarts": self.restarts,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "observedGeneration": self.observed_generation,
            "workers": {"total": self.workers_total, "ready": self.workers_ready},
            "workersReady": f"{self.workers_ready}/{self.workers_total}",
            "gpus": self.total_gpus,
            "launcher": {"state": self.launcher_state, "pod": self.launcher_pod},
        }
        if self.staging is not None:
            out["staging"] = dict(self.staging)
        if self.output_url is not None:
            output: dict[str, Any] = {"url": self.output_url, "logsUploaded": self.logs_uploaded}
            if self.logs_missing:
                output["logsMissing"] = list(self.logs_missing)
            if self.logs_error:
                output["logsError"] = self.logs_error
            out["output"] = output
        if self.sas_secrets_deleted:
            out["sasSecretsDeleted"] = True
        return out


def status_from_dict(data: Mapping[str, Any] | None) -> JobStatus:
    data = data or {}
    workers = data.get("workers") or {}
    launcher = data.get("launcher") or {}
    output = data.get("output") or {}
    return JobStatus(
        phase=data.get("phase"),
        message=data.get("message") or "",
        conditions=tuple(
            Condition(
                type=str(c.get("type")),
                status=str(c.get("status")),
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
                last_transition_time=str(c.get("lastTransitionTime") or ""),
            )
            for c in data.get("conditions") or ()
        ),
        restarts=int(data.get("restarts") or 0),
        start_time=data.get("startTime"),
        completion_time=data.get("completionTime"),
        observed_generation=data.get("observedGeneration"),
        workers_total=int(workers.get("total") or 0),
        workers_ready=int(workers.get("ready") or 0),
        total_gpus=int(data.get("gpus") or 0),
        launcher_state=str(launcher.get("state") or "Absent"),
        launcher_pod=launcher.get("pod"),
        staging=data.get("staging"),
        output_url=output.get("url"),
        logs_uploaded=bool(output.get("logsUploaded")),
        logs_missing=tuple(str(p) for p in output.get("logsMissing") or ()),
        logs_error=output.get("logsError"),
        sas_secrets_deleted=bool(data.get("sasSecretsDeleted")),
    )


# Actions the apply layer carries out; all are idempotent (create-if-absent, delete-if-present).
@dataclass(frozen=True)
class EnsureWorld:
    """SSH Secret, hostfile ConfigMap (kept current) and headless Service."""


@dataclass(frozen=True)
class CreateWorker:
    index: int
    attempt: int


@dataclass(frozen=True)
class CreateLauncher:
    attempt: int


@dataclass(frozen=True)
class DeletePod:
    name: str


@dataclass(frozen=True)
class DeleteLauncher:
    pass


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished elapsed: delete the DistributedTrainingJob itself (children follow by GC)."""


@dataclass(frozen=True)
class CreateStagingJob:
    """The staging Job that copies spec.dataset.stageFrom onto the data volume."""


@dataclass(frozen=True)
class UploadLogs:
    """Upload pod logs to the output container. At the end (attempt None) every pod's, and pods are deleted
    only after it (next reconcile); before a world restart, the failed attempt's, under logs/attempt-<n>/."""

    attempt: int | None = None


@dataclass(frozen=True)
class DeleteSasSecrets:
    """The job ended: revoke what pods could read by deleting `<job>-sas-in` and `<job>-sas-out`."""


Action = (
    EnsureWorld | CreateWorker | CreateLauncher | DeletePod | DeleteLauncher | DeleteJob
    | CreateStagingJob | UploadLogs | DeleteSasSecrets
)  # fmt: skip


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Blocker:
    """Something only the operator can find (a missing PVC, Secret, or no node big enough).

    fatal: the job cannot ever run as written -> Failed; otherwise it waits in Pending and is rechecked.
    """

    reason: str
    message: str
    fatal: bool = False


@dataclass
class Decision:
    status: JobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def seconds_after(moment: datetime, seconds: int) -> datetime:
    """moment + seconds, saturating at the last representable instant: a deadline or TTL beyond it never
    comes, and must not raise OverflowError in the middle of a reconcile."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


def set_condition(
    conditions: tuple[Condition, ...], kind: str, status: bool, reason: str, message: str, now: datetime
) -> tuple[Condition, ...]:
    """Set one condition; lastTransitionTime moves only when its status flips."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.type == kind), None)
    stamp = old.last_transition_time if old and old.status == value else format_time(now)
    new = Condition(kind, value, reason, message, stamp)
    others = [c for c in conditions if c.type != kind]
    merged = [*others, new]
    return tuple(
        sorted(merged, key=lambda c: CONDITION_TYPES.index(c.type) if c.type in CONDITION_TYPES else 99)
    )


class _Builder:
    """Accumulates one reconcile's decision; keeps decide() readable."""

    def __init__(self, prev: JobStatus, now: datetime) -> None:
        self.prev = prev
        self.now = now
        self.status = prev
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue_after: float | None = None

    def cond(self, kind: str, status: bool, reason: str, message: str) -> None:
        conds = set_condition(self.status.conditions, kind, status, reason, message, self.now)
        self.status = replace(self.status, conditions=conds)

    def cond_false_if_present(self, kind: str, reason: str, message: str = "") -> None:
        if self.status.condition(kind) is not None:
            self.cond(kind, False, reason, message)

    def phase(self, phase: str, message: str, event_type: str = "Normal", reason: str | None = None) -> None:
        if phase != self.prev.phase:
            self.events.append(Event(event_type, reason or phase, message or phase))
        self.status = replace(self.status, phase=phase, message=message)

    def requeue(self, seconds: float) -> None:
        seconds = min(max(seconds, 1.0), MAX_REQUEUE_SECONDS)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def decision(self) -> Decision:
        return Decision(self.status, self.actions, self.events, self.requeue_after)


def decide(
    spec: JobSpec,
    observed: Observed,
    prev: JobStatus,
    now: datetime,
    generation: int | None = None,
    blocker: Blocker | None = None,
    staging: StagingOutcome | None = None,
) -> Decision:
    """`staging` is the staging Job's outcome when that Job exists (None when it does not)."""
    b = _Builder(prev, now)
    b.status = replace(
        prev,
        observed_generation=generation,
        workers_total=spec.workers,
        total_gpus=spec.workers * spec.gpus_per_worker,
    )
    attempt = prev.restarts
    workers = {
        p.index: p
        for p in observed.workers()
        if p.attempt == attempt and p.index is not None and p.index < spec.workers and not p.deleting
    }
    launcher = observed.launcher if observed.launcher and observed.launcher.attempt == attempt else None
    _count(b, spec, workers, launcher)

    if prev.phase in FINISHED:
        _cleanup(b, spec, observed)
        _ttl(b, spec)
        return b.decision()

    world_started = bool(workers) or launcher is not None or prev.start_time is not None
    if blocker is not None and not world_started:
        if blocker.fatal:
            _finish(b, spec, observed, FAILED, blocker.reason, blocker.message)
        else:
            b.cond("Created", False, blocker.reason, blocker.message)
            b.phase(PENDING, blocker.message, "Warning", blocker.reason)
            b.requeue(15)
        return b.decision()

    if spec.run_policy.suspend:
        _delete_world_pods(b, observed)
        b.cond("Suspended", True, "Suspended", "runPolicy.suspend is true: pods deleted, job kept")
        b.cond_false_if_present("Running", "Suspended")
        b.cond_false_if_present("Restarting", "Suspended")
        b.status = replace(b.status, start_time=None)
        b.phase(SUSPENDED, "suspended: pods deleted; set runPolicy.suspend=false to resume")
        return b.decision()
    if prev.phase == SUSPENDED:
        b.cond("Suspended", False, "Resumed", "runPolicy.suspend is false")
        b.events.append(Event("Normal", "Resumed", "resumed: recreating the MPI world"))

    start_time = b.status.start_time or format_time(now)
    b.status = replace(b.status, start_time=start_time)
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None:
        remaining = seconds_after(parse_time(start_time), deadline) - now
        if remaining <= timedelta(0):
            _finish(
                b, spec, observed, FAILED, "DeadlineExceeded",
                f"job was active longer than runPolicy.activeDeadlineSeconds ({deadline}s)",
            )  # fmt: skip
            return b.decision()
        b.requeue(remaining.total_seconds())

    must_stage = spec.dataset.staging is not None and not b.status.is_true("Staged")
    if must_stage and not (workers or launcher) and not _stage(b, spec, observed, staging):
        return b.decision()

    if launcher is not None and launcher.succeeded:
        pod = launcher.pod_name or names.launcher_name(spec.name)
        _finish(b, spec, observed, SUCCEEDED, "LauncherSucceeded", f"launcher pod {pod} completed")
        return b.decision()
    failure = _failure(spec, workers, launcher)
    if failure is not None:
        _fail_world(b, spec, observed, *failure)
        return b.decision()

    _progress(b, spec, observed, workers, launcher, attempt)
    return b.decision()


def _stage(b: _Builder, spec: JobSpec, observed: Observed, outcome: StagingOutcome | None) -> bool:
    """Drive the staging Job; True once the data is staged and the world may be created."""
    staging = spec.dataset.staging
    assert staging is not None
    source = staging.source.source
    what = f"{source.container}/{source.prefix}".rstrip("/")
    job = staging_job_name(spec.name)
    if outcome is None:
        b.actions.append(CreateStagingJob())
        b.status = replace(b.status, staging={"phase": "starting"})
        b.phase(STAGING, f"staging {what} to {staging.destination} (Job {job})")
        b.requeue(STAGING_POLL_SECONDS)
        return False
    snapshot = outcome.progress.to_status() if outcome.progress is not None else None
    if outcome.phase == "Succeeded":
        b.status = replace(b.status, staging=snapshot or {"phase": "done"})
        b.cond("Staged", True, "StagingSucceeded", f"{what} staged to {staging.destination}")
        b.events.append(Event("Normal", "Staged", f"{what} staged to {staging.destination}"))
        return True
    if outcome.phase == "Failed":
        b.status = replace(
            b.status, staging={**(snapshot or {}), "phase": "failed", "reason": outcome.reason}
        )
        b.cond("Staged", False, "StagingFailed", outcome.reason)
        _finish(b, spec, observed, FAILED, "StagingFailed", f"staging Job {job} failed: {outcome.reason}")
        return False
    b.status = replace(b.status, staging=snapshot or b.status.staging or {"phase": "starting"})
    b.phase(STAGING, f"staging {what} to {staging.destination}{_progress_text(outcome)}")
    b.requeue(STAGING_POLL_SECONDS)
    return False


def _progress_text(outcome: StagingOutcome) -> str:
    p = outcome.progress
    if p is None or not p.files_total:
        return ""
    return (
        f": {p.files_complete}/{p.files_total} files, {(p.bytes_done + p.bytes_skipped) / 2**20:.0f}/"
        f"{p.bytes_total / 2**20:.0f} MiB at {p.bytes_per_s / 2**20:.1f} MiB/s"
    )


def _count(
    b: _Builder, spec: JobSpec, workers: Mapping[int, PodState], launcher: LauncherState | None
) -> None:
    ready = sum(1 for p in workers.values() if p.ready and p.phase == "Running")
    if launcher is None:
        state, pod = "Absent", None
    else:
        state = (
            "Succeeded" if launcher.succeeded
            else "Failed" if launcher.failed
            else "Running" if launcher.running
            else "Pending"
        )  # fmt: skip
        pod = launcher.pod_name
    b.status = replace(b.status, workers_ready=ready, launcher_state=state, launcher_pod=pod)


def _failure(
    spec: JobSpec, workers: Mapping[int, PodState], launcher: LauncherState | None
) -> tuple[str, str] | None:
    """(reason, message naming the pod) for the first failure of the current attempt, or None."""
    if launcher is not None and launcher.failed:
        pod = launcher.pod_name or names.launcher_name(spec.name)
        return "LauncherFailed", f"launcher pod {pod} failed: {launcher.reason or 'unknown reason'}"
    for index in sorted(workers):
        worker = workers[index]
        if worker.phase == "Failed":
            return "WorkerFailed", f"worker pod {worker.name} failed: {worker.reason or 'unknown reason'}"
        if worker.phase == "Succeeded":  # sshd must never exit while the world lives
            return "WorkerFailed", f"worker pod {worker.name} exited"
    if launcher is not None and not launcher.finished:
        # Once the launcher runs, every worker must stay: a vanished one (evicted, deleted) breaks the world.
        for index in range(spec.workers):
            if index not in workers:
                name = names.worker_name(spec.name, index)
                return "WorkerLost", f"worker pod {name} disappeared while the launcher was running"
    return None


def _fail_world(b: _Builder, spec: JobSpec, observed: Observed, reason: str, message: str) -> None:
    limit = spec.run_policy.backoff_limit
    if b.prev.restarts >= limit:
        _finish(
            b, spec, observed, FAILED, reason,
            f"{message}; runPolicy.backoffLimit ({limit}) reached after {b.prev.restarts} restarts",
        )  # fmt: skip
        return
    restarts = b.prev.restarts + 1
    b.status = replace(
        b.status, restarts=restarts, launcher_state="Absent", launcher_pod=None, workers_ready=0
    )
    text = f"{message}; restarting the world (restart {restarts} of {limit})"
    b.cond("Restarting", True, reason, text)
    b.cond_false_if_present("Running", reason, message)
    b.events.append(Event("Warning", reason, text))
    b.phase(RESTARTING, text, "Warning", "Restarting")
    if spec.output is not None:
        # The failed world's logs say why it failed: keep them before its pods go.
        b.actions.append(UploadLogs(attempt=b.prev.restarts))
    _delete_world_pods(b, observed)


def _progress(
    b: _Builder,
    spec: JobSpec,
    observed: Observed,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    attempt: int,
) -> None:
    # Children of older attempts (or beyond spec.workers) go first; their names are reused.
    blocked: set[str] = set()
    for pod in observed.workers():
        stale = pod.attempt != attempt or (pod.index is not None and pod.index >= spec.workers)
        if stale or pod.deleting:
            blocked.add(pod.name)
            if not pod.deleting:
                b.actions.append(DeletePod(pod.name))
    stale_launcher = observed.launcher is not None and launcher is None
    if stale_launcher and observed.launcher and not observed.launcher.deleting:
        b.actions.append(DeleteLauncher())

    missing = [
        i for i in range(spec.workers) if i not in workers and names.worker_name(spec.name, i) not in blocked
    ]
    if missing:
        b.actions.append(EnsureWorld())
        b.actions.extend(CreateWorker(i, attempt) for i in missing)
    all_ready = len(workers) == spec.workers and all(
        p.ready and p.phase == "Running" for p in workers.values()
    )
    create_launcher = launcher is None and all_ready and not stale_launcher
    if create_launcher:
        b.actions.append(CreateLauncher(attempt))
        b.status = replace(b.status, launcher_state="Pending")

    refused = b.prev.condition("Created")
    if refused is not None and refused.reason == CREATE_FORBIDDEN and (missing or create_launcher):
        # The last create was refused (a quota, RBAC): try again, and keep the API server's words in view.
        b.phase(RESTARTING if b.prev.phase == RESTARTING else PENDING, refused.message)
        return
    if not b.status.is_true("Created"):
        b.cond("Created", True, "WorldCreated", "SSH secret, hostfile, service and worker pods created")

    restarting = b.prev.phase == RESTARTING or b.status.is_true("Restarting")
    if launcher is not None and launcher.running:
        b.cond("Running", True, "LauncherRunning", f"{spec.total_slots} ranks on {spec.workers} workers")
        b.cond_false_if_present("Restarting", "Recovered", f"world running again after {attempt} restarts")
        if restarting:
            b.events.append(Event("Normal", "Recovered", f"world running again after {attempt} restarts"))
        b.phase(RUNNING, f"training: {spec.total_slots} ranks on {spec.workers} workers")
        return
    if launcher is not None or all_ready:
        message = "all workers ready; launcher starting"
        phase = STARTING
    else:
        waiting = _waiting_message(spec, workers, missing, blocked)
        scheduled = len(workers) == spec.workers and all(p.scheduled for p in workers.values())
        phase = STARTING if scheduled else PENDING
        message = waiting
    b.phase(RESTARTING if restarting else phase, message)


def _waiting_message(
    spec: JobSpec, workers: Mapping[int, PodState], missing: list[int], blocked: set[str]
) -> str:
    ready = sum(1 for p in workers.values() if p.ready)
    text = f"{ready}/{spec.workers} workers ready"
    if blocked:
        return f"{text}; waiting for {len(blocked)} old pod(s) to terminate"
    if missing:
        return f"{text}; creating {len(missing)} worker pod(s)"
    for index in sorted(workers):
        pod = workers[index]
        if not pod.ready and pod.reason:
            return f"{text}; {pod.name}: {pod.reason}"
    return text


def _finish(b: _Builder, spec: JobSpec, observed: Observed, phase: str, reason: str, message: str) -> None:
    b.status = replace(b.status, completion_time=format_time(b.now))
    b.cond(phase, True, reason, message)
    b.cond_false_if_present("Running", reason, message)
    b.cond_false_if_present("Restarting", reason, message)
    b.phase(phase, message, "Normal" if phase == SUCCEEDED else "Warning", reason)
    _cleanup(b, spec, observed)
    _ttl(b, spec)


def _cleanup(b: _Builder, spec: JobSpec, observed: Observed) -> None:
    """runPolicy.cleanPodPolicy once finished: None keeps pods, Running frees GPUs, All removes every pod.
    With spec.output, pod logs are uploaded first (so they survive), then the SAS Secrets are deleted."""
    if spec.output is not None and not b.status.logs_uploaded and not _log_grace_over(b):
        b.actions.append(UploadLogs())
        b.requeue(1)
        return
    has_sas = spec.output is not None or spec.dataset.staging is not None
    if has_sas and not b.status.sas_secrets_deleted:
        b.actions.append(DeleteSasSecrets())
        b.status = replace(b.status, sas_secrets_deleted=True)
    policy = spec.run_policy.clean_pod_policy
    if policy == "None":
        return
    for pod in observed.workers():
        if not pod.deleting and (policy == "All" or not pod.finished):
            b.actions.append(DeletePod(pod.name))
    launcher = observed.launcher
    if launcher is not None and not launcher.deleting and (policy == "All" or not launcher.finished):
        b.actions.append(DeleteLauncher())


def _log_grace_over(b: _Builder) -> bool:
    """Logs that cannot be uploaded must not keep GPUs busy forever: give up after LOG_UPLOAD_GRACE."""
    done = b.status.completion_time
    if done is None or b.now < parse_time(done) + LOG_UPLOAD_GRACE:
        return False
    if b.prev.sas_secrets_deleted is False and b.status.logs_error:
        b.events.append(
            Event("Warning", "LogsNotUploaded", f"gave up uploading pod logs: {b.status.logs_error}")
        )
    return True


def _ttl(b: _Builder, spec: JobSpec) -> None:
    ttl = spec.run_policy.ttl_seconds_after_finished
    if ttl is None or b.status.completion_time is None:
        return
    remaining = seconds_after(parse_time(b.status.completion_time), ttl) - b.now
    if remaining <= timedelta(0):
        b.actions.append(DeleteJob())
    else:
        b.requeue(remaining.total_seconds())


def _delete_world_pods(b: _Builder, observed: Observed) -> None:
    for pod in observed.workers():
        if not pod.deleting:
            b.actions.append(DeletePod(pod.name))
    if observed.launcher is not None and not observed.launcher.deleting:
        b.actions.append(DeleteLauncher())


def invalid_spec(
    prev: JobStatus,
    path: str,
    message: str,
    now: datetime,
    generation: int | None,
    reason: str = "InvalidSpec",
) -> Decision:
    """A spec the operator cannot run -> Failed, naming the field. Parsing comes first: nothing exists yet."""
    b = _Builder(prev, now)
    b.status = replace(prev, observed_generation=generation)
    text = f"{path}: {message}"
    if prev.phase in FINISHED:
        return b.decision()
    b.status = replace(b.status, completion_time=format_time(now))
    b.cond("Failed", True, reason, text)
    b.cond_false_if_present("Running", reason, text)
    b.phase(FAILED, text, "Warning", reason)
    return b.decision()
