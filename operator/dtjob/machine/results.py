"""What the actions produced, recorded after they ran: the log upload, the digest of a SAS token minted, the
SAS revocation, a pod force-deleted, and a refusal (dtjob.machine.refusals). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from dtjob.machine.refusals import refused
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    Decision,
    Event,
    LogsUploaded,
    PodForceDeleted,
    Refused,
    Result,
    SasMinted,
    SasSecretsDeleted,
)
from dtjob.state.status import JobStatus


def settle(decision: Decision, results: Sequence[Result], spec: JobSpec | None, now: datetime) -> Decision:
    """`decision` once its actions ran: its status with what they produced (with_results), then what a
    refusal means (dtjob.machine.refusals: a wait, or Failed and the world deleted). Holds only the events
    and actions that are new; its requeue is the refusal's when there is one."""
    done = [r for r in results if not isinstance(r, Refused)]
    status, events = with_results(decision.status, done)
    refusal = next((r for r in results if isinstance(r, Refused)), None)
    if refusal is None:
        return Decision(status, [], events, decision.requeue_after)
    after = refused(status, refusal, spec, now)
    return Decision(after.status, after.actions, [*events, *after.events], after.requeue_after)


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
            case SasMinted(access=access, token_sha256=digest):
                status = replace(status, sas_token_digests={**status.sas_token_digests, access: digest})
            case SasSecretsDeleted():
                status = replace(status, sas_secrets_deleted=True)
            case PodForceDeleted(name=name, overdue_s=overdue):
                events.append(Event(
                    "Warning", "PodForceDeleted",
                    f"{name} was still terminating {overdue:.0f}s after its grace period (its node lost?): "
                    "deleted without waiting for its kubelet",
                ))  # fmt: skip
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
