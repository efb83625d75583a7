"""observe(): every read one reconcile needs, gathered into one Observed value before anything is decided.

The children come from the watch cache; the rest are reads of the API server (the preflight lookups, the SAS
Secrets, the staging and launcher log tails) and only happen when the state machine can use them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from dtjob.contract.results_upload import (
    ANNOTATION_UPLOADED_LATER,
    ResultsRecord,
    latest_report,
    parse_record,
)
from dtjob.contract.training_progress import latest_progress
from dtjob.desired.owned import owner_uids
from dtjob.desired.pods import GPU_RESOURCE, worker_scheduling
from dtjob.gang import PoolRoom, pool_room
from dtjob.gang.node_affinity import Unmatched, required_terms
from dtjob.gang.pool_nodes import describe_pool, in_pool
from dtjob.kube.client import Kube, LogUnavailable
from dtjob.machine import world_started
from dtjob.machine.gang import wants_pool_room
from dtjob.machine.results_later import record_mismatch
from dtjob.names import Access
from dtjob.reconcile import reads
from dtjob.reconcile.preflight import preflight
from dtjob.reconcile.results_check import stored_results
from dtjob.reconcile.storage_observe import observe_sas, observe_staging, output_directory
from dtjob.spec.parse import JobSpec
from dtjob.state.failed_create import CreateRefusal
from dtjob.state.hosts import published_hosts
from dtjob.state.node_health import node_problems
from dtjob.state.observed import (
    Blocker,
    Children,
    LauncherState,
    Observed,
    PodState,
    StoredResults,
    observe_children,
)
from dtjob.state.prebuilt import PrebuiltWorkload, prebuilt_state
from dtjob.state.rank_error import rank_error
from dtjob.state.staging import StagingOutcome
from dtjob.state.status import FINISHED, SAS_SCOPE_CONTAINER, SAS_SCOPE_DIRECTORY, JobStatus
from dtjob.state.torchrun import torchrun_launch
from dtjob.timefmt import parse_time

log = logging.getLogger(__name__)

# The tail is enough: rank 0 prints a progress line every log interval. The byte cap bounds the read when a
# framework floods the log with one huge line.
PROGRESS_TAIL_LINES = 50
PROGRESS_TAIL_BYTES = 64 * 1024
# A launcher that just failed is read further back, once: after the rank's error line come mpirun's banner,
# horovodrun's own traceback and the other ranks' last words. limitBytes keeps the start of the tail, so the
# cap leaves room for every line asked for.
FAILURE_TAIL_LINES = 200
FAILURE_TAIL_BYTES = 256 * 1024


def observe(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    job: dict[str, Any],
    prev: JobStatus,
    children: Children,
    now: datetime,
) -> Observed:
    meta = job["metadata"]
    uid = str(meta.get("uid") or "")
    children = _owned(children, uid)
    seen = observe_children(children.pods, children.launcher, uid, names.launcher_name(spec.name))
    if spec.torchrun is not None:  # no launcher: the workers' torchrun agents are the world's launch
        seen = replace(seen, launcher=_torchrun_launch(spec, prev, seen))
    active = prev.phase not in FINISHED and not spec.run_policy.suspend
    workers, avoid_nodes = _node_health(kube, config, spec, seen.pods) if active else (seen.pods, ())
    blocker = preflight(kube, spec, uid, config) if active and not world_started(prev, seen) else None
    sas = observe_sas(kube, spec, prev, uid, now, config) if active else {}
    sas_blockers = [s.blocked for s in sas.values() if s.blocked is not None]
    blocker = _worst(blocker, *sas_blockers)
    staging = None
    if active and spec.dataset.staging is not None and not prev.is_true("Staged"):
        parsed = list(zip(children.pods, seen.children, strict=True))
        staging = observe_staging(kube, spec.namespace, children.staging, parsed)
    log_text = _launcher_log(kube, spec.namespace, prev, seen, config.progress_seconds)
    progress = None if log_text is None else latest_progress(log_text)
    results = None if log_text is None else latest_report(log_text)
    record, stored = _results_record(kube, config, spec, job, prev, now)
    launcher = seen.launcher
    if launcher is not None and log_text is not None and _failed_now(prev, launcher):
        launcher = replace(launcher, log_error=rank_error(log_text))
    room = _pool_room(kube, spec) if active and wants_pool_room(spec, seen, prev, now) else None
    prebuilt = _prebuilt(kube, spec, uid) if active else None
    launcher_refused = None
    if active and seen.launcher is not None and seen.launcher.pod_name is None and not seen.launcher.finished:
        launcher_refused = _refusal(kube, spec.namespace, children.launcher, children.failed_creates)
    return Observed(
        pods=workers,
        launcher=launcher,
        children=seen.children,
        generation=meta.get("generation"),
        uid=uid,
        blocker=blocker,
        sas=sas,
        staging=staging,
        training_progress=progress,
        progress_read=log_text is not None,
        results_upload=results,
        results_record=record,
        results_stored=stored,
        output_sas_scope=_output_sas_scope(spec, uid, config),
        progress_poll_s=_progress_poll_s(kube, config, spec.namespace, prev, seen),
        pool_room=room,
        prebuilt=prebuilt,
        launcher_refused=launcher_refused,
        staging_refused=_staging_refused(kube, spec, children, staging),
        published=published_hosts(children.endpoint_slices, spec.name, uid),
        avoid_nodes=avoid_nodes,
    )


def _owned(children: Children, uid: str) -> Children:
    """`children` less what is not the job's: a (legacy) launcher or staging Job whose ownerReference names
    another owner, and the pods that neither the job nor those two Jobs own. Names and labels are anyone's: a
    namespace admin's look-alikes, or what an older job of the same name deleted with --cascade=orphan left,
    never count as the job's (a completed staging Job of theirs would stand in for its staging) nor have
    their logs uploaded into its run."""
    launcher, staging = (
        job if job is not None and uid in owner_uids(job) else None
        for job in (children.launcher, children.staging)
    )
    owners = {uid} | {str(job["metadata"].get("uid")) for job in (launcher, staging) if job is not None}
    pods = tuple(pod for pod in children.pods if owner_uids(pod) & owners)
    return replace(children, pods=pods, launcher=launcher, staging=staging)


def _progress_poll_s(
    kube: Kube, config: OperatorConfig, namespace: str, prev: JobStatus, seen: Observed
) -> float | None:
    """How soon a job with a launcher is reconciled again to read its progress."""
    if seen.launcher is None:
        return None
    return reads.progress_poll_seconds(kube, config.progress_seconds, _polled_log(namespace, prev, seen))


def _polled_log(namespace: str, prev: JobStatus, seen: Observed) -> reads.LogKey | None:
    """The log a pass polls for progress (_launcher_log): the running launcher's, while it and the job have
    not finished."""
    launcher = seen.launcher
    if launcher is None or launcher.pod_name is None or prev.phase in FINISHED:
        return None
    if not launcher.running or launcher.finished:
        return None
    return namespace, launcher.pod_name, names.CONTAINER_OF_ROLE[launcher.role]


def _staging_refused(
    kube: Kube, spec: JobSpec, children: Children, staging: StagingOutcome | None
) -> CreateRefusal | None:
    """Why the running staging Job has no pod of its own (an older job's of the same name could still be
    terminating), when admission refused it."""
    staging_uid = str(((children.staging or {}).get("metadata") or {}).get("uid") or "")
    stagers = [p for p in children.pods if staging_uid in owner_uids(p)]
    if staging is None or staging.phase != "Running" or stagers:
        return None
    return _refusal(kube, spec.namespace, children.staging, children.failed_creates)


def _node_health(
    kube: Kube, config: OperatorConfig, spec: JobSpec, pods: tuple[PodState, ...]
) -> tuple[tuple[PodState, ...], tuple[str, ...]]:
    """The pods, each worker with its node's problem if its node has one, and the nodes of the workers' pool
    that new workers are kept off. The pool's node list is the preflight's (shared by every job, cached for
    a few seconds); without the right to list nodes (a namespace-scoped install) nothing is read."""
    if not config.node_health.enabled:
        return pods, ()
    selector = ",".join(f"{k}={v}" for k, v in sorted(spec.placement.node_selector.items()))
    nodes = reads.pool_nodes(kube, selector)
    problems = node_problems(nodes or (), config.node_health)
    if not problems:
        return pods, ()
    marked = tuple(
        replace(p, node_problem=problems[p.node]) if p.role == names.ROLE_WORKER and p.node in problems else p
        for p in pods
    )
    return marked, tuple(sorted(problems))


def _results_record(
    kube: Kube, config: OperatorConfig, spec: JobSpec, job: dict[str, Any], prev: JobStatus, now: datetime
) -> tuple[ResultsRecord | None, StoredResults | None]:
    """The record of `dtjob results upload` on a job that keeps results, and, for one about this run,
    what storage holds of them (asked only then: anyone who may edit the job may write a record)."""
    if prev.results_pod is None:
        return None, None
    meta = job["metadata"]
    record = parse_record((meta.get("annotations") or {}).get(ANNOTATION_UPLOADED_LATER))
    uid = str(meta.get("uid") or "")
    if record is None or record_mismatch(record, prev, uid) is not None:
        return record, None
    # What the look reads: the record, the run's location in status and the spec's output (editable).
    key = (uid, record.to_annotation(), str(prev.output_url), repr(spec.output))
    return record, reads.remembered_look(
        kube, key, lambda: stored_results(kube, spec, prev, uid, record, now, config)
    )


def _output_sas_scope(spec: JobSpec, uid: str, config: OperatorConfig) -> str | None:
    """What the output tokens reach: the run's directory on a hierarchical-namespace account, else the
    container."""
    if spec.output is None:
        return None
    directory = output_directory(spec, spec.output.target, uid, config, Access.OUTPUT)
    return SAS_SCOPE_DIRECTORY if directory is not None else SAS_SCOPE_CONTAINER


def _refusal(
    kube: Kube, namespace: str, job: Mapping[str, Any] | None, watched: Mapping[str, str] | None
) -> CreateRefusal | None:
    """Why a Job of ours has no pod, when admission refused it (asked only while it has none): from the
    Events' watch where it serves the namespace (`watched`), else read."""
    meta = (job or {}).get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return None
    message = reads.failed_create(kube, namespace, uid) if watched is None else watched.get(uid)
    if message is None:
        return None
    created = meta.get("creationTimestamp")
    return CreateRefusal(str(meta.get("name") or ""), message, parse_time(created) if created else None)


def _prebuilt(kube: Kube, spec: JobSpec, uid: str) -> PrebuiltWorkload | None:
    """The Workload a copy of a dispatched job names (None: not a copy), read at every pass: its world runs
    only while that Workload admits it."""
    name = spec.prebuilt_workload
    return None if name is None else prebuilt_state(name, reads.get_workload(kube, spec.namespace, name), uid)


def _pool_room(kube: Kube, spec: JobSpec) -> PoolRoom | None:
    """The free GPUs of the workers' pool, for a gang past its schedule timeout to name what it lacks: the
    nodes its workers may land on, as preflight counts them (never a pool it may not use: its size and free
    GPUs are another tenant's). None when the operator may not read nodes or pods cluster-wide (a
    namespace-scoped install), or the affinity is too large to match here."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(spec.placement.node_selector.items()))
    listed = reads.list_nodes(kube, selector)
    if not listed:  # none, or none the operator may read
        return None
    tolerations, affinity = worker_scheduling(spec)
    try:
        terms = required_terms(affinity)
    except Unmatched:
        return None
    nodes = [n for n in listed if in_pool(n, tolerations, terms)]
    if not nodes:
        return None
    by_node = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        pods = reads.list_node_pods(kube, name)
        if pods is None:
            return None
        by_node[name] = pods

    def own(pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(names.JOB_NAME_LABEL)
        return meta.get("namespace") == spec.namespace and job == spec.name

    return pool_room(describe_pool(spec.placement.node_selector, terms), nodes, by_node, GPU_RESOURCE, own)


def _worst(*blockers: Blocker | None) -> Blocker | None:
    """The first blocker, unless a later one can never clear (a refusal outranks a wait)."""
    found = [b for b in blockers if b is not None]
    return next((b for b in found if b.fatal), found[0] if found else None)


def _failed_now(prev: JobStatus, launcher: LauncherState) -> bool:
    """The launcher of the current world failed: this reconcile restarts or fails the job, naming why."""
    return launcher.failed and launcher.attempt == prev.restarts


def _torchrun_launch(spec: JobSpec, prev: JobStatus, seen: Observed) -> LauncherState | None:
    """The launch read from the workers, with what only the status remembers: whether an elastic world
    formed before, and whether a worker exited 0 (its pod may be gone since)."""
    formed = None if spec.elastic is None else prev.launcher_pod is not None
    trained = prev.workers_succeeded > 0
    return torchrun_launch(seen.workers(), prev.restarts, spec.workers, formed, trained)


def _launcher_log(kube: Kube, namespace: str, prev: JobStatus, seen: Observed, every_s: float) -> str | None:
    """The tail of the launcher's log, for rank 0's latest progress line while the launcher runs (at most once
    per `every_s` however often its pods' events reconcile the job) and once more as it ends (a short run may
    print all its progress between two reads), then also for the error line of a failed one. None: nothing
    new (the status keeps the last progress), or a log the API server cannot serve (the failure's message
    then says what the pod's status says)."""
    launcher = seen.launcher
    if launcher is None or launcher.pod_name is None or prev.phase in FINISHED:
        return None
    if not (launcher.running or launcher.finished):
        return None
    pod, container = launcher.pod_name, names.CONTAINER_OF_ROLE[launcher.role]
    try:
        if _failed_now(prev, launcher):
            return kube.read_log(
                namespace, pod, container, tail_lines=FAILURE_TAIL_LINES, limit_bytes=FAILURE_TAIL_BYTES
            )
        if launcher.finished:
            return kube.read_log(
                namespace, pod, container, tail_lines=PROGRESS_TAIL_LINES, limit_bytes=PROGRESS_TAIL_BYTES
            )
        tail, gap = PROGRESS_TAIL_LINES, reads.progress_read_gap(every_s)
        return reads.poll_pod_log(kube, namespace, pod, container, tail, PROGRESS_TAIL_BYTES, gap)
    except LogUnavailable:
        return None
