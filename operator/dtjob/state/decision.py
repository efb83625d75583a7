"""What one reconcile decided, and what carrying it out produced. Pure data.

decide() (dtjob.machine) returns a Decision: the status to write, the actions to run in order, the events to
post and when to look again. dtjob.reconcile.act runs every action (all idempotent: create-if-absent,
delete-if-present) and returns a Result for those whose outcome the status records, a refusal included: act
stops at the first action the API server or Azure refuses, and says which and why (Refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from dtjob.state.hosts import MpiHost, StaleSlice
from dtjob.state.status import JobStatus


@dataclass(frozen=True)
class MintSas:
    """Create `<job>-sas-<access>` with a fresh token, or replace its token (rotation). The token never
    outlives `not_after` (the job's active deadline)."""

    access: str  # "in" | "out"
    not_after: datetime | None = None


@dataclass(frozen=True)
class EnsureWorld:
    """The gang's PodGroup first (runPolicy.scheduling.gang), then the SSH Secret, hostfile ConfigMap (kept
    current) and headless Service."""


@dataclass(frozen=True)
class PublishHosts:
    """Write the Service's EndpointSlice with `hosts`: patch it when `published` (the operator's slice was
    observed), else create it (a name another owner holds is never taken)."""

    hosts: tuple[MpiHost, ...]
    published: bool


@dataclass(frozen=True)
class RetireSelector:
    """The Service still selects pods by label, or did: take its selector off (its fields kept in line, as
    EnsureWorld does) and delete what Kubernetes' controllers made for it (`slices`), each under the UID it
    was observed with: a slice of the EndpointSlice controller while that Service owns it; a mirrored slice,
    and the Endpoints object of the Service's name it mirrors (the Endpoints controller's, left behind)."""

    slices: tuple[StaleSlice, ...]


@dataclass(frozen=True)
class DeletePodGroup:
    """The job finished or was suspended: its gang's PodGroup goes (a Volcano queue counts it until then)."""


@dataclass(frozen=True)
class CreateWorker:
    index: int
    attempt: int
    avoid_nodes: tuple[str, ...] = ()  # nodes whose conditions say they cannot keep a worker


@dataclass(frozen=True)
class CreateLauncher:
    attempt: int
    # Kept out of its workers' Kueue pod group: an earlier release made them a group of the workers alone.
    outside_kueue_group: bool = False


@dataclass(frozen=True)
class DeletePod:
    """Delete the pod only while it is the one observed (`uid`): a pod created under its name since, by a
    new world or anyone else, is never deleted for it."""

    name: str
    uid: str = ""


@dataclass(frozen=True)
class ForceDeletePod:
    """Delete a pod without waiting for its kubelet (grace period 0), only while it is still the one with
    `uid`: it stayed terminating long past its grace period, so its node is lost, and a new world needs its
    name."""

    name: str
    uid: str
    overdue_s: float  # how long past its grace period it was still terminating


@dataclass(frozen=True)
class ReleasePod:
    """Take Kueue's finalizer off a pod of ours that is deleted and has ended, only while it is still the one
    with `uid`: Kueue keeps it on a pod group's member until a replacement exists, and the replacement needs
    this pod's name."""

    name: str
    uid: str


@dataclass(frozen=True)
class FinishKueueGroup:
    """The job has ended and its launcher pod stays (its log): mark it kueue.RETRIABLE_IN_GROUP false, only
    while it is still the one with `uid`, so that Kueue finishes the world's Workload, and frees its quota,
    once none of the group's pods is active (an MPI world's workers never succeed: they are deleted)."""

    name: str
    uid: str


@dataclass(frozen=True)
class ReleaseLauncher:
    """Every worker is Ready: take the operator's gate off the launcher's pod, only while it is still the one
    with `uid`; the scheduler places it from there."""

    name: str
    uid: str


@dataclass(frozen=True)
class DeleteLauncher:
    """Delete a launcher Job an earlier release of the operator made (today's launcher is a pod, deleted with
    DeletePod), only while it is this job's (its owner checked and its UID a precondition)."""


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished elapsed: delete the DistributedTrainingJob itself (children follow by GC)."""


@dataclass(frozen=True)
class CreateStagingJob:
    """The staging Job that copies spec.dataset.stageFrom onto the data volume."""


@dataclass(frozen=True)
class UploadLogs:
    """Upload pod logs to the output container. At the end (attempt None) every pod's, and pods are deleted
    only once its result is recorded; before a world restart, the failed attempt's (logs/attempt-<n>/)."""

    attempt: int | None = None


@dataclass(frozen=True)
class DeleteSasSecrets:
    """The job ended: revoke what pods could read by deleting `<job>-sas-in` and `<job>-sas-out`."""


@dataclass(frozen=True)
class DeleteWorld:
    """A refusal failed the job: its pods, its launcher's among them (by label, only those it owns, also those
    created a moment ago) and, when `launcher`, a legacy launcher Job go, so that no half world keeps holding
    GPUs."""

    launcher: bool = True


Action = (
    MintSas | EnsureWorld | CreateWorker | CreateLauncher | ReleaseLauncher | DeletePod | ForceDeletePod
    | ReleasePod | FinishKueueGroup | DeleteLauncher | DeleteJob | CreateStagingJob | UploadLogs
    | DeleteSasSecrets | DeletePodGroup | DeleteWorld | PublishHosts | RetireSelector
)  # fmt: skip


@dataclass(frozen=True)
class LogsUploaded:
    """The outcome of UploadLogs."""

    attempt: int | None
    uploaded: bool
    folder: str  # where the logs went (or would have gone)
    missing: tuple[str, ...] = ()  # pods whose log could not be read
    error: str | None = None  # why the upload failed (redacted)
    truncated: tuple[str, ...] = ()  # pods whose log was longer than the cap (head and tail kept)
    cap_bytes: int = 0  # that cap (DTJOB_LOG_CAP_BYTES)


@dataclass(frozen=True)
class SasMinted:
    """The outcome of MintSas when it wrote the Secret: the sha256 (hex) of the token it holds now, never the
    token. The status records it: a Secret whose token has another digest was not written by the operator."""

    access: str  # "in" | "out"
    token_sha256: str


@dataclass(frozen=True)
class SasSecretsDeleted:
    """The outcome of DeleteSasSecrets: both Secrets are gone."""


@dataclass(frozen=True)
class PodForceDeleted:
    """The outcome of ForceDeletePod when the pod was still there."""

    name: str
    overdue_s: float  # how long past its grace period it was still terminating


class RefusalKind(StrEnum):
    """Who refused an action, and how."""

    REJECTED = "Rejected"  # the API server found a child invalid (422, 400): the spec asked for it
    FORBIDDEN = "Forbidden"  # 403: Pod Security admission, a ResourceQuota, the operator's RBAC
    NOT_OURS = "NotOurs"  # a child's name is held by another owner's object
    API_NOT_SERVED = "ApiNotServed"  # the cluster does not serve the gang scheduler's PodGroup API
    STORAGE = "Storage"  # Azure refused the credentials for good (no user delegation key)
    # The operator itself, before a pod's create (dtjob.desired.pod_trust): the pod would name a Secret or the
    # ServiceAccount that is not the job's to hand out, or mount an NFS share its namespace may not (fails);
    # or name a Secret that does not exist yet, or mount a share of a list the operator may not read (waits).
    UNTRUSTED = "Untrusted"
    SECRET_MISSING = "SecretMissing"


@dataclass(frozen=True)
class Refused:
    """The outcome of an action the API server or Azure refused; the actions after it did not run.

    `message` is the refuser's own words naming the object (`Pod rn50-worker-0 refused by the API server:
    ...`), for NOT_OURS the object (`ConfigMap rn50-hostfile`), for API_NOT_SERVED the API; `reason` is a
    storage or UNTRUSTED refusal's condition reason (StorageCredentialsDenied, SecretNotAllowed); `field` the
    spec field an UNTRUSTED or SECRET_MISSING refusal names."""

    kind: RefusalKind
    action: Action
    message: str
    reason: str = ""
    field: str = ""


Result = LogsUploaded | SasMinted | SasSecretsDeleted | PodForceDeleted | Refused


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: JobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
