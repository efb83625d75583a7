"""`dtjob operator`'s choice of leader election (on in a cluster or with POD_NAMESPACE, off on a laptop)
and its watch list (--watch-namespace; --namespace a deprecated alias)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dtjob.cli.main import build_parser
from dtjob.cli.operator import identity, lease_namespace, watched_namespaces

IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


def chosen(tmp_path: Path, env: dict[str, str], *flags: str) -> str | None:
    sa_namespace = tmp_path / "namespace"
    sa_namespace.write_text("dtjob-system\n")
    return lease_namespace(build_parser().parse_args(["operator", *flags]), env, sa_namespace)


def test_off_outside_a_cluster_unless_asked(tmp_path: Path) -> None:
    assert chosen(tmp_path, {}) is None
    assert chosen(tmp_path, {}, "--leader-elect", "--lease-namespace", "ops") == "ops"
    with pytest.raises(SystemExit, match="POD_NAMESPACE"):
        chosen(tmp_path, {}, "--leader-elect")


def test_on_in_a_cluster_or_with_pod_namespace_unless_turned_off(tmp_path: Path) -> None:
    assert chosen(tmp_path, IN_CLUSTER) == "dtjob-system"  # the pod's own namespace
    assert chosen(tmp_path, {**IN_CLUSTER, "POD_NAMESPACE": "ops"}) == "ops"
    assert chosen(tmp_path, {"POD_NAMESPACE": "ops"}) == "ops"
    assert chosen(tmp_path, {"POD_NAMESPACE": "ops"}, "--no-leader-elect") is None
    assert chosen(tmp_path, IN_CLUSTER, "--no-leader-elect") is None


def test_each_start_is_a_new_identity_named_after_the_pod() -> None:
    first, second = identity({"POD_NAME": "dtjob-7c9f-abcde"}), identity({"POD_NAME": "dtjob-7c9f-abcde"})
    assert first.startswith("dtjob-7c9f-abcde_") and first != second


def test_the_watch_list_is_watch_namespace_and_namespace_is_a_deprecated_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["operator", "--watch-namespace", "ml-a", "--watch-namespace", "team-*"])
    assert watched_namespaces(args) == ["ml-a", "team-*"]
    assert capsys.readouterr().err == ""
    assert watched_namespaces(build_parser().parse_args(["operator"])) == []
    assert watched_namespaces(build_parser().parse_args(["operator", "-A"])) == []

    # --namespace (and -n) still add to the list for one release, each use saying what replaces it.
    args = build_parser().parse_args(
        ["operator", "--namespace", "ml-a", "-n", "ml-b", "--watch-namespace", "c"]
    )
    assert watched_namespaces(args) == ["ml-a", "ml-b", "c"]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "dtjob operator: --namespace is deprecated and will be removed in the next release: use "
        "--watch-namespace ml-a",
        "dtjob operator: -n is deprecated and will be removed in the next release: use "
        "--watch-namespace ml-b",
    ]


def test_the_deprecated_alias_is_hidden_and_the_whole_cluster_excludes_a_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--help"])
    shown = capsys.readouterr().out
    assert "--watch-namespace NS" in shown and "--namespace" not in shown and "-n " not in shown
    with pytest.raises(SystemExit, match="exclude each other"):
        watched_namespaces(build_parser().parse_args(["operator", "-n", "ml-a", "-A"]))
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["operator", "--watch-namespace", "ml-a", "-A"])
    assert refused.value.code == 2
