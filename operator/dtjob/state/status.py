"""The DistributedTrainingJob's status as the state machine reads and writes it: phases, conditions, and the
record that round-trips through `.status`. Pure.

Phases: Pending -> [Staging ->] Starting -> Running -> Succeeded | Failed, plus Suspended and Restarting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from dtjob.timefmt import format_time, parse_time_or_none


class Phase(StrEnum):
    PENDING = "Pending"
    STAGING = "Staging"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(StrEnum):
    """In the order `status.conditions` lists them."""

    STAGED = "Staged"
    CREATED = "Created"
    GANG_SCHEDULED = "GangScheduled"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    # An elastic world below spec.elastic.minWorkers: True since when (it restarts after timeoutSeconds).
    WORKERS_BELOW_MINIMUM = "WorkersBelowMinimum"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # The kstatus conditions GitOps tools read (dtjob.state.conditions), derived from the phase and the ones
    # above.
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


PENDING = Phase.PENDING
STAGING = Phase.STAGING
STARTING = Phase.STARTING
RUNNING = Phase.RUNNING
RESTARTING = Phase.RESTARTING
SUSPENDED = Phase.SUSPENDED
SUCCEEDED = Phase.SUCCEEDED
FAILED = Phase.FAILED
FINISHED = (SUCCEEDED, FAILED)
WORKERS_BELOW_MINIMUM = ConditionType.WORKERS_BELOW_MINIMUM
CONDITION_TYPES = tuple(ConditionType)

# status.output.sasScope: what the output tokens reach (the run's own directory, or the whole container).
SAS_SCOPE_DIRECTORY = "Directory"
SAS_SCOPE_CONTAINER = "Container"

# Condition Created=False with this reason: the API server refused a create with 403
# (dtjob.machine.refusals); the job waits and tries again, and keeps saying why instead of "creating N
# worker pod(s)".
CREATE_FORBIDDEN = "CreateForbidden"
# Condition Created=False with this reason: a child's name is held by another owner's object
# (dtjob.machine.refusals).
CHILD_NOT_OURS = "ChildNotOwned"
# Condition Created=False with this reason: the cluster does not serve the PodGroup API of the job's gang
# scheduler (its CRD is not installed; dtjob.machine.refusals).
GANG_API_MISSING = "GangSchedulerMissing"
# Condition Created=False with this reason: a pod would name a Secret that does not exist yet
# (dtjob.desired.pod_trust); no such pod is created until it does.
SECRET_NOT_FOUND = "SecretNotFound"
# Condition Created=False with this reason: a pod would mount an NFS share, and the operator may not read the
# job's Namespace for its list of shares (dtjob.reconcile.pod_trust); no such pod is created until it may.
NFS_SHARES_UNREADABLE = "NfsSharesUnreadable"


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
    # Of those, the restarts a node forced (a worker's node reported a GPU fault or that it is about to go):
    # not counted against runPolicy.backoffLimit.
    infrastructure_restarts: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    workers_total: int = 0
    workers_ready: int = 0
    # A torchrun world's workers that exited 0: its training is over, and a worker whose pod went since (its
    # node taken back) is no loss. Kept while the world lives, since the pods may not be.
    workers_succeeded: int = 0
    total_gpus: int = 0
    launcher_state: str = "Absent"
    launcher_pod: str | None = None
    staging: Mapping[str, Any] | None = None  # ProgressSnapshot.to_status() of the staging Job
    training_progress: Mapping[str, Any] | None = None  # rank 0's latest progress line (`.status.progress`)
    # When the operator last saw training advance (a record one step or epoch further), on its own clock:
    # runPolicy.progressDeadlineSeconds counts from it (dtjob.machine.progress_deadline).
    last_progress_time: str | None = None
    output_url: str | None = None  # the run's results URL, never with a SAS
    # What the output tokens reach: Directory (the run's own, on a hierarchical-namespace account) or
    # Container. Written with output_url, for the location the namespace's storage policy allowed.
    output_sas_scope: str | None = None
    logs_uploaded: bool = False
    logs_missing: tuple[str, ...] = ()  # pods whose log could not be read
    logs_error: str | None = None  # why the last log upload failed (redacted)
    logs_truncated: Mapping[str, Any] | None = None  # {"pods": [...], "capBytes": n}: logs cut to the cap
    sas_secrets_deleted: bool = False  # written once the delete has happened, never before
    # "in" | "out" -> the sha256 (hex) of the token the operator last wrote into `<job>-sas-<access>`: status
    # is a subresource namespace editors cannot write, so a Secret's token is checked against it.
    sas_token_digests: Mapping[str, str] = field(default_factory=dict)
    # The results upload after training (dtjob.contract.results_upload): Uploading, Retrying, Failed or
    # Uploaded; what its last line said; the pod kept because it holds results that were not uploaded (its
    # name and UID: a pod of the same name made later holds none of them).
    results_state: str | None = None
    results_message: str | None = None
    results_pod: str | None = None
    results_pod_uid: str | None = None

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
            # succeeded: null (removed by the merge patch) while none did.
            "workers": {
                "total": self.workers_total,
                "ready": self.workers_ready,
                "succeeded": self.workers_succeeded or None,
            },
            "workersReady": f"{self.workers_ready}/{self.workers_total}",
            "gpus": self.total_gpus,
            "launcher": {"state": self.launcher_state, "pod": self.launcher_pod},
        }
        if self.infrastructure_restarts:
            out["infrastructureRestarts"] = self.infrastructure_restarts
        if self.staging is not None:
            out["staging"] = dict(self.staging)
        if self.training_progress is not None:
            out["progress"] = dict(self.training_progress)
        if self.last_progress_time is not None:
            out["lastProgressTime"] = self.last_progress_time
        if self.output_url is not None:
            output: dict[str, Any] = {"url": self.output_url, "logsUploaded": self.logs_uploaded}
            if self.output_sas_scope is not None:
                output["sasScope"] = self.output_sas_scope
            if self.logs_missing:
                output["logsMissing"] = list(self.logs_missing)
            # Always written: null removes an old error from the merge patch once an upload succeeds.
            output["logsError"] = self.logs_error or None
            if self.logs_truncated:
                output["logsTruncated"] = dict(self.logs_truncated)
            if self.results_state is not None:
                # keptOnPod always written: null removes it once the results are uploaded later.
                output["results"] = {
                    "state": self.results_state,
                    "message": self.results_message or "",
                    "keptOnPod": self.results_pod or None,
                    "keptOnPodUID": self.results_pod_uid or None,
                }
            out["output"] = output
        if self.sas_secrets_deleted:
            out["sasSecretsDeleted"] = True
        if self.sas_token_digests:
            out["sasTokenDigests"] = dict(self.sas_token_digests)
        return out


def _count(value: Any) -> int:
    """A count in status; 0 for what is not one or is negative (status is the user's to edit: a negative
    restart count would become an attempt label the API server refuses)."""
    if isinstance(value, bool):
        return int(value)
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _stamp(value: Any) -> str | None:
    """A timestamp in status, or None for one that does not parse (it is written afresh)."""
    return value if parse_time_or_none(value) is not None else None


def _object(value: Any) -> Mapping[str, Any]:
    return _map(value) or {}


def _generation(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _map(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def status_from_dict(data: Mapping[str, Any] | None) -> JobStatus:
    """The status as recorded, read leniently: a field of the wrong type or an unreadable time (an edit of the
    status subresource) is read as absent rather than failing every reconcile."""
    data = _object(data)
    workers = _object(data.get("workers"))
    launcher = _object(data.get("launcher"))
    output = _object(data.get("output"))
    results = _object(output.get("results"))
    return JobStatus(
        phase=_text(data.get("phase")),
        message=data.get("message") or "",
        conditions=tuple(
            Condition(
                type=str(c.get("type")),
                status=str(c.get("status")),
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
                last_transition_time=str(c.get("lastTransitionTime") or ""),
            )
            for c in _list(data.get("conditions"))
            if isinstance(c, Mapping)
        ),
        restarts=_count(data.get("restarts")),
        # Never more than the restarts: an edit of status cannot make the restarts count negative.
        infrastructure_restarts=min(_count(data.get("infrastructureRestarts")), _count(data.get("restarts"))),
        start_time=_stamp(data.get("startTime")),
        completion_time=_stamp(data.get("completionTime")),
        observed_generation=_generation(data.get("observedGeneration")),
        workers_total=_count(workers.get("total")),
        workers_ready=_count(workers.get("ready")),
        workers_succeeded=_count(workers.get("succeeded")),
        total_gpus=_count(data.get("gpus")),
        launcher_state=str(launcher.get("state") or "Absent"),
        launcher_pod=_text(launcher.get("pod")),
        staging=_map(data.get("staging")),
        training_progress=_map(data.get("progress")),
        last_progress_time=_stamp(data.get("lastProgressTime")),
        output_url=_text(output.get("url")),
        output_sas_scope=_text(output.get("sasScope")),
        logs_uploaded=bool(output.get("logsUploaded")),
        logs_missing=tuple(str(p) for p in _list(output.get("logsMissing"))),
        logs_error=_text(output.get("logsError")),
        logs_truncated=_map(output.get("logsTruncated")),
        results_state=_text(results.get("state")),
        results_message=_text(results.get("message")),
        results_pod=_text(results.get("keptOnPod")),
        results_pod_uid=_text(results.get("keptOnPodUID")),
        sas_secrets_deleted=bool(data.get("sasSecretsDeleted")),
        sas_token_digests={
            k: v for k, v in _object(data.get("sasTokenDigests")).items() if isinstance(v, str)
        },
    )


def set_condition(
    conditions: tuple[Condition, ...], kind: str, status: bool, reason: str, message: str, now: datetime
) -> tuple[Condition, ...]:
    """Set one condition; lastTransitionTime moves only when its status flips, or when the one kept is not a
    readable time (a hand-edited status): timers read it back (spec.elastic.timeoutSeconds)."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.type == kind), None)
    kept = _stamp(old.last_transition_time) if old is not None and old.status == value else None
    stamp = kept or format_time(now)
    new = Condition(kind, value, reason, message, stamp)
    others = [c for c in conditions if c.type != kind]
    merged = [*others, new]
    return tuple(
        sorted(merged, key=lambda c: CONDITION_TYPES.index(c.type) if c.type in CONDITION_TYPES else 99)
    )
