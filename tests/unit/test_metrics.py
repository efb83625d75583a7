"""The operator's metrics: what each recording point counts, how API calls and errors are labelled, and the
state read at scrape time (jobs by phase, per-job series that end with the job, the work queue)."""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
import urllib3
from dtjob import metrics
from dtjob.cli.operator import DEFAULT_METRICS_ADDRESS, DEFAULT_METRICS_PORT, metrics_endpoint
from dtjob.config import OperatorConfig
from dtjob.kube.client import Conflict
from dtjob.kube.errors import ApiError
from dtjob.reconcile.job import reconcile
from dtjob.reconcile.storage_observe import StorageRefused
from dtjob.runtime.cached_kube import ControllerKube
from dtjob.runtime.controller import Controller
from dtjob.state.observed import Blocker, Children
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.operator_fixtures import CONFIG, job_body
from tests.unit.recording_kube import JOB_KIND, RecordingKube
from tests.unit.test_controller_queue import A, B, StubReconcile, until
from tests.unit.test_controller_queue import RecordingKube as QueueKube
from tests.unit.test_reconcile_calls import NOW, OUTPUT, _sas_secret, _storage

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape() -> Samples:
    """Every sample of the operator's registry, as a Prometheus server parses /metrics."""
    text = generate_latest(metrics.REGISTRY).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def unbound() -> Iterator[None]:
    yield
    metrics.bind(None)


@pytest.mark.parametrize(
    ("method", "url", "verb", "resource"),
    [
        ("GET", "https://k:6443/apis/dtjob.io/v1alpha1/namespaces/ml/distributedtrainingjobs/rn50",
         "get", "distributedtrainingjobs"),
        ("PATCH", "https://k:6443/apis/dtjob.io/v1alpha1/namespaces/ml/distributedtrainingjobs/rn50/status",
         "patch", "distributedtrainingjobs/status"),
        ("GET", "https://k:6443/api/v1/namespaces/ml/pods?labelSelector=a%3Db", "list", "pods"),
        ("GET", "https://k:6443/api/v1/namespaces/ml/pods/rn50-launcher-x/log?container=launcher&tailLines=5",
         "get", "pods/log"),
        ("GET", "https://k:6443/api/v1/namespaces/ml/pods?watch=true", "watch", "pods"),
        ("POST", "https://k:6443/apis/batch/v1/namespaces/ml/jobs", "create", "jobs"),
        ("PUT", "https://k:6443/api/v1/namespaces/ml/secrets/rn50-sas-out", "update", "secrets"),
        ("DELETE", "https://k:6443/api/v1/namespaces/ml/pods/rn50-worker-0", "delete", "pods"),
        ("DELETE", "https://k:6443/api/v1/namespaces/ml/pods", "deletecollection", "pods"),
        ("GET", "https://k:6443/api/v1/namespaces/ml", "get", "namespaces"),
        ("GET", "https://k:6443/api/v1/nodes?labelSelector=x", "list", "nodes"),
        ("POST", "https://k:6443/api/v1/namespaces/ml/events", "create", "events"),
        ("GET", "https://k:6443/version", "get", "other"),
        ("HEAD", "https://k:6443/api/v1/namespaces/ml/pods/p", "other", "pods"),
    ],
)  # fmt: skip
def test_api_calls_are_labelled_as_rbac_names_them(method: str, url: str, verb: str, resource: str) -> None:
    assert metrics.api_call_labels(method, url) == (verb, resource)


def test_api_call_latency_and_errors_by_verb_resource_and_code() -> None:
    url = "https://k/api/v1/namespaces/ml/pods/rn50-worker-0"
    before = value("dtjob_kube_api_request_duration_seconds_count", verb="get", resource="pods")
    missing = value("dtjob_kube_api_errors_total", verb="get", resource="pods", code="404")
    timeouts = value("dtjob_kube_api_errors_total", verb="get", resource="pods", code="timeout")
    metrics.api_call_done("GET", url, 0.01, 200, None)
    metrics.api_call_done("GET", url, 0.02, 404, None)
    metrics.api_call_done(
        "GET", url, 20.0, None, urllib3.exceptions.ReadTimeoutError(cast(Any, None), url, "read")
    )
    assert value("dtjob_kube_api_request_duration_seconds_count", verb="get", resource="pods") == before + 3
    assert value("dtjob_kube_api_errors_total", verb="get", resource="pods", code="404") == missing + 1
    assert value("dtjob_kube_api_errors_total", verb="get", resource="pods", code="timeout") == timeouts + 1


def test_errors_fall_into_a_few_kinds() -> None:
    refused = urllib3.exceptions.NewConnectionError(cast(Any, None), "refused")
    assert metrics.error_kind(Conflict("x")) == "conflict"
    assert metrics.error_kind(ApiError(500)) == "kubernetes"
    assert metrics.error_kind(TimeoutError()) == "timeout"
    assert metrics.error_kind(urllib3.exceptions.MaxRetryError(cast(Any, None), "/", refused)) == "connection"
    timed_out = urllib3.exceptions.ReadTimeoutError(cast(Any, None), "/", "read")
    assert metrics.error_kind(urllib3.exceptions.MaxRetryError(cast(Any, None), "/", timed_out)) == "timeout"
    assert metrics.error_kind(StorageRefused(Blocker("R", "m"))) == "storage"
    assert metrics.error_kind(KeyError("x")) == "other"
    assert set(metrics.ERROR_CLASSES.values()) <= set(metrics.ERROR_KINDS)


def test_bounded_labels_start_at_zero_and_stay_bounded() -> None:
    samples = scrape()
    for reason in metrics.RESTART_REASONS:
        assert ("dtjob_world_restarts_total", (("reason", reason),)) in samples
    for outcome in metrics.LOG_OUTCOMES:
        assert ("dtjob_log_uploads_total", (("outcome", outcome),)) in samples
    before = value("dtjob_world_restarts_total", reason="Other")
    metrics.world_restarted("SomethingNew")
    assert value("dtjob_world_restarts_total", reason="Other") == before + 1
    assert not [key for key in scrape() if ("reason", "SomethingNew") in key[1]]


def test_log_upload_outcomes() -> None:
    assert metrics.log_upload_outcome(True, 0) == "uploaded"
    assert metrics.log_upload_outcome(True, 2) == "partial"
    assert metrics.log_upload_outcome(False, 0) == "failed"


def test_a_job_summary_keeps_the_numbers_the_metrics_show() -> None:
    summary = metrics.job_summary({
        "phase": "Running",
        "progress": {"epoch": 2, "step": 40, "imagesPerSec": 2400.5, "summary": "epoch 2/3 ..."},
        "staging": {"bytesCompleted": 10, "bytesTotal": 100, "bytesPerSecond": 5, "phase": "done"},
    })  # fmt: skip
    # A NaN loss never reaches status (it leaves the field out): so no loss series either.
    assert summary == metrics.JobSummary(
        "Running",
        {"epoch": 2.0, "step": 40.0, "imagesPerSec": 2400.5},
        {"bytesCompleted": 10.0, "bytesTotal": 100.0, "bytesPerSecond": 5.0},
    )
    assert metrics.job_summary(None) == metrics.JobSummary("Unknown")
    assert (
        metrics.job_summary({"phase": "Bogus", "progress": {"epoch": True, "loss": "x"}}).phase == "Unknown"
    )
    assert metrics.job_summary({"progress": {"epoch": True, "loss": "x"}}).progress == {}


RUNNING = {
    "phase": "Running",
    "progress": {
        "epoch": 1,
        "step": 20,
        "imagesPerSec": 2500.0,
        "loss": 6.3,
        "percent": 20.0,
        "etaSeconds": 96,
    },
    "staging": {"bytesCompleted": 100, "bytesTotal": 100, "bytesPerSecond": 50},
}
PER_JOB = tuple(name for name, *_ in metrics.JOB_GAUGES)


def job_series(samples: Samples, job: str) -> dict[str, float]:
    return {name: v for (name, labels), v in samples.items() if ("job_name", job) in labels}


def test_per_job_series_end_when_the_job_finishes_or_is_deleted() -> None:
    async def main() -> None:
        controller = Controller(cast(ControllerKube, QueueKube()), OperatorConfig())
        metrics.bind(controller.metrics_snapshot)
        controller.observe_job(A, deleted=False, status=RUNNING)
        controller.observe_job(B, deleted=False, status={"phase": "Running"})
        samples = scrape()
        assert job_series(samples, "a") == {
            "dtjob_training_images_per_second": 2500.0, "dtjob_training_epoch": 1.0,
            "dtjob_training_step": 20.0, "dtjob_training_loss": 6.3,
            "dtjob_training_progress_percent": 20.0, "dtjob_training_eta_seconds": 96.0,
            "dtjob_staging_completed_bytes": 100.0, "dtjob_staging_size_bytes": 100.0,
            "dtjob_staging_bytes_per_second": 50.0,
        }  # fmt: skip
        assert job_series(samples, "b") == {}  # no progress reported yet: no series
        assert samples[("dtjob_jobs", (("namespace", "ns"), ("phase", "Running")))] == 2
        assert samples[("dtjob_jobs", (("namespace", "ns"), ("phase", "Succeeded")))] == 0

        controller.observe_job(A, deleted=False, status={**RUNNING, "phase": "Succeeded"})
        samples = scrape()
        assert job_series(samples, "a") == {}
        assert samples[("dtjob_jobs", (("namespace", "ns"), ("phase", "Succeeded")))] == 1
        assert samples[("dtjob_jobs", (("namespace", "ns"), ("phase", "Running")))] == 1

        controller.observe_job(A, deleted=True)
        controller.observe_job(B, deleted=True)
        samples = scrape()
        assert not [key for key in samples if key[0] in PER_JOB or key[0] == "dtjob_jobs"]
        await controller.stop()

    asyncio.run(main())


def test_only_the_leader_shows_jobs_so_that_replicas_sum_to_each_job_once() -> None:
    leader = [False]

    async def main() -> None:
        controller = Controller(
            cast(ControllerKube, QueueKube()), OperatorConfig(), leading=lambda: leader[0]
        )
        metrics.bind(controller.metrics_snapshot)
        controller.observe_job(A, deleted=False, status=RUNNING)
        samples = scrape()
        assert samples[("dtjob_leader", ())] == 0
        assert not [key for key in samples if key[0] in PER_JOB or key[0] == "dtjob_jobs"], "a standby's"
        assert ("dtjob_workqueue_depth", ()) in samples  # its own queue, still
        leader[0] = True
        samples = scrape()
        assert samples[("dtjob_leader", ())] == 1
        assert samples[("dtjob_jobs", (("namespace", "ns"), ("phase", "Running")))] == 1
        assert job_series(samples, "a")["dtjob_training_step"] == 20.0
        await controller.stop()

    asyncio.run(main())


def test_unbound_the_state_metrics_exist_without_samples() -> None:
    families = {f.name for f in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode())}
    assert {"dtjob_jobs", "dtjob_workqueue_depth", *PER_JOB} <= families
    assert not [key for key in scrape() if key[0] == "dtjob_workqueue_depth"]


def test_the_queue_depth_counts_waiting_jobs_and_the_oldest_ages() -> None:
    stub = StubReconcile()

    async def main() -> None:
        controller = Controller(cast(ControllerKube, QueueKube()), OperatorConfig(), reconcile_fn=stub)
        controller.known.update({A, B})
        metrics.bind(controller.metrics_snapshot)
        gate = stub.block[A] = threading.Event()
        controller.enqueue(A)
        controller.enqueue(B)
        snap = controller.metrics_snapshot()
        assert (snap.queue_waiting, snap.queue_active) == (2, 0)
        await asyncio.sleep(0.05)
        assert controller.metrics_snapshot().queue_oldest_s >= 0.05
        controller.start()

        def only_a_runs() -> bool:  # B's reconcile is over (not only begun); A's is held by its gate
            return stub.count(A) == stub.count(B) == 1 and controller.metrics_snapshot().queue_active == 1

        await until(only_a_runs)
        controller.enqueue(A)  # while A runs: dirty, so waiting, not queued beside it
        samples = scrape()
        assert samples[("dtjob_workqueue_depth", ())] == 1
        # The spacing of progress reads: half DTJOB_PROGRESS_SECONDS, which no budget stretches here.
        assert samples[("dtjob_progress_read_spacing_seconds", ())] == OperatorConfig().progress_seconds / 2
        assert samples[("dtjob_workqueue_active", ())] == 1
        gate.set()
        await until(lambda: stub.count(A) == 2 and controller.depth == 0)
        snap = controller.metrics_snapshot()
        assert (snap.queue_waiting, snap.queue_active, snap.queue_oldest_s) == (0, 0, 0.0)
        await controller.stop()

    asyncio.run(main())


def test_reconciles_are_timed_and_their_errors_counted_by_kind() -> None:
    stub = StubReconcile()
    stub.results = [None, Conflict("stale"), RuntimeError("boom")]

    async def main() -> None:
        controller = Controller(cast(ControllerKube, QueueKube()), OperatorConfig(), reconcile_fn=stub)
        controller.known.update({A, B})
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 1 and controller.depth == 0)
        controller.enqueue(B)
        await until(lambda: stub.count(B) >= 2)  # the conflict retries at once
        await until(lambda: controller.depth == 0)
        await controller.stop()

    count = value("dtjob_reconcile_duration_seconds_count")
    conflicts = value("dtjob_reconcile_errors_total", kind="conflict")
    others = value("dtjob_reconcile_errors_total", kind="other")
    asyncio.run(main())
    assert value("dtjob_reconcile_duration_seconds_count") == count + 3
    assert value("dtjob_reconcile_errors_total", kind="conflict") == conflicts + 1
    assert value("dtjob_reconcile_errors_total", kind="other") == others + 1


def test_a_world_restart_is_counted_by_reason_once_it_is_recorded() -> None:
    kube = RecordingKube()
    running = {"phase": "Running", "restarts": 0, "startTime": "2026-05-01T11:00:00Z"}
    kube.put({**job_body(), "kind": JOB_KIND, "status": running})
    failed = {
        "kind": "Pod",
        "metadata": {
            "name": "rn50-worker-1", "namespace": "ml", "uid": "u-1", "ownerReferences": [{"uid": "uid-1"}],
            "labels": {"dtjob.io/role": "worker", "dtjob.io/attempt": "0", "dtjob.io/worker-index": "1"},
        },
        "status": {"phase": "Failed", "reason": "Error"},
    }  # fmt: skip
    before = value("dtjob_world_restarts_total", reason="WorkerFailed")
    kube.conflict_next = True  # the first decision is never recorded: it must not count
    with pytest.raises(Conflict):
        reconcile(kube, CONFIG, "ml", "rn50", Children(pods=(failed,)), NOW)
    assert value("dtjob_world_restarts_total", reason="WorkerFailed") == before
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=(failed,)), NOW)
    assert kube.objects[(JOB_KIND, "ml", "rn50")]["status"]["restarts"] == 1
    assert value("dtjob_world_restarts_total", reason="WorkerFailed") == before + 1
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=(failed,)), NOW)  # the same world, seen again
    assert value("dtjob_world_restarts_total", reason="WorkerFailed") == before + 1


def test_sas_mints_and_rotations() -> None:
    kube = RecordingKube()
    _storage(kube)
    kube.put({**job_body(output=OUTPUT), "kind": JOB_KIND})
    mints, rotations = (
        value("dtjob_sas_mints_total", access="out"),
        value("dtjob_sas_rotations_total", access="out"),
    )
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert value("dtjob_sas_mints_total", access="out") == mints + 1
    assert value("dtjob_sas_rotations_total", access="out") == rotations
    kube.put(_sas_secret(NOW - timedelta(hours=9), NOW + timedelta(hours=1)))  # 90% of its life used
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert value("dtjob_sas_mints_total", access="out") == mints + 2
    assert value("dtjob_sas_rotations_total", access="out") == rotations + 1


def test_the_metrics_endpoint_comes_from_flags_then_environment_then_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = argparse.Namespace(metrics_port=None, metrics_address=None)
    monkeypatch.delenv("DTJOB_METRICS_PORT", raising=False)
    monkeypatch.delenv("DTJOB_METRICS_ADDRESS", raising=False)
    assert metrics_endpoint(args) == (DEFAULT_METRICS_ADDRESS, DEFAULT_METRICS_PORT) == ("0.0.0.0", 8081)
    monkeypatch.setenv("DTJOB_METRICS_PORT", "0")
    monkeypatch.setenv("DTJOB_METRICS_ADDRESS", "127.0.0.1")
    assert metrics_endpoint(args) == ("127.0.0.1", 0)
    assert metrics_endpoint(argparse.Namespace(metrics_port=9100, metrics_address="::1")) == ("::1", 9100)
    monkeypatch.setenv("DTJOB_METRICS_PORT", "http")
    with pytest.raises(SystemExit, match="DTJOB_METRICS_PORT"):
        metrics_endpoint(args)


def test_a_worker_off_a_sick_node_is_counted_once_when_a_lagging_cache_decides_its_delete_again() -> None:
    """The next reconcile may not see the first one's delete yet (its watch lags under load) and decide it
    again: the worker is counted once, by its UID."""
    from dtjob.reconcile.job import _count_workers_off_nodes
    from dtjob.state.decision import DeletePod
    from dtjob.state.node_health import NodeProblem
    from dtjob.state.observed import Observed, PodState

    problem = NodeProblem("n-lagging", "XIDErrors", "xid 79", None, drain=False)
    sick = PodState(name="w-1", role="worker", attempt=0, index=1, phase="Running", scheduled=True,
                    ready=True, deleting=False, uid="u-lag", node="n-lagging",
                    node_problem=problem)  # fmt: skip
    before = value("dtjob_node_problem_workers_total", node="n-lagging", condition="XIDErrors")
    for _ in range(2):
        _count_workers_off_nodes(Observed(pods=(sick,)), [DeletePod("w-1", "u-lag")])
    after = value("dtjob_node_problem_workers_total", node="n-lagging", condition="XIDErrors")
    assert after - before == 1
