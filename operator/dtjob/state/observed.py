"""What exists in the cluster for one job, reduced to the few facts the state machine decides on.

Built from raw Pod and Job dicts (as the watch cache holds them) and from the reads of
dtjob.reconcile.observe; pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dtjob import names
from dtjob.contract.results_upload import ResultsRecord, UploadReport
from dtjob.gang import kueue
from dtjob.gang.pool_room import PoolRoom
from dtjob.state.failed_create import CreateRefusal
from dtjob.state.hosts import PublishedHosts
from dtjob.state.node_health import NodeProblem
from dtjob.state.prebuilt import PrebuiltWorkload
from dtjob.state.rank_error import RankError
from dtjob.state.staging import StagingOutcome as StagingOutcome
from dtjob.timefmt import parse_time_or_none

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Children:
    """The job's pods, launcher Job, staging Job and the EndpointSlices of its Service as the watch cache last
    saw them (raw dicts)."""

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
class PodState:
    name: str
    role: str
    attempt: int | None
    index: int | None
    phase: str
    scheduled: bool
    ready: bool
    deleting: bool
    # Why the pod failed or waits (e.g. "Error, exit code 1", "ImagePullBackOff: ..."), for messages.
    reason: str | None = None
    uid: str = ""
    # When a deleting pod's grace period ends (metadata.deletionTimestamp): its kubelet confirms the end by
    # then, unless the node is lost and no kubelet is left to confirm anything.
    deletion_deadline: datetime | None = None
    # Why the cluster took the pod away (its DisruptionTarget condition): an eviction from a NotReady node,
    # the pod garbage collector after its node was deleted, a preemption. None: no disruption.
    disruption: str | None = None
    created: datetime | None = None  # metadata.creationTimestamp
    # Why a container has not started (ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ...).
    waiting: str | None = None
    unschedulable: bool = False  # PodScheduled False: no node can take it (now)
    # How the container ended when it failed: its exit code and reason (Error, OOMKilled, ...).
    exit_code: int | None = None
    termination_reason: str | None = None
    # Kueue: the pod waits for its group's admission (its scheduling gate is on) ...
    gated: bool = False
    # ... Kueue stopped it, its Workload evicted (`<reason>: <message>`, e.g. "Preempted: ...") ...
    kueue_eviction: str | None = None
    # ... and its finalizer is still on the pod.
    kueue_finalizer: bool = False
    # A launcher pod the operator still holds (names.LAUNCH_GATE is on): it waits for every worker Ready.
    held: bool = False
    address: str = ""  # status.podIP: where the pod's name resolves once the operator publishes it
    node: str = ""  # spec.nodeName, once bound
    avoided_nodes: tuple[str, ...] = ()  # the nodes the operator kept it off when it made it
    # Its node's condition that says it cannot keep the pod (read only for the workers of an active job).
    node_problem: NodeProblem | None = None
    world_size: int | None = None  # a torchrun worker's: the workers its torchrun was started for (--nnodes)
    ended: datetime | None = None  # when its failed container ended (to tell the first failure of several)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


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
    # Whose pod this is: the launcher Job's, or for a torchrun world (dtjob.state.torchrun) a worker's.
    role: str = names.ROLE_LAUNCHER
    # A torchrun world whose training is over (a worker exited 0): its other workers may go.
    trained: bool = False
    # Not launched yet: made with its world, its pod (none yet, or one the operator's gate holds) waits for
    # every worker Ready. Until then a worker that goes is only missing, not a broken world.
    held: bool = False
    held_pod: PodState | None = None  # the pod to release once every worker is Ready

    @property
    def launched(self) -> bool:
        return not self.held

    @property
    def finished(self) -> bool:
        return self.succeeded or self.failed

    @property
    def is_job(self) -> bool:
        """A launcher Job of the operator's (there is none to delete in a torchrun world)."""
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

    pods: tuple[PodState, ...] = ()  # the job's own pods, and its launcher Job's
    launcher: LauncherState | None = None
    # Every pod of the job's the watch cache holds, parsed once: the job's own, its launcher Job's and its
    # staging Job's (dtjob.reconcile.observe leaves out what they do not own). Their logs are what UploadLogs
    # uploads.
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

    @property
    def world_exists(self) -> bool:
        """A worker pod or the launcher of any attempt exists."""
        return bool(self.workers()) or self.launcher is not None


def _int_label(labels: Json, key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None


def _condition(conditions: Iterable[Json] | None, kind: str) -> Json | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


def _true_condition(conditions: Iterable[Json] | None, kind: str) -> Json | None:
    found = _condition(conditions, kind)
    return found if found is not None and found.get("status") == "True" else None


def pod_state(pod: Json) -> PodState:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    conditions = status.get("conditions")
    ready = _condition(conditions, "Ready")
    scheduled = _condition(conditions, "PodScheduled")
    role = str(labels.get(names.ROLE_LABEL, ""))
    exit_code, termination_reason, ended = _failed_termination(status, names.CONTAINER_OF_ROLE.get(role))
    return PodState(
        name=str(meta.get("name", "")),
        role=role,
        attempt=_int_label(labels, names.ATTEMPT_LABEL),
        index=_int_label(labels, names.WORKER_INDEX_LABEL),
        phase=str(status.get("phase") or "Pending"),
        scheduled=bool(scheduled and scheduled.get("status") == "True"),
        ready=bool(ready and ready.get("status") == "True"),
        deleting=bool(meta.get("deletionTimestamp")),
        reason=pod_reason(pod),
        uid=str(meta.get("uid") or ""),
        deletion_deadline=parse_time_or_none(meta.get("deletionTimestamp")),
        disruption=pod_disruption(pod),
        created=parse_time_or_none(meta.get("creationTimestamp")),
        waiting=_waiting_reason(status),
        unschedulable=bool(scheduled and scheduled.get("status") == "False"),
        exit_code=exit_code,
        termination_reason=termination_reason,
        gated=_has_gate(pod, kueue.ADMISSION_GATE),
        kueue_eviction=kueue.eviction(pod),
        kueue_finalizer=kueue.holds(pod),
        held=_has_gate(pod, names.LAUNCH_GATE),
        address=str(status.get("podIP") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        avoided_nodes=_avoided_nodes(meta),
        world_size=_int_label(labels, names.WORLD_SIZE_LABEL),
        ended=ended,
    )


def _has_gate(pod: Json, gate: str) -> bool:
    """The pod still carries scheduling gate `gate` (Kueue's admission, or the operator's launch hold)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == gate for g in gates)


def _avoided_nodes(meta: Json) -> tuple[str, ...]:
    text = (meta.get("annotations") or {}).get(names.AVOIDED_NODES_ANNOTATION)
    return tuple(sorted(n for n in text.split(",") if n)) if isinstance(text, str) else ()


def _statuses(status: Json) -> list[Json]:
    """Every container's status: init containers (a job's template may add them, native sidecars too) first,
    as they run first."""
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def _waiting_reason(status: Json) -> str | None:
    for cs in _statuses(status):
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
        if reason and reason not in ("ContainerCreating", "PodInitializing"):
            return str(reason)
    return None


def _failed_termination(
    status: Json, main: str | None = None
) -> tuple[int | None, str | None, datetime | None]:
    """(exit code, reason, end) of the first container that ended with a nonzero code, the pod's own
    container (`main`, e.g. the launcher's, whose code the restart policy judges) before a sidecar; or
    (None, None, None)."""
    statuses = sorted(_statuses(status), key=lambda cs: cs.get("name") != main)
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term and isinstance(term.get("exitCode"), int) and term["exitCode"] != 0:
            return int(term["exitCode"]), term.get("reason"), parse_time_or_none(term.get("finishedAt"))
    return None, None, None


def pod_disruption(pod: Json) -> str | None:
    """`<reason>: <message>` of a True DisruptionTarget condition (the cluster, not the container, ended the
    pod), or None."""
    found = _true_condition((pod.get("status") or {}).get("conditions"), "DisruptionTarget")
    if found is None:
        return None
    return f"{found.get('reason') or 'DisruptionTarget'}: {found.get('message') or ''}".rstrip(": ")


def pod_reason(pod: Json) -> str | None:
    """The most telling reason a pod is not healthy, or None."""
    status = pod.get("status") or {}
    for cs in _statuses(status):
        state = cs.get("state") or {}
        term = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term and (term.get("exitCode") or 0) != 0:
            text = f"{term.get('reason') or 'Terminated'}, exit code {term.get('exitCode')}"
            return f"{text}: {term['message']}" if term.get("message") else text
        waiting = state.get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    scheduled = _condition(status.get("conditions"), "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return f"{scheduled.get('reason', 'Unschedulable')}: {scheduled.get('message', '')}".rstrip(": ")
    disruption = pod_disruption(pod)
    if disruption is not None:
        return disruption
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": ")
    return None


def launcher_state(job: Json, pods: Iterable[PodState]) -> LauncherState:
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    conditions = status.get("conditions")
    attempt = _int_label(meta.get("labels") or {}, names.ATTEMPT_LABEL)
    mine = [p for p in pods if p.role == names.ROLE_LAUNCHER and p.attempt == attempt]
    failed_pod = next((p for p in mine if p.phase == "Failed"), None)
    succeeded_pod = next((p for p in mine if p.phase == "Succeeded"), None)
    running_pod = next((p for p in mine if p.phase == "Running"), None)
    # The launcher Job has backoffLimit 0 and one completion, so its pod's end is the Job's outcome; the
    # pod is seen before the Job controller's Complete/Failed condition, so the status never flickers back.
    failed_cond = _true_condition(conditions, "Failed") or _true_condition(conditions, "FailureTarget")
    succeeded = bool(
        _true_condition(conditions, "Complete") or _true_condition(conditions, "SuccessCriteriaMet")
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
    # A Job's pod is made by the Job controller: until one is there, or while each there is still gated, the
    # launch has not begun. A Job made before the gate existed has ungated pods, and launches as it did.
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
        world_size=_int_label(meta.get("labels") or {}, names.WORLD_SIZE_LABEL),
        failed_pod=failed_pod if is_failed else None,
        held=held,
        held_pod=next((p for p in live if p.held), None),
    )


def observe_children(pods: Iterable[Json], launcher_job: Json | None, job_uid: str = "") -> Observed:
    """The children's facts alone, each pod parsed once; dtjob.reconcile.observe adds the rest. With
    `job_uid`, what another owner holds (an older job of the same name, not yet garbage collected) is left
    out of `pods` and `launcher`: it is never taken for ours."""
    if job_uid and launcher_job is not None and not _owned_by(launcher_job, {job_uid}):
        launcher_job = None
    found = [(pod, pod_state(pod)) for pod in pods]
    states = tuple(state for _, state in found)
    if job_uid:
        owners = {job_uid} | ({str(launcher_job["metadata"].get("uid"))} if launcher_job else set())
        states = tuple(state for pod, state in found if _owned_by(pod, owners))
    launcher = launcher_state(launcher_job, states) if launcher_job else None
    return Observed(pods=states, launcher=launcher, children=tuple(state for _, state in found))


def _owned_by(obj: Json, uids: set[str]) -> bool:
    """Whether an ownerReference names one of `uids`; a copy without ownerReferences is taken as ours."""
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    return refs is None or any(str(ref.get("uid")) in uids for ref in refs)
