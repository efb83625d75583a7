"""The operator's /metrics during a job and after it, scraped from the operator process as Prometheus would,
on the real control plane with a kwok-simulated GPU pool."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log

pytestmark = pytest.mark.integration
Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]
JOB = "metered"
PER_JOB = (
    "dtjob_training_images_per_second",
    "dtjob_training_epoch",
    "dtjob_training_step",
    "dtjob_training_loss",
    "dtjob_training_progress_percent",
    "dtjob_training_eta_seconds",
)


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_PROGRESS_SECONDS": "1"}


def scrape(operator: OperatorProcess) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(operator.metrics_text())
        for sample in family.samples
    }


def jobs_by_phase(samples: Samples, namespace: str) -> dict[str, float]:
    return {
        dict(labels)["phase"]: value
        for (name, labels), value in samples.items()
        if name == "dtjob_jobs" and ("namespace", namespace) in labels and value
    }


def job_series(samples: Samples, namespace: str) -> dict[str, float]:
    return {
        name: value
        for (name, labels), value in samples.items()
        if ("namespace", namespace) in labels and ("job_name", JOB) in labels
    }


def api_calls(samples: Samples) -> set[tuple[str, str]]:
    """(verb, resource) of every API call the operator has timed."""
    return {
        (dict(labels)["verb"], dict(labels)["resource"])
        for (name, labels), value in samples.items()
        if name == "dtjob_kube_api_request_duration_seconds_count" and value > 0
    }


def reconciles(samples: Samples) -> float:
    return samples[("dtjob_reconcile_duration_seconds_count", ())]


def scrape_until(operator: OperatorProcess, holds: Callable[[Samples], bool], what: str) -> Samples:
    """The first scrape for which `holds` is true."""

    def scraped() -> Samples | None:
        samples = scrape(operator)
        return samples if holds(samples) else None

    return wait_for(scraped, timeout=60, interval=0.5, what=what)


def progress_line(step: int, images_per_sec: float, steps_per_sec: float | None = None) -> str:
    record = {"epoch": 1, "epochs": 2, "step": step, "stepsPerEpoch": 50, "imagesPerSec": images_per_sec,
              "loss": 6.5 - step / 100, "updatedAt": "2026-11-22T03:00:00Z",
              "stepsPerSec": steps_per_sec}  # fmt: skip
    return f"[0]<stdout>:DTJOB_PROGRESS {json.dumps(record)}"


def test_metrics_follow_a_job_and_its_series_end_with_it(
    api_client: client.ApiClient,
    jobs: Jobs,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    before = scrape(operator)
    assert jobs_by_phase(before, namespace) == {}
    assert ("dtjob_workqueue_depth", ()) in before

    jobs.create(JOB, launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "10m"}})
    pods = wait_for(lambda: jobs.pods(JOB, "launcher"), timeout=90, what="the launcher pod")
    launcher = str(pods[0].metadata.name)
    log = tmp_path / "launcher.log"
    append_log(log, progress_line(10, 2400.0))
    serve_pod_log(api_client, jobs.ns, launcher, "launcher", log)
    jobs.wait_phase(JOB, "Running")

    running = scrape_until(
        operator, lambda s: job_series(s, namespace).get("dtjob_training_step") == 10, "progress in /metrics"
    )
    assert jobs_by_phase(running, namespace) == {"Running": 1}
    assert job_series(running, namespace) == {
        "dtjob_training_images_per_second": 2400.0,
        "dtjob_training_epoch": 1.0,
        "dtjob_training_step": 10.0,
        "dtjob_training_loss": 6.4,
        "dtjob_training_progress_percent": 10.0,  # no pace measured yet: no ETA series
    }
    # The calls this job cost, each timed under its verb and resource.
    assert {
        ("patch", "distributedtrainingjobs/status"),
        ("list", "pods"),
        ("watch", "pods"),  # the children's watch is the operator's own
        ("list", "jobs"),
        ("create", "pods"),  # the workers and the launcher: no batch Job for the launcher
        ("create", "secrets"),
        ("create", "configmaps"),
        ("create", "services"),
        ("create", "events"),
        ("get", "pods/log"),
    } <= api_calls(running)
    assert not [labels for (name, labels) in running if name.startswith("dtjob_kube_api") and
                dict(labels).get("resource") == "other"]  # fmt: skip
    assert ("create", "jobs") not in api_calls(running)

    # More progress: another status write, more reconciles, the gauges follow.
    append_log(log, progress_line(20, 2500.0, steps_per_sec=0.1))
    later = scrape_until(
        operator, lambda s: job_series(s, namespace).get("dtjob_training_step") == 20, "progress to follow"
    )
    assert reconciles(later) > reconciles(running)
    series = job_series(later, namespace)
    assert series["dtjob_training_images_per_second"] == 2500.0
    # 80 of 100 steps left at 0.1 steps/sec.
    assert (series["dtjob_training_progress_percent"], series["dtjob_training_eta_seconds"]) == (20.0, 800.0)

    # Finished: counted as Succeeded, and its per-job series are gone.
    jobs.annotate_pod(launcher, {"sim.dtjob.io/outcome": "Succeeded"})
    jobs.wait_phase(JOB, "Succeeded")
    finished = scrape_until(
        operator, lambda s: jobs_by_phase(s, namespace) == {"Succeeded": 1}, "the job counted as Succeeded"
    )
    assert job_series(finished, namespace) == {}
    assert jobs.status(JOB)["progress"]["step"] == 20, "the last progress stays in the job's status"

    # Deleted: nothing of it left in /metrics.
    jobs.delete(JOB)
    wait_for(lambda: jobs.get(JOB) is None, timeout=60, what="the job deleted")
    gone = scrape_until(
        operator, lambda s: not [k for k in s if ("namespace", namespace) in k[1]], "the job's series gone"
    )
    assert reconciles(gone) >= reconciles(later)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on: its socket inodes matched against /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("metrics", [True, False])
def test_the_metrics_server_listens_on_loopback_unless_port_zero(
    kubeconfig: str, namespace: str, tmp_path: Path, jobs: Jobs, metrics: bool
) -> None:
    operator = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", metrics=metrics)
    operator.start()
    try:
        assert operator.proc is not None
        expected = {operator.port, operator.metrics_port} if metrics else {operator.port}
        assert listening_ports(operator.proc.pid) == expected
    finally:
        operator.stop()
