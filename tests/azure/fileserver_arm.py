"""The ARM side of `dtjob fileserver` tests: an AKS cluster with its subnets for the ARM player, and a runner
of the command on the real Azure SDK clients over it."""

from __future__ import annotations

import argparse
from typing import Any

from dtjob.azure.fileserver import FileServers
from dtjob.cli.main import build_parser

from tests.azure.arm_player import ArmPlayer, StaticToken

SUB = "sub-1"
NETWORK = f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network"
SUBNET = f"{NETWORK}/virtualNetworks/vnet1/subnets/nodes"
GPU_SUBNET = SUBNET.replace("/nodes", "/gpu")
CREATE = [
    "fileserver",
    "create",
    "--subscription",
    SUB,
    "-g",
    "ml-rg",
    "--cluster",
    "aks-train",
    "--account",
    "mlfiles",
]
STORAGE = f"/subscriptions/{SUB}/resourceGroups/ml-rg/providers/Microsoft.Storage/storageAccounts/mlfiles"


def subnet(name: str, endpoints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {
        "addressPrefix": "10.224.0.0/16" if name == "nodes" else "10.225.0.0/16",
        "networkSecurityGroup": {"id": "/subscriptions/sub-1/.../networkSecurityGroups/aks-nsg"},
        "provisioningState": "Succeeded",
        "ipConfigurations": [{"id": "/subscriptions/sub-1/.../ipConfigurations/ipconfig1"}],
    }
    if endpoints is not None:
        props["serviceEndpoints"] = endpoints
    return {"id": SUBNET.replace("/nodes", f"/{name}"), "name": name, "etag": 'W/"1"', "properties": props}


def aks_player(**kwargs: Any) -> ArmPlayer:
    """A cluster in westeurope whose system pool is on subnet nodes and GPU pool on subnet gpu; nodes
    lacks the Microsoft.Storage endpoint, gpu has it."""
    player = ArmPlayer(**kwargs)
    player.clusters["aks-train"] = {
        "id": f"/subscriptions/{SUB}/resourceGroups/ml-rg/providers/Microsoft.ContainerService/"
        "managedClusters/aks-train",
        "name": "aks-train",
        "location": "westeurope",
        "properties": {
            "nodeResourceGroup": "MC_ml-rg_aks-train_westeurope",
            "agentPoolProfiles": [
                {"name": "system", "vnetSubnetID": SUBNET},
                {"name": "gpu", "vnetSubnetID": GPU_SUBNET},
                {"name": "gpu2", "vnetSubnetID": GPU_SUBNET.upper()},  # the same subnet, other spelling
            ],
        },
    }
    player.vnets["net-rg/vnet1"] = {
        "id": "vnet1",
        "name": "vnet1",
        "properties": {"subnets": [subnet("nodes"), subnet("gpu", [{"service": "Microsoft.Storage"}])]},
    }
    return player


def run(argv: list[str], player: ArmPlayer, lines: list[str] | None = None, **extra: Any) -> int:
    args = build_parser().parse_args(argv)

    def connect(a: argparse.Namespace) -> FileServers:
        sink = lines.append if lines is not None else (lambda _line: None)
        return FileServers(
            a.subscription,
            a.resource_group or "",
            StaticToken(),
            player,
            polling_interval=0,
            progress=sink,
            busy_wait_s=0.2,
        )

    code: int = args.func(args, connect=connect, **extra)
    return code
