"""Storage secrets off the command line: every `dtjob` command that takes --account-key or --sas also reads
them from a file or stdin (--account-key-file, --sas-file), and says so in its help."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest
from dtjob.cli.blob_access import credential
from dtjob.cli.main import build_parser

from tests.unit.cli_parsers import subparsers

# One command line of each command that takes the storage credentials, less the credentials.
COMMANDS = {
    "data upload": ["data", "upload", "src", "--account", "acct", "--container", "c"],
    "data ls": ["data", "ls", "--account", "acct", "--container", "c"],
    "data hash": ["data", "hash", "--account", "acct", "--container", "c"],
    "data prepare-imagenet": [
        "data", "prepare-imagenet", "--train-tar", "t", "--val-tar", "v", "--val-labels", "l",
        "--account", "acct", "--container", "c",
    ],
    "results download": ["results", "download", "r50", "dest"],
    "results upload": ["results", "upload", "r50"],
    "logs": ["logs", "r50"],
}  # fmt: skip


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_every_command_with_a_secret_flag_reads_it_from_a_file_too() -> None:
    taking = {
        words: flags
        for words, sub in subparsers(build_parser())
        if "--account-key" in (flags := options(sub)) or "--sas" in flags
    }
    assert set(taking) == set(COMMANDS)
    for words, flags in taking.items():
        assert flags["--account-key-file"].dest == flags["--account-key"].dest == "account_key", words
        assert flags["--sas-file"].dest == flags["--sas"].dest == "sas", words
        # The secret itself on the command line is kept, and its help points to the safer forms.
        key_help, sas_help = flags["--account-key"].help or "", flags["--sas"].help or ""
        assert "--account-key-file" in key_help and "$AZURE_STORAGE_KEY" in key_help, words
        assert "--sas-file" in sas_help and "$AZURE_STORAGE_SAS_TOKEN" in sas_help, words
        assert "stdin" in (flags["--account-key-file"].help or ""), words


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_key_and_the_token_come_from_files(command: str, tmp_path: Path) -> None:
    key, sas = tmp_path / "key", tmp_path / "sas"
    key.write_text("a2V5IGZyb20gYSBmaWxl==\n")
    sas.write_text("  ?sv=2024&sig=abc \n")
    args = build_parser().parse_args(
        [*COMMANDS[command], "--account-key-file", str(key), "--sas-file", str(sas)]
    )
    assert (args.account_key, args.sas) == ("a2V5IGZyb20gYSBmaWxl==", "?sv=2024&sig=abc")


def test_a_secret_from_stdin_is_the_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("a2V5IGZyb20gc3RkaW4=\n"))
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    args = build_parser().parse_args([*COMMANDS["logs"], "--account-key-file", "-"])
    found, hint = credential(args.sas, args.account_key, "acct")
    assert found == {"account_name": "acct", "account_key": "a2V5IGZyb20gc3RkaW4="}
    assert "account key" in hint


def test_the_environment_still_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", "ZW52aXJvbm1lbnQ=")
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    args = build_parser().parse_args(COMMANDS["results download"])
    assert args.account_key is None
    assert credential(args.sas, args.account_key, "acct")[0]["account_key"] == "ZW52aXJvbm1lbnQ="


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--account-key-file", "MISSING"], "argument --account-key-file: cannot read MISSING: No such file"),
        (["--sas-file", "EMPTY"], "argument --sas-file: EMPTY is empty"),
        (["--account-key-file", "KEY", "--account-key", "k"], "not allowed with argument"),
        (["--sas", "t", "--sas-file", "KEY"], "not allowed with argument"),
    ],
)
def test_an_unreadable_empty_or_doubled_secret_is_a_usage_error(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "EMPTY").write_text(" \n")
    (tmp_path / "KEY").write_text("a2V5")
    paths = {name: str(tmp_path / name) for name in ("MISSING", "EMPTY", "KEY")}
    argv = [*COMMANDS["data ls"], *(paths.get(f, f) for f in flags)]
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(argv)
    assert done.value.code == 2
    assert (
        said.replace("MISSING", paths["MISSING"]).replace("EMPTY", paths["EMPTY"]) in capsys.readouterr().err
    )
