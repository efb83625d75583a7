"""The subscription of `dtjob pool` and `dtjob fileserver`: --subscription, else $AZURE_SUBSCRIPTION_ID, else
the Azure CLI's default subscription, read from its profile as `az login` writes it (with a byte order
mark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dtjob.cli import fileserver as fileserver_cli
from dtjob.cli import pool as pool_cli
from dtjob.cli.main import build_parser
from dtjob.cli.subscription import (
    NoSubscription,
    cli_default,
    find_subscription,
    profile_path,
    resolve_subscription,
)
from dtjob.contract.transfer_report import ExitCode

DEFAULT = "11111111-2222-3333-4444-555555555555"
OTHER = "99999999-8888-7777-6666-555555555555"


def write_profile(config_dir: Path, subscriptions: list[dict[str, Any]], bom: bool = True) -> Path:
    """azureProfile.json as the Azure CLI writes it."""
    profile = {"installationId": "0f0e0d0c-0b0a-0908-0706-050403020100", "subscriptions": subscriptions}
    path = config_dir / "azureProfile.json"
    path.write_text(json.dumps(profile), encoding="utf-8-sig" if bom else "utf-8")
    return path


def subscription(sub_id: str, default: bool) -> dict[str, Any]:
    return {
        "id": sub_id,
        "name": f"sub {sub_id[:4]}",
        "state": "Enabled",
        "user": {"name": "someone@example.com", "type": "user"},
        "isDefault": default,
        "tenantId": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "environmentName": "AzureCloud",
        "homeTenantId": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "managedByTenants": [],
    }


@pytest.fixture
def az_dir(tmp_path: Path) -> Path:
    write_profile(tmp_path, [subscription(OTHER, False), subscription(DEFAULT, True)])
    return tmp_path


def test_the_flag_then_the_variable_then_the_cli_default(az_dir: Path) -> None:
    env = {"AZURE_CONFIG_DIR": str(az_dir)}
    assert find_subscription(None, env) == DEFAULT
    assert find_subscription(None, {**env, "AZURE_SUBSCRIPTION_ID": OTHER}) == OTHER
    assert find_subscription("given", {**env, "AZURE_SUBSCRIPTION_ID": OTHER}) == "given"
    assert find_subscription(None, {**env, "AZURE_SUBSCRIPTION_ID": ""}) == DEFAULT  # empty is unset


def test_the_profile_is_read_with_or_without_a_byte_order_mark(tmp_path: Path) -> None:
    path = write_profile(tmp_path, [subscription(DEFAULT, True)])
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert cli_default({"AZURE_CONFIG_DIR": str(tmp_path)}) == DEFAULT
    write_profile(tmp_path, [subscription(DEFAULT, True)], bom=False)
    assert cli_default({"AZURE_CONFIG_DIR": str(tmp_path)}) == DEFAULT


def test_the_default_profile_is_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".azure").mkdir()
    write_profile(tmp_path / ".azure", [subscription(DEFAULT, True)])
    assert profile_path({}) == tmp_path / ".azure" / "azureProfile.json"
    assert cli_default({}) == DEFAULT


@pytest.mark.parametrize(
    "content",
    [
        None,  # never logged in
        json.dumps({"subscriptions": []}),  # logged out
        json.dumps({"subscriptions": [subscription(DEFAULT, False)]}),  # none marked default
        "{not json",
        json.dumps(["a list"]),
    ],
)
def test_no_default_without_a_usable_profile(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "azureProfile.json").write_text(content, encoding="utf-8-sig")
    env = {"AZURE_CONFIG_DIR": str(tmp_path)}
    assert cli_default(env) is None
    with pytest.raises(NoSubscription) as raised:
        resolve_subscription(None, env)
    message = str(raised.value)
    assert "--subscription" in message and "AZURE_SUBSCRIPTION_ID" in message and "az login" in message
    assert str(tmp_path / "azureProfile.json") in message


@pytest.mark.parametrize(
    ("argv", "module", "client", "prefix"),
    [
        (["pool", "ls", "-g", "ml-rg", "--cluster", "aks-train"], pool_cli, "NodePools", "dtjob pool: "),
        (["fileserver", "ls"], fileserver_cli, "FileServers", "dtjob fileserver: "),
    ],
)
def test_both_commands_use_the_cli_default_or_say_the_three_ways(
    argv: list[str],
    module: Any,
    client: str,
    prefix: str,
    az_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(az_dir))
    made: list[str] = []

    def record(subscription: str, *rest: Any, **kwargs: Any) -> str:
        made.append(subscription)
        return "client"

    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda: "credential")
    monkeypatch.setattr(module, client, record)
    args = build_parser().parse_args(argv)
    assert args.subscription is None
    assert module.connect(args) == "client"
    assert made == [DEFAULT]

    monkeypatch.setenv("AZURE_CONFIG_DIR", str(az_dir / "absent"))
    assert args.func(args) == ExitCode.USAGE
    assert made == [DEFAULT]
    err = capsys.readouterr().err
    assert err.startswith(f"{prefix}no Azure subscription: pass --subscription, set AZURE_SUBSCRIPTION_ID")
    assert "az login" in err


def test_a_fileserver_dry_run_names_the_cli_default(
    az_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(az_dir))
    argv = ["fileserver", "create", "-g", "ml-rg", "--account", "mlfiles", "--location", "westeurope"]
    argv += [
        "--subnet-id",
        "/subscriptions/x/resourceGroups/n/providers/Microsoft.Network/virtualNetworks/v/subnets/s",
    ]
    args = build_parser().parse_args([*argv, "--dry-run"])
    assert args.func(args) == 0
    assert f"/subscriptions/{DEFAULT}/resourceGroups/ml-rg" in capsys.readouterr().out
