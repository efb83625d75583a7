"""The reads (and the status write) a reconcile makes, over the thin client (dtjob.kube.client.Kube). The
runtime hands reconciles a client whose answers come from its caches where they hold a recent one
(dtjob.runtime.cached_kube): the job's copy, the node lists, the log polls' memory."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from dtjob import KIND, names
from dtjob.desired.workload import KUEUE_APIS, PRIORITY_CLASS_KIND, WORKLOAD_KIND
from dtjob.gang.pool_room import pod_view
from dtjob.kube.client import Conflict, Forbidden, Kube, Rejected
from dtjob.spec.validators import GPU_RESOURCE
from dtjob.state.failed_create import failed_create_view, newest_failed_create
from dtjob.state.observed import StoredResults

log = logging.getLogger(__name__)
Json = dict[str, Any]
# The soonest a running job's progress pass comes again, and how far past a log's due time.
MIN_PROGRESS_POLL_SECONDS = 1.0
DUE_MARGIN_SECONDS = 0.05
LogKey = tuple[str, str, str]  # (namespace, pod, container)
# A refused pod's Events: the Job controller records one per try (merged into a count), so a few are plenty.
FAILED_CREATE_EVENTS = 20


@runtime_checkable
class PollsLogs(Protocol):
    """A client that remembers when each log tail was last read (the runtime's), so that progress polls read
    it at most once per interval however many events reconcile the job."""

    def poll_log(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
    ) -> str | None: ...

    def log_read_spacing(self, every_s: float) -> float:
        """How far apart one log's reads are now: `every_s`, or wider within the reads' budget."""

    def log_read_in(self, namespace: str, pod: str, container: str, after_s: float) -> float | None:
        """Seconds until `after_s` has passed since this log was last read; None if it never was."""


def get_job(kube: Kube, namespace: str, name: str) -> Json | None:
    return kube.get(KIND, namespace, name)


def kueue_api(kube: Kube) -> str:
    """The apiVersion to speak to Kueue in: the newest of those the operator knows that the cluster serves
    (the newest, when it serves none: there is no Kueue to speak to yet)."""
    served = kube.served_versions(KUEUE_APIS[0].rpartition("/")[0])
    return next((api for api in KUEUE_APIS if api.rpartition("/")[2] in served), KUEUE_APIS[0])


def get_workload(kube: Kube, namespace: str, name: str) -> Json | None:
    """A Kueue Workload; None when there is none (or Kueue's API is not served)."""
    return kube.get(WORKLOAD_KIND, namespace, name, kueue_api(kube))


def get_priority_class(kube: Kube, name: str, api_version: str) -> Json | None:
    """A Kueue WorkloadPriorityClass; None when there is none. Forbidden where the operator may not read them
    (a namespace-scoped install)."""
    return kube.get(PRIORITY_CLASS_KIND, None, name, api_version)


@runtime_checkable
class RemembersLooks(Protocol):
    """A client that keeps what storage answered a look for a run's results (the runtime's): a record that
    storage does not bear out is otherwise looked for again at every resync, a manifest of up to 8 MiB read
    and up to 100,000 blobs listed each time."""

    looks: Any  # TtlCache[tuple[str, ...], StoredResults]


def remembered_look(kube: Kube, key: tuple[str, ...], look: Callable[[], StoredResults]) -> StoredResults:
    """`look()`, or what it answered for `key` a short while ago where the client remembers; an answer that
    asks to be retried (storage did not answer) is never kept."""
    if not isinstance(kube, RemembersLooks):
        return look()
    kept = kube.looks.get(key)
    if isinstance(kept, StoredResults):
        return kept
    answer = look()
    if not answer.retry:
        kube.looks.put(key, answer)
    return answer


@runtime_checkable
class RemembersSettledJobs(Protocol):
    """A client that tells the controller which of the operator's own status writes left the job settled
    (the runtime's), so that their watch events cost no reconcile."""

    def job_settled(self, namespace: str, name: str, version: str) -> None: ...


def job_settled(kube: Kube, namespace: str, name: str, version: str) -> None:
    """The job at `version`, this reconcile's own status write, needs no other reconcile until something else
    changes (a child, the job, a timer): the watch event of that write brings nothing new."""
    if isinstance(kube, RemembersSettledJobs):
        kube.job_settled(namespace, name, version)


def patch_status(
    kube: Kube, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
) -> str:
    """Merge-patch status, guarded by resourceVersion so a stale read never overwrites newer status.
    Returns the job's resourceVersion after the patch."""
    body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
    job = kube.patch(f"{KIND}/status", namespace, name, body)
    if job is None:
        raise Conflict(f"{namespace}/{name} is gone; retrying")
    return str(job["metadata"]["resourceVersion"])


def poll_pod_log(
    kube: Kube, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
) -> str | None:
    """The log's tail, or None when this pod's container was polled less than `every_s` ago (by a client
    that remembers; any other reads each time)."""
    if isinstance(kube, PollsLogs):
        return kube.poll_log(namespace, pod, container, tail_lines, limit_bytes, every_s)
    return kube.read_log(namespace, pod, container, tail_lines, limit_bytes)


def progress_read_gap(every_s: float) -> float:
    """The least time between two progress reads of a log polled every `every_s`: half of it, so that the
    timer's pass reads even when a pod event's pass read shortly after the last one."""
    return every_s / 2


def progress_poll_seconds(kube: Kube, every_s: float, log: LogKey | None = None) -> float:
    """How soon a running job's progress is read again: every `every_s`, or as the runtime's budget of every
    job's reads spaces them out, not sooner (a pass that could not read would only cost a reconcile). Counted
    from the last read of `log`, the log the job's passes poll, where the client remembers it: a pass that
    read nothing (a resync's, a pod event's) then keeps the read when it is due rather than putting it off
    by a whole period."""
    if not isinstance(kube, PollsLogs):
        return every_s
    period = max(every_s, kube.log_read_spacing(progress_read_gap(every_s)))
    due_in = None if log is None else kube.log_read_in(*log, period)
    # A moment past the due time, so that a timer the event loop fires a hair early finds the log due.
    return period if due_in is None else max(MIN_PROGRESS_POLL_SECONDS, due_in + DUE_MARGIN_SECONDS)


def list_nodes(kube: Kube, label_selector: str, fresh: bool = False) -> list[Json]:
    """Nodes matching the selector; empty when RBAC forbids listing nodes (a namespace-scoped install).
    Rejected when the API server refuses the selector itself (400: a key or value it cannot parse). Unless
    `fresh`, the answer may come from the API server's watch cache (or the runtime's). Callers must not
    change the nodes."""
    try:
        return kube.list("Node", None, labels=label_selector, cached=not fresh)
    except Forbidden:
        log.warning("cannot list nodes (forbidden): skipping the GPUs-per-node check")
        return []
    except Rejected as err:
        raise Rejected(f"node selector {label_selector!r} refused: {err}") from err


def pool_nodes(kube: Kube, label_selector: str) -> list[Json] | None:
    """The nodes matching the selector, possibly from a watch cache; None when listing nodes is forbidden
    (a namespace-scoped install) or the selector is refused, without a word: this runs at every reconcile
    of an active job, and the preflight already says both."""
    try:
        return kube.list("Node", None, labels=label_selector, cached=True)
    except (Forbidden, Rejected):
        return None


def list_node_pods(kube: Kube, node: str) -> list[Json] | None:
    """The pods bound to `node` that have not ended, in every namespace; None when that is forbidden (a
    namespace-scoped install)."""
    selector = f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
    try:
        return kube.list("Pod", None, fields=selector, keep=pod_view(GPU_RESOURCE, names.JOB_NAME_LABEL))
    except Forbidden:
        return None


def failed_create(kube: Kube, namespace: str, job_uid: str) -> str | None:
    """What the API server answered the Job controller when it refused the pod of the Job `job_uid` (its
    newest FailedCreate Event: Pod Security, a ResourceQuota), or None. Admission refuses the pod, not
    the Job, so the Job itself never says why it has no pod."""
    selector = f"involvedObject.uid={job_uid},reason=FailedCreate"
    events = kube.list(
        "Event", namespace, fields=selector, limit=FAILED_CREATE_EVENTS, keep=failed_create_view
    )
    return newest_failed_create(events)
