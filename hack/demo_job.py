"""The demo's job: examples/pytorch-synthetic-resnet50.yaml as a user would write it, shrunk to a machine of
two CPU cores and no GPU. `make demo` applies it, and the real-node e2e test of PyTorch trains this very
manifest, so a change that breaks the demo fails `make test`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch-synthetic-resnet50.yaml"
DEFAULT_STEPS = 6
EXPECT_GPU_ENV = "DTJOB_EXPECT_GPU"
# One core for each worker, its request small so that one node holds two: the trainer then runs one compute
# thread a rank (it reads the CPU quota). Without a limit each rank counts both cores of a 2-core machine, and
# two ranks run four threads on two cores: ResNet-50's steps took some six times as long.
ONE_CORE_WORKER_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}


def demo_job(output: dict[str, Any], steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """The example with 2 workers x 1 slot, `steps` steps of ResNet-50 at 64x64 on CPU, writing to `output`
    (the job's `spec.output`)."""
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = manifest["spec"]
    spec["gpusPerWorker"] = 1
    # The real node advertises nvidia.com/gpu as the device plugin would, but its containers see no GPU: the
    # trainer's check that a GPU job got its GPU (on by default for a job that asks for GPUs) is turned off.
    spec["env"] = [
        *(e for e in spec.get("env", []) if e.get("name") != EXPECT_GPU_ENV),
        {"name": EXPECT_GPU_ENV, "value": "0"},
    ]
    resources = spec.setdefault("worker", {}).setdefault("resources", {})
    for kind, amounts in ONE_CORE_WORKER_RESOURCES.items():
        resources.setdefault(kind, {}).update(amounts)
    spec["hyperparameters"].update(
        {"batchSizePerGpu": 4, "stepsPerEpoch": steps, "imageSize": 64, "logInterval": 1, "amp": False}
    )
    spec["output"] = output
    return manifest
