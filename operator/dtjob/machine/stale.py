"""Children of older attempts, or beyond the world's size, go before a world is made again: their names are
reused. A pod whose node is lost never confirms its end: it is force-deleted once overdue. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from dtjob.machine.admission import release_when_ended
from dtjob.machine.builder import Builder
from dtjob.machine.elastic import replaced_now
from dtjob.state.decision import DeletePod, ForceDeletePod
from dtjob.state.observed import Observed, PodState

# A live kubelet confirms a pod's end within its grace period. A pod still terminating this long after that is
# on a lost node (no kubelet left to confirm): it is force-deleted so that the next world can reuse its name,
# instead of waiting until the node comes back or is deleted.
FORCE_DELETE_AFTER = timedelta(seconds=30)


def clear_stale(
    b: Builder,
    observed: Observed,
    attempt: int,
    size: int,
    replace_lost: bool = False,
    regroup: frozenset[str] = frozenset(),
) -> set[str]:
    """Children of older attempts (or beyond the world's size) go first: their names are reused; so do the
    lost workers of an elastic world, whose replacements take their names, and the workers in `regroup`
    (made again in another Kueue pod group). Returns the names still held (going, or just told to go)."""
    blocked: set[str] = set()
    for pod in observed.workers():
        stale = pod.attempt != attempt or (pod.index is not None and pod.index >= size) or pod.name in regroup
        if replace_lost and not stale and not pod.deleting:
            stale = replaced_now(b, pod)
        # Kept off a node that has recovered since, and not placed: made again, so it may go there.
        stale = stale or (not pod.node and not pod.deleting and _recovered(pod, observed.avoid_nodes))
        if stale or pod.deleting:
            blocked.add(pod.name)
            if not pod.deleting:
                b.actions.append(DeletePod(pod.name, pod.uid))
            elif not release_when_ended(b, pod):
                force_delete_when_stuck(b, pod)
    return blocked


def _recovered(pod: PodState, avoid_nodes: Iterable[str]) -> bool:
    return bool(set(pod.avoided_nodes) - set(avoid_nodes))


def force_delete_when_stuck(b: Builder, pod: PodState) -> None:
    """A terminating pod whose kubelet never confirms (its node lost) would hold its name, and with it the
    next world, until the node comes back or is deleted: force-delete it once FORCE_DELETE_AFTER past its
    grace period, and look again then (a stuck pod sends no event)."""
    if pod.deletion_deadline is None:
        return
    due = pod.deletion_deadline + FORCE_DELETE_AFTER
    if b.now >= due:
        overdue = (b.now - pod.deletion_deadline).total_seconds()
        b.actions.append(ForceDeletePod(pod.name, pod.uid, overdue))
    else:
        b.requeue((due - b.now).total_seconds())
