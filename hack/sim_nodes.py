"""Print (as a JSON List) the fake nodes of a simulated AKS cluster for kwok: a CPU system and a GPU pool.

Shaped like AKS: nodes named aks-<pool>-<id>-vmss00000N, labelled with kubernetes.azure.com/agentpool, mode,
instance type and accelerator; the GPU pool tainted sku=gpu:NoSchedule (the AKS GPU-pool convention) and
advertising nvidia.com/gpu, as the NVIDIA device plugin would.

Environment: SYSTEM_POOL_SIZE (2), GPU_POOL_SIZE (4), GPU_VM_SIZE (Standard_NC24s_v3), SYSTEM_VM_SIZE
(Standard_D4s_v5).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VmSize:
    cpu: int
    memory_gi: int
    gpus: int
    accelerator: str = ""


# Published shapes of the Azure VM sizes a GPU pool is usually built from (vCPU, GiB, GPUs).
VM_SIZES = {
    "Standard_D4s_v5": VmSize(4, 16, 0),
    "Standard_D8s_v5": VmSize(8, 32, 0),
    "Standard_NC6s_v3": VmSize(6, 112, 1, "nvidia"),
    "Standard_NC12s_v3": VmSize(12, 224, 2, "nvidia"),
    "Standard_NC24s_v3": VmSize(24, 448, 4, "nvidia"),
    "Standard_NC24ads_A100_v4": VmSize(24, 220, 1, "nvidia"),
    "Standard_NC96ads_A100_v4": VmSize(96, 880, 4, "nvidia"),
    "Standard_ND96asr_v4": VmSize(96, 900, 8, "nvidia"),
    "Standard_ND96isr_H100_v5": VmSize(96, 1900, 8, "nvidia"),
}


def node(pool: str, index: int, vm_size: str, gpu: bool) -> dict[str, Any]:
    shape = VM_SIZES[vm_size]
    name = f"aks-{pool}-31415926-vmss{index:06d}"
    resources = {"cpu": str(shape.cpu), "memory": f"{shape.memory_gi}Gi", "pods": "110"}
    resources["ephemeral-storage"] = "128Gi"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "agentpool": pool,
        "kubernetes.azure.com/agentpool": pool,
        "kubernetes.azure.com/mode": "user" if gpu else "system",
        "node.kubernetes.io/instance-type": vm_size,
        "topology.kubernetes.io/region": "eastus",
        "topology.kubernetes.io/zone": "0",
    }
    taints: list[dict[str, str]] = []
    if gpu:
        resources["nvidia.com/gpu"] = str(shape.gpus)
        labels["kubernetes.azure.com/accelerator"] = shape.accelerator
        taints.append({"key": "sku", "value": "gpu", "effect": "NoSchedule"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # kwok manages only nodes carrying this annotation.
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def pool_nodes() -> list[dict[str, Any]]:
    system_size = os.environ.get("SYSTEM_VM_SIZE", "Standard_D4s_v5")
    gpu_size = os.environ.get("GPU_VM_SIZE", "Standard_NC24s_v3")
    for variable, size in (("SYSTEM_VM_SIZE", system_size), ("GPU_VM_SIZE", gpu_size)):
        if size not in VM_SIZES:
            raise SystemExit(f"{variable}={size!r} is not one of: {', '.join(sorted(VM_SIZES))}")
    if VM_SIZES[gpu_size].gpus == 0:
        raise SystemExit(f"GPU_VM_SIZE={gpu_size!r} has no GPUs")
    system = [
        node("system", i, system_size, gpu=False) for i in range(int(os.environ.get("SYSTEM_POOL_SIZE", 2)))
    ]
    gpus = [node("gpu", i, gpu_size, gpu=True) for i in range(int(os.environ.get("GPU_POOL_SIZE", 4)))]
    return system + gpus


if __name__ == "__main__":
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": pool_nodes()}, indent=1))
