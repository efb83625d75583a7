"""`dtjob pool` and dtjob.azure.aks: the real azure-mgmt-containerservice client, played by an ARM stand-in.

The captured request bodies are what Azure would receive; ARM errors must come back as one clear line.
"""

from __future__ import annotations

import argparse

import pytest
from dtjob.azure.aks import (
    GpuPool,
    NodePools,
    PoolError,
    agent_pool_body,
    image_compatibility_note,
    scaled_body,
)
from dtjob.cli.main import build_parser
from dtjob.contract.transfer_report import ExitCode

from tests.azure.arm_player import ArmPlayer, StaticToken
from tests.azure.compute_arm import with_compute

CLUSTER = ["--subscription", "sub-1", "-g", "ml-rg", "--cluster", "aks-train"]


def run(argv: list[str], player: ArmPlayer, lines: list[str] | None = None) -> int:
    """Run `dtjob pool` on the real SDK clients over `player`, which plays cluster aks-train with room in its
    region's quota for any pool, unless the test set the region's quota itself (tests.azure.compute_arm)."""
    with_compute(player)
    args = build_parser().parse_args(argv)

    def connect(a: argparse.Namespace) -> NodePools:
        sink = lines.append if lines is not None else (lambda _line: None)
        return NodePools(
            a.subscription,
            a.resource_group,
            a.cluster,
            StaticToken(),
            player,
            polling_interval=0,
            progress=sink,
        )

    code: int = args.func(args, connect=connect)
    return code


def test_create_sends_an_autoscaling_gpu_pool(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer(polls_before_done=3)
    lines: list[str] = []
    argv = ["pool", "create", *CLUSTER, "--max", "8", "--label", "team=vision", "--zones", "1", "2"]
    assert run(argv, player, lines) == 0
    (put,) = player.puts()
    assert put.url.startswith(
        "https://management.azure.com/subscriptions/sub-1/resourceGroups/ml-rg/providers/"
        "Microsoft.ContainerService/managedClusters/aks-train/agentPools/gpu?api-version="
    )
    props = put.body["properties"]
    assert props["vmSize"] == "Standard_NC96ads_A100_v4"
    assert (props["enableAutoScaling"], props["minCount"], props["maxCount"], props["count"]) == (
        True,
        0,
        8,
        0,
    )
    assert props["nodeTaints"] == ["sku=gpu:NoSchedule"]
    assert props["nodeLabels"] == {"dtjob.io/pool": "gpu", "accelerator": "nvidia", "team": "vision"}
    assert props["mode"] == "User"
    assert props["osDiskSizeGB"] == 256
    assert props["availabilityZones"] == ["1", "2"]
    assert props["gpuProfile"] == {"driver": "Install"}
    # The long-running operation was polled to its end before the CLI reported success.
    polls = [r for r in player.requests if "/operations/" in r.url]
    assert len(polls) == 3
    assert player.pools["gpu"]["properties"]["provisioningState"] == "Succeeded"
    assert "Succeeded" in capsys.readouterr().out
    assert lines[0].endswith("started")
    assert "Succeeded after" in lines[-1]


def test_spot_and_custom_taints() -> None:
    body = agent_pool_body(GpuPool(name="spot", spot=True, taints=("sku=gpu:NoSchedule", "team=a:NoExecute")))
    props = body["properties"]
    assert props["scaleSetPriority"] == "Spot"
    assert props["spotMaxPrice"] == -1
    assert props["nodeTaints"] == [
        "sku=gpu:NoSchedule",
        "team=a:NoExecute",
        "kubernetes.azure.com/scalesetpriority=spot:NoSchedule",
    ]


def test_dry_run_prints_the_body_and_only_reads(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run(["pool", "create", *CLUSTER, "--dry-run", "--vm-size", "Standard_ND96asr_v4"], player) == 0
    assert [r.method for r in player.requests] == ["GET", "GET", "GET"]  # the cluster, its region's quota
    assert player.pools == {}
    captured = capsys.readouterr()
    assert '"vmSize": "Standard_ND96asr_v4"' in captured.out
    assert "quota in westeurope: up to 4 x Standard_ND96asr_v4 (96 vCPUs each) = 384 vCPUs" in captured.err
    player = ArmPlayer()
    argv = ["pool", "create", *CLUSTER, "--dry-run", "--skip-quota-check"]
    assert run(argv, player) == 0
    assert player.requests == []


def test_quota_exceeded_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    message = (
        "Operation could not be completed as it results in exceeding approved standardNCSv3Family "
        "Cores quota. "
        "Current Limit: 24, Current Usage: 24, Additional Required: 24."
    )
    player = ArmPlayer(fail_put=(409, "QuotaExceeded", message))
    # Azure's own refusal, as when the check was skipped (or the quota went to another pool meanwhile).
    assert run(["pool", "create", *CLUSTER, "--skip-quota-check"], player) == ExitCode.STORAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "dtjob pool: create pool gpu in ml-rg/aks-train: 409 QuotaExceeded: Operation could"
    )
    assert "Current Limit: 24" in err
    assert "Request more vCPU quota" in err
    assert "Traceback" not in err


def test_failure_during_the_operation_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer(
        fail_operation=("SkuNotAvailable", "The requested VM size is not available in westeurope.")
    )
    assert (
        run(["pool", "create", *CLUSTER, "--vm-size", "Standard_NC96ads_A100_v4"], player) == ExitCode.STORAGE
    )
    err = capsys.readouterr().err
    assert "SkuNotAvailable" in err
    assert "not available in westeurope" in err
    assert "try another --vm-size" in err


def test_bad_request_400_names_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer(
        fail_put=(400, "InvalidParameter", "The value of parameter agentPoolProfile.count is invalid.")
    )
    assert run(["pool", "create", *CLUSTER], player) == ExitCode.STORAGE
    assert "400 InvalidParameter: The value of parameter agentPoolProfile.count" in capsys.readouterr().err


def test_scale_keeps_other_settings_and_ls_lists(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run(["pool", "create", *CLUSTER, "--max", "2", "--os-disk-size", "512"], player) == 0
    assert run(["pool", "scale", *CLUSTER, "gpu", "--max", "16"], player) == 0
    put = player.puts()[-1].body["properties"]
    assert (put["enableAutoScaling"], put["minCount"], put["maxCount"]) == (True, 0, 16)
    assert put["osDiskSizeGB"] == 512
    assert put["nodeTaints"] == ["sku=gpu:NoSchedule"]
    assert "provisioningState" not in put
    assert run(["pool", "scale", *CLUSTER, "gpu", "--count", "3"], player) == 0
    put = player.puts()[-1].body["properties"]
    assert (put["enableAutoScaling"], put["count"]) == (False, 3)
    capsys.readouterr()
    assert run(["pool", "ls", *CLUSTER], player) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["NAME", "MODE", "VM"]
    assert out[1].split()[:3] == ["gpu", "User", "Standard_NC96ads_A100_v4"]
    assert "fixed 3" in out[1]


def test_scale_or_delete_of_a_missing_pool(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run(["pool", "scale", *CLUSTER, "nope", "--max", "3"], player) == ExitCode.NOT_FOUND
    err = capsys.readouterr().err
    assert "get pool nope: 404 NotFound" in err
    assert "Check --subscription, --resource-group and --cluster" in err


def test_delete_waits_for_the_operation(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run(["pool", "create", *CLUSTER], player) == 0
    assert run(["pool", "delete", *CLUSTER, "gpu", "--yes"], player) == 0
    assert player.pools == {}
    assert [r.method for r in player.requests].count("DELETE") == 1
    assert "deleted pool gpu" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("pool", "flag"),
    [
        (GpuPool(name="GPU-Pool"), "NAME"),
        (GpuPool(name="averyverylongname"), "NAME"),
        (GpuPool(vm_size="nc24"), "--vm-size"),
        (GpuPool(min_count=3, max_count=2), "--min/--max"),
        (GpuPool(max_count=0), "--min/--max"),
        (GpuPool(count=9, max_count=4), "--count"),
        (GpuPool(os_disk_type="Fast"), "--os-disk-type"),
        (GpuPool(taints=("sku=gpu",)), "--taint"),
        (GpuPool(labels={"kubernetes.azure.com/mode": "x"}), "--label"),
        (GpuPool(gpu_driver="Maybe"), "--gpu-driver"),
    ],
)
def test_bad_pool_settings_name_the_flag(pool: GpuPool, flag: str) -> None:
    with pytest.raises(PoolError, match=f"^{flag}:"):
        agent_pool_body(pool)


def test_bad_cli_values_reach_no_azure(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer()
    assert run(["pool", "create", *CLUSTER, "--label", "novalue"], player) == ExitCode.USAGE
    assert "--label: expected key=value" in capsys.readouterr().err
    assert player.requests == []
    assert run(["pool", "create", *CLUSTER], player) == 0
    assert run(["pool", "scale", *CLUSTER, "gpu", "--count", "2", "--max", "3"], player) == ExitCode.USAGE
    assert player.requests[-1].method == "GET"  # refused before any PUT
    assert len(player.puts()) == 1  # the create's


def test_scaled_body_requires_a_change() -> None:
    with pytest.raises(PoolError, match="--min and/or --max"):
        scaled_body({"properties": {}}, None, None, None)


@pytest.mark.parametrize(
    ("vm_size", "volta"),
    [
        ("Standard_NC6s_v3", True),
        ("Standard_NC24rs_v3", True),
        ("Standard_ND40rs_v2", True),
        ("Standard_NC24ads_A100_v4", False),
        ("Standard_ND96asr_v4", False),
        ("Standard_ND96isr_H100_v5", False),
        ("Standard_NC40ads_H100_v5", False),
    ],
)
def test_v100_pools_are_told_the_pytorch_image_needs_a100(vm_size: str, volta: bool) -> None:
    note = image_compatibility_note(vm_size)
    assert (note is not None) == volta
    if note:
        assert "horovod-pytorch" in note and "A100" in note and "horovod-tensorflow" in note


def test_create_on_a_v100_size_says_so_and_still_creates(capsys: pytest.CaptureFixture[str]) -> None:
    player = ArmPlayer(polls_before_done=0)
    argv = ["pool", "create", *CLUSTER, "--vm-size", "Standard_NC24s_v3", "--dry-run"]
    assert run(argv, player) == 0
    assert "note: Standard_NC24s_v3 has V100 GPUs" in capsys.readouterr().err
    argv = ["pool", "create", *CLUSTER, "--vm-size", "Standard_NC24ads_A100_v4", "--dry-run"]
    assert run(argv, player) == 0
    assert "note:" not in capsys.readouterr().err
