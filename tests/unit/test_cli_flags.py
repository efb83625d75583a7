"""The `dtjob` flags mean what kubectl's mean: -n/--namespace a namespace, -c/--container a container (the
AKS cluster is --cluster only), -o json|yaml on every listing and on status, and a pool named by a positional
NAME in create, scale and delete. The former spellings that are kept warn on stderr."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml
from dtjob.azure.download import RemoteFile
from dtjob.cli.main import build_parser, main
from dtjob.cli.pool import pool_name

from tests.azure.arm_player import ArmPlayer
from tests.unit.cli_parsers import subparsers
from tests.unit.test_azure_aks import CLUSTER
from tests.unit.test_azure_aks import run as run_pool


def flag(parser: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    return next((a for a in parser._actions if option in a.option_strings), None)


COMMANDS = dict(subparsers(build_parser()))


def test_n_is_a_namespace_in_every_command() -> None:
    having = {words: action for words, sub in COMMANDS.items() if (action := flag(sub, "-n")) is not None}
    assert {"status", "logs", "results download", "results upload", "fileserver create", "operator"} <= set(
        having
    )
    for words, action in having.items():
        assert "--namespace" in action.option_strings, words
        if words == "operator":  # the deprecated alias of --watch-namespace, hidden
            assert action.help == argparse.SUPPRESS and flag(COMMANDS[words], "--watch-namespace") is not None
        else:
            assert action.dest == "namespace" and action.default is None, words
            assert "default: the context's" in (action.help or ""), words


def test_c_is_a_container_and_the_cluster_is_cluster_only() -> None:
    having_c = {words for words, sub in COMMANDS.items() if flag(sub, "-c") is not None}
    assert having_c == {"logs"}
    container = flag(COMMANDS["logs"], "-c")
    assert container is not None and container.option_strings == ["-c", "--container"]
    assert container.dest == "container"
    for words in ("pool create", "pool scale", "pool delete", "pool ls", "fileserver create"):
        cluster = flag(COMMANDS[words], "--cluster")
        assert cluster is not None and cluster.option_strings == ["--cluster"], words


def test_every_listing_and_status_take_o_json_or_yaml() -> None:
    listings = {words for words in COMMANDS if words.split()[-1] == "ls"}
    assert listings == {"data ls", "pool ls", "fileserver ls"}
    for words in (*listings, "status", "describe"):
        output = flag(COMMANDS[words], "-o")
        assert output is not None and output.option_strings == ["-o", "--output"], words
        assert set(output.choices or ()) == {"text", "json", "yaml"} and output.default == "text", words


@pytest.mark.parametrize(("words", "argv"), [("pool ls", [*CLUSTER]), ("fileserver ls", [])])
def test_the_former_json_flag_is_hidden_and_warns(
    words: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args([*words.split(), *argv, "--json"])
    assert args.output == "json"
    assert (
        "--json is deprecated and will be removed in the next release: use -o json" in capsys.readouterr().err
    )
    json_flag = flag(COMMANDS[words], "--json")
    assert json_flag is not None and json_flag.help == argparse.SUPPRESS


def test_pool_ls_prints_the_resources_as_json_or_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run_pool(["pool", "create", "big", *CLUSTER, "--max", "2"], player) == 0
    capsys.readouterr()
    assert run_pool(["pool", "ls", *CLUSTER, "-o", "yaml"], player) == 0
    listed = yaml.safe_load(capsys.readouterr().out)
    assert [p["name"] for p in listed] == ["big"] and listed[0]["properties"]["maxCount"] == 2
    assert run_pool(["pool", "ls", *CLUSTER, "-o", "json"], player) == 0
    assert json.loads(capsys.readouterr().out) == listed


def test_a_pool_is_named_by_its_positional_name_in_create_scale_and_delete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for words in ("pool create", "pool scale", "pool delete"):
        name = next(a for a in COMMANDS[words]._actions if a.dest == "name")
        assert name.option_strings == [] and name.metavar == "NAME", words
    assert pool_name(build_parser().parse_args(["pool", "create", *CLUSTER])) == "gpu"
    assert pool_name(build_parser().parse_args(["pool", "create", "gpu2", *CLUSTER])) == "gpu2"
    assert capsys.readouterr().err == ""

    player = ArmPlayer()
    assert run_pool(["pool", "create", "big", *CLUSTER], player) == 0
    assert player.puts()[-1].url.split("?")[0].endswith("/agentPools/big")
    assert run_pool(["pool", "scale", "big", *CLUSTER, "--max", "9"], player) == 0
    assert run_pool(["pool", "delete", "big", *CLUSTER, "--yes"], player) == 0
    assert player.pools == {}


def test_the_former_name_flag_still_names_the_pool_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["pool", "create", *CLUSTER, "--name", "old"])
    assert pool_name(args) == "old"
    assert (
        "--name is deprecated and will be removed in the next release: use the pool name as NAME (old)"
        in (capsys.readouterr().err)
    )
    assert flag(COMMANDS["pool create"], "--name") is not None
    assert "--name" not in COMMANDS["pool create"].format_help()
    player = ArmPlayer()
    assert run_pool(["pool", "create", "new", *CLUSTER, "--name", "old"], player) == 2
    assert "NAME 'new' and --name 'old' differ" in capsys.readouterr().err
    assert player.requests == []


def test_data_ls_prints_the_blobs_as_json_or_yaml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blobs = [
        RemoteFile("imagenet/train/a.JPEG", "train/a.JPEG", 3, "0x1", "q6u3bPp1kMoKSe8R0dHIGA=="),
        RemoteFile("imagenet/val/b.JPEG", "val/b.JPEG", 5, "0x2", None),
    ]

    def listed(_client: Any, prefix: str) -> list[RemoteFile]:
        assert prefix == "imagenet/"
        return blobs

    monkeypatch.setattr("dtjob.cli.data._client", lambda _args, _n: (object(), "the credentials"))
    monkeypatch.setattr("dtjob.azure.download.list_remote", listed)
    argv = ["data", "ls", "--account", "acct", "--container", "c", "--prefix", "imagenet"]
    expected = [
        {"name": "imagenet/train/a.JPEG", "size": 3, "md5": "q6u3bPp1kMoKSe8R0dHIGA=="},
        {"name": "imagenet/val/b.JPEG", "size": 5, "md5": None},
    ]
    assert main([*argv, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert main([*argv, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == expected
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == ["imagenet/train/a.JPEG", "imagenet/val/b.JPEG"]
