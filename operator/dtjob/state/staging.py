"""The staging Job's outcome, read from the Job, its pods' termination messages and the running stager's log.
Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob import names
from dtjob.contract.transfer_report import ExitCode, ProgressSnapshot, parse_progress

Json = Mapping[str, Any]

# Why a stager exited, by its exit status, for a Failed outcome whose pod left no reason of its own.
EXIT_REASONS = {
    ExitCode.USAGE: "the stager could not read its SAS Secret files",
    ExitCode.DENIED: "the input SAS was denied (403)",
    ExitCode.NOT_FOUND: "the input container or prefix does not exist",
    ExitCode.LOCAL_IO: "the stager could not write to the data volume",
    ExitCode.STORAGE: "Blob Storage returned an error",
    ExitCode.INTEGRITY: "a downloaded file did not match its Content-MD5",
}


@dataclass(frozen=True)
class StagingOutcome:
    phase: str  # Running | Succeeded | Failed
    progress: ProgressSnapshot | None
    reason: str = ""  # for Failed: one line naming what to fix


def _terminated(pod: Json) -> Json | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == names.STAGER_CONTAINER:
            state = status.get("state") or {}
            terminated = state.get("terminated")
            return terminated if isinstance(terminated, dict) else None
    return None


def _snapshot(message: str) -> ProgressSnapshot | None:
    try:
        return ProgressSnapshot.from_json(message)
    except (ValueError, TypeError):
        return None


def staging_outcome(job: Json, pods: Sequence[Json], log_tail: str = "") -> StagingOutcome:
    """Where staging stands, from the staging Job, its pods (newest last) and optionally the running pod's
    log tail (for live progress). A failure's reason comes from the stager's termination message."""
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    last_terminated = next((t for t in (_terminated(p) for p in reversed(pods)) if t is not None), None)
    snap = _snapshot(str(last_terminated.get("message") or "")) if last_terminated else None
    if (conditions.get("Complete") or {}).get("status") == "True":
        return StagingOutcome("Succeeded", snap)
    if (conditions.get("Failed") or {}).get("status") == "True":
        reason = snap.reason if snap is not None and snap.reason else ""
        if not reason and last_terminated is not None:
            code = last_terminated.get("exitCode")
            known = {int(c): text for c, text in EXIT_REASONS.items()}
            reason = known.get(code, "") if isinstance(code, int) else ""
            reason = reason or f"the stager exited with status {code}"
        if not reason:
            failed = conditions["Failed"]
            reason = f"staging Job failed: {failed.get('reason', '')} {failed.get('message', '')}".strip()
        return StagingOutcome("Failed", snap, reason)
    return StagingOutcome("Running", parse_progress(log_tail) if log_tail else snap)
