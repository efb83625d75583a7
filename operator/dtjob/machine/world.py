"""The world of one attempt: count it, find its first failure, restart it, or advance it toward all workers
Ready and the launcher running. Pods carry the attempt (`status.restarts`) as a label, so pods of an older
attempt are recognised as stale after a restart, also after an operator restart. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from dtjob import names
from dtjob.gang import kueue
from dtjob.machine.admission import release_when_ended
from dtjob.machine.builder import Builder
from dtjob.machine.elastic import elastic_ranks, lost, replaces_lost_workers
from dtjob.machine.finish import delete_world_pods, finish
from dtjob.machine.hosts import publish_hosts, world_hosts
from dtjob.machine.launch import launch, launcher_deletes, regrouped
from dtjob.machine.stale import clear_stale, force_delete_when_stuck
from dtjob.machine.world_messages import counted_twice, waiting_message
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    CreateWorker,
    EnsureWorld,
    Event,
    UploadLogs,
)
from dtjob.state.node_health import NODE_UNHEALTHY
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import (
    CHILD_NOT_OURS,
    CREATE_FORBIDDEN,
    FAILED,
    GANG_API_MISSING,
    NFS_SHARES_UNREADABLE,
    PENDING,
    RESTARTING,
    RUNNING,
    SECRET_NOT_FOUND,
    STARTING,
    SUSPENDED,
    JobStatus,
)

# Why a pod's container cannot start that only a change of spec or cluster fixes: each fails the job once
# runPolicy.startupDeadlineSeconds has passed since the pod was created (so does being unschedulable).
STARTUP_STUCK = frozenset({"ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"})
# ... and one that no waiting fixes: fails the job at once.
STARTUP_HOPELESS = frozenset({"InvalidImageName"})


# Why a world's launch failed: its launcher's pod, or in a torchrun world one of its workers.
LAUNCH_FAILED_REASONS = ("LauncherFailed", "WorkerFailed")


@dataclass(frozen=True)
class WorldFailure:
    reason: str
    message: str  # names the pod
    permanent: bool = False  # the job fails without a restart
    # The nodes failed, not the job: the restart is not counted against runPolicy.backoffLimit.
    infrastructure: bool = False


def count_workers(
    b: Builder, spec: JobSpec, workers: Mapping[int, PodState], launcher: LauncherState | None
) -> None:
    ready = sum(1 for p in workers.values() if p.ready and p.phase == "Running")
    succeeded = 0
    if spec.torchrun is not None:
        # The most seen: a worker that exited 0 stays counted once its pod is gone (a restart resets it).
        done = sum(1 for p in workers.values() if p.phase == "Succeeded")
        succeeded = max(done, b.prev.workers_succeeded)
    if launcher is None:
        state, pod = "Absent", None
    else:
        state = (
            "Succeeded" if launcher.succeeded
            else "Failed" if launcher.failed
            else "Running" if launcher.running
            else "Pending"
        )  # fmt: skip
        pod = launcher.pod_name
        if state == "Pending" and launcher.is_launcher:
            # Named with its Running state, in that patch, not in one of its own (a write per job): until
            # it runs, a launcher pod found gone is made again, as any not yet seen, not counted as lost.
            pod = b.prev.launcher_pod
    b.status = replace(
        b.status, workers_ready=ready, workers_succeeded=succeeded, launcher_state=state, launcher_pod=pod
    )


def first_failure(
    spec: JobSpec,
    size: int,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    prev: JobStatus,
    leaving: Mapping[int | None, PodState],
    now: datetime,
) -> WorldFailure | None:
    """The first failure of the current attempt (its message names the pod), or None. A worker the cluster
    took away (evicted from a lost node, removed with a deleted one) is lost, not failed."""
    if launcher is None and prev.launcher_pod is not None and spec.torchrun is not None:
        # The torchrun world formed before and no longer does: one of its workers is gone.
        return _missing_worker(spec, size, workers, leaving)
    if launcher is None and prev.launcher_pod is not None and prev.phase != SUSPENDED:
        # Its pod was seen running, so this is no cache lag after our own create: it was deleted.
        return WorldFailure("LauncherLost", f"launcher pod {prev.launcher_pod} disappeared (it was deleted)")
    if launcher is not None and launcher.failed:
        return _launcher_failure(spec, size, workers, launcher, leaving, now)
    return _worker_failure(spec, size, workers, launcher, leaving, now)


def _launcher_failure(
    spec: JobSpec,
    size: int,
    workers: Mapping[int, PodState],
    launcher: LauncherState,
    leaving: Mapping[int | None, PodState],
    now: datetime,
) -> WorldFailure:
    """Under restartPolicy ExitCode, a launcher that exits with a permanent code while its world is whole
    failed in the user's code: no restart. A broken world (a worker failed or gone), a signal, OOMKilled or
    an eviction is infrastructure, and restarts it. A rank dies with its GPU: when a worker's node reports
    a fault, the fault is the world's failure, not the launcher's exit."""
    on_sick_node = _node_failure(workers)
    if on_sick_node is not None:
        return on_sick_node
    pod = launcher.pod_name or names.launcher_name(spec.name)
    message = f"{launcher.role} pod {pod} failed: {launcher.reason or 'unknown reason'}"
    reason = LAUNCH_FAILED_REASONS[0] if launcher.is_launcher else LAUNCH_FAILED_REASONS[1]
    if launcher.log_error is not None:  # what the rank said, where the user would otherwise have to look
        message += f": {launcher.log_error.describe()}"
    failed = launcher.failed_pod
    code = failed.exit_code if failed is not None else None
    infrastructure = failed is not None and (failed.disruption or failed.termination_reason == "OOMKilled")
    policy = spec.run_policy
    if not policy.is_permanent(code) or infrastructure:
        return WorldFailure(reason, message)
    if launcher.is_launcher:
        broken = _worker_failure(spec, size, workers, None, leaving, now)
    else:  # the failed worker is the launch's own failure; only another one taken away breaks the world
        broken = next((_lost(w) for w in workers.values() if w.name != pod and w.disruption), None)
    broken = broken or _missing_worker(spec, size, workers, leaving)
    if broken is not None:
        return broken
    ranges = ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in policy.permanent_exit_codes)
    return WorldFailure(
        reason,
        f"{message}; exit code {code} is permanent under runPolicy.restartPolicy ExitCode "
        f"(permanentExitCodes {ranges}): not restarting",
        permanent=True,
    )


def _missing_worker(
    spec: JobSpec, size: int, workers: Mapping[int, PodState], leaving: Mapping[int | None, PodState]
) -> WorldFailure | None:
    """A worker gone while its world ran (evicted, deleted): the world is broken."""
    running = "the launcher was running" if spec.torchrun is None else "the world was running"
    for index in range(size):
        if index not in workers:
            name = names.worker_name(spec.name, index)
            gone = leaving.get(index)
            if gone is not None and gone.disruption:
                return WorldFailure(
                    "WorkerLost", f"worker pod {name} was lost while {running}: {gone.disruption}"
                )
            return WorldFailure("WorkerLost", f"worker pod {name} disappeared while {running}")
    return None


def _lost(worker: PodState) -> WorldFailure:
    return WorldFailure("WorkerLost", f"worker pod {worker.name} was lost: {worker.disruption}")


def _worker_failure(
    spec: JobSpec,
    size: int,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    leaving: Mapping[int | None, PodState],
    now: datetime,
) -> WorldFailure | None:
    elastic = replaces_lost_workers(spec, launcher)
    if not elastic and (on_sick_node := _node_failure(workers)) is not None:
        return on_sick_node
    for index in sorted(workers):
        worker = workers[index]
        if elastic and (lost(worker, now) or worker.node_problem is not None):
            continue  # replaced (a node about to go: once its ranks left) while the others train on
        if worker.phase == "Failed" and worker.disruption:
            return _lost(worker)
        if worker.phase == "Failed":
            reason = worker.reason or "unknown reason"
            return WorldFailure("WorkerFailed", f"worker pod {worker.name} failed: {reason}")
        # sshd must never exit while the world lives (a torchrun worker ends when its ranks are done).
        if worker.phase == "Succeeded" and spec.torchrun is None:
            return WorldFailure("WorkerFailed", f"worker pod {worker.name} exited")
    if (
        launcher is not None
        and launcher.launched
        and not launcher.finished
        and not elastic
        and not launcher.trained
    ):
        # Once the launch began, every worker must stay: a vanished one (evicted, deleted) breaks the world.
        # A torchrun world whose training is over is no longer broken by it: a gone worker did its part.
        return _missing_worker(spec, size, workers, leaving)
    return None


def _node_failure(workers: Mapping[int, PodState]) -> WorldFailure | None:
    """A worker whose node cannot keep it (a GPU fault, or the node about to go) ends a fixed world: it is
    restarted from its checkpoint on other nodes, not counted against runPolicy.backoffLimit."""
    for index in sorted(workers):
        worker = workers[index]
        problem = worker.node_problem
        if problem is not None and worker.phase != "Succeeded":
            message = f"worker pod {worker.name}'s {problem.describe()}"
            return WorldFailure(NODE_UNHEALTHY, message, infrastructure=True)
    return None


def startup_failure(
    spec: JobSpec, pods: Iterable[PodState], now: datetime
) -> tuple[WorldFailure | None, float | None]:
    """(a world pod that cannot start, or None; seconds until the next startup deadline, or None).

    InvalidImageName fails at once; unschedulable, image pull and container config errors fail once
    runPolicy.startupDeadlineSeconds has passed since the pod was created."""
    deadline = spec.run_policy.startup_deadline_seconds
    next_due: float | None = None
    for pod in pods:
        if pod.phase != "Pending" or pod.deleting:
            continue
        what = f"{pod.role} pod {pod.name}"
        if pod.waiting in STARTUP_HOPELESS:
            return WorldFailure(pod.waiting, f"{what} cannot start: {pod.reason}", permanent=True), None
        stuck = pod.unschedulable or pod.waiting in STARTUP_STUCK
        if deadline is None or not stuck or pod.created is None:
            continue
        left = (pod.created + timedelta(seconds=deadline) - now).total_seconds()
        if left <= 0:
            message = (
                f"{what} still cannot start {deadline}s after it was created "
                f"(runPolicy.startupDeadlineSeconds): {pod.reason or pod.waiting or 'unschedulable'}"
            )
            return WorldFailure("StartupDeadlineExceeded", message, permanent=True), None
        next_due = left if next_due is None else min(next_due, left)
    return None, next_due


def fail_world(b: Builder, spec: JobSpec, observed: Observed, failure: WorldFailure) -> None:
    reason, message = failure.reason, failure.message
    if failure.permanent:
        finish(b, spec, observed, FAILED, reason, message)
        return
    limit = spec.run_policy.backoff_limit
    counted = b.prev.restarts - b.prev.infrastructure_restarts
    if not failure.infrastructure and counted >= limit:
        finish(
            b, spec, observed, FAILED, reason,
            f"{message}; runPolicy.backoffLimit ({limit}) reached after {counted} restarts",
        )  # fmt: skip
        return
    restarts = b.prev.restarts + 1
    infrastructure = b.prev.infrastructure_restarts + int(failure.infrastructure)
    b.status = replace(
        b.status, restarts=restarts, infrastructure_restarts=infrastructure, launcher_state="Absent",
        launcher_pod=None, workers_ready=0, workers_succeeded=0,
    )  # fmt: skip
    if failure.infrastructure:
        text = f"{message}; restarting the world on other nodes (not counted against runPolicy.backoffLimit)"
    else:
        text = f"{message}; restarting the world (restart {counted + 1} of {limit})"
    b.cond("Restarting", True, reason, text)
    b.cond_false_if_present("Running", reason, message)
    b.events.append(Event("Warning", reason, text))
    b.phase(RESTARTING, text, "Warning", "Restarting")
    if spec.output is not None:
        # The failed world's logs say why it failed: keep them before its pods go.
        b.actions.append(UploadLogs(attempt=b.prev.restarts))
    delete_world_pods(b, observed)


def advance_world(
    b: Builder,
    spec: JobSpec,
    observed: Observed,
    workers: Mapping[int, PodState],
    launcher: LauncherState | None,
    attempt: int,
    size: int,
) -> None:
    """Toward a world of `size` workers (spec.workers, or the running world's own size)."""
    regroup = regrouped(spec, workers)
    blocked = clear_stale(b, observed, attempt, size, replaces_lost_workers(spec, launcher), regroup)
    stale_launcher = observed.launcher is not None and launcher is None
    if stale_launcher and observed.launcher is not None:
        b.actions.extend(launcher_deletes(observed.launcher))
        going = observed.launcher.pod
        # Its name is the next launcher's: Kueue's finalizer comes off once it ended, a lost node's is forced.
        if going is not None and going.deleting and not release_when_ended(b, going):
            force_delete_when_stuck(b, going)
    # Before any create: a refused one (a quota) must not keep a gone pod's address among the hosts.
    publish_hosts(b, spec, observed, world_hosts(spec, observed, workers, attempt))

    missing = [i for i in range(size) if i not in workers and names.worker_name(spec.name, i) not in blocked]
    if launcher is not None and launcher.trained:
        missing = []  # a worker gone after the training ended did its part: none replaces it
    if missing:
        b.actions.append(EnsureWorld())
        b.actions.extend(CreateWorker(i, attempt, observed.avoid_nodes) for i in missing)
    all_ready = len(workers) == size and all(p.ready and p.phase == "Running" for p in workers.values())
    create_launcher = launch(b, spec, launcher, workers, missing, stale_launcher, all_ready, attempt)

    refused = b.prev.condition("Created")
    waits = (CREATE_FORBIDDEN, CHILD_NOT_OURS, GANG_API_MISSING, SECRET_NOT_FOUND, NFS_SHARES_UNREADABLE)
    held = refused is not None and refused.reason in waits
    if refused is not None and held and (missing or create_launcher):
        # The last create was refused (a quota, RBAC, a name still held, a Secret not there yet): try again,
        # and keep saying why.
        b.phase(RESTARTING if b.prev.phase == RESTARTING else PENDING, refused.message)
        return
    if not b.status.is_true("Created"):
        made = (
            "service and worker pods"
            if spec.torchrun is not None
            else "SSH secret, hostfile, service and worker pods"
        )
        b.cond("Created", True, "WorldCreated", f"{made} created")

    restarting = b.prev.phase == RESTARTING or b.status.is_true("Restarting")
    if launcher is not None and launcher.running:
        _running(b, spec, workers, launcher, size, attempt, restarting)
        return
    if (launcher is not None and launcher.launched) or all_ready:
        message = "all workers ready; " + ("launcher starting" if spec.torchrun is None else "world forming")
        phase = STARTING
    else:
        waiting = waiting_message(spec, workers, missing, blocked)
        scheduled = len(workers) == size and all(p.scheduled for p in workers.values())
        phase = STARTING if scheduled else PENDING
        message = waiting
    b.phase(RESTARTING if restarting else phase, message)


def _running(
    b: Builder,
    spec: JobSpec,
    workers: Mapping[int, PodState],
    launcher: LauncherState,
    size: int,
    attempt: int,
    restarting: bool,
) -> None:
    ranks = f"{size * spec.total_slots // spec.workers} ranks on {size} workers"
    if spec.elastic is not None:
        ranks = elastic_ranks(spec, b.status.workers_ready, b.status.training_progress)
    elif size != spec.workers:
        ranks += f" (spec.workers={spec.workers} applies at the next world)"
    if spec.edited_workers is not None:
        ranks += kueue.edit_waits_message(spec.edited_workers, spec.workers)
    b.cond("Running", True, "LauncherRunning" if launcher.is_launcher else "WorkersRunning", ranks)
    b.cond_false_if_present("Restarting", "Recovered", f"world running again after {attempt} restarts")
    if restarting:
        b.events.append(Event("Normal", "Recovered", f"world running again after {attempt} restarts"))
    b.phase(RUNNING, f"training: {ranks}" + counted_twice(spec, workers, launcher))
