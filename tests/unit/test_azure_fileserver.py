"""`dtjob fileserver` and dtjob.azure.fileserver: the real azure-mgmt-storage, -network and -containerservice
clients, played by the ARM stand-in. The captured request bodies are what Azure would receive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dtjob.azure.fileserver_spec import FileServerSpec, account_patch, subnet_with_storage_endpoint
from dtjob.contract.transfer_report import ExitCode

from tests.azure.arm_player import Fault
from tests.azure.fileserver_arm import CREATE, GPU_SUBNET, STORAGE, SUB, SUBNET, aks_player, run, subnet


def test_create_sends_the_account_share_and_endpoint_bodies(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player(polls_before_done=3)
    lines: list[str] = []
    assert run([*CREATE, "--size-gib", "2048"], player, lines) == 0
    puts = {r.path: r.body for r in player.puts()}
    assert set(puts) == {SUBNET, STORAGE, f"{STORAGE}/fileServices/default/shares/datasets"}
    # Only the subnet without the endpoint is written, with everything else it had and nothing read-only.
    endpoint_put = puts[SUBNET]["properties"]
    assert endpoint_put["serviceEndpoints"] == [{"service": "Microsoft.Storage"}]
    assert endpoint_put["addressPrefix"] == "10.224.0.0/16"
    assert endpoint_put["networkSecurityGroup"]["id"].endswith("aks-nsg")
    assert "provisioningState" not in endpoint_put and "ipConfigurations" not in endpoint_put
    account = puts[STORAGE]
    assert (account["kind"], account["sku"], account["location"]) == (
        "FileStorage",
        {"name": "Premium_LRS"},
        "westeurope",
    )
    assert account["tags"]["dtjob-fileserver"] == "true"
    props = account["properties"]
    assert props["supportsHttpsTrafficOnly"] is False
    assert props["networkAcls"]["defaultAction"] == "Deny"
    assert props["networkAcls"]["virtualNetworkRules"] == [
        {"id": SUBNET, "action": "Allow"},
        {"id": GPU_SUBNET, "action": "Allow"},
    ]
    share = puts[f"{STORAGE}/fileServices/default/shares/datasets"]["properties"]
    assert share == {"enabledProtocols": "NFS", "rootSquash": "NoRootSquash", "shareQuota": 2048}
    # Every request named its api-version (the player refuses others); the endpoint precedes the account,
    # whose network rule needs it.
    order = [r.path for r in player.puts()]
    assert order.index(SUBNET) < order.index(STORAGE)
    # Both long-running operations were polled to their end, and said so.
    assert len([r for r in player.requests if "/operations/" in r.url]) == 6
    assert "create storage account mlfiles in ml-rg: started" in lines
    assert any(line.startswith("create storage account mlfiles in ml-rg: Succeeded after") for line in lines)
    out, err = capsys.readouterr()
    volume = yaml.safe_load(out)["volume"]
    assert volume == {
        "mountPath": "/data",
        "nfs": {"server": "mlfiles.file.core.windows.net", "path": "/mlfiles/datasets"},
    }
    assert "storage account mlfiles created" in err


def test_a_second_create_writes_nothing_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    assert run(CREATE, player) == 0
    first_out = capsys.readouterr().out
    before = len(player.requests)
    assert run(CREATE, player) == 0
    again = player.requests[before:]
    assert [r.method for r in again] == ["GET"] * len(again)
    out, err = capsys.readouterr()
    assert "nothing changed" in err
    assert out == first_out


def test_create_brings_an_existing_account_and_share_in_line(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    assert run(CREATE, player) == 0
    account = player.accounts["mlfiles"]
    account["properties"]["supportsHttpsTrafficOnly"] = True
    own_rule = {"id": "/subscriptions/sub-1/.../subnets/laptops", "action": "Allow", "state": "Succeeded"}
    account["properties"]["networkAcls"]["virtualNetworkRules"] = [own_rule]
    account["properties"]["networkAcls"]["ipRules"] = [{"value": "203.0.113.7", "action": "Allow"}]
    before = len(player.requests)
    capsys.readouterr()
    assert run([*CREATE, "--size-gib", "4096"], player) == 0
    writes = [r for r in player.requests[before:] if r.method != "GET"]
    assert [(r.method, r.path) for r in writes] == [
        ("PATCH", STORAGE),
        ("PATCH", f"{STORAGE}/fileServices/default/shares/datasets"),
    ]
    patch = writes[0].body["properties"]
    assert patch["supportsHttpsTrafficOnly"] is False
    # The rule someone added by hand stays.
    assert [r["id"] for r in patch["networkAcls"]["virtualNetworkRules"]] == [
        own_rule["id"],
        SUBNET,
        GPU_SUBNET,
    ]
    assert writes[1].body == {"properties": {"shareQuota": 4096}}
    err = capsys.readouterr().err
    assert "size 1024 GiB -> 4096 GiB" in err
    assert "secure transfer required -> off" in err


def test_an_account_of_another_kind_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="exists as StorageV2 Standard_LRS; NFS shares need FileStorage"):
        account_patch({"kind": "StorageV2", "sku": {"name": "Standard_LRS"}}, FileServerSpec("mlfiles"))


def test_a_subnet_with_the_endpoint_is_left_alone() -> None:
    assert subnet_with_storage_endpoint(subnet("x", [{"service": "microsoft.storage"}])) is None
    added = subnet_with_storage_endpoint(subnet("x", [{"service": "Microsoft.Sql"}]))
    assert added is not None
    assert added["properties"]["serviceEndpoints"] == [
        {"service": "Microsoft.Sql"},
        {"service": "Microsoft.Storage"},
    ]


def test_busy_throttled_and_failing_answers_are_tried_again(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    player.faults = [
        Fault("PUT", "/subnets/nodes", 409, "AnotherOperationInProgress", "Another operation is in progress"),
        Fault("GET", "/storageAccounts/mlfiles", 429, "TooManyRequests", "throttled", retry_after=1),
        Fault("PUT", "/storageAccounts/mlfiles", 500, "InternalServerError", "oops"),
        Fault("PUT", "/shares/datasets", 409, "StorageAccountIsNotProvisioned", "not yet", retry_after=1),
    ]
    lines: list[str] = []
    assert run(CREATE, player, lines) == 0
    assert all(f.times == 0 for f in player.faults)
    assert set(player.accounts) == {"mlfiles"} and ("mlfiles", "datasets") in player.shares
    # Retry-After was honoured: the request after each answer that carried one came a second later.
    for method, fragment in (("GET", "/storageAccounts/mlfiles"), ("PUT", "/shares/datasets")):
        times = [r.at for r in player.requests if r.method == method and r.path.endswith(fragment)]
        assert times[1] - times[0] >= 0.95, (method, fragment, times)
    # A busy answer without Retry-After waits busy_wait_s; with one, the SDK's own retry policy waits it.
    busy = "add the Microsoft.Storage service endpoint to subnet vnet1/nodes: 409 AnotherOperationInProgress"
    assert f"{busy}, trying again in 0.2s" in lines
    endpoint_puts = [r.at for r in player.requests if r.method == "PUT" and r.path == SUBNET]
    assert endpoint_puts[1] - endpoint_puts[0] >= 0.19


def test_a_conflict_that_is_not_busy_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player(
        fail_put=(409, "StorageAccountAlreadyTaken", "The storage account named mlfiles is taken.")
    )
    assert run(CREATE, player) == ExitCode.STORAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "dtjob fileserver: create storage account mlfiles in ml-rg: 409 StorageAccountAlreadyTaken: "
        "The storage account named mlfiles is taken. Account names are global across Azure: "
        "choose another --account (or -g, if it is yours)."
    )
    assert [r.method for r in player.requests].count("PUT") == 2  # the subnet's, and this one, once


def test_a_failed_operation_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player(fail_operation=("InternalError", "The account could not be provisioned."))
    player.vnets["net-rg/vnet1"]["properties"]["subnets"][0] = subnet(
        "nodes", [{"service": "Microsoft.Storage"}]
    )
    assert run(CREATE, player) == ExitCode.STORAGE
    err = capsys.readouterr().err
    assert (
        "dtjob fileserver: create storage account mlfiles in ml-rg: 400 InternalError: The account could not"
        in err
    )
    assert "Traceback" not in err
    assert player.accounts == {}
    assert not any("/shares/" in r.path for r in player.requests)  # nothing after the failed step


def test_dry_run_sends_nothing_and_prints_the_bodies(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    argv = [*CREATE, "--dry-run", "--apply", "-n", "ml", "--size-gib", "100"]
    assert run(argv, player) == 0
    assert player.requests == []
    plan = json.loads(capsys.readouterr().out)
    account = next(r for r in plan["azure"] if r["url"].endswith("/storageAccounts/mlfiles"))["body"]
    assert account["kind"] == "FileStorage" and account["properties"]["supportsHttpsTrafficOnly"] is False
    assert account["location"] == "<location of cluster aks-train>"
    share = next(r for r in plan["azure"] if r["url"].endswith("/shares/datasets"))["body"]
    assert share["properties"]["shareQuota"] == 100
    kinds = [o["kind"] for o in plan["kubernetes"]]
    assert kinds == ["PersistentVolume", "PersistentVolumeClaim"]


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--size-gib", "99"], "--size-gib"),
        (["--share", "Data_Sets"], "--share"),
        (["--subnet-id", "nodes"], "--subnet-id"),
    ],
)
def test_bad_values_reach_no_azure(extra: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    assert run([*CREATE, *extra], player) == ExitCode.USAGE
    assert capsys.readouterr().err.startswith(f"dtjob fileserver: {flag}:")
    assert player.requests == []


def test_bad_account_name(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    argv = [*CREATE[:-1], "ML-Files", "--dry-run"]
    assert run(argv, player) == ExitCode.USAGE
    assert "--account: 3-24 lowercase letters and digits" in capsys.readouterr().err


def test_a_cluster_on_a_managed_vnet_uses_its_one_subnet(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    cluster = player.clusters["aks-train"]["properties"]
    cluster["agentPoolProfiles"] = [{"name": "system"}, {"name": "gpu"}]
    managed = (
        f"/subscriptions/{SUB}/resourceGroups/MC_ml-rg_aks-train_westeurope/providers/Microsoft.Network/"
        "virtualNetworks/aks-vnet-1/subnets/aks-subnet"
    )
    player.vnets["MC_ml-rg_aks-train_westeurope/aks-vnet-1"] = {
        "id": "aks-vnet-1",
        "name": "aks-vnet-1",
        "properties": {
            "subnets": [
                {"id": managed, "name": "aks-subnet", "properties": {"addressPrefix": "10.224.0.0/16"}}
            ]
        },
    }
    assert run(CREATE, player) == 0
    account = next(r.body for r in player.puts() if r.path == STORAGE)
    assert account["properties"]["networkAcls"]["virtualNetworkRules"] == [{"id": managed, "action": "Allow"}]


def test_ls_lists_the_file_servers_only(capsys: pytest.CaptureFixture[str]) -> None:
    player = aks_player()
    assert run(CREATE, player) == 0
    assert run([*CREATE[:-1], "mlfiles2", "--share", "imagenet", "--size-gib", "512"], player) == 0
    # An account the tool did not make is not listed.
    player.accounts["blobs"] = {
        "id": f"/subscriptions/{SUB}/resourceGroups/ml-rg/providers/Microsoft.Storage/storageAccounts/blobs",
        "name": "blobs",
        "kind": "StorageV2",
        "location": "westeurope",
        "properties": {},
    }
    capsys.readouterr()
    assert run(["fileserver", "ls", "--subscription", SUB], player) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ACCOUNT", "SHARE", "SIZE"]
    assert [line.split() for line in out[1:]] == [
        [
            "mlfiles",
            "datasets",
            "1024GiB",
            "NFS",
            "ml-rg",
            "westeurope",
            "mlfiles.file.core.windows.net:/mlfiles/datasets",
        ],
        [
            "mlfiles2",
            "imagenet",
            "512GiB",
            "NFS",
            "ml-rg",
            "westeurope",
            "mlfiles2.file.core.windows.net:/mlfiles2/imagenet",
        ],
    ]
    assert run(["fileserver", "ls", "--subscription", SUB, "-g", "ml-rg", "-o", "json"], player) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[1]["nfs"] == {"server": "mlfiles2.file.core.windows.net", "path": "/mlfiles2/imagenet"}
    assert listed[1]["sizeGiB"] == 512
    assert run(["fileserver", "ls", "--subscription", SUB, "-g", "ml-rg", "-o", "yaml"], player) == 0
    assert yaml.safe_load(capsys.readouterr().out) == listed


def unreachable_kubeconfig(tmp_path: Path, namespace: str | None = None) -> str:
    """A kubeconfig whose API server refuses connections (nothing listens on port 1); its context's
    namespace is `namespace`, when given."""
    path = tmp_path / "kubeconfig"
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": context}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def planned_namespaces(out: str) -> set[str | None]:
    return {
        o["metadata"].get("namespace")
        for o in json.loads(out)["kubernetes"]
        if o["kind"] != "PersistentVolume"
    }


def test_the_claims_namespace_is_the_contexts_unless_n_names_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    player = aks_player()
    plan = [*CREATE, "--dry-run", "--apply", "--kubeconfig", unreachable_kubeconfig(tmp_path, "ml-team")]
    assert run(plan, player) == 0
    assert planned_namespaces(capsys.readouterr().out) == {"ml-team"}
    assert run([*plan, "-n", "other"], player) == 0
    assert planned_namespaces(capsys.readouterr().out) == {"other"}
    assert run([*plan, "--namespace", "third"], player) == 0
    assert planned_namespaces(capsys.readouterr().out) == {"third"}

    # Without a kubeconfig: a plan in default, saying why; an --apply refused before Azure is asked.
    absent = [*CREATE, "--apply", "--kubeconfig", str(tmp_path / "absent")]
    assert run([*absent, "--dry-run"], player) == 0
    out, err = capsys.readouterr()
    assert planned_namespaces(out) == {"default"} and "the plan puts the claim in namespace default" in err
    assert run(absent, player) == ExitCode.USAGE
    assert "cannot load the kubeconfig" in capsys.readouterr().err
    assert player.requests == []


def test_delete_without_a_reachable_cluster_is_refused_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    player = aks_player()
    assert run(CREATE, player) == 0
    delete = ["fileserver", "delete", "--subscription", SUB, "-g", "ml-rg", "--account", "mlfiles", "--yes"]
    kube = ["--kubeconfig", unreachable_kubeconfig(tmp_path)]
    capsys.readouterr()
    assert run([*delete, *kube], player) == ExitCode.STORAGE  # the API server cannot be reached
    assert (
        "cannot check which jobs use mlfiles.file.core.windows.net:/mlfiles/datasets"
        in capsys.readouterr().err
    )
    assert "mlfiles" in player.accounts and not any(r.method == "DELETE" for r in player.requests)
    assert run([*delete, *kube, "--force"], player) == 0
    assert [(r.method, r.path) for r in player.requests if r.method == "DELETE"] == [
        ("DELETE", f"{STORAGE}/fileServices/default/shares/datasets"),
        ("DELETE", STORAGE),  # it held no other share
    ]
    assert player.accounts == {}
    assert run([*delete, *kube], player) == 0  # gone: nothing to do, no check needed
    assert "nothing to delete" in capsys.readouterr().err


def test_apply_to_an_unreachable_cluster_says_the_share_is_ready(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    player = aks_player()
    argv = [*CREATE, "--apply", "--kubeconfig", unreachable_kubeconfig(tmp_path)]
    assert run(argv, player) == ExitCode.STORAGE
    err = capsys.readouterr().err
    assert "dtjob fileserver: the share is ready, but the PV and claim were not written" in err
    assert "Traceback" not in err
    assert ("mlfiles", "datasets") in player.shares
