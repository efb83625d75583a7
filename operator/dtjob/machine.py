"""The job state machine: decide(spec, observed, previous status, now) -> new status + actions. Pure.

Staging (spec.dataset.stageFrom) copies the dataset onto the job's volume with a staging Job before any
worker exists; the `Staged` condition remembers it, so world restarts never stage again.
A world attempt is numbered by `status.restarts`; pods carry it as a label, so pods of an older attempt are
recognised as stale after a restart (also after an operator restart: nothing is kept in memory).
What actions produce (the log upload, the SAS revocation) reaches the status through with_results(), after
they ran: the status never claims what has not happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from dtjob import names
from dtjob.actions import (
    Action,
    CreateLauncher,
    CreateStagingJob,
    CreateWorker,
    Decision,
    DeleteJob,
    DeleteLauncher,
    DeletePod,
    DeleteSasSecrets,
    EnsureWorld,
    Event,
    LogsUploaded,
    MintSas,
    Result,
    SasSecretsDeleted,
    UploadLogs,
)
from dtjob.azure.results import output_url
from dtjob.observed import LauncherState, Observed, PodState
from dtjob.spec import JobSpec
from dtjob.stager.job import StagingOutcome, staging_job_name
from dtjob.status import (
    CHILD_NOT_OURS,
    CREATE_FORBIDDEN,
    FAILED,
    FINISHED,
    PENDING,
    RESTARTING,
    RUNNING,
    STAGING,
    STARTING,
    SUCCEEDED,
    SUSPENDED,
    JobStatus,
    format_time,
    parse_time,
    seconds_after,
    set_condition,
)

# How long a finished job waits for its pod logs to reach the output container before cleaning up anyway.
LOG_UPLOAD_GRACE = timedelta(minutes=5)
LOG_RETRY_SECONDS = 10.0
STAGING_POLL_SECONDS = 10.0
BLOCKED_POLL_SECONDS = 15.0
# The longest a decision asks to wait for a timer; a far deadline is simply looked at again later.
MAX_REQUEUE_SECONDS = 24 * 3600.0


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


def world_started(prev: JobStatus, observed: Observed) -> bool:
    """Whether a world of this job has ever existed: from then on, no preflight lookup may fail it."""
    return prev.start_time is not None or observed.world_exists


def decide(spec: JobSpec, observed: Observed, prev: JobStatus, now: datetime) -> Decision:
    b = _Builder(prev, now)
    b.status = replace(
        prev,
        observed_generation=observed.generation,
        workers_total=spec.workers,
        total_gpus=spec.workers * spec.gpus_per_worker,
    )
    _observations(b, spec, observed)
    attempt = prev.restarts
    launcher = observed.launcher if observed.launcher and observed.launcher.attempt == attempt else None
    # A running world keeps the size it was created with; an edit of spec.workers applies at the next one.
    size = (launcher.world_size if launcher else None) or spec.workers
    workers = {
        p.index: p
        for p in observed.workers()
        if p.attempt == attempt and p.index is not None and p.index < size and not p.deleting
    }
    _count(b, spec, workers, launcher)

    if prev.phase in FINISHED:
        _cleanup(b, spec, observed)
        _ttl(b, spec)
        return b.decision()

    blocker = observed.blocker
    if blocker is not None and not world_started(prev, observed):
        if blocker.fatal:
            _finish(b, spec, observed, FAILED, blocker.reason, blocker.message)
        else:
            b.cond("Created", False, blocker.reason, blocker.message)
            b.phase(PENDING, blocker.message, "Warning", blocker.reason)
            b.requeue(BLOCKED_POLL_SECONDS)
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
    deadline_s = spec.run_policy.active_deadline_seconds
    deadline = None if deadline_s is None else seconds_after(parse_time(start_time), deadline_s)
    if deadline is not None:
        remaining = deadline - now
        if remaining <= timedelta(0):
            _finish(
                b, spec, observed, FAILED, "DeadlineExceeded",
                f"job was active longer than runPolicy.activeDeadlineSeconds ({deadline_s}s)",
            )  # fmt: skip
            return b.decision()
        b.requeue(remaining.total_seconds())
    # Before anything that mounts them: the SAS Secrets, minted or rotated.
    _sas(b, observed, deadline)

    must_stage = spec.dataset.staging is not None and not b.status.is_true("Staged")
    if must_stage and not (workers or launcher) and not _stage(b, spec, observed, observed.staging):
        return b.decision()

    if launcher is not None and launcher.succeeded:
        pod = launcher.pod_name or names.launcher_name(spec.name)
        _finish(b, spec, observed, SUCCEEDED, "LauncherSucceeded", f"launcher pod {pod} completed")
        return b.decision()
    failure = _failure(spec, size, workers, launcher, prev)
    if failure is not None:
        _fail_world(b, spec, observed, *failure)
        return b.decision()

    _advance_world(b, spec, observed, workers, launcher, attempt, size)
    if b.status.phase == RUNNING and observed.progress_poll_s is not None:
        b.requeue(observed.progress_poll_s)
    return b.decision()


def _observations(b: _Builder, spec: JobSpec, observed: Observed) -> None:
    """Facts that go into status as read: the results URL and rank 0's training progress."""
    if spec.output is not None and observed.uid:
        target = spec.output.target
        url = output_url(target.container_url, target.prefix, spec.namespace, spec.name, observed.uid)
        b.status = replace(b.status, output_url=url)
    if observed.training_progress is not None:
        b.status = replace(b.status, training_progress=observed.training_progress)


def _sas(b: _Builder, observed: Observed, deadline: datetime | None) -> None:
    for access, sas in sorted(observed.sas.items()):
        if sas.mint_needed and sas.blocked is None:
            b.actions.append(MintSas(access, not_after=deadline))
        elif sas.mint_needed:  # the world runs on the old token while the credentials are fixed
            b.requeue(BLOCKED_POLL_SECONDS)
        elif sas.rotate_in_s is not None:
            b.requeue(sas.rotate_in_s)


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
    b.phase(STAGING, f"staging {what} to {staging.destination}{_staging_text(outcome)}")
    b.requeue(STAGING_POLL_SECONDS)
    return False


def _staging_text(outcome: StagingOutcome) -> str:
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
    spec: JobSpec,
    size: int,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    prev: JobStatus,
) -> tuple[str, str] | None:
    """(reason, message naming the pod) for the first failure of the current attempt, or None."""
    if launcher is None and prev.launcher_pod is not None and prev.phase != SUSPENDED:
        # Its pod was seen, so this is no cache lag after our own create: the Job was deleted by hand.
        return "LauncherLost", f"launcher pod {prev.launcher_pod} disappeared (its Job was deleted)"
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
        for index in range(size):
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


def _advance_world(
    b: _Builder,
    spec: JobSpec,
    observed: Observed,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    attempt: int,
    size: int,
) -> None:
    """Toward a world of `size` workers (spec.workers, or the running world's own size)."""
    # Children of older attempts (or beyond the world's size) go first; their names are reused.
    blocked: set[str] = set()
    for pod in observed.workers():
        stale = pod.attempt != attempt or (pod.index is not None and pod.index >= size)
        if stale or pod.deleting:
            blocked.add(pod.name)
            if not pod.deleting:
                b.actions.append(DeletePod(pod.name))
    stale_launcher = observed.launcher is not None and launcher is None
    if stale_launcher and observed.launcher and not observed.launcher.deleting:
        b.actions.append(DeleteLauncher())

    missing = [i for i in range(size) if i not in workers and names.worker_name(spec.name, i) not in blocked]
    if missing:
        b.actions.append(EnsureWorld())
        b.actions.extend(CreateWorker(i, attempt) for i in missing)
    all_ready = len(workers) == size and all(p.ready and p.phase == "Running" for p in workers.values())
    create_launcher = launcher is None and all_ready and not stale_launcher
    if create_launcher:
        b.actions.append(CreateLauncher(attempt))
        b.status = replace(b.status, launcher_state="Pending")

    refused = b.prev.condition("Created")
    held = refused is not None and refused.reason in (CREATE_FORBIDDEN, CHILD_NOT_OURS)
    if refused is not None and held and (missing or create_launcher):
        # The last create was refused (a quota, RBAC, a name still held): try again, and keep saying why.
        b.phase(RESTARTING if b.prev.phase == RESTARTING else PENDING, refused.message)
        return
    if not b.status.is_true("Created"):
        b.cond("Created", True, "WorldCreated", "SSH secret, hostfile, service and worker pods created")

    restarting = b.prev.phase == RESTARTING or b.status.is_true("Restarting")
    if launcher is not None and launcher.running:
        ranks = f"{size * spec.total_slots // spec.workers} ranks on {size} workers"
        if size != spec.workers:
            ranks += f" (spec.workers={spec.workers} applies at the next world)"
        b.cond("Running", True, "LauncherRunning", ranks)
        b.cond_false_if_present("Restarting", "Recovered", f"world running again after {attempt} restarts")
        if restarting:
            b.events.append(Event("Normal", "Recovered", f"world running again after {attempt} restarts"))
        b.phase(RUNNING, f"training: {ranks}")
        return
    if launcher is not None or all_ready:
        message = "all workers ready; launcher starting"
        phase = STARTING
    else:
        waiting = _waiting_message(spec, workers, missing, blocked)
        scheduled = len(workers) == size and all(p.scheduled for p in workers.values())
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
    grace_over = _log_grace_over(b.status, b.now)
    if spec.output is not None and not b.status.logs_uploaded and not grace_over:
        b.actions.append(UploadLogs())
        b.requeue(LOG_RETRY_SECONDS if b.status.logs_error else 1)
        return
    has_sas = spec.output is not None or spec.dataset.staging is not None
    if has_sas and not b.status.sas_secrets_deleted:
        b.actions.append(DeleteSasSecrets())
        if grace_over and b.status.logs_error and not b.status.logs_uploaded:
            b.events.append(
                Event("Warning", "LogsNotUploaded", f"gave up uploading pod logs: {b.status.logs_error}")
            )
    policy = spec.run_policy.clean_pod_policy
    if policy == "None":
        return
    for pod in observed.workers():
        if not pod.deleting and (policy == "All" or not pod.finished):
            b.actions.append(DeletePod(pod.name))
    launcher = observed.launcher
    if launcher is not None and not launcher.deleting and (policy == "All" or not launcher.finished):
        b.actions.append(DeleteLauncher())


def _log_grace_over(status: JobStatus, now: datetime) -> bool:
    """Logs that cannot be uploaded must not keep GPUs busy forever: give up after LOG_UPLOAD_GRACE."""
    done = status.completion_time
    return done is not None and now >= parse_time(done) + LOG_UPLOAD_GRACE


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


def with_results(status: JobStatus, results: Sequence[Result]) -> tuple[JobStatus, list[Event]]:
    """The status once the actions ran: what they produced, recorded only now that it has happened."""
    events: list[Event] = []
    for result in results:
        match result:
            case LogsUploaded(attempt=None):
                status = replace(
                    status,
                    logs_uploaded=result.uploaded,
                    logs_missing=result.missing,
                    logs_error=result.error,
                )
                status = replace(status, logs_truncated=_truncation(result))
            case LogsUploaded() if not result.uploaded:  # a failed world's logs: best effort, said once
                reason = result.error or "unknown error"
                events.append(Event("Warning", "LogsNotUploaded", f"logs of {result.folder}: {reason}"))
            case SasSecretsDeleted():
                status = replace(status, sas_secrets_deleted=True)
        if isinstance(result, LogsUploaded) and result.uploaded:
            text = f"pod logs uploaded to {result.folder}"
            if result.missing:
                text += f" (not readable: {', '.join(result.missing)})"
            if result.truncated:
                text += f" (cut to the {result.cap_bytes}-byte cap: {', '.join(result.truncated)})"
            events.append(Event("Normal", "LogsUploaded", text))
    return status, events


def _truncation(result: LogsUploaded) -> dict[str, Any] | None:
    """status.output.logsTruncated: the pods whose log was cut to the cap, and the cap."""
    return {"pods": list(result.truncated), "capBytes": result.cap_bytes} if result.truncated else None
