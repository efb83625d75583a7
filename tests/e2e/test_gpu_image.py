"""The GPU PyTorch image on the real node's CPU. horovod-pytorch is built as a GPU pool gets it (CUDA torch,
Horovod's collectives on NCCL, DALI, on a Debian base with no CUDA base image) and every e2e job runs it: sshd
in the workers, horovodrun over SSH, the trainer with DTJOB_EXPECT_GPU=0. This test checks what only a GPU
build has, in a pod the restricted Pod Security Standard admits, with the operator's own security context:
- Horovod reports NCCL built, linked to the NCCL wheel torch itself loads (one NCCL in the process), its
  libraries finding NCCL and the CUDA runtime relative to themselves, with kernels for the VM sizes named;
- DALI imports and decodes a JPEG (a CPU pipeline: no GPU here);
- the environment the NVIDIA container toolkit reads is set as the CUDA images set it;
- the trainer runs a few steps under horovodrun, as uid 1000.
"""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import pytest
from dtjob.config import OperatorConfig
from dtjob.desired.command import training_command
from dtjob.desired.common import OUTPUT_DIR, TRAINING_UID, container_security_context, pod_security_context
from dtjob.spec.parse import parse_spec
from kubernetes import client

from testbed.kube_wait import wait_for
from tests.e2e.conftest import IMAGES, RealCluster
from tests.e2e.real_jobs import tiny_training

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FATBIN = Path(__file__).resolve().parents[1] / "cuda_fatbin.py"

PROBE = r"""
import glob, json, os, pwd
from importlib.metadata import version

import horovod.torch as hvd
import torch
from PIL import Image

# Horovod's extension links NCCL: loaded by now, and only the one torch loads (the nvidia-nccl wheel's).
with open("/proc/self/maps") as maps:
    nccl = sorted({line.split()[-1] for line in maps if "libnccl.so" in line})

from nvidia.dali import fn, pipeline_def

Image.new("RGB", (64, 48), (200, 30, 30)).save("/tmp/probe.jpg", quality=90)


@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def decode():
    jpegs, _ = fn.readers.file(files=["/tmp/probe.jpg"] * 2)
    return fn.resize(fn.decoders.image(jpegs, device="cpu"), resize_x=32, resize_y=16)


pipe = decode()
pipe.build()
(images,) = pipe.run()


# An ELF library's RUNPATH (the one NUL-ended string holding NCCL's entry) and its GPU code (gpu_code, the
# source of tests/cuda_fatbin.py, comes before this script).
def linked(path):
    data = open(path, "rb").read()
    at = data.find(b"$ORIGIN/../../nvidia/nccl/lib")
    start, end = data.rfind(b"\0", 0, at) + 1, data.find(b"\0", at)
    return {"runpath": data[start:end].decode() if at >= 0 else "", "arches": gpu_code(data)}


site = os.path.dirname(os.path.dirname(os.path.dirname(hvd.__file__)))  # .../horovod/torch/__init__.py
libraries = sorted(glob.glob(os.path.join(site, "horovod", "**", "*.so"), recursive=True))
print("PROBE " + json.dumps({
    "horovod_libraries": {os.path.relpath(lib, site): linked(lib) for lib in libraries},
    "uid": os.getuid(),
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "nccl_built": hvd.nccl_built(),
    "nccl_wheel": version("nvidia-nccl-cu13"),
    "nccl_loaded": nccl,
    "torch_cuda": torch.version.cuda,
    "dali": version("nvidia-dali-cuda130"),
    "dali_shapes": [list(images.at(i).shape) for i in range(len(images))],
    "env": {k: os.environ.get(k) for k in
            ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA")},
}))
"""


def _trainer_command() -> str:
    """The ranks' command as the operator builds it for a tiny synthetic job, under a one-rank horovodrun."""
    body = {
        "apiVersion": "dtjob.io/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": "probe", "namespace": "probe", "uid": "probe", "generation": 1},
        "spec": {
            "framework": "pytorch",
            "workers": 1,
            "gpusPerWorker": 0,
            "dataset": {"source": "synthetic"},
            "hyperparameters": tiny_training(stepsPerEpoch=3),
        },
    }
    ranks = training_command(parse_spec(body, OperatorConfig()))
    return shlex.join(["horovodrun", "--gloo", "-np", "1", "-H", "localhost:1", *ranks])


def _probe_pod(name: str) -> dict[str, Any]:
    probe = f"{FATBIN.read_text()}\n{PROBE}"
    script = f"python - <<'EOF'\n{probe}\nEOF\n{_trainer_command()} 2>&1 | tail -n 30"
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            # The operator's pods' own contexts: what the image must run under on a cluster.
            "securityContext": pod_security_context(TRAINING_UID),
            "containers": [
                {
                    "name": "probe",
                    "image": IMAGES["pytorch"],
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-o", "pipefail", "-c", script],
                    "env": [{"name": "DTJOB_EXPECT_GPU", "value": "0"}],
                    "securityContext": container_security_context(),
                    # Where the trainer writes its results, checkpoints and progress, as in rank 0's pod.
                    "volumeMounts": [{"name": "output", "mountPath": OUTPUT_DIR}],
                }
            ],
            "volumes": [{"name": "output", "emptyDir": {}}],
        },
    }
    return pod


def test_the_gpu_pytorch_image_has_nccl_horovod_and_dali_and_trains_on_cpu_as_uid_1000(
    real_cluster: RealCluster, real_namespace: str
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    name = f"gpu-image-{uuid.uuid4().hex[:6]}"
    # The namespace enforces the restricted standard: the API server refuses the pod if the image needed more.
    core.create_namespaced_pod(real_namespace, _probe_pod(name))  # type: ignore[arg-type]

    def ended() -> str | None:
        phase = core.read_namespaced_pod(name, real_namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(ended, timeout=480, interval=2, what=f"pod {name} to end")
    log = core.read_namespaced_pod_log(name, real_namespace)
    assert phase == "Succeeded", log[-4000:]
    probe = json.loads(next(line for line in log.splitlines() if line.startswith("PROBE ")).split(" ", 1)[1])
    assert (probe["uid"], probe["user"]) == (1000, "dtjob"), probe
    # nccl_built() is NCCL's version code (major*10000 + minor*100 + patch) of the headers it was built with:
    # the wheel's, which is also the one library loaded.
    major, minor, patch = (int(part) for part in probe["nccl_wheel"].split(".")[:3])
    assert probe["nccl_built"] == major * 10000 + minor * 100 + patch, probe
    assert len(probe["nccl_loaded"]) == 1 and "/site-packages/nvidia/nccl/" in probe["nccl_loaded"][0], probe
    assert probe["torch_cuda"].startswith("13."), probe
    assert probe["dali_shapes"] == [[16, 32, 3], [16, 32, 3]], probe
    assert probe["env"] == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "NVIDIA_REQUIRE_CUDA": "cuda>=13.0",
    }, probe
    # Horovod's libraries find NCCL and the CUDA runtime in torch's own wheels, relative to themselves
    # (nothing of the build stage), and carry kernels for A100 (8.0) and H100 (9.0), PTX for newer GPUs.
    libraries = probe["horovod_libraries"]
    assert libraries, probe
    for path, lib in libraries.items():
        entries = lib["runpath"].split(":")
        assert entries[:2] == ["$ORIGIN/../../nvidia/nccl/lib", "$ORIGIN/../../nvidia/cu13/lib"], (path, lib)
        assert all(e.startswith(("$ORIGIN/", "/usr/")) for e in entries), (path, lib)
        assert lib["arches"] == ["compute_90", "sm_80", "sm_90"], (path, lib)
    # The trainer's own lines (dtjob_train.progress): the last step, then the closing figure.
    assert "epoch 1/1 step 3/3 " in log and "total images/sec: " in log, log[-4000:]
