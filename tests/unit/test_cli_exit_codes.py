"""The `dtjob` commands' exit statuses: one table, shown by `dtjob --help`, and what `status`, `logs` and
`results` return for a job that is not there, an API server that refuses the caller or cannot be reached, and
a kubeconfig that cannot be loaded. A stand-in API server on loopback answers with the status asked of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml
from dtjob.cli.main import EXIT_CODES, build_parser, main
from dtjob.contract.transfer_report import ExitCode

from tests.unit.local_server import serving

COMMANDS = [
    ["status", "r50"],
    ["describe", "r50", "-o", "json"],
    ["logs", "r50"],
    ["results", "download", "r50", "DEST"],
    ["results", "upload", "r50"],
]


class Answer:
    status = 404


@pytest.fixture
def api_server() -> Iterator[tuple[str, type[Answer]]]:
    """(URL, Answer): every request is answered with Answer.status and a Kubernetes Status body."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"kind": "Status", "code": Answer.status, "message": "said the stand-in"})
            self.send_response(Answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url, Answer


def kubeconfig(tmp_path: Path, server: str, namespace: str | None = None) -> str:
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": context}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def argv(command: list[str], tmp_path: Path, config: str) -> list[str]:
    return [*(str(tmp_path / "dest") if a == "DEST" else a for a in command), "--kubeconfig", config]


def test_help_shows_every_exit_status_of_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    epilog = shown[shown.index("exit status:") :]
    codes = {int(line.split()[0]) for line in epilog.splitlines()[1:] if line[:7].strip()}
    assert codes == {c for c, _ in EXIT_CODES} == {0, 1, 130} | {int(c) for c in ExitCode}
    assert "4    not found" in epilog and "2    usage" in epilog


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_missing_job_is_4_and_names_the_namespace_of_the_context(
    command: list[str],
    api_server: tuple[str, type[Answer]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, answer = api_server
    answer.status = 404
    assert main(argv(command, tmp_path, kubeconfig(tmp_path, url, "ml"))) == ExitCode.NOT_FOUND
    err = capsys.readouterr().err
    assert "no DistributedTrainingJob 'r50' in namespace ml" in err and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(("status", "code"), [(403, ExitCode.DENIED), (401, ExitCode.DENIED), (500, 6)])
def test_a_refusal_or_a_failure_of_the_api_server_is_3_or_6(
    command: list[str],
    status: int,
    code: int,
    api_server: tuple[str, type[Answer]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, answer = api_server
    answer.status = status
    assert main(argv(command, tmp_path, kubeconfig(tmp_path, url))) == code
    err = capsys.readouterr().err
    assert f"reading job r50: {status}" in err and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_api_server_that_cannot_be_reached_is_6_not_a_traceback(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on port 1: the connection is refused, and urllib3 gives up after its retries.
    assert main(argv(command, tmp_path, kubeconfig(tmp_path, "http://127.0.0.1:1"))) == ExitCode.STORAGE
    err = capsys.readouterr().err
    assert "reading job r50: cannot reach the API server" in err and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_kubeconfig_that_cannot_be_loaded_is_usage(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv(command, tmp_path, str(tmp_path / "absent"))) == ExitCode.USAGE
    assert "cannot load the kubeconfig" in capsys.readouterr().err


def test_bad_arguments_are_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["logs"])
    assert done.value.code == ExitCode.USAGE
    assert "the following arguments are required: JOB" in capsys.readouterr().err
