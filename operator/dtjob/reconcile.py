"""One reconcile of one job: read it, parse, observe (from the watch cache), decide, write status, act.

Blocking (the Kubernetes client is synchronous); the controller runs it in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from dtjob import desired, names, storage
from dtjob.azure.results import output_url
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.kube import Forbidden, Kube, LogUnavailable, Rejected
from dtjob.observed import observe
from dtjob.preflight import preflight
from dtjob.progress import latest_progress
from dtjob.refusals import create_forbidden
from dtjob.spec import JobSpec, SpecError, parse_spec
from dtjob.sshkeys import generate_keypair
from dtjob.status import (
    FINISHED,
    RUNNING,
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
    JobStatus,
    UploadLogs,
    decide,
    invalid_spec,
    status_from_dict,
)

log = logging.getLogger(__name__)
Json = dict[str, Any]


@dataclass(frozen=True)
class Children:
    """The job's pods, launcher Job and staging Job as the watch cache last saw them."""

    pods: tuple[Mapping[str, Any], ...]
    launcher: Mapping[str, Any] | None
    staging: Mapping[str, Any] | None = None


def reconcile(
    kube: Kube,
    config: OperatorConfig,
    namespace: str,
    name: str,
    children: Children,
    now: datetime | None = None,
) -> float | None:
    """Returns seconds until this job needs another look without any event (deadline, TTL), or None."""
    now = now or datetime.now(UTC)
    job = kube.get_job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None  # gone or going: ownerReferences let the garbage collector remove the children
    meta = job["metadata"]
    prev = status_from_dict(job.get("status"))
    generation = meta.get("generation")
    spec: JobSpec | None
    try:
        spec = parse_spec(job, config)
    except SpecError as err:
        spec = None
        decision = invalid_spec(prev, err.path, err.message, now, generation)
    sas_requeue: float | None = None
    if spec is not None:
        observed = observe(children.pods, children.launcher)
        blocker = None
        if _needs_preflight(spec, prev.phase, observed.pods, children.launcher, prev.start_time):
            blocker = preflight(kube, spec)
        if prev.phase not in FINISHED and not spec.run_policy.suspend:
            # Before anything that mounts them exists: the SAS Secrets, minted or rotated.
            owner = owner_reference(name, meta["uid"])
            try:
                sas = storage.ensure_sas_secrets(kube, spec, prev, owner, now, config)
            except Forbidden as err:  # a quota on Secrets, say: the same wait as a refused pod
                return _forbidden(kube, namespace, name, str(err), now)
            # A refusal that can never clear (storage the namespace may not use) outranks a wait.
            if sas.blocker is not None and (blocker is None or (sas.blocker.fatal and not blocker.fatal)):
                blocker = sas.blocker
                log.warning("%s/%s: %s", namespace, name, sas.blocker.message)
            sas_requeue = sas.next_rotation_s
        staging = None
        if spec.dataset.staging is not None and not prev.is_true("Staged"):
            staging = storage.observe_staging(kube, namespace, children.staging, children.pods)
        decision = decide(spec, observed, prev, now, generation, blocker, staging)
        decision = _storage_status(kube, spec, meta["uid"], children, decision)

    new_status = decision.status.to_dict()
    requeue = decision.requeue_after
    running = decision.status.phase == RUNNING
    # Also once when the job finishes: a short run may print all its progress between two reads.
    finishing = decision.status.phase in FINISHED and prev.phase not in FINISHED
    if decision.status.launcher_pod and (running or finishing):
        progress = _launcher_progress(kube, namespace, decision.status.launcher_pod)
        if progress is not None:
            new_status["progress"] = progress
    if running and decision.status.launcher_pod:
        requeue = min(requeue or config.progress_seconds, config.progress_seconds)
    if _status_changed(job.get("status") or {}, new_status):
        # Status first: it records intent (e.g. restarts+1) that the actions below then carry out.
        kube.patch_status(namespace, name, new_status, meta["resourceVersion"])
    for event in decision.events:
        kube.emit_event(job, event.type, event.reason, event.message, now)
    if spec is not None:
        owner = owner_reference(name, meta["uid"])
        try:
            for action in decision.actions:
                _apply(kube, config, spec, owner, action)
        except Rejected as err:
            _fail_rejected(kube, namespace, name, str(err), now)
            return None
        except Forbidden as err:
            return _forbidden(kube, namespace, name, str(err), now)
    if sas_requeue is not None:
        requeue = min(sas_requeue, requeue or sas_requeue)
    return requeue


def _launcher_progress(kube: Kube, namespace: str, launcher_pod: str) -> dict[str, Any] | None:
    # The tail is enough: rank 0 prints a progress line every log interval. The byte cap bounds the read
    # when a framework floods the log with one huge line.
    try:
        text = kube.read_pod_log(
            namespace, launcher_pod, names.LAUNCHER_CONTAINER, tail_lines=50, limit_bytes=64 * 1024
        )
    except LogUnavailable:
        return None
    return latest_progress(text)


def _storage_status(kube: Kube, spec: JobSpec, uid: str, children: Children, decision: Decision) -> Decision:
    """The output URL, and the log upload the decision asks for before it lets pods be deleted."""
    if spec.output is None:
        return decision
    target = spec.output.target
    status: JobStatus = replace(
        decision.status,
        output_url=output_url(target.container_url, target.prefix, spec.namespace, spec.name, uid),
    )
    for action in decision.actions:
        if not isinstance(action, UploadLogs):
            continue
        if action.attempt is None:
            upload = storage.upload_pod_logs(kube, spec, uid, children.pods)
            status = replace(
                status, logs_uploaded=upload.uploaded, logs_missing=upload.missing, logs_error=upload.error
            )
            folder = f"{status.output_url}logs/"
        else:
            # Best effort, once: a restart never waits on storage.
            attempt_pods = [p for p in children.pods if storage.pod_attempt(p) == action.attempt]
            upload = storage.upload_pod_logs(kube, spec, uid, attempt_pods, attempt=action.attempt)
            folder = f"{status.output_url}logs/attempt-{action.attempt}/"
            if not upload.uploaded:
                reason = upload.error or "unknown error"
                decision.events.append(Event("Warning", "LogsNotUploaded", f"logs of {folder}: {reason}"))
        if upload.uploaded:
            text = f"pod logs uploaded to {folder}"
            if upload.missing:
                text += f" (not readable: {', '.join(upload.missing)})"
            decision.events.append(Event("Normal", "LogsUploaded", text))
    decision.status = status
    return decision


def _fail_rejected(kube: Kube, namespace: str, name: str, message: str, now: datetime) -> None:
    """A child the schema let through but the API refused: Failed with its message, and no half world left."""
    job = kube.get_job(namespace, name)
    if job is None:
        return
    meta = job["metadata"]
    prev = status_from_dict(job.get("status"))
    decision = invalid_spec(prev, "spec", message, now, meta.get("generation"), reason="ChildRejected")
    kube.patch_status(namespace, name, decision.status.to_dict(), meta["resourceVersion"])
    for event in decision.events:
        kube.emit_event(job, event.type, event.reason, event.message, now)
    _delete_world(kube, namespace, name)


def _forbidden(kube: Kube, namespace: str, name: str, message: str, now: datetime) -> float | None:
    """A child refused with 403: Failed naming the field (Pod Security admission) and no world left, or a
    waiting condition quoting the API server (a quota, RBAC) and another try later."""
    job = kube.get_job(namespace, name)
    if job is None:
        return None
    meta = job["metadata"]
    decision = create_forbidden(status_from_dict(job.get("status")), message, now, meta.get("generation"))
    new_status = decision.status.to_dict()
    if _status_changed(job.get("status") or {}, new_status):
        kube.patch_status(namespace, name, new_status, meta["resourceVersion"])
    for event in decision.events:
        kube.emit_event(job, event.type, event.reason, event.message, now)
    if decision.status.phase in FINISHED:
        _delete_world(kube, namespace, name)
    return decision.requeue_after


def _delete_world(kube: Kube, namespace: str, name: str) -> None:
    kube.delete_pods(namespace, f"{names.JOB_NAME_LABEL}={name}")
    kube.delete_batch_job(namespace, names.launcher_name(name))


def _needs_preflight(
    spec: JobSpec, phase: str | None, pods: Iterable[object], launcher: object, start_time: str | None
) -> bool:
    # Only before the first world exists: a running job is never failed by a later lookup.
    started = start_time is not None or any(True for _ in pods) or launcher is not None
    return not started and phase not in FINISHED and not spec.run_policy.suspend


def _status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(key) != value for key, value in new.items())


def _apply(kube: Kube, config: OperatorConfig, spec: JobSpec, owner: Json, action: Action) -> None:
    ns = spec.namespace
    match action:
        case EnsureWorld():
            if kube.get_secret(ns, names.ssh_secret_name(spec.name)) is None:
                keys = generate_keypair(comment=f"dtjob-{spec.name}")
                kube.create_if_absent(desired.ssh_secret(spec, owner, keys))
            kube.ensure_config_map(desired.hostfile_config_map(spec, owner))
            kube.create_if_absent(desired.workers_service(spec, owner))
            if config.network_policy:
                kube.create_if_absent(desired.network_policy(spec, owner))
        case CreateWorker(index=index, attempt=attempt):
            kube.create_if_absent(desired.worker_pod(spec, owner, index, attempt))
        case CreateLauncher(attempt=attempt):
            kube.create_if_absent(desired.launcher_job(spec, owner, attempt))
        case DeletePod(name=pod):
            kube.delete_pod(ns, pod)
        case DeleteLauncher():
            kube.delete_batch_job(ns, names.launcher_name(spec.name))
        case CreateStagingJob():
            kube.create_if_absent(desired.staging_job(spec, owner, config.stager_image))
        case UploadLogs():
            pass  # done before the status write (_storage_status); pods go on the next reconcile
        case DeleteSasSecrets():
            storage.delete_sas_secrets(kube, ns, spec.name)
        case DeleteJob():
            log.info("ttlSecondsAfterFinished elapsed: deleting %s/%s", ns, spec.name)
            kube.delete_training_job(ns, spec.name)


__all__ = ["Children", "Decision", "reconcile"]
