"""A Horovod world's launcher: its pod made with the world's workers and held (names.LAUNCH_GATE) until every
worker is Ready, then released. The pod is already there when the world is, so the start waits for no other
controller; the release is one write. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

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
    size: int,
    stale: bool,
    all_ready: bool,
    attempt: int,
) -> bool:
    """The launcher's create (True: decided in this pass), or its pod's release once every worker is Ready.
    `stale`: an older world's launcher pod is still there (its name is not free yet)."""
    if launcher is None and not stale and spec.torchrun is None and _due(spec, workers, missing, size):
        b.actions.append(CreateLauncher(attempt))
        b.status = replace(b.status, launcher_state="Pending")
        return True
    if launcher is not None and launcher.held_pod is not None and all_ready:
        b.actions.append(ReleaseLauncher(launcher.held_pod.name, launcher.held_pod.uid))
    return False


def _due(spec: JobSpec, workers: Mapping[int, PodState], missing: list[int], size: int) -> bool:
    """Made with its world's workers; a world Kueue queues gets it once admitted (every worker there and
    ungated), so that a queued world holds no pod beside its workers."""
    if spec.run_policy.scheduling.queue_name:
        return len(workers) == size and not any(p.gated for p in workers.values())
    return bool(missing or workers)


def launcher_deletes(launcher: LauncherState | None) -> list[Action]:
    """What removes the launcher of a world that goes: its pod, by UID (a legacy launcher Job, as the Job);
    nothing while it is already going, or for a torchrun world, whose launch is a worker's."""
    if launcher is None or not launcher.is_launcher or launcher.deleting:
        return []
    if launcher.legacy_job:
        return [DeleteLauncher()]
    pod = launcher.pod  # a launcher pod's `deleting` is its pod's
    return [] if pod is None else [DeletePod(pod.name, pod.uid)]
