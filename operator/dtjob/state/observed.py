"""What exists in the cluster for one job, reduced to the few facts the state machine decides on.

Built from raw Pod and Job dicts (as the watch cache holds them) and from the reads of
dtjob.reconcile.observe; pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dtjob import names
from dtjob.contract.results_upload import ResultsRecord, UploadReport
from dtjob.gang.pool_room import PoolRoom
from dtjob.state.failed_create import CreateRefusal
from dtjob.state.hosts import PublishedHosts
from dtjob.state.pod_state import PodState as PodState
from dtjob.state.pod_state import int_label, true_condition, world_size_label
from dtjob.state.pod_state import pod_state as pod_state
from dtjob.state.prebuilt import PrebuiltWorkload
from dtjob.state.rank_error import RankError
from dtjob.state.staging import StagingOutcome as StagingOutcome

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Children:
    """The job's pods (its launcher's among them), staging Job and the EndpointSlices of its Service as the
    watch cache last saw them (raw dicts); `launcher`: a launcher Job that an earlier release of the operator
    made, whose pod is its world's launcher until that world ends."""

    pods: tuple[Mapping[str, Any], ...] = ()
    launcher: Mapping[str, Any] | None = None
    staging: Mapping[str, Any] | None = None
    endpoint_slices: tuple[Mapping[str, Any], ...] = ()
    # The newest FailedCreate message of the launcher's and staging Jobs (by the Job's uid; absent: none), as
    # the Events' watch holds them; None where that watch does not serve the namespace yet (read them).
    failed_creates: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Blocker:
    """Something only the operator can find (a missing PVC, Secret, or no node big enough).

    fatal: the job cannot ever run as written -> Failed; otherwise it waits in Pending and is rechecked.
    """

    reason: str
    message: str
    fatal: bool = False


@dataclass(frozen=True)
class SasObservation:
    """One `<job>-sas-<access>` Secret as read now: whether a token must be minted (absent, or past its
    rotation time), the seconds until its rotation otherwise, and what stops a mint (credentials, policy)."""

    mint_needed: bool
    rotate_in_s: float | None = None
    blocked: Blocker | None = None
    altered: str | None = None  # how the Secret was changed since the operator wrote it (then re-minted)


@dataclass(frozen=True)
class LauncherState:
    attempt: int | None
    deleting: bool
    running: bool
    succeeded: bool
    failed: bool
    pod_name: str | None = None
    reason: str | None = None
    world_size: int | None = None  # the workers its hostfile names
    failed_pod: PodState | None = None  # the launcher pod that failed: its exit code, reason, disruption
    # Why a rank failed, as its log says (the failed launcher's log tail, read once by the observer).
    log_error: RankError | None = None
    # Whose pod this is: the operator's launcher, or for a torchrun world (dtjob.state.torchrun) a worker's.
    role: str = names.ROLE_LAUNCHER
    # A torchrun world whose training is over (a worker exited 0): its other workers may go.
    trained: bool = False
    # Not launched yet: made with its world, its pod (none yet, or one the operator's gate holds) waits for
    # every worker Ready. Until then a worker that goes is only missing, not a broken world.
    held: bool = False
    held_pod: PodState | None = None  # the pod to release once every worker is Ready
    pod: PodState | None = None  # the launcher's own pod, which goes with its world (by its UID)
    # Made by an earlier release of the operator as a batch Job: it goes as the Job.
    legacy_job: bool = False

    @property
    def launched(self) -> bool:
        return not self.held

    @property
    def finished(self) -> bool:
        return self.succeeded or self.failed

    @property
    def is_launcher(self) -> bool:
        """The operator's launcher (a torchrun world has none: its launch is a worker's)."""
        return self.role == names.ROLE_LAUNCHER


@dataclass(frozen=True)
class StoredResults:
    """What the operator found under the run's prefix, with its own credentials, for a record of `dtjob
    results upload`: whether the manifest is there with the files it lists (`complete`), else what is not."""

    complete: bool
    message: str
    retry: bool = False  # storage could not be asked: look again


@dataclass(frozen=True)
class Observed:
    """Every read of one reconcile, gathered before anything is decided."""

    pods: tuple[PodState, ...] = ()  # the job's own pods (its launcher's among them)
    launcher: LauncherState | None = None
    # Every pod of the job's the watch cache holds, parsed once: the job's own (its launcher's among them) and
    # its staging Job's (dtjob.reconcile.observe leaves out what they do not own). Their logs are what
    # UploadLogs uploads.
    children: tuple[PodState, ...] = ()
    generation: int | None = None  # metadata.generation of the job
    uid: str = ""  # metadata.uid of the job
    # Preflight and storage facts that stop the first world (missing PVC, credentials, storage policy).
    blocker: Blocker | None = None
    # The SAS Secrets the job needs now, by access ("in", "out"); an access not listed was not looked at.
    sas: Mapping[str, SasObservation] = field(default_factory=dict)
    staging: StagingOutcome | None = None  # the staging Job's outcome, when that Job exists
    training_progress: Mapping[str, Any] | None = None  # rank 0's latest progress, from the launcher's log
    # The launcher's log was read in this pass (training_progress is then its tail's latest record, or None
    # for a tail with none): only a log read now can show that a world made no progress.
    progress_read: bool = False
    results_upload: UploadReport | None = None  # the results upload's latest line, from the launcher's log
    # What `dtjob results upload` recorded on the job (read only while results are kept), and, for a record
    # that matches the status, whether storage holds the results it names.
    results_record: ResultsRecord | None = None
    results_stored: StoredResults | None = None
    # What the output tokens reach ("Directory" or "Container"), read with the SAS Secrets.
    output_sas_scope: str | None = None
    # The launcher's or the stager's pod refused by admission (read only while their Job has no pod).
    launcher_refused: CreateRefusal | None = None
    staging_refused: CreateRefusal | None = None
    progress_poll_s: float | None = None  # how soon progress should be read again while training
    pool_room: PoolRoom | None = None  # read only for a gang past its schedule timeout
    # The Workload Kueue's copy of a dispatched job names (read only for such a copy, while it is active).
    prebuilt: PrebuiltWorkload | None = None
    # The MPI hosts the job's headless Service publishes (its EndpointSlices, from the watch cache).
    published: PublishedHosts = field(default_factory=PublishedHosts)
    # Nodes of the workers' pool whose conditions say they cannot keep a worker: new workers keep off them.
    avoid_nodes: tuple[str, ...] = ()

    def workers(self) -> list[PodState]:
        return [p for p in self.pods if p.role == names.ROLE_WORKER]

    def launcher_of(self, attempt: int) -> LauncherState | None:
        """The launcher of world `attempt`; None while there is none, or only an older world's."""
        return self.launcher if self.launcher is not None and self.launcher.attempt == attempt else None

    @property
    def world_exists(self) -> bool:
        """A worker pod or the launcher of any attempt exists."""
        return bool(self.workers()) or self.launcher is not None


def launcher_state(pod: PodState) -> LauncherState:
    """The launcher, from its pod: made with its world and held until every worker is Ready, then its phase
    is the launch's (restartPolicy Never: its end is the world's outcome)."""
    failed = pod.phase == "Failed"
    return LauncherState(
        attempt=pod.attempt,
        deleting=pod.deleting,
        running=pod.phase == "Running",
        succeeded=pod.phase == "Succeeded",
        failed=failed,
        pod_name=pod.name,
        reason=(pod.reason or "failed") if failed else None,
        world_size=pod.world_size,
        failed_pod=pod if failed else None,
        held=pod.held and pod.phase == "Pending",
        held_pod=pod if pod.held and not pod.deleting else None,
        pod=pod,
    )


def legacy_launcher_state(job: Json, pods: Iterable[PodState]) -> LauncherState:
    """The launcher of a world that an earlier release of the operator made: a batch Job (backoffLimit 0, one
    completion), whose pod the Job controller made."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    conditions = status.get("conditions")
    attempt = int_label(meta.get("labels") or {}, names.ATTEMPT_LABEL)
    mine = [p for p in pods if p.role == names.ROLE_LAUNCHER and p.attempt == attempt]
    failed_pod = next((p for p in mine if p.phase == "Failed"), None)
    succeeded_pod = next((p for p in mine if p.phase == "Succeeded"), None)
    running_pod = next((p for p in mine if p.phase == "Running"), None)
    # Its pod's end is the Job's outcome, and is seen before the Job controller's Complete/Failed condition,
    # so the status never flickers back.
    failed_cond = true_condition(conditions, "Failed") or true_condition(conditions, "FailureTarget")
    succeeded = bool(
        true_condition(conditions, "Complete") or true_condition(conditions, "SuccessCriteriaMet")
    )
    succeeded = succeeded or (succeeded_pod is not None and failed_cond is None)
    is_failed = not succeeded and (failed_cond is not None or failed_pod is not None)
    reason = None
    if is_failed:
        reason = (failed_pod.reason if failed_pod else None) or str(
            (failed_cond or {}).get("message") or (failed_cond or {}).get("reason") or "failed"
        )
    pod = failed_pod or succeeded_pod or running_pod or (mine[0] if mine else None)
    live = [p for p in mine if not p.deleting]
    # Until the Job controller's pod is there, or while each there is still gated, the launch has not begun.
    running = running_pod is not None or int(status.get("ready") or 0) > 0
    held = not (running or succeeded or is_failed) and all(p.held for p in live)
    return LauncherState(
        attempt=attempt,
        deleting=bool(meta.get("deletionTimestamp")),
        running=running,
        succeeded=succeeded,
        failed=is_failed,
        pod_name=pod.name if pod else None,
        reason=reason,
        world_size=world_size_label(meta.get("labels") or {}),
        failed_pod=failed_pod if is_failed else None,
        held=held,
        held_pod=next((p for p in live if p.held), None),
        legacy_job=True,
    )


def observe_children(
    pods: Iterable[Json], launcher_job: Json | None, job_uid: str = "", launcher_name: str = ""
) -> Observed:
    """The children's facts alone, each pod parsed once; dtjob.reconcile.observe adds the rest. With
    `job_uid`, what another owner holds (an older job of the same name, not yet garbage collected) is left
    out of `pods` and `launcher`: it is never taken for ours. The launcher is the pod named `launcher_name`
    that the job owns, or a legacy launcher Job's (`launcher_job`) while one is there."""
    if job_uid and launcher_job is not None and not _owned_by(launcher_job, {job_uid}):
        launcher_job = None
    found = [(pod, pod_state(pod)) for pod in pods]
    states = tuple(state for _, state in found)
    if job_uid:
        owners = {job_uid} | ({str(launcher_job["metadata"].get("uid"))} if launcher_job else set())
        states = tuple(state for pod, state in found if _owned_by(pod, owners))
    if launcher_job is not None:
        launcher: LauncherState | None = legacy_launcher_state(launcher_job, states)
    else:
        own = next((p for p in states if p.role == names.ROLE_LAUNCHER and p.name == launcher_name), None)
        launcher = launcher_state(own) if own is not None and launcher_name else None
    return Observed(pods=states, launcher=launcher, children=tuple(state for _, state in found))


def _owned_by(obj: Json, uids: set[str]) -> bool:
    """Whether an ownerReference names one of `uids`. An object without any is no child of the operator's,
    which makes each with its owner: a namespace admin's pod under the job's labels, were it taken as one,
    could stand in for a worker or the launcher."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(str(ref.get("uid")) in uids for ref in refs)
