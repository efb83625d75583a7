"""The operator's Prometheus metrics: the one registry and every metric's definition; the server is
dtjob.runtime.metrics_server.

A leaf: the controller, the reconcile and the I/O layers import it and record; the pure core never does (an
import-linter contract keeps it so). What the operator already knows is not copied into metrics at all: jobs
by phase, each unfinished job's training progress and staging transfer, and the work queue are read at scrape
time from the controller's own state (`bind`), so they cannot drift from it, and a job's series end when the
job finishes or is deleted. Every label takes values from a small fixed set, or namespace and job name of a
job that exists and has not finished. Every name starts with dtjob_.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.registry import Collector

from dtjob.state.status import FINISHED, Phase

Key = tuple[str, str]  # (namespace, job name)

# The `_created` timestamp series double every counter's series and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry()
# The operator process's own: dtjob_process_cpu_seconds_total, dtjob_process_resident_memory_bytes, ...
ProcessCollector(namespace="dtjob", registry=REGISTRY)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

RECONCILE_DURATION = Histogram(
    "dtjob_reconcile_duration_seconds",
    "Time one reconcile of one job took (observe, decide, record, act), failed ones included.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "dtjob_reconcile_errors",
    "Reconciles that ended in an exception, by kind (conflict: a stale read, retried at once; the others "
    "back off).",
    ["kind"],
    registry=REGISTRY,
)
WORLD_RESTARTS = Counter(
    "dtjob_world_restarts", "World restarts the operator decided, by the failure's reason.", ["reason"],
    registry=REGISTRY,
)  # fmt: skip
KUBE_API_DURATION = Histogram(
    "dtjob_kube_api_request_duration_seconds",
    "Kubernetes API calls the operator makes (its watches included): time to the answer's headers, "
    "retries included, by verb and resource.",
    ["verb", "resource"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
KUBE_API_ERRORS = Counter(
    "dtjob_kube_api_errors",
    "Kubernetes API calls answered outside 2xx (code: the HTTP status) or failed without an answer (code: "
    "timeout, connection, other). 404 on a get and 409 on a create are the operator's idempotence at work.",
    ["verb", "resource", "code"],
    registry=REGISTRY,
)
SAS_MINTS = Counter(
    "dtjob_sas_mints",
    "SAS tokens the operator signed and stored in a job's Secret, first ones and rotations, by access.",
    ["access"],
    registry=REGISTRY,
)
SAS_ROTATIONS = Counter(
    "dtjob_sas_rotations", "SAS tokens that replaced an older one before it expired, by access.", ["access"],
    registry=REGISTRY,
)  # fmt: skip
LOG_UPLOADS = Counter(
    "dtjob_log_uploads",
    "Uploads of a job's pod logs to Blob Storage (at the end, and before a restart), by outcome: uploaded, "
    "partial (some pods' logs unreadable), failed.",
    ["outcome"],
    registry=REGISTRY,
)
NODE_PROBLEM_WORKERS = Counter(
    "dtjob_node_problem_workers",
    "Worker pods the operator took off a node whose condition says it cannot keep them (a GPU fault, a VM "
    "event scheduled), by node and condition: with their world (a fixed one restarts) or alone (an elastic "
    "world replaces them).",
    ["node", "condition"],
    registry=REGISTRY,
)

# Bounded label values. Anything outside them is counted under "Other"/"other".
RESTART_REASONS = ("WorkerFailed", "WorkerLost", "LauncherFailed", "LauncherLost", "NodeUnhealthy", "Other")
ERROR_KINDS = ("conflict", "kubernetes", "timeout", "connection", "storage", "other")
LOG_OUTCOMES = ("uploaded", "partial", "failed")
SAS_ACCESS = ("in", "out")
# An exception is classed by the first of its classes (most derived first) named here; by name, so that this
# leaf imports neither the Kubernetes, urllib3 nor the Azure libraries.
ERROR_CLASSES = {
    "Conflict": "conflict",
    "ApiError": "kubernetes",
    "TimeoutError": "timeout",
    "ReadTimeoutError": "timeout",
    "ConnectTimeoutError": "timeout",
    "ServiceRequestTimeoutError": "timeout",
    "ServiceResponseTimeoutError": "timeout",
    "MaxRetryError": "connection",
    "NewConnectionError": "connection",
    "ProtocolError": "connection",
    "ConnectionError": "connection",
    "ServiceRequestError": "connection",
    "StorageRefused": "storage",
    "AzureError": "storage",
}

for _reason in RESTART_REASONS:
    WORLD_RESTARTS.labels(_reason)
for _kind in ERROR_KINDS:
    RECONCILE_ERRORS.labels(_kind)
for _outcome in LOG_OUTCOMES:
    LOG_UPLOADS.labels(_outcome)
for _access in SAS_ACCESS:
    SAS_MINTS.labels(_access)
    SAS_ROTATIONS.labels(_access)


# --- what the operator records --------------------------------------------------------------------------


def error_kind(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if type(error).__name__ == "MaxRetryError" and isinstance(reason, BaseException):
        return error_kind(reason)  # urllib3's retries gave up: on what
    for cls in type(error).__mro__:
        kind = ERROR_CLASSES.get(cls.__name__)
        if kind is not None:
            return kind
    return "other"


def reconcile_failed(error: BaseException) -> None:
    RECONCILE_ERRORS.labels(error_kind(error)).inc()


def world_restarted(reason: str) -> None:
    WORLD_RESTARTS.labels(reason if reason in RESTART_REASONS else "Other").inc()


# The pods counted off their nodes, by UID: a reconcile whose cache has not yet seen the deletion the one
# before made decides the same delete again, and must not count it again. Bounded: the oldest are forgotten.
_COUNTED_OFF_NODES: dict[str, None] = {}
_COUNTED_OFF_NODES_LOCK = threading.Lock()
COUNTED_OFF_NODES_KEPT = 4096


def worker_off_node(node: str, condition: str, pod_uid: str) -> None:
    """The worker `pod_uid` deleted while `node` reports `condition`, counted once (reconciles run in
    threads)."""
    with _COUNTED_OFF_NODES_LOCK:
        if pod_uid in _COUNTED_OFF_NODES:
            return
        _COUNTED_OFF_NODES[pod_uid] = None
        while len(_COUNTED_OFF_NODES) > COUNTED_OFF_NODES_KEPT:
            del _COUNTED_OFF_NODES[next(iter(_COUNTED_OFF_NODES))]
    NODE_PROBLEM_WORKERS.labels(node, condition).inc()


def sas_minted(access: str, rotation: bool) -> None:
    SAS_MINTS.labels(access).inc()
    if rotation:
        SAS_ROTATIONS.labels(access).inc()


def log_upload_outcome(uploaded: bool, missing: int) -> str:
    if not uploaded:
        return "failed"
    return "partial" if missing else "uploaded"


def logs_uploaded(uploaded: bool, missing: int) -> None:
    LOG_UPLOADS.labels(log_upload_outcome(uploaded, missing)).inc()


# One path segment of an API URL that may name a resource: a plural, never a value with odd characters.
RESOURCE_NAME = re.compile(r"^[a-z][a-z0-9.-]{0,62}$")


def api_call_labels(method: str, url: str) -> tuple[str, str]:
    """(verb, resource) of a Kubernetes API request, as RBAC names them: get | list | watch | create |
    update | patch | delete | deletecollection, and `pods`, `pods/log`, `distributedtrainingjobs/status`..."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    # /api/v1/... (core) or /apis/<group>/<version>/...
    rest = segments[2:] if segments[:1] == ["api"] else segments[3:] if segments[:1] == ["apis"] else []
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaced: namespaces/<ns>/<resource>/...
    resource = rest[0] if rest and RESOURCE_NAME.match(rest[0]) else "other"
    collection = len(rest) == 1  # a non-resource path (/version, /healthz) reads as a get
    if len(rest) >= 3 and RESOURCE_NAME.match(rest[2]) and resource != "other":
        resource = f"{resource}/{rest[2]}"
    method = method.upper()
    if method == "GET":
        watching = "watch=" in parts.query and parse_qs(parts.query).get("watch", [""])[0].lower() in (
            "true",
            "1",
        )
        verb = "watch" if watching else "list" if collection else "get"
    elif method == "DELETE":
        verb = "deletecollection" if collection else "delete"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "other")
    return verb, resource


def api_call_done(
    method: str, url: str, seconds: float, status: int | None, error: BaseException | None
) -> None:
    """One Kubernetes API call: its latency, and an error unless it was answered with a 2xx."""
    verb, resource = api_call_labels(method, url)
    KUBE_API_DURATION.labels(verb, resource).observe(seconds)
    if error is not None:
        kind = error_kind(error)
        KUBE_API_ERRORS.labels(verb, resource, kind if kind in ("timeout", "connection") else "other").inc()
    elif status is not None and not 200 <= status < 300:
        KUBE_API_ERRORS.labels(verb, resource, str(status)).inc()


# --- what is read at scrape time -------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSummary:
    """The part of a job's status that its metrics show: kept per job by the controller from watch events."""

    phase: str
    progress: Mapping[str, float] = field(default_factory=dict)  # PROGRESS_FIELDS
    staging: Mapping[str, float] = field(default_factory=dict)  # bytesCompleted, bytesTotal, bytesPerSecond


PHASES = tuple(Phase)
UNKNOWN_PHASE = "Unknown"  # a job without a status yet, or with a phase this operator does not know
PROGRESS_FIELDS = ("imagesPerSec", "epoch", "step", "loss", "percent", "etaSeconds")
STAGING_FIELDS = ("bytesCompleted", "bytesTotal", "bytesPerSecond")


def job_summary(status: Mapping[str, Any] | None) -> JobSummary:
    status = status or {}
    phase = status.get("phase")
    return JobSummary(
        phase=phase if phase in PHASES else UNKNOWN_PHASE,
        progress=_numbers(status.get("progress"), PROGRESS_FIELDS),
        staging=_numbers(status.get("staging"), STAGING_FIELDS),
    )


def _numbers(record: Any, names: Iterable[str]) -> dict[str, float]:
    if not isinstance(record, Mapping):
        return {}
    found: dict[str, float] = {}
    for name in names:
        value = record.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            found[name] = float(value)
    return found


@dataclass(frozen=True)
class Snapshot:
    """The controller's state at one scrape."""

    jobs: Mapping[Key, JobSummary]
    queue_waiting: int  # keys waiting for a worker
    queue_active: int  # keys being reconciled
    queue_oldest_s: float  # how long the longest-waiting key has waited; 0 when none waits
    leading: bool = True  # this replica holds the leader Lease (or runs alone)
    progress_read_spacing_s: float = 0.0  # the least time between two progress reads of one job's log


SnapshotFn = Callable[[], Snapshot]

# (metric name, help, status field) of the per-job gauges, labelled namespace and job_name: not `job`, which
# Prometheus gives every series (the scrape job), as kube-state-metrics names its kube_job_* label job_name.
JOB_GAUGES = (
    ("dtjob_training_images_per_second", "Training throughput rank 0 last reported (status.progress).",
     "progress", "imagesPerSec"),
    ("dtjob_training_epoch", "Epoch rank 0 last reported (status.progress).", "progress", "epoch"),
    ("dtjob_training_step", "Step within the epoch rank 0 last reported (status.progress).", "progress",
     "step"),
    ("dtjob_training_loss", "Loss rank 0 last reported (status.progress).", "progress", "loss"),
    ("dtjob_training_progress_percent", "Percent of the planned training steps done, as rank 0 last "
     "reported (status.progress.percent).", "progress", "percent"),
    ("dtjob_training_eta_seconds", "Seconds of training left at this world's measured pace, as of rank 0's "
     "last report (status.progress.etaSeconds); absent until a pace is known and while no world runs.",
     "progress", "etaSeconds"),
    ("dtjob_training_world_size", "Ranks of the world rank 0 last reported from (status.progress.worldSize); "
     "an elastic world's changes as it loses and regains workers.", "progress", "worldSize"),
    ("dtjob_workers_ready", "Worker pods Ready (status.workers.ready).", "workers", "ready"),
    ("dtjob_staging_completed_bytes", "Bytes of the dataset on the volume, copied or already there "
     "(status.staging).", "staging", "bytesCompleted"),
    ("dtjob_staging_size_bytes", "Bytes of the dataset to stage (status.staging).", "staging", "bytesTotal"),
    ("dtjob_staging_bytes_per_second", "The staging Job's transfer rate (status.staging).", "staging",
     "bytesPerSecond"),
)  # fmt: skip


class StateCollector(Collector):
    """The metrics computed from the controller's state at each scrape. Unbound (before the controller starts,
    after it stops) it yields every family empty."""

    def __init__(self) -> None:
        self.snapshot: SnapshotFn | None = None

    def describe(self) -> Iterator[Metric]:
        return iter(self._families(None))

    def collect(self) -> Iterator[Metric]:
        source = self.snapshot
        return iter(self._families(source() if source is not None else None))

    @staticmethod
    def _families(snap: Snapshot | None) -> list[Metric]:
        jobs = GaugeMetricFamily(
            "dtjob_jobs", "DistributedTrainingJobs the operator sees, by namespace and phase.",
            labels=["namespace", "phase"],
        )  # fmt: skip
        per_job = [
            (GaugeMetricFamily(name, text, labels=["namespace", "job_name"]), part, key)
            for name, text, part, key in JOB_GAUGES
        ]
        waiting = GaugeMetricFamily("dtjob_workqueue_depth", "Jobs waiting in the work queue for a worker.")
        active = GaugeMetricFamily("dtjob_workqueue_active", "Jobs being reconciled now.")
        oldest = GaugeMetricFamily(
            "dtjob_workqueue_oldest_item_age_seconds",
            "How long the job that has waited longest in the work queue has waited; 0 when none waits.",
        )
        spacing = GaugeMetricFamily(
            "dtjob_progress_read_spacing_seconds",
            "The least time between two reads of a running job's launcher log for its progress: half "
            "DTJOB_PROGRESS_SECONDS, or more while the running jobs' reads would pass "
            "DTJOB_PROGRESS_READS_PER_SECOND.",
        )
        leader = GaugeMetricFamily(
            "dtjob_leader", "1 on the replica that holds the leader Lease (or runs alone), 0 on a standby."
        )
        if snap is not None:
            leader.add_metric([], 1.0 if snap.leading else 0.0)
        # Job series come from the leader only: with several replicas, each job is counted once in a sum.
        if snap is not None and snap.leading:
            counts: dict[str, dict[str, int]] = {}
            for (namespace, _), summary in snap.jobs.items():
                by_phase = counts.setdefault(namespace, dict.fromkeys([*PHASES, UNKNOWN_PHASE], 0))
                by_phase[summary.phase] += 1
            for namespace in sorted(counts):
                for phase, count in counts[namespace].items():
                    jobs.add_metric([namespace, phase], count)
            for (namespace, name), summary in sorted(snap.jobs.items()):
                if summary.phase in FINISHED:
                    continue  # a finished job's last progress is in its status, not in a live series
                for family, part, key in per_job:
                    value = (summary.progress if part == "progress" else summary.staging).get(key)
                    if value is not None:
                        family.add_metric([namespace, name], value)
        if snap is not None:
            waiting.add_metric([], snap.queue_waiting)
            active.add_metric([], snap.queue_active)
            oldest.add_metric([], snap.queue_oldest_s)
            spacing.add_metric([], snap.progress_read_spacing_s)
        return [jobs, *(family for family, _, _ in per_job), waiting, active, oldest, spacing, leader]


STATE = StateCollector()
REGISTRY.register(STATE)


def bind(snapshot: SnapshotFn | None) -> None:
    """The controller whose state the scrape reads (None: none, after it stopped)."""
    STATE.snapshot = snapshot
