"""`dtjob logs`' kubectl options: -c, --tail, --since and --timestamps reach the pods/log request; a reconnect
prints only what is new; the uploaded copy gets --tail and says what cannot apply to it. `--stager` follows
the staging Job's pods until staging ends, and says so once they are gone (their log is not uploaded). The
pods/log API is a stand-in here (tests/integration/test_cli_following.py reads real ones)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import urllib3
from dtjob.azure.errors import StorageFailure
from dtjob.cli import kube_access as kube_cli
from dtjob.cli.log_target import LogTarget
from dtjob.cli.logs import Follower
from dtjob.cli.main import build_parser
from dtjob.contract.transfer_report import ExitCode

T = "2026-01-02T03:04:0{}.000000001Z"


def stamped(*lines: tuple[int, str]) -> bytes:
    return b"".join(f"{T.format(second)} {text}\n".encode() for second, text in lines)


class Response:
    """A pods/log answer: its bytes, then (when `quiet`) the read timeout of a stream that went quiet."""

    def __init__(self, data: bytes, quiet: bool) -> None:
        self.data, self.quiet = data, quiet

    def stream(self, _amount: int, decode_content: bool) -> Iterator[bytes]:
        yield self.data
        if self.quiet:
            raise urllib3.exceptions.ReadTimeoutError(None, "/log", "quiet")  # type: ignore[arg-type]

    def release_conn(self) -> None:
        pass


class LogApi:
    """CoreV1Api's read_namespaced_pod_log: answers from `answers` in turn, recording each request."""

    requests: ClassVar[list[dict[str, Any]]] = []
    answers: ClassVar[list[Response]] = []

    def __init__(self, _api: Any) -> None:
        pass

    def read_namespaced_pod_log(self, name: str, namespace: str, **options: Any) -> Response:
        LogApi.requests.append({"name": name, **options})
        return LogApi.answers.pop(0)


@pytest.fixture
def log_api(monkeypatch: pytest.MonkeyPatch) -> type[LogApi]:
    LogApi.requests, LogApi.answers = [], []
    monkeypatch.setattr("kubernetes.client.CoreV1Api", LogApi)
    return LogApi


POD = {
    "metadata": {"name": "r50-launcher-x7k2p", "uid": "u1"},
    "spec": {"containers": [{"name": "launcher"}], "initContainers": [{"name": "log-shipper"}]},
    "status": {"phase": "Running"},
}


def follower(*flags: str) -> tuple[Follower, io.BytesIO]:
    args = build_parser().parse_args(["logs", "r50", *flags])
    out = io.BytesIO()
    return Follower(kube_cli.Cluster(object(), "ml"), LogTarget("r50"), args, out), out


def test_the_options_reach_the_request_and_the_stamps_are_printed_only_when_asked(
    log_api: type[LogApi],
) -> None:
    log_api.answers = [Response(stamped((1, "a"), (2, "b")), quiet=False)] * 2
    plain, out = follower("--tail", "2", "--since", "1h30m", "-c", "log-shipper")
    assert plain._stream(POD) is True
    assert out.getvalue() == b"a\nb\n"
    request = log_api.requests[-1]
    assert request["container"] == "log-shipper" and request["timestamps"] is True
    assert (request["tail_lines"], request["since_seconds"]) == (2, 5400)

    stamps, out = follower("--timestamps")
    assert stamps._stream(POD) is True
    assert out.getvalue() == stamped((1, "a"), (2, "b"))
    request = log_api.requests[-1]
    assert request["container"] == "launcher"  # the operator's own, by default
    assert (request["tail_lines"], request["since_seconds"]) == (None, None)


def test_a_reconnect_prints_only_what_is_new_after_a_tail(log_api: type[LogApi]) -> None:
    log_api.answers = [
        Response(stamped((3, "c"), (4, "d")), quiet=True),  # --tail 2 of a, b, c, d; then quiet
        Response(stamped((1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")), quiet=False),
    ]
    logs, out = follower("-f", "--tail", "2")
    assert logs._stream(POD) is False  # went quiet: dropped, to be opened again
    assert logs._stream(POD) is False  # Running: -f keeps going
    assert out.getvalue() == b"c\nd\ne\n"
    assert log_api.requests[0]["tail_lines"] == 2 and log_api.requests[0]["follow"] is True
    # The second read asks for the whole log and skips by timestamp; a count of the two lines printed would
    # have printed c, d and e again.
    assert (log_api.requests[1]["tail_lines"], log_api.requests[1]["since_seconds"]) == (None, None)


def test_tail_0_prints_no_old_line_on_a_reconnect(log_api: type[LogApi]) -> None:
    log_api.answers = [Response(b"", quiet=True), Response(stamped((9, "new")), quiet=False)]
    logs, out = follower("-f", "--tail", "0")
    assert logs._stream(POD) is False
    assert logs._stream(POD) is False
    assert out.getvalue() == b"new\n"
    assert log_api.requests[1]["tail_lines"] is None and log_api.requests[1]["since_seconds"] >= 1


def test_a_container_the_pod_does_not_have_is_not_found(log_api: type[LogApi]) -> None:
    logs, _ = follower("-c", "metrics")
    with pytest.raises(kube_cli.KubeFailure) as failed:
        logs._stream(POD)
    assert failed.value.code == ExitCode.NOT_FOUND
    assert (
        str(failed.value)
        == "pod r50-launcher-x7k2p has no container 'metrics' (it has launcher, log-shipper)"
    )
    assert log_api.requests == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--tail", "-2"], "dtjob logs: --tail is 0 or more, or -1 for all"),
        (["--since", "5"], "argument --since: not a duration like 30s, 5m or 2h: '5'"),
        (["--since", "0s"], "argument --since: a duration longer than zero"),
        (
            ["--stager", "--attempt", "0"],
            "dtjob logs: --attempt names a world; the stager runs once, before the first",
        ),
        (["--stager", "--worker", "1"], "argument --worker: not allowed with argument --stager"),
    ],
)
def test_bad_values_are_usage(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        args = build_parser().parse_args(["logs", "r50", *flags])
        code = args.func(args)
    except SystemExit as done:
        code = done.code
    assert code == ExitCode.USAGE
    assert said in capsys.readouterr().err


def test_the_defaults_are_kubectls() -> None:
    args = build_parser().parse_args(["logs", "r50"])
    assert (args.tail, args.since, args.timestamps, args.container) == (-1, None, False, None)


def stager_pod(name: str, phase: str, created: str) -> dict[str, Any]:
    meta = {"name": name, "uid": name, "creationTimestamp": created, "labels": {"dtjob.io/role": "stager"}}
    return {"metadata": meta, "spec": {"containers": [{"name": "stager"}]}, "status": {"phase": phase}}


STAGE_FROM = {"dataset": {"stageFrom": {"container": "datasets", "prefix": "imagenet"}}}
STAGED = {"type": "Staged", "status": "True", "reason": "StagingSucceeded", "message": "imagenet staged"}


class Jobs:
    """The cluster as `dtjob logs` reads it: the job as each read finds it, and the pods each list finds."""

    def __init__(self, jobs: list[dict[str, Any]], pods: list[list[dict[str, Any]]]) -> None:
        self.jobs, self.pods = jobs, pods
        self.api, self.namespace = object(), "ml"

    def read_job(self, _name: str) -> dict[str, Any]:
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def listed(self) -> list[dict[str, Any]]:
        return self.pods.pop(0) if len(self.pods) > 1 else self.pods[0]


def stager_follower(
    cluster: Jobs, monkeypatch: pytest.MonkeyPatch, *flags: str
) -> tuple[Follower, io.BytesIO]:
    monkeypatch.setattr("dtjob.cli.logs.time.sleep", lambda _s: None)
    args = build_parser().parse_args(["logs", "r50", "--stager", *flags])
    out = io.BytesIO()
    follower = Follower(cluster, LogTarget("r50", stager=True), args, out)  # type: ignore[arg-type]
    monkeypatch.setattr(follower, "_pods", cluster.listed)
    return follower, out


def test_the_stager_is_followed_across_the_staging_jobs_retry_until_staging_ends(
    log_api: type[LogApi], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first, retry = "r50-stage-a", "r50-stage-b"
    failed = stager_pod(first, "Failed", "2026-01-02T03:00:00Z")
    # The job is read once before the first pod, then after each pod's log: staged after the third.
    cluster = Jobs(
        [{"spec": STAGE_FROM, "status": {"phase": "Staging"}}] * 3
        + [{"spec": STAGE_FROM, "status": {"phase": "Staging", "conditions": [STAGED]}}],
        [
            [stager_pod(first, "Running", "2026-01-02T03:00:00Z")],
            [failed, stager_pod(retry, "Running", "2026-01-02T03:01:00Z")],
            [failed, stager_pod(retry, "Succeeded", "2026-01-02T03:01:00Z")],
        ],
    )
    log_api.answers = [
        Response(stamped((1, "listing imagenet/")), quiet=False),
        Response(stamped((2, "resuming: 300 files present")), quiet=True),
        Response(stamped((2, "resuming: 300 files present"), (3, "staged 1000 files")), quiet=False),
    ]
    logs, out = stager_follower(cluster, monkeypatch, "-f")
    assert logs.run() == 0
    assert out.getvalue() == b"listing imagenet/\nresuming: 300 files present\nstaged 1000 files\n"
    assert [r["name"] for r in log_api.requests] == [first, retry, retry]
    assert {r["container"] for r in log_api.requests} == {"stager"}
    # The retry is announced as the next pod of the staging Job, not as another world.
    assert capsys.readouterr().err == f"--- {retry} ---\n"


def test_a_stager_whose_pods_are_gone_says_so_and_how_staging_ended(
    log_api: type[LogApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = {
        "type": "Staged",
        "status": "False",
        "reason": "StagingFailed",
        "message": "the stager exited 5",
    }
    cluster = Jobs([{"spec": STAGE_FROM, "status": {"phase": "Failed", "conditions": [failed]}}], [[]])
    for flags in ((), ("-f",)):  # following waits for nothing: no stager pod can come any more
        logs, out = stager_follower(cluster, monkeypatch, *flags)
        with pytest.raises(StorageFailure) as gone:
            logs.run()
        assert gone.value.code == ExitCode.NOT_FOUND and out.getvalue() == b""
        assert str(gone.value) == (
            "the stager's pods of job r50 are gone, and the operator does not upload the stager's log (only "
            "the launcher's and the workers'); condition Staged=False (StagingFailed): the stager exited 5"
        )
    assert log_api.requests == []


def test_a_stager_not_there_yet_is_waited_for_with_f_only(
    log_api: type[LogApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    pending = {"spec": STAGE_FROM, "status": {"phase": "Pending"}}
    logs, _ = stager_follower(Jobs([pending], [[]]), monkeypatch)
    with pytest.raises(StorageFailure) as early:
        logs.run()
    assert early.value.code == ExitCode.NOT_FOUND
    assert str(early.value) == (
        "the stager (Job r50-stage) of job r50 has no pod yet (phase Pending); -f waits for it"
    )
    log_api.answers = [Response(stamped((1, "listing imagenet/")), quiet=False)]
    later = stager_pod("r50-stage-a", "Succeeded", "2026-01-02T03:00:00Z")
    staged = {"spec": STAGE_FROM, "status": {"phase": "Starting", "conditions": [STAGED]}}
    logs, out = stager_follower(Jobs([pending, pending, staged], [[], [later]]), monkeypatch, "-f")
    assert logs.run() == 0
    assert out.getvalue() == b"listing imagenet/\n"


def test_a_job_that_stages_nothing_has_no_stager(
    log_api: type[LogApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Jobs([{"spec": {"dataset": {"volume": {"persistentVolumeClaim": {}}}}, "status": {}}], [[]])
    logs, _ = stager_follower(cluster, monkeypatch, "-f")
    with pytest.raises(StorageFailure) as none:
        logs.run()
    assert none.value.code == ExitCode.NOT_FOUND
    assert str(none.value) == "job r50 stages no dataset (no spec.dataset.stageFrom): it has no stager"
