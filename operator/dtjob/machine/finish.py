"""The end of a job: its final condition, cleanup per cleanPodPolicy after the logs are uploaded, the SAS
revocation, the TTL; and a spec the operator cannot run. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from dtjob import gang, names
from dtjob.contract.results_upload import FAILED as RESULTS_FAILED
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT, UploadReport
from dtjob.machine.admission import after_the_end
from dtjob.machine.builder import Builder
from dtjob.machine.launch import launcher_deletes
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    Decision,
    DeleteJob,
    DeletePod,
    DeletePodGroup,
    DeleteSasSecrets,
    Event,
    UploadLogs,
)
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import FAILED, FINISHED, SUCCEEDED, JobStatus
from dtjob.timefmt import format_time, parse_time, seconds_after

RESULTS_UPLOAD_FAILED = "ResultsUploadFailed"
# How long a finished job waits for its pod logs to reach the output container before cleaning up anyway.
LOG_UPLOAD_GRACE = timedelta(minutes=5)
LOG_RETRY_SECONDS = 10.0


def finish(b: Builder, spec: JobSpec, observed: Observed, phase: str, reason: str, message: str) -> None:
    b.status = replace(b.status, completion_time=format_time(b.now))
    b.cond(phase, True, reason, message)
    b.cond_false_if_present("Running", reason, message)
    b.cond_false_if_present("Restarting", reason, message)
    b.phase(phase, message, "Normal" if phase == SUCCEEDED else "Warning", reason)
    if gang.pod_group_api(spec) is not None:
        # Once, as the job ends (its ownerReference removes it with the job in any case).
        b.actions.append(DeletePodGroup())
    cleanup(b, spec, observed)
    after_the_end(b, observed)  # now: with cleanPodPolicy None no pod event may come again
    ttl(b, spec)


def results_upload_failed(spec: JobSpec, launcher: LauncherState, observed: Observed) -> bool:
    """The results upload failed for good after training, as its own last line says: the current world's
    launcher ended with the reserved exit code (a user program that exits with that code during training is
    not mistaken for it), or a torchrun world's worker 0 keeps running with the results."""
    report = observed.results_upload
    if spec.output is None or report is None or report.state != RESULTS_FAILED:
        return False
    failed = launcher.failed_pod
    if launcher.failed:
        return failed is not None and failed.exit_code == UPLOAD_FAILED_EXIT
    return not launcher.is_launcher and launcher.running


def results_not_uploaded(b: Builder, spec: JobSpec, observed: Observed) -> None:
    """Training succeeded and storage refused the results for all of spec.output.uploadRetrySeconds: the job
    fails as an infrastructure failure, never a restart (which would train again) and never the user's code.
    The pod holding the results is kept whatever cleanPodPolicy says, until the job is deleted."""
    report = observed.results_upload
    reason = report.message if report is not None else "unknown error"
    holder: PodState | None = None
    if spec.launcher.run_as_worker:
        kept = "the results were on the launcher pod, which has ended with them"
    else:
        holder, kept = _results_holder(spec, observed, report, b.status.restarts)
    message = f"training finished, but the results upload failed: {reason}; {kept}"
    b.status = replace(
        b.status,
        results_state=RESULTS_FAILED,
        results_message=reason,
        results_pod=holder.name if holder is not None else None,
        results_pod_uid=holder.uid if holder is not None else None,
    )
    finish(b, spec, observed, FAILED, RESULTS_UPLOAD_FAILED, message)


def _results_holder(
    spec: JobSpec, observed: Observed, report: UploadReport | None, attempt: int
) -> tuple[PodState | None, str]:
    """The worker whose output directory holds the results, and what the message says of it: the pod the
    upload ran on, as its last line names it (an elastic world's rank 0 moves when its host is lost), else
    worker 0 of a static world, the one host its launcher uploads from. Only a live pod of the job's own
    current world, held by its UID: a pod of the same name made later holds none of them."""
    if report is not None and report.pod is not None:
        name = report.pod
    elif spec.elastic is None:
        name = names.worker_name(spec.name, 0)
    else:
        return None, "the upload did not say which pod holds the results, so no pod is kept for them"
    holder = next(
        (
            p
            for p in observed.workers()
            if p.name == name and p.attempt == attempt and p.phase == "Running" and not p.deleting
        ),
        None,
    )
    if holder is None:
        return None, f"pod {name}, which held the results, is gone with them"
    return holder, (
        f"the results are kept on pod {name} (which keeps its GPUs, and ttlSecondsAfterFinished waits) "
        f"until `dtjob results upload {spec.name}` uploads them or the job is deleted"
    )


def cleanup(b: Builder, spec: JobSpec, observed: Observed) -> None:
    """runPolicy.cleanPodPolicy once finished: None keeps pods, Running frees GPUs, All removes every pod.
    With spec.output, pod logs are uploaded first (so they survive) to the run's location, once the storage
    policy allowed it (status.output.url), then the SAS Secrets are deleted."""
    grace_over = _log_grace_over(b.status, b.now)
    allowed = spec.output is not None and b.status.output_url is not None
    if allowed and not b.status.logs_uploaded and not grace_over:
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
        if _keeps_results(b.status, pod):
            continue
        if not pod.deleting and (policy == "All" or not pod.finished):
            b.actions.append(DeletePod(pod.name, pod.uid))
    launcher = observed.launcher
    if launcher is not None and (policy == "All" or not launcher.finished):
        b.actions.extend(launcher_deletes(launcher))


def _keeps_results(status: JobStatus, pod: PodState) -> bool:
    """The pod holds results that were never uploaded: the one status names, by name and UID (a status
    written before the UID was recorded names it by name only)."""
    if status.results_state != RESULTS_FAILED or pod.name != status.results_pod:
        return False
    return status.results_pod_uid in (None, pod.uid)


def wound_down(spec: JobSpec, status: JobStatus, now: datetime) -> bool:
    """The job has ended and cleanup() has nothing left to do that needs its pods or its Secrets: the logs are
    uploaded (or given up on), the SAS Secrets deleted, no pod kept for results never uploaded. Until then,
    MultiKueue must not be told the job is done: it would delete the job's copy, and its pods, at once."""
    if status.phase not in FINISHED or status.results_pod is not None:
        return False
    if spec.output is not None and not status.logs_uploaded and not _log_grace_over(status, now):
        return False
    has_sas = spec.output is not None or spec.dataset.staging is not None
    return not has_sas or status.sas_secrets_deleted


def _log_grace_over(status: JobStatus, now: datetime) -> bool:
    """Logs that cannot be uploaded must not keep GPUs busy forever: give up after LOG_UPLOAD_GRACE."""
    done = status.completion_time
    return done is not None and now >= parse_time(done) + LOG_UPLOAD_GRACE


def ttl(b: Builder, spec: JobSpec) -> None:
    ttl = spec.run_policy.ttl_seconds_after_finished
    # A pod that keeps results never uploaded is not deleted with the job until they are (or a person does).
    if ttl is None or b.status.completion_time is None or b.status.results_pod is not None:
        return
    remaining = seconds_after(parse_time(b.status.completion_time), ttl) - b.now
    if remaining <= timedelta(0):
        b.actions.append(DeleteJob())
    else:
        b.requeue(remaining.total_seconds())


def delete_world_pods(b: Builder, observed: Observed) -> None:
    for pod in observed.workers():
        if not pod.deleting:
            b.actions.append(DeletePod(pod.name, pod.uid))
    b.actions.extend(launcher_deletes(observed.launcher))


def invalid_spec(
    prev: JobStatus,
    path: str,
    message: str,
    now: datetime,
    generation: int | None,
    reason: str = "InvalidSpec",
) -> Decision:
    """A spec the operator cannot run -> Failed, naming the field (`path`; "": the message names what failed).
    Parsing comes first: nothing exists yet."""
    b = Builder(prev, now)
    b.status = replace(prev, observed_generation=generation)
    text = f"{path}: {message}" if path else message
    if prev.phase in FINISHED:
        return b.decision()
    b.status = replace(b.status, completion_time=format_time(now))
    b.cond("Failed", True, reason, text)
    b.cond_false_if_present("Running", reason, text)
    b.phase(FAILED, text, "Warning", reason)
    return b.decision()
