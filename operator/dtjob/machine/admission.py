"""Kueue's side of a world: a Workload evicted (preempted by a job of higher priority, its queue stopped)
stops the world without counting a restart against runPolicy.backoffLimit; the workers are created again and
wait, gated, until Kueue admits the group again. Pure.

Kueue marks each pod of the group it stops with a TerminationTarget condition before deleting it; the job
holds Suspended=True (reason Preempted) from the first such pod it sees until every worker of the world is
back and ungated, so a launcher that fails as its workers go is never taken for a failure of the world. What
Kueue writes on the pods (TerminationTarget, its gate and finalizer) and the words are dtjob.gang.kueue's."""

from __future__ import annotations

from dataclasses import replace

from dtjob import names
from dtjob.gang import kueue
from dtjob.machine.builder import Builder
from dtjob.machine.launch import launcher_deletes
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    CreateLauncher,
    CreateWorker,
    DeletePod,
    EnsureWorld,
    Event,
    FinishKueueGroup,
    ReleasePod,
)
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import SUSPENDED

PREEMPTED = "Preempted"


def release_when_ended(b: Builder, pod: PodState) -> bool:
    """A deleted pod of ours that has ended (or never ran) and still carries Kueue's finalizer: take it off,
    so that its name is free for the next world. True when that was decided."""
    ended = pod.finished or not pod.scheduled
    if pod.deleting and pod.kueue_finalizer and ended:
        b.actions.append(ReleasePod(pod.name, pod.uid))
        return True
    return False


def _launcher(observed: Observed) -> LauncherState | None:
    """The operator's launcher, if there is one (a torchrun world's launch is a worker's)."""
    launcher = observed.launcher
    return launcher if launcher is not None and launcher.is_launcher else None


def release_all_ended(b: Builder, observed: Observed) -> None:
    """Kueue's finalizer off every deleted pod of the job's that has ended: no replacement comes for them (the
    job has ended, or is suspended), and Kueue frees the group's quota once its last pod is gone."""
    launcher = _launcher(observed)
    pod = launcher.pod if launcher is not None else None
    for gone in (*observed.workers(), *((pod,) if pod is not None else ())):
        release_when_ended(b, gone)


def after_the_end(b: Builder, observed: Observed) -> None:
    """Once the job has ended, Kueue frees the world's quota when its Workload finishes: when every pod of the
    group is gone, or, while the launcher pod stays for its log, once that pod is marked (FinishKueueGroup)
    and none is active."""
    release_all_ended(b, observed)
    launcher = _launcher(observed)
    pod = launcher.pod if launcher is not None else None
    if pod is not None and not pod.deleting and pod.finished and pod.kueue_finalizer and pod.kueue_group_open:
        b.actions.append(FinishKueueGroup(pod.name, pod.uid))


def preempted(b: Builder, spec: JobSpec, observed: Observed, attempt: int) -> bool:
    """While Kueue has evicted the world: tear down what is left of it, create it again (Kueue gates its pods
    until the group, launcher included, is admitted) and say so; True until the world is admitted again."""
    launcher = _launcher(observed)
    own = launcher.pod if launcher is not None and launcher.attempt == attempt else None
    mine = [p for p in (*observed.workers(), *((own,) if own else ())) if p.attempt == attempt]
    eviction = next((p.kueue_eviction for p in mine if p.kueue_eviction), None)
    held = b.prev.condition("Suspended")
    holding = held is not None and held.status == "True" and held.reason == PREEMPTED
    if eviction is None and not holding:
        return False
    size = spec.workers
    live = {p.index: p for p in mine if not p.deleting and p.index is not None and p.index < size}
    # Admitted again: a fresh world, before its launcher (a torchrun world's workers may already run).
    launched = launcher is not None and launcher.launched
    back = eviction is None and not launched and len(live) == size
    if back and not any(p.gated for p in live.values()):
        b.cond("Suspended", False, "Admitted", kueue.ADMITTED_AGAIN)
        b.events.append(Event("Normal", "Admitted", f"{kueue.ADMITTED_AGAIN}: resuming"))
        return False
    if not holding:
        text = kueue.evicted_message(str(eviction))
        b.events.append(Event("Warning", PREEMPTED, text))
        b.cond("Suspended", True, PREEMPTED, text)
        b.cond_false_if_present("Running", PREEMPTED, text)
        b.cond_false_if_present("Restarting", PREEMPTED, text)
    b.status = replace(
        b.status, start_time=None, launcher_state="Absent", launcher_pod=None, workers_ready=0,
        workers_succeeded=0,
    )  # fmt: skip
    blocked: set[str] = set()
    for pod in observed.workers():
        if pod.deleting or pod.attempt != attempt or pod.kueue_eviction:
            blocked.add(pod.name)
            if not pod.deleting:
                b.actions.append(DeletePod(pod.name, pod.uid))
            else:
                release_when_ended(b, pod)
    missing = [i for i in range(size) if i not in live and names.worker_name(spec.name, i) not in blocked]
    if missing:
        b.actions.append(EnsureWorld())
        b.actions.extend(CreateWorker(i, attempt, observed.avoid_nodes) for i in missing)
    _launcher_again(b, spec, launcher, attempt)
    waiting = kueue.waiting_message(spec.run_policy.scheduling.queue_name, bool(blocked))
    b.phase(SUSPENDED, waiting, "Warning", PREEMPTED)
    return True


def _launcher_again(b: Builder, spec: JobSpec, launcher: LauncherState | None, attempt: int) -> None:
    """The evicted world's launcher goes (Kueue stops it with its workers); the next world's is made with its
    workers, as a member of the group that Kueue admits whole. One made for the next world (held by the
    operator's gate, not stopped by Kueue) is kept."""
    if launcher is None:
        if spec.torchrun is None:
            b.actions.append(CreateLauncher(attempt))
            b.status = replace(b.status, launcher_state="Pending")
        return
    pod = launcher.pod
    stopped = pod is None or pod.deleting or bool(pod.kueue_eviction)
    if launcher.held and launcher.attempt == attempt and not stopped:
        return  # made for the next world
    b.actions.extend(launcher_deletes(launcher))
    if pod is not None and pod.deleting:
        release_when_ended(b, pod)


def admitted_by_kueue(observed: Observed, attempt: int) -> bool:
    """Kueue admitted the world (its workers ungated): the pod group it admitted keeps its size, so an edit of
    spec.workers applies at the next world, as once launched."""
    live = [p for p in observed.workers() if p.attempt == attempt and not p.deleting]
    return any(p.kueue_finalizer and not p.gated for p in live)


def admitted_group(spec: JobSpec, observed: Observed, attempt: int) -> JobSpec:
    """The world a job runs once Kueue admitted it as one pod group: the size it was made with. Kueue
    deletes a member made for a group of another size: an elastic world that took an edit of spec.workers as
    it ran, or a worker made again for a world still to launch, was made again every few seconds, for good.
    The edit applies at the next world (spec.edited_workers keeps it, for the status to say so)."""
    if not spec.run_policy.scheduling.kueue_pod_group:
        return spec
    launcher = observed.launcher_of(attempt)
    size = launcher.world_size if launcher is not None else None
    if size is None or size == spec.workers:
        return spec
    if spec.elastic is not None and not spec.elastic.min_workers <= size <= spec.elastic.max_workers:
        return spec
    if not admitted_by_kueue(observed, attempt):
        return spec  # still queued: the gated workers are made again in a group of the edited size
    return replace(spec, workers=size, edited_workers=spec.workers)
