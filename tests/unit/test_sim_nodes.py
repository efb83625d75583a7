"""The simulated AKS pools: node shapes, labels and taints as AKS sets them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "sim_nodes.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_nodes", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_default_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SYSTEM_POOL_SIZE", "GPU_POOL_SIZE", "GPU_VM_SIZE", "SYSTEM_VM_SIZE"):
        monkeypatch.delenv(var, raising=False)
    nodes = load().pool_nodes()
    pools = [n["metadata"]["labels"]["kubernetes.azure.com/agentpool"] for n in nodes]
    assert pools == ["system"] * 2 + ["gpu"] * 4
    gpu = nodes[-1]
    assert gpu["status"]["allocatable"] == {
        "cpu": "24",
        "memory": "448Gi",
        "pods": "110",
        "ephemeral-storage": "128Gi",
        "nvidia.com/gpu": "4",
    }
    assert gpu["spec"]["taints"] == [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]
    assert gpu["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert nodes[0]["spec"]["taints"] == []
    assert "nvidia.com/gpu" not in nodes[0]["status"]["capacity"]
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)


def test_pool_shape_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_POOL_SIZE", "2")
    monkeypatch.setenv("GPU_VM_SIZE", "Standard_ND96isr_H100_v5")
    nodes = [n for n in load().pool_nodes() if n["metadata"]["labels"]["agentpool"] == "gpu"]
    assert len(nodes) == 2
    assert {n["status"]["capacity"]["nvidia.com/gpu"] for n in nodes} == {"8"}


@pytest.mark.parametrize(
    ("size", "message"), [("Standard_Bogus", "is not one of"), ("Standard_D4s_v5", "has no GPUs")]
)
def test_bad_gpu_vm_size_is_named(monkeypatch: pytest.MonkeyPatch, size: str, message: str) -> None:
    monkeypatch.setenv("GPU_VM_SIZE", size)
    with pytest.raises(SystemExit, match=f"GPU_VM_SIZE='{size}' {message}"):
        load().pool_nodes()
