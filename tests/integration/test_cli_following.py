"""The commands for people following their jobs, against the real API server (kwok-simulated pods whose logs
grow while the command reads them) and Azurite: `dtjob status`, `dtjob logs` (kubectl's -c, --tail, --since
and --timestamps included, and the stager's log of a real staging Job) and `dtjob results download`, and their
exit status for a job that is not there."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from azure.storage.blob import BlobServiceClient, ContainerClient
from dtjob import API_GROUP, API_VERSION, KIND, PLURAL
from dtjob.cli.log_target import split_stamp
from dtjob.cli.main import main
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import STORAGE_KEY_LABEL, run_prefix
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log, serve_pod_logs
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)

pytestmark = [pytest.mark.integration, pytest.mark.azure]

OUTPUT_PREFIX = "runs"


def job_with_output(jobs: Jobs, name: str, azurite: Azurite, container: str) -> dict[str, Any]:  # noqa: F811
    output = {
        "endpoint": azurite.endpoint,
        "container": container,
        "prefix": OUTPUT_PREFIX,
        "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
    }
    return jobs.create(name, output=output)


def put(container: ContainerClient, name: str, data: bytes) -> None:
    container.upload_blob(name, data, overwrite=True)


def download(kubeconfig: str, jobs: Jobs, azurite: Azurite, job: str, dest: Path, *extra: str) -> int:  # noqa: F811
    """`dtjob results download`, the account key read from a file (not on the command line)."""
    key = dest.parent / f"{dest.name}.account-key"
    key.write_text(azurite.account_key + "\n")
    argv = ["results", "download", job, str(dest), "-n", jobs.ns, "--kubeconfig", kubeconfig]
    return main([*argv, "--account-key-file", str(key), "--no-progress", *extra])


def files_under(root: Path) -> dict[str, bytes]:
    """The downloaded files, less the download's own bookkeeping (manifest, completion marker)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".dtjob")
    }


def test_downloads_the_runs_results_only_and_resumes(
    jobs: Jobs,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    container_name: str,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blob = BlobServiceClient(azurite.endpoint, credential=azurite.account_key)
    container = blob.create_container(container_name)
    created = job_with_output(jobs, "r50", azurite, container_name)
    uid = created["metadata"]["uid"]
    run = run_prefix(OUTPUT_PREFIX, jobs.ns, "r50", uid)
    put(container, f"{run}model/checkpoint-final.pt", b"weights" * 1000)
    put(container, f"{run}metrics.json", json.dumps({"top1": 0.761}).encode())
    put(container, f"{run}logs/r50-launcher.log", b"rank 0 says hello\n")
    # Another run of a job with the same name, and another job: neither belongs to this run.
    put(container, f"{run_prefix(OUTPUT_PREFIX, jobs.ns, 'r50', 'an-earlier-uid')}metrics.json", b"{}")
    put(container, f"{run_prefix(OUTPUT_PREFIX, jobs.ns, 'other', uid)}metrics.json", b"{}")

    dest = tmp_path / "results"
    assert download(kubeconfig, jobs, azurite, "r50", dest) == 0
    out = capsys.readouterr()
    assert files_under(dest) == {
        "model/checkpoint-final.pt": b"weights" * 1000,
        "metrics.json": json.dumps({"top1": 0.761}).encode(),
    }
    assert "downloaded 2 file(s)" in out.out
    assert "r50 is Pending; its results may not be complete yet" in out.err

    # A second run fetches nothing it already has, and a changed blob again.
    put(container, f"{run}metrics.json", json.dumps({"top1": 0.768}).encode())
    assert download(kubeconfig, jobs, azurite, "r50", dest) == 0
    assert "downloaded 1 file(s)" in capsys.readouterr().out
    assert json.loads((dest / "metrics.json").read_text()) == {"top1": 0.768}

    assert download(kubeconfig, jobs, azurite, "r50", dest, "--with-logs") == 0
    assert (dest / "logs" / "r50-launcher.log").read_bytes() == b"rank 0 says hello\n"


def test_refuses_a_job_without_output_and_a_missing_job(
    jobs: Jobs,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs.create("no-output")
    assert download(kubeconfig, jobs, azurite, "no-output", tmp_path / "a") == 2
    assert "job no-output has no spec.output" in capsys.readouterr().err

    assert download(kubeconfig, jobs, azurite, "absent", tmp_path / "b") == 4
    assert f"no DistributedTrainingJob 'absent' in namespace {jobs.ns}" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_wrong_credentials_fail_with_one_line_naming_them(
    jobs: Jobs,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    container_name: str,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container(container_name)
    job_with_output(jobs, "r50", azurite, container_name)
    wrong_key = "A" * 86 + "=="
    argv = ["results", "download", "r50", str(tmp_path / "d"), "-n", jobs.ns, "--kubeconfig", kubeconfig]
    assert main([*argv, "--account-key", wrong_key, "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("dtjob results: ") and "the account key" in err


def job_event(jobs: Jobs, job: dict[str, Any], uid: str, reason: str, message: str) -> None:
    name = job["metadata"]["name"]
    jobs.core.create_namespaced_event(
        jobs.ns,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}."),
            involved_object=client.V1ObjectReference(
                api_version=f"{API_GROUP}/{API_VERSION}", kind=KIND, name=name, namespace=jobs.ns, uid=uid
            ),
            reason=reason,
            message=message,
            type="Normal",
            count=1,
            last_timestamp=datetime.now(UTC),
        ),
    )


def test_status_shows_one_screen_of_the_job_and_only_its_own_events(
    jobs: Jobs, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = jobs.create("r50")
    status = {
        "phase": "Running",
        "workersReady": "2/2",
        "restarts": 1,
        "progress": {"summary": "epoch 1/3 step 7/20 41 img/s loss 6.902"},
    }
    jobs.custom.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, jobs.ns, PLURAL, "r50", {"status": status}
    )
    job_event(jobs, created, created["metadata"]["uid"], "LauncherCreated", "every worker is Ready")
    job_event(jobs, created, "uid-of-an-earlier-r50", "WorldRestarted", "not this job's")

    argv = ["status", "r50", "-n", jobs.ns, "--kubeconfig", kubeconfig]
    assert main(argv) == 0
    screen = capsys.readouterr().out.splitlines()
    assert "Phase:      Running" in screen
    assert "Restarts:   1" in screen
    assert "Progress:   epoch 1/3 step 7/20 41 img/s loss 6.902" in screen
    assert any("LauncherCreated" in line and "every worker is Ready" in line for line in screen)
    assert not any("WorldRestarted" in line for line in screen)

    assert main([*argv, "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metadata"]["uid"] == created["metadata"]["uid"]
    assert shown["status"]["progress"]["summary"] == status["progress"]["summary"]

    assert main(["describe", "absent", "-n", jobs.ns, "--kubeconfig", kubeconfig]) == 4
    assert "no DistributedTrainingJob 'absent'" in capsys.readouterr().err


def context_in(kubeconfig: str, namespace: str, tmp_path: Path) -> str:
    """A copy of the kubeconfig whose current context's namespace is `namespace`."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    current["context"]["namespace"] = namespace
    path = tmp_path / "kubeconfig-in-namespace"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize(
    ("words", "flags"),
    [
        (["status"], []),
        (["describe"], ["-o", "yaml"]),
        (["logs"], []),
        (["logs"], ["-f", "--tail", "5"]),
        (["results", "download"], ["DIR"]),
        (["results", "upload"], []),
    ],
    ids=lambda part: " ".join(part),
)
def test_a_missing_job_is_4_in_the_contexts_namespace_unless_n_names_another(
    words: list[str],
    flags: list[str],
    jobs: Jobs,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs.create("here")
    in_ns = context_in(kubeconfig, jobs.ns, tmp_path)
    flags = [str(tmp_path / "dest") if f == "DIR" else f for f in flags]
    # No -n: the context's namespace, as kubectl; the job is not there.
    assert main([*words, "absent", *flags, "--kubeconfig", in_ns]) == ExitCode.NOT_FOUND
    err = capsys.readouterr().err
    assert f"no DistributedTrainingJob 'absent' in namespace {jobs.ns}" in err and "Traceback" not in err
    # -n names another namespace, where the job that exists here is not.
    assert main([*words, "here", *flags, "--kubeconfig", in_ns, "-n", "default"]) == ExitCode.NOT_FOUND
    assert "no DistributedTrainingJob 'here' in namespace default" in capsys.readouterr().err
    assert not (tmp_path / "dest").exists()


class Collected:
    """A child process's stdout and stderr, read as they come (so a test can wait for a line)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)

    @classmethod
    def dtjob(cls, *args: str) -> Collected:
        """`python -m dtjob ARGS...`, its output collected."""
        cmd = [sys.executable, "-m", "dtjob", *args]
        return cls(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code


def serve_launcher_log(
    jobs: Jobs, api_client: client.ApiClient, name: str, path: Path, skip: str = ""
) -> client.V1Pod:
    """Wait for the job's live launcher pod (not the one of uid `skip`: the next world's launcher has the same
    name) and serve `path` as its log; returns it."""

    def new_launcher() -> client.V1Pod | None:
        pods = [p for p in jobs.pods(name, "launcher") if not p.metadata.deletion_timestamp]
        return next((p for p in pods if p.metadata.uid != skip), None)

    pod = wait_for(new_launcher, timeout=60, what=f"a launcher pod of {name} other than uid {skip!r}")
    serve_pod_log(api_client, jobs.ns, str(pod.metadata.name), "launcher", path)
    return pod


def test_logs_follow_the_launcher_across_a_world_restart_to_the_end(
    jobs: Jobs, operator: OperatorProcess, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    # The launcher runs until the test says otherwise (kwok ends a launcher pod 3 s after it starts by
    # default, which would race the worker failure below on a busy machine).
    jobs.create("follow", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}})
    first_log = tmp_path / "world-0.log"
    first = serve_launcher_log(jobs, api_client, "follow", first_log)
    append_log(first_log, "world 0: step 1")
    follower = Collected.dtjob("logs", "follow", "-f", "-n", jobs.ns, "--kubeconfig", kubeconfig)
    try:
        # The first line waits for the CLI's own start too (its imports take seconds on a busy machine).
        wait_for(lambda: "world 0: step 1\n" in follower.out, timeout=90, what="the first line, live")
        append_log(first_log, "world 0: step 2")
        wait_for(lambda: "world 0: step 2\n" in follower.out, timeout=30, what="a line appended later")

        # A worker fails: the operator replaces the world, and the follower moves on to the new launcher.
        jobs.annotate_pod("follow-worker-1", {"sim.dtjob.io/outcome": "Failed"})
        second_log = tmp_path / "world-1.log"
        second = serve_launcher_log(jobs, api_client, "follow", second_log, skip=str(first.metadata.uid))
        append_log(second_log, "world 1: step 1")
        wait_for(lambda: "world 1: step 1\n" in follower.out, timeout=60, what="the next world's line")
        assert jobs.status("follow")["restarts"] == 1

        jobs.annotate_pod(str(second.metadata.name), {"sim.dtjob.io/outcome": "Succeeded"})
        assert follower.wait_exit(timeout=60) == 0, "".join(follower.err)
    finally:
        follower.proc.kill()
    assert follower.out == ["world 0: step 1\n", "world 0: step 2\n", "world 1: step 1\n"]
    assert any(line.startswith(f"--- {second.metadata.name} (world 1) ---") for line in follower.err), (
        follower.err
    )
    assert jobs.status("follow")["phase"] == "Succeeded"


SHIPPER = {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always"}


def read_logs(argv: list[str], capfd: pytest.CaptureFixture[bytes]) -> tuple[int, bytes, bytes]:
    code = main(argv)
    got = capfd.readouterr()
    return code, got.out, got.err


def test_logs_tail_since_timestamps_and_a_sidecar_pass_through_to_the_live_pod(
    jobs: Jobs,
    operator: OperatorProcess,
    kubeconfig: str,
    api_client: client.ApiClient,
    tmp_path: Path,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    # The launcher's pod carries a sidecar from the pod template (a native sidecar: the launcher's pod takes
    # no other container) and runs until the test says otherwise.
    template = {
        "metadata": {"annotations": {"sim.dtjob.io/run-duration": "600s"}},
        "spec": {"initContainers": [SHIPPER]},
    }
    jobs.create("live", launcher={"template": template})
    launcher_log, shipper_log = tmp_path / "launcher.log", tmp_path / "shipper.log"
    append_log(launcher_log, "old 1", "old 2", at=datetime.now(UTC) - timedelta(hours=2))
    recent = datetime.now(UTC).replace(microsecond=123456) - timedelta(minutes=1)
    append_log(launcher_log, "new 1", "new 2", "new 3", at=recent)
    append_log(shipper_log, "shipped 10 records")
    pod = wait_for(
        lambda: next((p.metadata.name for p in jobs.pods("live", "launcher")), None),
        timeout=60,
        what="the launcher's pod",
    )
    serve_pod_logs(api_client, jobs.ns, pod, {"launcher": launcher_log, "log-shipper": shipper_log})
    base = ["logs", "live", "-n", jobs.ns, "--kubeconfig", kubeconfig]

    everything = wait_for(lambda: read_logs(base, capfdbinary)[1], timeout=30, what="the log served by kwok")
    assert everything == b"old 1\nold 2\nnew 1\nnew 2\nnew 3\n"
    assert read_logs([*base, "--tail", "2"], capfdbinary)[:2] == (0, b"new 2\nnew 3\n")
    assert read_logs([*base, "--since", "1h"], capfdbinary)[:2] == (0, b"new 1\nnew 2\nnew 3\n")
    assert read_logs([*base, "--since", "3h", "--tail", "3"], capfdbinary)[:2] == (
        0,
        b"new 1\nnew 2\nnew 3\n",
    )
    code, out, _ = read_logs([*base, "--timestamps", "--tail", "1"], capfdbinary)
    assert code == 0 and out != b"new 3\n"
    assert split_stamp(out) == ((int(recent.timestamp()), 123456000), b"new 3\n")

    # -c: the sidecar's log; a container the pod does not have is not found (not an empty log).
    assert read_logs([*base, "-c", "log-shipper"], capfdbinary)[:2] == (0, b"shipped 10 records\n")
    code, out, err = read_logs([*base, "-c", "metrics"], capfdbinary)
    assert (code, out) == (ExitCode.NOT_FOUND, b"")
    assert f"pod {pod} has no container 'metrics' (it has launcher, log-shipper)".encode() in err

    # Following from the last line: what was there before it is not printed, what comes later is.
    follower = Collected.dtjob(*base, "-f", "--tail", "1")
    try:
        wait_for(lambda: "new 3\n" in follower.out, timeout=30, what="the last line, live")
        append_log(launcher_log, "new 4")
        wait_for(lambda: "new 4\n" in follower.out, timeout=30, what="a line appended later")
        jobs.annotate_pod(pod, {"sim.dtjob.io/outcome": "Succeeded"})
        assert follower.wait_exit(timeout=60) == 0, "".join(follower.err)
    finally:
        follower.proc.kill()
    assert follower.out == ["new 3\n", "new 4\n"]


def test_logs_of_gone_pods_come_from_the_uploaded_copies(
    jobs: Jobs,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    container_name: str,  # noqa: F811
    capfdbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    container = BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container(
        container_name
    )
    created = job_with_output(jobs, "done", azurite, container_name)
    run = run_prefix(OUTPUT_PREFIX, jobs.ns, "done", created["metadata"]["uid"])
    launcher_log = b"rank 0: epoch 1\nrank 0: epoch 2\nrank 0: total images/sec: 41.2\n"
    put(container, f"{run}logs/done-launcher.log", launcher_log)
    put(container, f"{run}logs/done-worker-0.log", b"sshd of worker 0\n")
    put(container, f"{run}logs/attempt-0/done-worker-1.log", b"worker 1 killed\n")
    status = {"phase": "Succeeded", "restarts": 1, "output": {"url": "x", "logsUploaded": True}}
    jobs.custom.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, jobs.ns, PLURAL, "done", {"status": status}
    )
    base = ["logs", "done", "-n", jobs.ns, "--kubeconfig", kubeconfig, "--account-key", azurite.account_key]

    assert main(base) == 0
    assert capfdbinary.readouterr().out == launcher_log
    assert main([*base, "--worker", "1", "--attempt", "0"]) == 0
    assert capfdbinary.readouterr().out == b"worker 1 killed\n"
    assert main([*base, "--worker", "1"]) == 4
    assert b"worker 1 of job done has no pod yet and no uploaded log" in capfdbinary.readouterr().err
    assert main([*base, "--attempt", "2"]) == 2

    # --tail applies to the uploaded copy; --since and --timestamps cannot (it has no timestamps), and say so.
    assert main([*base, "--tail", "1"]) == 0
    assert capfdbinary.readouterr().out == b"rank 0: total images/sec: 41.2\n"
    assert main([*base, "--tail", "2", "--since", "5m", "--timestamps"]) == 0
    got = capfdbinary.readouterr()
    assert got.out == b"rank 0: epoch 2\nrank 0: total images/sec: 41.2\n"
    assert b"--since cannot apply to the uploaded log (no timestamps); printing its last 2 line(s)" in got.err
    assert b"--timestamps cannot apply to the uploaded log (no timestamps)" in got.err
    # Only the operator's own container's log is uploaded.
    assert main([*base, "-c", "log-shipper"]) == ExitCode.NOT_FOUND
    assert (
        b"uploads the log of their launcher container only, not log-shipper's" in capfdbinary.readouterr().err
    )

    # The key from stdin instead of the command line.
    monkeypatch.setattr("sys.stdin", io.StringIO(azurite.account_key + "\n"))
    keyless = [a for a in base if a not in ("--account-key", azurite.account_key)]
    assert main([*keyless, "--account-key-file", "-", "--tail", "1"]) == 0
    assert capfdbinary.readouterr().out == b"rank 0: total images/sec: 41.2\n"


# The installer allows Azurite's account, so that the operator signs the staging Job's input token.
@pytest.mark.parametrize("operator_env", [{"DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME}])
def test_logs_follow_the_stager_until_staging_ends_and_say_when_its_pod_is_gone(
    jobs: Jobs,
    operator: OperatorProcess,
    kubeconfig: str,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    tmp_path: Path,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    key = client.V1Secret(
        metadata=client.V1ObjectMeta(name="storage-key", labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    jobs.core.create_namespaced_secret(jobs.ns, key)
    stage_from = {
        "endpoint": azurite.endpoint,
        "container": "datasets",
        "prefix": "ilsvrc2012",
        "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
        # The stager runs until the test ends it.
        "podAnnotations": {"sim.dtjob.io/run-duration": "600s"},
    }
    dataset = {
        "source": "imagenet",
        "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports/imagenet"}, "mountPath": "/data"},
        "dataDir": "/data/imagenet",
        "stageFrom": stage_from,
    }
    jobs.create("staged", dataset=dataset)
    base = ["logs", "staged", "--stager", "-n", jobs.ns, "--kubeconfig", kubeconfig]
    pod = wait_for(
        lambda: next((p.metadata.name for p in jobs.pods("staged", "stager")), None),
        timeout=60,
        what="the staging Job's pod",
    )
    stager_log = tmp_path / "stager.log"
    append_log(stager_log, "listing ilsvrc2012/")
    serve_pod_log(api_client, jobs.ns, pod, "stager", stager_log)

    follower = Collected.dtjob(*base, "-f")
    try:
        wait_for(lambda: "listing ilsvrc2012/\n" in follower.out, timeout=30, what="the stager's line, live")
        append_log(stager_log, "staged 1000 files")
        wait_for(lambda: "staged 1000 files\n" in follower.out, timeout=30, what="a line appended later")
        # The stager ends: the operator marks the job Staged, and the follower stops.
        jobs.annotate_pod(pod, {"sim.dtjob.io/outcome": "Succeeded"})
        assert follower.wait_exit(timeout=60) == 0, "".join(follower.err)
    finally:
        follower.proc.kill()
    assert follower.out == ["listing ilsvrc2012/\n", "staged 1000 files\n"]
    staged = jobs.condition("staged", "Staged")
    assert staged is not None and staged["status"] == "True", staged

    # Its pod goes (as with a node the autoscaler removed): the log is nowhere, and the command says so.
    jobs.core.delete_namespaced_pod(pod, jobs.ns, grace_period_seconds=0)
    wait_for(lambda: not jobs.pods("staged", "stager"), timeout=60, what="the stager's pod gone")
    code, out, err = read_logs(base, capfdbinary)
    assert (code, out) == (ExitCode.NOT_FOUND, b"")
    assert (
        b"the stager's pods of job staged are gone, and the operator does not upload the stager's log" in err
    )
    assert b"condition Staged=True (StagingSucceeded)" in err

    # A job that stages nothing has no stager to read.
    jobs.create("unstaged")
    code, _, err = read_logs(
        ["logs", "unstaged", "--stager", "-n", jobs.ns, "--kubeconfig", kubeconfig], capfdbinary
    )
    assert code == ExitCode.NOT_FOUND and b"stages no dataset (no spec.dataset.stageFrom)" in err


def test_logs_of_a_torchrun_job_are_worker_0s_where_rank_0_runs(
    jobs: Jobs,
    operator: OperatorProcess,
    kubeconfig: str,
    api_client: client.ApiClient,
    tmp_path: Path,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    jobs.create("ddp-logs", torchrun={})
    jobs.wait_phase("ddp-logs", "Running", timeout=120)
    rank0 = tmp_path / "worker-0.log"
    serve_pod_log(api_client, jobs.ns, "ddp-logs-worker-0", "worker", rank0)
    append_log(rank0, "rank 0: step 1")
    argv = ["logs", "ddp-logs", "-n", jobs.ns, "--kubeconfig", kubeconfig]
    code, out, err = read_logs(argv, capfdbinary)
    assert (code, out) == (0, b"rank 0: step 1\n"), err
    code, out, err = read_logs([*argv, "--launcher"], capfdbinary)
    assert code == 2 and b"runs under torchrun and has no launcher" in err and not out, err
