"""Staging: the staging Job copies spec.dataset.stageFrom onto the job's volume before any worker exists;
the `Staged` condition remembers it, so world restarts never stage again. Pure."""

from __future__ import annotations

from dataclasses import replace

from dtjob.contract.transfer_report import WAITING_PHASE
from dtjob.machine.builder import Builder
from dtjob.machine.finish import finish
from dtjob.machine.refused_pods import refused_pod, wait_refused
from dtjob.names import staging_job_name
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    CreateStagingJob,
    Event,
)
from dtjob.state.observed import Observed
from dtjob.state.staging import StagingOutcome
from dtjob.state.status import (
    FAILED,
    STAGING,
)

STAGING_POLL_SECONDS = 10.0


def stage(b: Builder, spec: JobSpec, observed: Observed, outcome: StagingOutcome | None) -> bool:
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
        finish(b, spec, observed, FAILED, "StagingFailed", f"staging Job {job} failed: {outcome.reason}")
        return False
    b.status = replace(b.status, staging=snapshot or b.status.staging or {"phase": "starting"})
    if observed.staging_refused is not None:
        refused, waiting, due = refused_pod(spec, "stager", observed.staging_refused, b.now)
        if refused is not None:
            b.cond("Staged", False, refused.reason, refused.message)
            finish(b, spec, observed, FAILED, refused.reason, refused.message)
            return False
        wait_refused(b, "Staged", STAGING, waiting, due, STAGING_POLL_SECONDS)
        return False
    b.phase(STAGING, f"staging {what} to {staging.destination}{_staging_text(outcome)}")
    b.requeue(STAGING_POLL_SECONDS)
    return False


def _staging_text(outcome: StagingOutcome) -> str:
    p = outcome.progress
    if p is not None and p.phase == WAITING_PHASE:
        return ": waiting for another job's stager writing there to finish"
    if p is None or not p.files_total:
        return ""
    return (
        f": {p.files_complete}/{p.files_total} files, {(p.bytes_done + p.bytes_skipped) / 2**20:.0f}/"
        f"{p.bytes_total / 2**20:.0f} MiB at {p.bytes_per_s / 2**20:.1f} MiB/s"
    )
