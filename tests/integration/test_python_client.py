"""The Python client (dtjob.client.Client) against the real API server with the operator running and kwok's
simulated pools: create (and bad input refused before anything is sent), status, wait with progress, the
launcher's log read and followed to the job's end, results downloaded from Azurite, and delete."""

from __future__ import annotations

import importlib.util
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from dtjob import API_GROUP, API_VERSION, PLURAL
from dtjob.client import Client, InvalidJob, JobNotFound, JobStatus, WaitTimeout
from dtjob.names import run_prefix
from kubernetes import client

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)

pytestmark = [pytest.mark.integration]

# The launcher runs until the test says otherwise (kwok ends a launcher pod 3 s after it starts by default).
SPEC = {
    "framework": "pytorch",
    "workers": 2,
    "gpusPerWorker": 4,
    "dataset": {"source": "synthetic"},
    "launcher": {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
}


def launcher_pod(jobs: Jobs, name: str) -> str:
    return str(
        wait_for(
            lambda: next((p.metadata.name for p in jobs.pods(name, "launcher")), None),
            timeout=60,
            what=f"the launcher pod of {name}",
        )
    )


def test_bad_input_raises_naming_the_field_and_creates_nothing(jobs: Jobs, kubeconfig: str) -> None:
    dtjob = Client(kubeconfig=kubeconfig, namespace=jobs.ns)
    with pytest.raises(InvalidJob) as raised:
        dtjob.create({**SPEC, "workers": 0}, name="bad")
    assert raised.value.field == "spec.workers"
    with pytest.raises(InvalidJob, match=r"^spec\.launcher\.template\.spec\.containers"):
        dtjob.create({**SPEC, "launcher": {"template": {"spec": {"containers": "launcher"}}}}, name="bad")
    assert jobs.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, jobs.ns, PLURAL)["items"] == []
    with pytest.raises(JobNotFound, match=f"no DistributedTrainingJob 'absent' in namespace {jobs.ns}"):
        dtjob.status("absent")


def test_a_handle_names_its_own_job_not_a_later_one_of_the_same_name(jobs: Jobs, kubeconfig: str) -> None:
    dtjob = Client(kubeconfig=kubeconfig, namespace=jobs.ns)
    first = dtjob.create(SPEC, name="same")
    dtjob.delete(first, wait=True, timeout=30)
    jobs.create("same")
    assert dtjob.status("same").uid != first.uid
    with pytest.raises(JobNotFound, match="was deleted and another of its name created since"):
        dtjob.status(first)


def test_create_status_wait_logs_and_delete(
    jobs: Jobs,
    operator: OperatorProcess,
    kubeconfig: str,
    api_client: client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dtjob = Client(kubeconfig=kubeconfig, namespace=jobs.ns)
    job = dtjob.create(SPEC, name="pyc")
    assert (job.name, job.namespace) == ("pyc", jobs.ns) and job.uid
    assert dtjob.status(job).uid == job.uid

    seen: list[JobStatus] = []
    running = dtjob.wait(job, until=lambda s: s.launcher == "Running", timeout=90, progress=seen.append)
    assert running.phase == "Running" and (running.workers_ready, running.workers) == (2, 2)
    assert seen[-1] == running and all(a != b for a, b in itertools.pairwise(seen))
    with pytest.raises(WaitTimeout) as raised:
        dtjob.wait("pyc", until="Succeeded", timeout=1)
    assert raised.value.status.phase == "Running"

    log = tmp_path / "launcher.log"
    pod = launcher_pod(jobs, "pyc")
    serve_pod_log(api_client, jobs.ns, pod, "launcher", log)
    append_log(log, "rank 0: step 1", "rank 0: step 2")
    assert wait_for(lambda: list(dtjob.logs(job)) or None, timeout=30, what="the log") == [
        "rank 0: step 1",
        "rank 0: step 2",
    ]

    followed: list[str] = []
    follower = threading.Thread(target=lambda: followed.extend(dtjob.logs(job, follow=True, tail=1)))
    follower.start()
    wait_for(lambda: followed == ["rank 0: step 2"], timeout=30, what="the last line, followed")
    append_log(log, "rank 0: done")
    wait_for(lambda: "rank 0: done" in followed, timeout=30, what="a line appended later")
    jobs.annotate_pod(pod, {"sim.dtjob.io/outcome": "Succeeded"})

    final = dtjob.wait(job, timeout=90, progress=True)
    assert final.succeeded and final.finished
    assert "pyc: Succeeded, workers" in capsys.readouterr().out
    follower.join(60)
    assert not follower.is_alive() and followed == ["rank 0: step 2", "rank 0: done"]

    dtjob.delete(job, wait=True, timeout=60)
    with pytest.raises(JobNotFound):
        dtjob.status(job)
    with pytest.raises(JobNotFound):
        dtjob.delete("pyc")


@pytest.mark.azure
def test_results_download_the_runs_results(
    jobs: Jobs,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    container_name: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    container = BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container(
        container_name
    )
    output: dict[str, Any] = {
        "endpoint": azurite.endpoint,
        "container": container_name,
        "prefix": "runs",
        "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
    }
    dtjob = Client(kubeconfig=kubeconfig, namespace=jobs.ns)
    job = dtjob.create({**SPEC, "output": output}, name="r50")
    run = run_prefix("runs", jobs.ns, "r50", job.uid)
    container.upload_blob(f"{run}metrics.json", json.dumps({"top1": 0.761}).encode())
    container.upload_blob(f"{run}logs/r50-launcher.log", b"rank 0\n")

    done = dtjob.results(job).download(tmp_path / "out", account_key=azurite.account_key)
    assert (done.files, done.skipped) == (1, 0) and done.source.endswith(run)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == {"top1": 0.761}
    assert not (tmp_path / "out" / "logs").exists()
    again = dtjob.results("r50").download(tmp_path / "out", with_logs=True, account_key=azurite.account_key)
    assert (again.files, again.skipped) == (1, 1)
    assert (tmp_path / "out" / "logs" / "r50-launcher.log").read_bytes() == b"rank 0\n"

    with pytest.raises(JobNotFound):
        dtjob.results("absent").download(tmp_path / "none", account_key=azurite.account_key)


def test_the_example_runs_its_job_to_the_end(
    jobs: Jobs, operator: OperatorProcess, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "python_client.py"
    spec = importlib.util.spec_from_file_location("python_client_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    argv = ["--kubeconfig", kubeconfig, "--namespace", jobs.ns, "--name", "demo", "--timeout", "120"]
    assert example.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"created demo in namespace {jobs.ns}" in out and "demo: Succeeded, workers" in out
    assert jobs.get("demo") is None, "the example deletes its job"
