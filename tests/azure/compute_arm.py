"""A region's compute quota and VM sizes for the ARM player, in the shapes Usage - List and Resource Skus -
List answer with, and the AKS cluster `dtjob pool` reads the region from."""

from __future__ import annotations

from typing import Any

from tests.azure.arm_player import ArmPlayer

SUB = "sub-1"
REGION = "westeurope"
A100 = "standardNCADSA100v4Family"
V100 = "standardNCSv3Family"
ND_A100 = "standardNDASv4_A100Family"


def usage(name: str, label: str, current: int, limit: int) -> dict[str, Any]:
    return {
        "unit": "Count",
        "currentValue": current,
        "limit": limit,
        "name": {"value": name, "localizedValue": label},
    }


def family_usage(family: str, current: int, limit: int) -> dict[str, Any]:
    """A VM family's row, labelled as the portal labels it (Standard NCSv3 Family vCPUs)."""
    label = "Standard " + family.removeprefix("standard").removesuffix("Family") + " Family vCPUs"
    return usage(family, label, current, limit)


def regional(current: int, limit: int) -> dict[str, Any]:
    return usage("cores", "Total Regional vCPUs", current, limit)


def spot(current: int, limit: int) -> dict[str, Any]:
    return usage("lowPriorityCores", "Total Regional Low-priority vCPUs", current, limit)


def vm_sku(
    name: str,
    family: str,
    vcpus: int,
    gpus: int,
    *,
    region: str = REGION,
    restrictions: list[dict[str, Any]] | None = None,
    spot_capable: bool = True,
) -> dict[str, Any]:
    return {
        "resourceType": "virtualMachines",
        "name": name,
        "tier": "Standard",
        "size": name.removeprefix("Standard_"),
        "family": family,
        "locations": [region],
        "locationInfo": [{"location": region, "zones": ["1", "2", "3"], "zoneDetails": []}],
        "capabilities": [
            {"name": "MaxResourceVolumeMB", "value": "65536"},
            {"name": "vCPUs", "value": str(vcpus)},
            {"name": "GPUs", "value": str(gpus)},
            {"name": "LowPriorityCapable", "value": str(spot_capable)},
            {"name": "vCPUsAvailable", "value": str(vcpus)},
        ],
        "restrictions": restrictions or [],
    }


def location_restriction(region: str = REGION) -> dict[str, Any]:
    return {
        "type": "Location",
        "values": [region],
        "restrictionInfo": {"locations": [region]},
        "reasonCode": "NotAvailableForSubscription",
    }


def zone_restriction(zones: list[str], region: str = REGION) -> dict[str, Any]:
    return {
        "type": "Zone",
        "values": [region],
        "restrictionInfo": {"locations": [region], "zones": zones},
        "reasonCode": "NotAvailableForSubscription",
    }


def region_skus(region: str = REGION) -> list[dict[str, Any]]:
    """The GPU sizes the tests use, a size of another region, and a disk SKU (the list holds every kind)."""
    return [
        vm_sku("Standard_NC24ads_A100_v4", A100, 24, 1, region=region),
        vm_sku("Standard_NC96ads_A100_v4", A100, 96, 4, region=region),
        vm_sku("Standard_NC24s_v3", V100, 24, 4, region=region),
        vm_sku("Standard_ND96asr_v4", ND_A100, 96, 8, region=region),
        vm_sku("Standard_NC40ads_H100_v5", "standardNCadsH100v5Family", 40, 1, region="eastus"),
        {"resourceType": "disks", "name": "Premium_LRS", "tier": "Premium", "locations": [region]},
    ]


def with_compute(
    player: ArmPlayer, usages: list[dict[str, Any]] | None = None, region: str = REGION
) -> ArmPlayer:
    """The player with cluster aks-train in `region` and that region's VM sizes and `usages`; by default
    room for any pool the tests make. What the test already gave the player is kept."""
    player.clusters.setdefault(
        "aks-train",
        {
            "id": f"/subscriptions/{SUB}/resourceGroups/ml-rg/providers/Microsoft.ContainerService/"
            "managedClusters/aks-train",
            "name": "aks-train",
            "location": region,
            "properties": {"nodeResourceGroup": f"MC_ml-rg_aks-train_{region}"},
        },
    )
    if not player.skus:
        player.skus = region_skus(region)
    if usages is None:
        usages = [regional(8, 2000), spot(0, 2000)]
        usages += [family_usage(f, 0, 1000) for f in (A100, V100, ND_A100)]
    player.usages.setdefault(region, usages)
    return player
