"""decide(): the order in which the state machine's rules apply to one job. Pure.

A finished job only cleans up; a blocked first world waits or fails; a suspended job deletes its pods; then
the deadline, the SAS Secrets, staging, the launcher's outcome, a failure of the world, and finally the
world advanced toward every worker Ready and the launcher running. What actions produce (the log upload,
the SAS revocation, a refusal) reaches the status through settle() and with_results(), after they ran.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from dtjob import gang, names
from dtjob.contract.results_upload import UPLOADED
from dtjob.machine.admission import PREEMPTED, admitted_by_kueue, after_the_end, preempted, release_all_ended
from dtjob.machine.builder import Builder
from dtjob.machine.deadline import active_deadline
from dtjob.machine.elastic import BELOW_MINIMUM, elastic_world, replaces_lost_workers
from dtjob.machine.finish import (
    cleanup,
    delete_world_pods,
    finish,
    results_not_uploaded,
    results_upload_failed,
    ttl,
)
from dtjob.machine.gang import report_gang
from dtjob.machine.hosts import publish_hosts
from dtjob.machine.prebuilt import wait_for_prebuilt
from dtjob.machine.progress_deadline import note_progress, progress_deadline_failure
from dtjob.machine.refused_pods import refused_pod, wait_refused
from dtjob.machine.results_later import uploaded_later
from dtjob.machine.staging import stage
from dtjob.machine.world import (
    WorldFailure,
    advance_world,
    count_workers,
    fail_world,
    first_failure,
    startup_failure,
)
from dtjob.names import Access, output_url
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    Decision,
    DeletePodGroup,
    Event,
    MintSas,
)
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import FAILED, FINISHED, PENDING, RUNNING, STARTING, SUCCEEDED, SUSPENDED, JobStatus
from dtjob.timefmt import format_time

BLOCKED_POLL_SECONDS = 15.0
# How often a refused launcher pod is looked at again (the Job controller retries it with backoff).
REFUSED_POLL_SECONDS = 15.0


def world_started(prev: JobStatus, observed: Observed) -> bool:
    """Whether a world of this job has ever existed: from then on, no preflight lookup may fail it."""
    return prev.start_time is not None or observed.world_exists


def decide(spec: JobSpec, observed: Observed, prev: JobStatus, now: datetime) -> Decision:
    b = Builder(prev, now)
    b.status = replace(
        prev,
        observed_generation=observed.generation,
        workers_total=spec.workers,
        total_gpus=spec.workers * spec.gpus_per_worker,
    )
    _observations(b, spec, observed)
    attempt = prev.restarts
    world = _World.of(spec, observed, attempt)
    count_workers(b, spec, world.workers, world.launcher)

    if prev.phase in FINISHED:
        _finished(b, spec, observed)
        return b.decision()
    if _blocked(b, spec, observed) or _suspended(b, spec, observed) or wait_for_prebuilt(b, spec, observed):
        return b.decision()
    if preempted(b, spec, observed, attempt):
        return b.decision()
    deadline = _deadline(b, spec, observed)
    if b.status.phase in FINISHED:
        return b.decision()
    # Before anything that mounts them: the SAS Secrets, minted or rotated.
    _sas(b, observed, deadline)

    must_stage = spec.dataset.staging is not None and not b.status.is_true("Staged")
    started = bool(world.workers) or world.launcher is not None
    if must_stage and not started and not stage(b, spec, observed, observed.staging):
        return b.decision()
    if _ended(b, spec, observed, world) or _stuck(b, spec, observed, world, attempt):
        return b.decision()
    advance_world(b, spec, observed, world.workers, world.launcher, attempt, world.size)
    report_gang(b, spec, observed, world.workers, world.size)
    if b.status.phase == RUNNING and observed.progress_poll_s is not None:
        b.requeue(observed.progress_poll_s)
    return b.decision()


@dataclass(frozen=True)
class _World:
    """The current attempt's world as observed."""

    launcher: LauncherState | None
    size: int  # the workers it was created with
    workers: dict[int, PodState]  # by index, those of this attempt within its size and not deleting
    leaving: dict[int | None, PodState]  # those the cluster is taking away: they say why one is lost

    @staticmethod
    def of(spec: JobSpec, observed: Observed, attempt: int) -> _World:
        launcher = observed.launcher_of(attempt)
        if (
            launcher
            and launcher.held
            and spec.elastic is None
            and launcher.world_size not in (None, spec.workers)
            and not admitted_by_kueue(observed, attempt)
        ):
            launcher = None  # made for a size edited since, not launched: it goes, and one for the edit comes
        # A launched world keeps the size it was made with; an edit of spec.workers applies at the next one.
        # An elastic world takes the edit as it runs: Horovod's discovery finds the workers added or removed.
        size = (launcher.world_size if launcher and spec.elastic is None else None) or spec.workers
        workers = {
            p.index: p
            for p in observed.workers()
            if p.attempt == attempt and p.index is not None and p.index < size and not p.deleting
        }
        leaving = {p.index: p for p in observed.workers() if p.attempt == attempt and p.deleting}
        return _World(launcher, size, workers, leaving)


def _finished(b: Builder, spec: JobSpec, observed: Observed) -> None:
    """A finished job only cleans up (and becomes Succeeded once its kept results were uploaded by hand)."""
    uploaded_later(b, observed)
    cleanup(b, spec, observed)
    publish_hosts(b, spec, observed)
    after_the_end(b, observed)
    ttl(b, spec)


def _ended(b: Builder, spec: JobSpec, observed: Observed, world: _World) -> bool:
    """The current world's outcome: its launcher succeeded, its results could not be uploaded, or it failed or
    made no progress past runPolicy.progressDeadlineSeconds (then restarted or the job failed)."""
    launcher = world.launcher
    if launcher is not None and launcher.succeeded:
        pod = launcher.pod_name or names.launcher_name(spec.name)
        if spec.output is not None:
            said = observed.results_upload.message if observed.results_upload is not None else "uploaded"
            b.status = replace(b.status, results_state=UPLOADED, results_message=said)
        if launcher.is_launcher:
            finish(b, spec, observed, SUCCEEDED, "LauncherSucceeded", f"launcher pod {pod} completed")
        else:
            finish(
                b, spec, observed, SUCCEEDED, "WorkersSucceeded", f"all {world.size} worker pods completed"
            )
        return True
    if launcher is not None and results_upload_failed(spec, launcher, observed):
        results_not_uploaded(b, spec, observed)
        return True
    failure = first_failure(spec, world.size, world.workers, launcher, b.prev, world.leaving, b.now)
    below = elastic_world(b, spec, world.workers, launcher) if failure is None else None
    if below is not None:
        failure = WorldFailure(BELOW_MINIMUM, below)
    if failure is None:
        failure = progress_deadline_failure(b, spec, observed, launcher)
    if failure is not None:
        fail_world(b, spec, observed, failure)
        return True
    return False


def _stuck(b: Builder, spec: JobSpec, observed: Observed, world: _World, attempt: int) -> bool:
    """A world that cannot start: its launcher's pod refused, or a pod past runPolicy.startupDeadlineSeconds
    (fails), or one that may still start (waits, looking again at its deadline)."""
    launcher = world.launcher
    if launcher is not None and observed.launcher_refused is not None and launcher.pod_name is None:
        refused, waiting, due = refused_pod(spec, "launcher", observed.launcher_refused, b.now)
        if refused is not None:
            fail_world(b, spec, observed, refused)
            return True
        wait_refused(b, "Created", STARTING, waiting, due, REFUSED_POLL_SECONDS)
        return True
    # A running elastic world trains on while a replacement waits for a node (spot capacity may take long):
    # only staying below spec.elastic.minWorkers ends that world (dtjob.machine.elastic).
    waiting_workers = [] if replaces_lost_workers(spec, launcher) else list(world.workers.values())
    pods = [
        *waiting_workers,
        # A launcher pod the operator holds waits for the workers, whose own deadline counts.
        *(p for p in observed.pods if p.role == names.ROLE_LAUNCHER and p.attempt == attempt and not p.held),
    ]
    stuck, due = startup_failure(spec, pods, b.now)
    if stuck is not None:
        fail_world(b, spec, observed, stuck)
        return True
    if due is not None:
        b.requeue(due)
    return False


def _blocked(b: Builder, spec: JobSpec, observed: Observed) -> bool:
    """What stops the first world (a missing PVC, credentials, storage policy): wait, or fail when it never
    clears. A world that has existed is never failed by a later lookup."""
    blocker = observed.blocker
    if blocker is None or world_started(b.prev, observed):
        return False
    if blocker.fatal:
        finish(b, spec, observed, FAILED, blocker.reason, blocker.message)
    else:
        b.cond("Created", False, blocker.reason, blocker.message)
        b.phase(PENDING, blocker.message, "Warning", blocker.reason)
        b.requeue(BLOCKED_POLL_SECONDS)
    return True


def _suspended(b: Builder, spec: JobSpec, observed: Observed) -> bool:
    if spec.run_policy.suspend:
        delete_world_pods(b, observed)
        release_all_ended(b, observed)  # a suspended world holds no quota of Kueue's
        publish_hosts(b, spec, observed)
        if gang.pod_group_api(spec) is not None and b.prev.phase != SUSPENDED:
            b.actions.append(DeletePodGroup())  # a Volcano queue counts it while it exists
        b.cond("Suspended", True, "Suspended", "runPolicy.suspend is true: pods deleted, job kept")
        b.cond_false_if_present("Running", "Suspended")
        b.cond_false_if_present("Restarting", "Suspended")
        b.status = replace(b.status, start_time=None, workers_succeeded=0)
        b.phase(SUSPENDED, "suspended: pods deleted; set runPolicy.suspend=false to resume")
        return True
    held = b.prev.condition("Suspended")
    if b.prev.phase == SUSPENDED and not (held is not None and held.reason == PREEMPTED):
        b.cond("Suspended", False, "Resumed", "runPolicy.suspend is false")
        b.events.append(Event("Normal", "Resumed", "resumed: recreating the MPI world"))
    return False


def _deadline(b: Builder, spec: JobSpec, observed: Observed) -> datetime | None:
    """Start the clock; fail the job past runPolicy.activeDeadlineSeconds, else wake up when it comes."""
    start_time = b.status.start_time or format_time(b.now)
    b.status = replace(b.status, start_time=start_time)
    deadline = active_deadline(spec, start_time)
    if deadline is None:
        return None
    seconds = spec.run_policy.active_deadline_seconds
    remaining = deadline - b.now
    if remaining <= timedelta(0):
        finish(
            b, spec, observed, FAILED, "DeadlineExceeded",
            f"job was active longer than runPolicy.activeDeadlineSeconds ({seconds}s)",
        )  # fmt: skip
    else:
        b.requeue(remaining.total_seconds())
    return deadline


def _observations(b: Builder, spec: JobSpec, observed: Observed) -> None:
    """Facts that go into status as read: the results URL and rank 0's training progress. The URL (and what
    the output tokens reach) only for a location the output SAS may be signed for: the storage policy
    allowed it, so `dtjob results upload` can trust it (a finished job's stays the one its run used)."""
    out = observed.sas.get(Access.OUTPUT.value)
    if spec.output is not None and observed.uid and out is not None and out.blocked is None:
        target = spec.output.target
        url = output_url(target.container_url, target.prefix, spec.namespace, spec.name, observed.uid)
        b.status = replace(b.status, output_url=url, output_sas_scope=observed.output_sas_scope)
    if observed.training_progress is not None:
        note_progress(b, observed)
        b.status = replace(b.status, training_progress=observed.training_progress)
    report = observed.results_upload
    if report is not None and b.prev.phase not in FINISHED:
        b.status = replace(b.status, results_state=report.state, results_message=report.message)


def _sas(b: Builder, observed: Observed, deadline: datetime | None) -> None:
    for access, sas in sorted(observed.sas.items()):
        if sas.altered is not None:
            text = f"the {access} SAS Secret {sas.altered}: replaced with a fresh token and the spec's URL"
            b.events.append(Event("Warning", "SasSecretAltered", text))
        if sas.mint_needed and sas.blocked is None:
            b.actions.append(MintSas(access, not_after=deadline))
        elif sas.mint_needed:  # the world runs on the old token while the credentials are fixed
            b.requeue(BLOCKED_POLL_SECONDS)
        elif sas.rotate_in_s is not None:
            b.requeue(sas.rotate_in_s)
