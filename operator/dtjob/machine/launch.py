"""A Horovod world's launcher: its pod made with the world's workers and held (names.LAUNCH_GATE) until every
worker is Ready, then released. The pod is already there when the world is, so the start waits for no other
controller; the release is one write. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dtjob.gang import kueue
from dtjob.machine.builder import Builder
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import Action, CreateLauncher, DeleteLauncher, DeletePod, ReleaseLauncher
from dtjob.state.observed import LauncherState, PodState


def launch(
    b: Builder,
    spec: JobSpec,
    launcher: LauncherState | None,
    workers: Mapping[int, PodState],
    missing: list[int],
    stale: bool,
    all_ready: bool,
    attempt: int,
) -> bool:
    """The launcher's create (True: decided in this pass), or its pod's release once every worker is Ready.
    `stale`: an older world's launcher pod is still there (its name is not free yet)."""
    # Made with its world's workers: a world Kueue queues is one pod group, launcher included, which Kueue
    # counts only once every member of it exists.
    if launcher is None and not stale and spec.torchrun is None and (missing or workers):
        outside = _group_of_workers_alone(spec, workers)
        if outside and (missing or any(p.gated for p in workers.values())):
            return False  # as the release that made the group did: once it is admitted, outside it
        b.actions.append(CreateLauncher(attempt, outside_kueue_group=outside))
        b.status = replace(b.status, launcher_state="Pending")
        return True
    if launcher is not None and launcher.held_pod is not None and all_ready:
        b.actions.append(ReleaseLauncher(launcher.held_pod.name, launcher.held_pod.uid))
    return False


def _group_of_workers_alone(spec: JobSpec, workers: Mapping[int, PodState]) -> bool:
    """The world's workers are in a Kueue pod group that counts no launcher, or Kueue manages them pod by pod
    (in no group): an earlier release of the operator made them so (or spec.workers was edited since). A
    launcher that joined would be a member Kueue never admits; it is made outside the group, as that release
    made it."""
    if not spec.run_policy.scheduling.kueue_pod_group:
        return False  # the launcher joins no group either
    size = kueue.group_size(spec)
    return any(_in_other_group(p, size) for p in workers.values())


def regrouped(spec: JobSpec, workers: Mapping[int, PodState]) -> frozenset[str]:
    """Workers Kueue still gates in a pod group of another size than the spec's: spec.workers was edited while
    the world waited for admission. Kueue makes no Workload of a group whose members disagree on its size, so
    the world would wait for good; these are made again, in the spec's group. A group an earlier release made
    (every worker's count spec.workers: no launcher in it) keeps its place in the queue
    (_group_of_workers_alone); an edit to one worker more looks so at first, and is regrouped once the added
    worker's count disagrees."""
    if not spec.run_policy.scheduling.kueue_pod_group or _earlier_release_group(spec, workers):
        return frozenset()
    size = kueue.group_size(spec)
    return frozenset(p.name for p in workers.values() if p.gated and p.kueue_group_size not in (None, size))


def _earlier_release_group(spec: JobSpec, workers: Mapping[int, PodState]) -> bool:
    counts = {p.kueue_group_size for p in workers.values()}
    return spec.torchrun is None and counts == {spec.workers}


def _in_other_group(worker: PodState, size: int) -> bool:
    if worker.kueue_group_size is None:
        return worker.kueue_finalizer  # Kueue's pod by pod; else no Kueue at all, and the group does nothing
    return worker.kueue_group_size != size


def launcher_deletes(launcher: LauncherState | None) -> list[Action]:
    """What removes the launcher of a world that goes: its pod, by UID (a legacy launcher Job, as the Job);
    nothing while it is already going, or for a torchrun world, whose launch is a worker's."""
    if launcher is None or not launcher.is_launcher or launcher.deleting:
        return []
    if launcher.legacy_job:
        return [DeleteLauncher()]
    pod = launcher.pod  # a launcher pod's `deleting` is its pod's
    return [] if pod is None else [DeletePod(pod.name, pod.uid)]
