"""How a real run ends when things go wrong around it, on the real node: storage away just as the results
upload starts (for less than the upload's retries, and for longer, when `dtjob results upload` finishes the
job), and the job's deadline firing mid-training. Nothing trained, and no log, is lost."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from dtjob.azure.sas import ANNOTATION_EXPIRES
from dtjob.cli.main import main
from dtjob.timefmt import parse_time

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.outage import OutageProxy
from tests.e2e.conftest import NODE_IP, RealCluster
from tests.e2e.real_jobs import (
    assert_trained_together,
    blob_names,
    blob_text,
    create_tiny_job,
    live_launcher_records,
    new_container,
    output_location,
    pod_logs,
    run_metrics,
    tiny_model,
    tiny_training,
    wait_finished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
OUTAGE_SECONDS = 45
# How long after rank 0's first logged step the deadline is brought: the operator follows the edit and mints
# the pods' tokens again well within it.
DEADLINE_AFTER_TRAINING_S = 30


def output_sas_minted(jobs: Jobs, name: str) -> None:
    """Waits for the job's output SAS Secret: the operator has checked the results container by then, and
    nothing talks to the output endpoint again before rank 0's upload (signing is local)."""
    wait_for(lambda: jobs.core.list_namespaced_secret(
        jobs.ns, field_selector=f"metadata.name={name}-sas-out").items, timeout=120,
        what=f"{name}-sas-out minted")  # fmt: skip


def test_results_arrive_after_storage_refused_just_as_the_upload_started(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
) -> None:
    """Before: the upload was tried once, chained onto training; a 503 failed the launcher, and the world
    restarted (training again) or the job failed as if the user's code had."""
    container = new_container(node_azurite)
    upstream = urlsplit(node_azurite.endpoint)
    assert upstream.hostname is not None and upstream.port is not None
    with OutageProxy(NODE_IP, upstream.hostname, upstream.port) as proxy:
        output = output_location(node_azurite, container)
        output["endpoint"] = f"{proxy.url}{upstream.path}"
        name = "outage"
        create_tiny_job(
            real_jobs,
            name,
            node_azurite,
            container,
            output={**output, "uploadRetrySeconds": 300},
            **tiny_model(),
        )
        # The operator checks that the results container exists before it signs the output token; after
        # that nothing talks to this endpoint before the upload (signing is local): the first connection
        # once armed is rank 0's upload, and it starts the outage.
        output_sas_minted(real_jobs, name)
        proxy.arm(OUTAGE_SECONDS)
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            status = real_jobs.status(name)
            results = (status.get("output") or {}).get("results")
            if results and (not seen or seen[-1] != results):
                seen.append(results)
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        status = wait_finished(real_jobs, name, timeout=60, azurite=node_azurite, container=container)
        assert proxy.refused > 0, "the outage never happened: the test proved nothing"
    assert status["restarts"] == 0, "a storage outage after training must not train again"
    states = [r["state"] for r in seen]
    assert "Retrying" in states, seen
    retrying = next(r for r in seen if r["state"] == "Retrying")
    assert "503" in retrying["message"] or "Unavailable" in retrying["message"], retrying
    assert status["output"]["results"]["state"] == "Uploaded", status
    assert_trained_together(run_metrics(node_azurite, container, real_jobs, name))


def test_a_torchrun_worker_that_exited_0_may_go_while_worker_0_uploads(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
) -> None:
    """Worker 1's agent passed torchrun's exit barrier, so the training is over; its pod then goes (force-
    deleted, as the pod garbage collector removes the pods of a node the autoscaler took back) while worker
    0's upload waits for storage. Before: the world read as broken, WorkerLost restarted the training and a
    new worker 1 was made."""
    container = new_container(node_azurite)
    upstream = urlsplit(node_azurite.endpoint)
    assert upstream.hostname is not None and upstream.port is not None
    name = "gone-after"
    with OutageProxy(NODE_IP, upstream.hostname, upstream.port) as proxy:
        output = output_location(node_azurite, container)
        output["endpoint"] = f"{proxy.url}{upstream.path}"
        output["uploadRetrySeconds"] = 600
        create_tiny_job(real_jobs, name, node_azurite, container, torchrun={}, output=output,
                        **tiny_model(torchrun=True))  # fmt: skip
        output_sas_minted(real_jobs, name)
        proxy.arm(3600)  # from worker 0's first upload call until the test says so

        def worker_1_ended_and_worker_0_uploads() -> str | None:
            status = real_jobs.status(name)
            assert status.get("phase") not in ("Succeeded", "Failed"), status
            results = (status.get("output") or {}).get("results") or {}
            ended = [p for p in real_jobs.pods(name, "worker") if p.status.phase == "Succeeded"]
            one = [p for p in ended if p.metadata.name == f"{name}-worker-1"]
            return str(one[0].metadata.uid) if one and results.get("state") == "Retrying" else None

        uid = wait_for(worker_1_ended_and_worker_0_uploads, timeout=600, interval=1, what="worker 1 ended")
        real_jobs.core.delete_namespaced_pod(f"{name}-worker-1", real_jobs.ns, grace_period_seconds=0)
        # Long enough for the operator to see worker 1 gone and act on it, storage still away.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status = real_jobs.status(name)
            assert status.get("restarts", 0) == 0 and status.get("phase") == "Running", status
            again = [p for p in real_jobs.pods(name, "worker") if p.metadata.name == f"{name}-worker-1"]
            assert not again, f"worker 1 made again: {[p.metadata.uid for p in again]} (ended: {uid})"
            time.sleep(1)
        proxy.arm(0)  # storage is back
        status = wait_finished(real_jobs, name, timeout=600, azurite=node_azurite, container=container)
        assert proxy.refused > 0, "the outage never happened: the test proved nothing"
    assert status["phase"] == "Succeeded" and status["restarts"] == 0, status
    assert status["workers"].get("succeeded", 0) >= 1, status
    assert status["output"]["results"]["state"] == "Uploaded", status
    said = [str(e.reason) for e in real_jobs.events(name)]
    assert "WorkerLost" not in said and "Restarting" not in said, said
    assert_trained_together(run_metrics(node_azurite, container, real_jobs, name))


# An MPI world's worker 0 runs sshd on; a torchrun world's stays after its own upload failed.
WORLDS: dict[str, dict[str, Any]] = {"mpi": {}, "torchrun": {"torchrun": {}}}


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_results_that_storage_refused_for_good_are_uploaded_later_from_the_pod_that_kept_them(
    real_cluster: RealCluster,
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    world: str,
) -> None:
    """Before: the results of a run whose upload failed for good could only be copied off worker 0 by hand,
    and the job stayed Failed holding that pod's GPUs."""
    container = new_container(node_azurite)
    upstream = urlsplit(node_azurite.endpoint)
    assert upstream.hostname is not None and upstream.port is not None
    name = f"later-{world}"
    with OutageProxy(NODE_IP, upstream.hostname, upstream.port) as proxy:
        proxy.arm(3600)  # down until the test says so: far past the upload's retries
        output = output_location(node_azurite, container)
        output["endpoint"] = f"{proxy.url}{upstream.path}"
        create_tiny_job(
            real_jobs,
            name,
            node_azurite,
            container,
            output={**output, "uploadRetrySeconds": 10},
            **WORLDS[world],
            **tiny_model(torchrun=world == "torchrun"),
        )
        status = real_jobs.wait_phase(name, "Succeeded", "Failed", timeout=900)
        failed = real_jobs.condition(name, "Failed")
        assert failed and failed["reason"] == "ResultsUploadFailed", status
        kept = status["output"]["results"]["keptOnPod"]
        assert kept == f"{name}-worker-0", status
        proxy.arm(0)  # storage is back
        monkeypatch.setenv("DTJOB_EMULATOR_HOSTS", NODE_IP)  # as for the operator: Azurite on the node
        argv = [
            "results", "upload", name, "-n", real_jobs.ns, "--kubeconfig", real_cluster.kubeconfig,
            "--account-key", node_azurite.account_key, "--wait", "120",
        ]  # fmt: skip
        code = main(argv)
        said = capsys.readouterr()
        assert code == 0, said
        assert proxy.forwarded > 0, "the upload must have gone through the endpoint the job names"
        # Storage stays up (the proxy open) from here on: the operator's retried log upload reaches it, and
        # cleanPodPolicy frees the kept pod once the logs are stored, not only past the logs' grace.
        assert "dtjob results upload: done" in said.err, said
        assert f"job {name} is Succeeded" in said.out, said
        assert_trained_together(run_metrics(node_azurite, container, real_jobs, name))
        status = real_jobs.status(name)
        succeeded = real_jobs.condition(name, "Succeeded")
        assert succeeded and succeeded["reason"] == "ResultsUploadedLater", status
        assert (
            status["output"]["results"]["state"] == "Uploaded"
            and "keptOnPod" not in status["output"]["results"]
        )
        # The pod ends at SIGTERM; on a real node busy with other runs the kubelet may take minutes.
        deadline = time.monotonic() + 300
        while any(p.metadata.name == kept for p in real_jobs.pods(name)) and time.monotonic() < deadline:
            time.sleep(2)
        left = [
            (p.metadata.name, p.metadata.deletion_timestamp, p.status.phase) for p in real_jobs.pods(name)
        ]
        # Whether the operator asked (a deletionTimestamp) tells the operator's fault from the kubelet's pace.
        still = f"{left}, status {real_jobs.status(name)}"
        assert all(n != kept for n, _, _ in left), f"cleanPodPolicy frees the pod now: {still}"
    assert main(argv) == 0 and "already uploaded" in capsys.readouterr().err


def test_every_pods_log_is_uploaded_when_the_deadline_fires_mid_training(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
) -> None:
    """Before: the output SAS expired at the deadline, so the final upload was refused (403) and the logs
    people need to debug a deadline were lost. The deadline is brought forward once rank 0 has logged a step,
    so that it fires mid-training however long the world took to start on busy cores; the operator then
    mints the pods' tokens again to expire by the new deadline, as they were before the fix."""
    container = new_container(node_azurite)
    name = "deadline"
    # Many more steps than fit: the deadline ends it while the ranks train.
    create_tiny_job(
        real_jobs, name, node_azurite, container,
        hyperparameters=tiny_training(stepsPerEpoch=100000), **tiny_model(),
        runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 1200, "cleanPodPolicy": "Running"},
    )  # fmt: skip
    try:
        wait_for(lambda: live_launcher_records(real_jobs, name), timeout=600, interval=1, what="training")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_logs(real_jobs, name, None, '')}") from None
    started = parse_time(real_jobs.status(name)["startTime"])
    seconds = int((datetime.now(UTC) - started).total_seconds()) + DEADLINE_AFTER_TRAINING_S
    real_jobs.patch_spec(name, {"runPolicy": {"activeDeadlineSeconds": seconds}})
    deadline = started + timedelta(seconds=seconds)

    def token_minted_again() -> str | None:
        secret = real_jobs.core.read_namespaced_secret(f"{name}-sas-out", real_jobs.ns)
        expires = (secret.metadata.annotations or {}).get(ANNOTATION_EXPIRES)
        return expires if expires and parse_time(expires) <= deadline else None

    expires = wait_for(token_minted_again, timeout=DEADLINE_AFTER_TRAINING_S, interval=1,
                       what=f"{name}-sas-out minted again to expire by the new deadline")  # fmt: skip
    status = real_jobs.wait_phase(name, "Succeeded", "Failed", timeout=300)
    failed = real_jobs.condition(name, "Failed")
    assert failed and failed["reason"] == "DeadlineExceeded", status
    assert f"({seconds}s)" in failed["message"], failed
    assert status.get("progress"), status

    def uploaded() -> dict[str, Any] | None:
        output = real_jobs.status(name).get("output") or {}
        return output if output.get("logsUploaded") or output.get("logsError") else None

    # Uploaded after the deadline, when the pods' own token (expiring by it) is of no use.
    output = wait_for(uploaded, timeout=120, interval=2, what=f"{name}'s logs uploaded")
    assert output.get("logsUploaded") is True, f"expired {expires}: {output}"
    uid = real_jobs.get(name)["metadata"]["uid"]
    run = f"runs/{real_jobs.ns}/{name}/{uid}/logs/"
    logs = {n.removeprefix(run) for n in blob_names(node_azurite, container, run)}
    assert {f"{name}-worker-0.log", f"{name}-worker-1.log"} <= logs, logs
    launcher = [n for n in logs if n.startswith(f"{name}-launcher")]
    assert launcher, logs
    assert "DTJOB_PROGRESS" in blob_text(node_azurite, container, run + launcher[0])
