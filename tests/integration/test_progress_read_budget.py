"""Every running job's progress reads together stay within DTJOB_PROGRESS_READS_PER_SECOND: with more jobs
running than the budget allows at the progress period, each job's launcher log is read less often, and each
job's progress still follows its log. The operator talks through the test bed's proxy, which records when
each log was read: the resync's passes, which find a log not yet due, must not put its next read off."""

from __future__ import annotations

import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from testbed.faultproxy import FaultProxy
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log

pytestmark = pytest.mark.integration
JOBS = 4
BUDGET = 0.2  # reads a second, all jobs together: with 4 running, each job's log every 20 s
SPACING_S = JOBS / BUDGET
WINDOW_S = 60.0
# Resyncs closer than the spacing: each finds the logs not due. Were the next read counted from such a pass,
# reads would come 20-39 s apart.
RESYNC_S = 13
# A timer's reconcile and its read, late by at most this much on a loaded machine.
LATE_S = 4.0


@pytest.fixture
def operator_env() -> dict[str, str]:
    # Unbounded, each job's log would be read every second: 4 a second, 240 in the window.
    return {
        "DTJOB_PROGRESS_SECONDS": "1",
        "DTJOB_PROGRESS_READS_PER_SECOND": str(BUDGET),
        "DTJOB_RESYNC_SECONDS": str(RESYNC_S),
    }


@pytest.fixture
def operator(proxied_operator: OperatorProcess) -> OperatorProcess:
    """The operator, every API call of it through the proxy (which injects nothing here)."""
    return proxied_operator


def progress_line(step: int) -> str:
    record = {"epoch": 1, "epochs": 1, "step": step, "stepsPerEpoch": 100, "imagesPerSec": 100.0, "loss": 1.0}
    return f"[0]<stdout>:DTJOB_PROGRESS {json.dumps(record)}"


def operator_metrics(operator: OperatorProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the operator's /metrics, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(operator.metrics_text())
        for sample in family.samples
    }


def log_reads(operator: OperatorProcess) -> float:
    labels = (("resource", "pods/log"), ("verb", "get"))
    return operator_metrics(operator).get(("dtjob_kube_api_request_duration_seconds_count", labels), 0.0)


def read_times(proxy: FaultProxy, pod: str, since: float) -> list[float]:
    """When the operator read the pod's log, from `since` (monotonic) on."""
    return [
        r.at
        for r in proxy.records
        if r.at >= since and r.request.subresource == "log" and r.request.name == pod and r.fault is None
    ]


def test_progress_reads_stay_within_the_budget_and_every_job_is_still_read(
    api_client: client.ApiClient,
    jobs: Jobs,
    namespace: str,
    operator: OperatorProcess,
    proxy: FaultProxy,
    simulated_pool: list[client.V1Node],
    tmp_path: Path,
) -> None:
    names = [f"budget-{i}" for i in range(JOBS)]
    for name in names:
        jobs.create(
            name,
            workers=1,
            gpusPerWorker=1,
            launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "10m"}},
        )
    logs: dict[str, Path] = {}
    pods: dict[str, str] = {}

    def launcher_pod(name: str) -> str | None:
        pods = jobs.pods(name, "launcher")
        return pods[0].metadata.name if pods else None

    for name in names:
        pod = wait_for(functools.partial(launcher_pod, name), timeout=120, what=f"{name}'s launcher pod")
        pods[name] = pod
        logs[name] = tmp_path / f"{name}.log"
        append_log(logs[name], progress_line(10))
        serve_pod_log(api_client, namespace, pod, "launcher", logs[name])

    def steps() -> dict[str, Any]:
        return {
            name: ((jobs.get(name) or {}).get("status") or {}).get("progress", {}).get("step")
            for name in names
        }

    wait_for(lambda: set(steps().values()) == {10}, timeout=120, what="every job's first progress")
    reads_before, start = log_reads(operator), time.monotonic()
    for log in logs.values():
        append_log(log, progress_line(20))
    # Each job's progress follows its log within one spacing.
    wait_for(lambda: set(steps().values()) == {20}, timeout=WINDOW_S, what="every job's progress to follow")
    time.sleep(max(0.0, WINDOW_S - (time.monotonic() - start)))
    reads = log_reads(operator) - reads_before
    elapsed = time.monotonic() - start
    # Within the budget: a read of each job every 20 s, and at most one more each for the window's edges.
    assert reads <= BUDGET * elapsed + JOBS, f"{reads} log reads in {elapsed:.0f}s"
    spacing = operator_metrics(operator)[("dtjob_progress_read_spacing_seconds", ())]
    assert spacing == pytest.approx(SPACING_S), spacing
    # Each job read on the spacing, neither sooner nor later: two or three reads each in the window.
    for name, pod in pods.items():
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(read_times(proxy, pod, start))]
        assert gaps and all(SPACING_S - 1.0 <= gap <= SPACING_S + LATE_S for gap in gaps), (name, gaps)
