"""A torchrun world's launch, read from its workers. Pure.

A torchrun world has no launcher: every worker's torchrun agent runs its share of the ranks. What the state
machine reads from an MPI world's launcher (running, succeeded, failed, the pod whose log holds rank 0's
progress or the failed rank's error) is read here from the current attempt's workers, so the rest of the
state machine decides on a torchrun world as on any other:

- running once every worker of the world runs (the agents are at the rendezvous or training), or has ended
  well while the others finish (worker 0 still uploading the results);
- succeeded once every worker exited 0;
- failed as soon as one worker failed: that worker's pod, log and exit code say why.

An elastic world forms as a fixed one does, then lives as long as worker 0 runs (see torchrun_launch).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from dtjob import names
from dtjob.state.observed import LauncherState, PodState

_LATEST = datetime.max.replace(tzinfo=UTC)


def torchrun_launch(
    workers: Iterable[PodState],
    attempt: int,
    workers_wanted: int,
    elastic_formed: bool | None = None,
    trained_before: bool = False,
) -> LauncherState | None:
    """The launch of attempt `attempt`, or None while its world has not formed yet. Its size is the one its
    workers were started with (an edit of spec.workers, `workers_wanted`, applies at the next world), when
    they all agree.

    elastic_formed (None: a fixed world) tells an elastic world whether it formed before. Once it has, it
    runs as long as worker 0 (the rendezvous store) does: a worker the cluster takes away is no failure of
    the launch (the operator replaces it, its peers re-rendezvous), and too few workers is spec.elastic's
    minimum to judge.

    trained_before: a worker of this world exited 0 earlier (the job's status keeps the count), whose pod
    may be gone since."""
    mine = sorted(
        (p for p in workers if p.attempt == attempt and p.index is not None and not p.deleting),
        key=lambda p: p.index or 0,
    )
    sizes = {p.world_size for p in mine}
    agreed = sizes.pop() if len(sizes) == 1 else None
    size = agreed or workers_wanted
    # The first worker to fail is the cause; the others' ranks lost a peer (a tie goes to the lower index).
    failures = [p for p in mine if p.phase == "Failed" and not (elastic_formed is not None and _replaced(p))]
    failed = min(failures, key=lambda p: (p.ended or _LATEST, p.index or 0), default=None)
    if failed is not None:
        return _launch(attempt, size, failed.name, failed=True, reason=failed.reason, failed_pod=failed)
    world = [p for p in mine if (p.index or 0) < size]
    # Worker 0 runs rank 0: its log holds the progress and the upload's report (`<job>-worker-0`).
    rank0 = world[0].name.rsplit("-", 1)[0] + "-0" if world else ""
    if trained(world) or trained_before:
        if not any(p.index == 0 for p in world):
            return None  # worker 0 gone before it exited 0: its upload never ended, the world is lost
        still = [p for p in world if p.phase != "Succeeded"]  # worker 0 still uploading the results
        return _launch(attempt, size, rank0, running=bool(still), succeeded=not still, trained=True)
    formed = len(world) == size and all(p.phase == "Running" for p in world)
    if elastic_formed:
        formed = any(p.index == 0 and p.phase == "Running" for p in world)
    return _launch(attempt, size, rank0, running=True) if formed else None


def _replaced(worker: PodState) -> bool:
    """An elastic world's worker (not worker 0, whose agent hosts the store) that the cluster took away:
    the operator replaces it."""
    return worker.index != 0 and worker.disruption is not None


def trained(workers: Iterable[PodState]) -> bool:
    """A torchrun worker exited 0: its agent passed torchrun's exit barrier, which waits for every agent's
    processes to be done, so the world's training is over, and a worker whose pod is gone since (its node
    taken back) is no loss."""
    return any(p.phase == "Succeeded" for p in workers)


def _launch(
    attempt: int,
    size: int,
    pod: str,
    running: bool = False,
    succeeded: bool = False,
    failed: bool = False,
    reason: str | None = None,
    failed_pod: PodState | None = None,
    trained: bool = False,
) -> LauncherState:
    return LauncherState(
        attempt=attempt,
        deleting=False,
        running=running,
        succeeded=succeeded,
        failed=failed,
        pod_name=pod,
        reason=reason,
        world_size=size,
        failed_pod=failed_pod,
        role=names.ROLE_WORKER,
        trained=trained,
    )
