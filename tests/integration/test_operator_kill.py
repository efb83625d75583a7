"""The operator SIGKILLed at each step of a job, then started again: it converges from what the API server
holds, with no duplicate child, no lost log and no SAS Secret left behind.

Each kill lands at a step found from outside, at the watch event that marks it
(tests/integration/api_history.py), never through a hook in the product; slow steps are made slow from
outside (a pod log of many MiB to upload, a worker that takes seconds to turn Ready). What was created is
counted from the API server's own watch streams, so a child created and deleted between two polls still
counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, cri_line, serve_pod_log
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)
from tests.integration.api_history import ApiHistory, Seen, api_history, job_of, role
from tests.integration.test_operator_storage import key_secret, secret_files, storage_spec

pytestmark = pytest.mark.integration

# Big enough that reading every pod's log and uploading it takes seconds, so a kill at the phase change lands
# inside the upload.
LOG_MIB = 32


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME, "DTJOB_WRITE_CONTAINERS": "*"}


@pytest.fixture
def operators(
    kubeconfig: str, namespace: str, tmp_path: Path, jobs: Jobs, operator_env: dict[str, str]
) -> Iterator[Callable[[], OperatorProcess]]:
    """Starts one more operator process per call (the previous one killed); all stopped at the end."""
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        log = tmp_path / f"operator-{len(started) + 1}.log"
        proc = OperatorProcess(kubeconfig, namespace, log, operator_env)
        proc.start()
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def blob(azurite: Azurite) -> BlobServiceClient:  # noqa: F811
    return BlobServiceClient(azurite.endpoint, credential=azurite.account_key)


def _phase(seen: Seen) -> str | None:
    return (seen.obj.get("status") or {}).get("phase")


def _one_per_name(history: ApiHistory, kind: str, match: Callable[[Seen], bool]) -> dict[str, str]:
    """name -> uid of every object created during the test; fails if a name was created twice."""
    created = history.created(kind, match)
    by_name: dict[str, list[str]] = {}
    for uid, name in created.items():
        by_name.setdefault(name, []).append(uid)
    twice = {name: uids for name, uids in by_name.items() if len(uids) > 1}
    assert not twice, f"{kind}s created more than once: {twice}"
    return {name: uids[0] for name, uids in by_name.items()}


def _big_log(path: Path, pod: str, mib: int) -> str:
    """`mib` MiB of log lines in the CRI format; returns the text the API server serves for it."""
    text = f"{pod}: step {'x' * 200}"
    line = cri_line(text)
    count = mib * 2**20 // len(line)
    last = f"{pod}: end of log"
    with path.open("w") as log:
        log.write(line * count)
        log.write(cri_line(last))
    return (text + "\n") * count + last + "\n"


def test_killed_between_the_workers_and_the_launcher(
    jobs: Jobs, operators: Callable[[], OperatorProcess], api_client: client.ApiClient
) -> None:
    with api_history(api_client, jobs.ns) as history:
        first = operators()
        at_kill: dict[str, Any] = {}

        def kill(_: Seen) -> None:
            first.kill()
            at_kill["workers"] = sorted(history.created("Pod", role("worker")).values())
            at_kill["launchers"] = len(history.created("Pod", role("launcher")))

        # As soon as the first worker pod exists: the operator is creating the world (its launcher pod comes
        # after the workers); workers turn Ready only after 8 s, so no launcher's pod can have been released.
        killed = history.when(lambda e: e.kind == "Pod" and role("worker")(e), kill)
        jobs.create(
            "split",
            worker={"podAnnotations": {"sim.dtjob.io/ready-after": "8s"}},
            launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "5s"}},
        )
        assert killed.wait(60), "no worker pod was created"
        operators()
        status = jobs.wait_phase("split", "Succeeded", "Failed", timeout=120)
        assert status["phase"] == "Succeeded", status
        assert status["restarts"] == 0

    mine = job_of("split")
    workers = _one_per_name(history, "Pod", lambda e: mine(e) and role("worker")(e))
    assert sorted(workers) == ["split-worker-0", "split-worker-1"], at_kill
    launchers = history.created("Pod", lambda e: mine(e) and role("launcher")(e))
    assert list(launchers.values()) == ["split-launcher"]
    assert history.created("Job", mine) == {}  # the launcher is a pod of the operator's, not a batch Job's
    _one_per_name(history, "Secret", mine)  # the SSH key pair was generated once
    # The world that ran is the one created before the kill: one attempt, both workers of it.
    assert {e.labels["dtjob.io/attempt"] for e in history.of("Pod", mine)} == {"0"}
    print(
        f"killed with {len(at_kill['workers'])} worker pod(s), {at_kill['launchers']} launcher pod(s) created"
    )


@pytest.mark.azure
def test_killed_during_the_finish_keeps_every_log_and_revokes_the_sas(
    jobs: Jobs,
    operators: Callable[[], OperatorProcess],
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    container_name: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    blob.create_container(container_name)
    key_secret(jobs, azurite)
    name = "finale"
    expected: dict[str, str] = {}  # pod -> the log text its blob must hold

    def serve(pod: str, container: str, mib: int) -> None:
        path = tmp_path / f"{pod}.log"
        if mib:
            expected[pod] = _big_log(path, pod, mib)
        else:
            append_log(path, f"{pod}: done")
            expected[pod] = f"{pod}: done\n"
        serve_pod_log(api_client, jobs.ns, pod, container, path)

    for index in range(2):
        serve(f"{name}-worker-{index}", "worker", LOG_MIB)
    mine = job_of(name)
    spec = storage_spec(
        azurite,
        stage_annotations={"sim.dtjob.io/run-duration": "2s"},
        launcher_annotations={"sim.dtjob.io/run-duration": "8s"},
        output=container_name,
    )
    with api_history(api_client, jobs.ns) as history:
        history.when(
            lambda e: e.kind == "Pod" and e.type == "ADDED" and mine(e) and role("launcher")(e),
            lambda e: serve(e.name, "launcher", LOG_MIB),
        )
        history.when(
            lambda e: e.kind == "Pod" and e.type == "ADDED" and mine(e) and role("stager")(e),
            lambda e: serve(e.name, "stager", 0),
        )
        first = operators()
        # Kill 1: the moment the status says Succeeded; the pods' logs are read and uploaded right after.
        killed = history.when(
            lambda e: e.kind == "DistributedTrainingJob" and _phase(e) == "Succeeded", lambda _: first.kill()
        )
        uid = jobs.create(name, **spec)["metadata"]["uid"]
        assert killed.wait(180), f"{name} never Succeeded: {jobs.status(name)}"
        status = jobs.status(name)
        assert not (status.get("output") or {}).get("logsUploaded"), "the kill came after the upload"

        # Kill 2: the moment the first SAS Secret is deleted, in the middle of the cleanup.
        second: list[OperatorProcess] = []
        revoked = history.when(
            lambda e: e.kind == "Secret" and e.type == "DELETED" and e.name.startswith(f"{name}-sas-"),
            lambda _: second[0].kill(),
        )
        second.append(operators())
        assert revoked.wait(120), f"no SAS Secret deleted: {jobs.status(name)}\n{second[0].log_tail()}"
        at_kill = {
            "secrets": [n for n in ("sas-in", "sas-out") if secret_files(jobs, f"{name}-{n}") is not None],
            "workers": sorted(p.metadata.name for p in jobs.live_workers(name)),
            "sasSecretsDeleted": jobs.status(name).get("sasSecretsDeleted"),
        }

        operators()

        def converged() -> dict[str, Any] | None:
            status = jobs.status(name)
            done = status.get("sasSecretsDeleted") and not jobs.live_workers(name)
            return status if done else None

        status = wait_for(converged, timeout=90, what="SAS revoked and workers cleaned up")

    # Every pod's whole log is in the run's folder.
    assert (status.get("output") or {}).get("logsUploaded") is True
    assert not (status.get("output") or {}).get("logsMissing"), status
    results = blob.get_container_client(container_name)
    folder = f"runs/{jobs.ns}/{name}/{uid}/logs/"
    blobs = {b.name.removeprefix(folder): b.size for b in results.list_blobs(name_starts_with=folder)}
    assert set(blobs) == {f"{pod}.log" for pod in expected}, blobs
    for pod, text in expected.items():
        assert blobs[f"{pod}.log"] == len(text.encode()), f"{pod}: log incomplete"
        assert results.download_blob(f"{folder}{pod}.log").readall() == text.encode(), pod

    # Both SAS Secrets are gone, and the status said so only after they were.
    for secret in (f"{name}-sas-in", f"{name}-sas-out"):
        left = secret_files(jobs, secret) is not None  # a bool: a failure must not print the token
        assert not left, f"{secret} left behind"
        minted = history.created("Secret", lambda e, wanted=secret: e.name == wanted)  # type: ignore[misc]
        assert len(minted) == 1, f"{secret} minted twice"
    claimed = [
        e.revision
        for e in history.of("DistributedTrainingJob", lambda e: e.name == name)
        if (e.obj.get("status") or {}).get("sasSecretsDeleted")
    ]
    deleted = [history.deleted_at("Secret", f"{name}-sas-{a}") for a in ("in", "out")]
    assert None not in deleted, deleted
    last_delete = max(d for d in deleted if d is not None)
    assert min(claimed) > last_delete, "status.sasSecretsDeleted written before the delete"

    # No duplicate child; cleanPodPolicy Running deleted the idle workers and kept the finished launcher pod.
    workers = _one_per_name(history, "Pod", lambda e: mine(e) and role("worker")(e))
    assert sorted(workers) == [f"{name}-worker-0", f"{name}-worker-1"]
    assert history.created("Job", lambda e: mine(e) and role("launcher")(e)) == {}
    assert len(history.created("Job", lambda e: mine(e) and role("stager")(e))) == 1
    launcher_pods = history.created("Pod", lambda e: mine(e) and role("launcher")(e))
    assert list(launcher_pods.values()) == [f"{name}-launcher"]
    assert [p.metadata.name for p in jobs.pods(name, "launcher")] == list(launcher_pods.values())
    assert status["phase"] == "Succeeded" and status["restarts"] == 0
    print(f"second kill, after the first SAS Secret deletion: {at_kill}")


@pytest.mark.azure
def test_killed_during_staging_creates_no_second_staging_job(
    jobs: Jobs,
    operators: Callable[[], OperatorProcess],
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
) -> None:
    key_secret(jobs, azurite)
    name = "restage"
    mine = job_of(name)
    spec = storage_spec(
        azurite,
        stage_annotations={"sim.dtjob.io/run-duration": "12s"},
        launcher_annotations={"sim.dtjob.io/run-duration": "3s"},
    )
    with api_history(api_client, jobs.ns) as history:
        first = operators()

        def stager_running(e: Seen) -> bool:
            phase = (e.obj.get("status") or {}).get("phase")
            return e.kind == "Pod" and mine(e) and role("stager")(e) and phase == "Running"

        killed = history.when(stager_running, lambda _: first.kill())
        jobs.create(name, **spec)
        assert killed.wait(90), f"the stager never ran: {jobs.status(name)}"
        assert jobs.status(name)["phase"] == "Staging"
        operators()
        status = jobs.wait_phase(name, "Succeeded", "Failed", timeout=150)
        assert status["phase"] == "Succeeded", status

    staged = jobs.condition(name, "Staged")
    assert staged and staged["status"] == "True"
    assert list(history.created("Job", lambda e: mine(e) and role("stager")(e)).values()) == [f"{name}-stage"]
    assert len(history.created("Pod", lambda e: mine(e) and role("stager")(e))) == 1
    assert len(history.created("Secret", lambda e: e.name == f"{name}-sas-in")) == 1
    workers = _one_per_name(history, "Pod", lambda e: mine(e) and role("worker")(e))
    assert sorted(workers) == [f"{name}-worker-0", f"{name}-worker-1"]
    # The workers were created only once the data was staged.
    first_worker = min(e.revision for e in history.of("Pod", lambda e: mine(e) and role("worker")(e)))
    complete = [
        e.revision
        for e in history.of("Job", lambda e: mine(e) and role("stager")(e))
        if any(c.get("type") == "Complete" for c in (e.obj.get("status") or {}).get("conditions") or [])
    ]
    assert complete and min(complete) < first_worker
