"""Horovod's GPU build, compiled here without a GPU: training/install.sh with DTJOB_DEVICE=gpu, as the images
run it, into a venv of its own per framework. It proves:
- the CUDA and NCCL code paths compile against the pinned frameworks (TensorFlow 2.21 needed a patch);
- Horovod links the NCCL the framework itself loads, so the process holds one NCCL;
- its libraries find their CUDA runtime and NCCL wherever the venv lands;
- the kernels target the architectures of the VM sizes the project names.

The venvs install offline from the wheelhouse that `make gpu-build-wheels` fills (the tests have no route
out); the Horovod wheel is cached by its build inputs, so only the first run compiles.

And the CPU build for one framework, as the horovod-tensorflow image makes it, takes the training venv's
two-framework wheel instead of compiling Horovod again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cache import cache_root
from tests.cuda_fatbin import gpu_code
from tests.training.training_helpers import REPO

pytestmark = pytest.mark.training

INSTALL = REPO / "training" / "install.sh"


def _offline_env(**extra: str) -> dict[str, str]:
    wheelhouse = cache_root() / "wheels" / "pypi"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "DTJOB_", "PIP_"))}
    env |= {"DTJOB_CACHE": str(cache_root()), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    # No bytecode for the venv's thousands of modules (pip compiles each one it installs): the venv is
    # removed when the test ends, and what the probe imports compiles as it loads.
    env["PIP_COMPILE"] = "0"  # pip --no-compile (PIP_NO_COMPILE=1 would turn compiling on)
    return env | extra


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A bare venv, removed as soon as the test ends: a GPU framework venv takes 5-6 GB."""
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_gpu_build_takes_one_framework(venv: Path) -> None:
    env = _offline_env(DTJOB_DEVICE="gpu", DTJOB_FRAMEWORKS="torch tensorflow")
    done = subprocess.run(
        [str(INSTALL), str(venv / "bin" / "python")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1
    assert "DTJOB_FRAMEWORKS" in done.stderr and "one framework per environment" in done.stderr
    assert not list((venv / "lib").glob("python3*/site-packages/torch")), "nothing is installed"


PROBE = """
import json, sys
framework = sys.argv[1]
if framework == "torch":
    import horovod.torch as hvd
else:
    import horovod.tensorflow.keras as hvd
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})
print(json.dumps({"nccl": hvd.nccl_built(), "cuda": hvd.cuda_built(), "mpi": hvd.mpi_built(), "maps": maps}))
"""


# PyTorch's GPU build is the horovod-pytorch image's, which make test builds and
# tests/e2e/test_gpu_image.py checks the same way; TensorFlow's GPU image is not built here, so its venv is.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("framework", "nccl_wheel", "cudart_dir"), [("tensorflow", "nvidia-nccl-cu12", "nvidia/cuda_runtime/lib")]
)
def test_gpu_build_links_the_frameworks_own_nccl(
    venv: Path, framework: str, nccl_wheel: str, cudart_dir: str
) -> None:
    python = venv / "bin" / "python"
    env = _offline_env(DTJOB_DEVICE="gpu", DTJOB_FRAMEWORKS=framework)
    done = subprocess.run([str(INSTALL), str(python)], capture_output=True, text=True, env=env, timeout=1700)
    assert done.returncode == 0, done.stderr[-4000:]

    # The venv works from anywhere, without the build directory (removed) or an LD_LIBRARY_PATH.
    moved = venv.with_name("moved")
    venv.rename(moved)
    try:
        probe_env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"}
        probe = subprocess.run(
            [str(moved / "bin" / "python"), "-c", PROBE, framework],
            capture_output=True,
            text=True,
            env=probe_env,
        )
        assert probe.returncode == 0, probe.stderr[-4000:]
        result = json.loads(probe.stdout.strip().splitlines()[-1])
        site = next((moved / "lib").glob("python3*/site-packages"))
        assert result["nccl"], "built without NCCL"
        assert result["cuda"] and result["mpi"]
        # One NCCL in the process, the framework's own wheel (not a second copy from a CUDA image).
        assert result["maps"] == [str(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")]
        nccl_version = subprocess.run(
            [str(moved / "bin" / "python"), "-m", "pip", "show", nccl_wheel], capture_output=True, text=True
        ).stdout
        version = re.search(r"^Version: (\d+)\.(\d+)\.(\d+)", nccl_version, re.M)
        assert version, nccl_version
        major, minor, patch = (int(part) for part in version.groups())
        assert result["nccl"] == major * 10000 + minor * 100 + patch

        libraries = sorted((site / "horovod").rglob("*.so"))
        assert libraries
        for lib in libraries:
            runpath = subprocess.run(
                ["patchelf", "--print-rpath", str(lib)], capture_output=True, text=True
            ).stdout
            entries = runpath.strip().split(":")
            assert entries[:2] == ["$ORIGIN/../../nvidia/nccl/lib", f"$ORIGIN/../../{cudart_dir}"], runpath
            # Nothing from the build: every entry is relative to the venv, or a system directory.
            assert all(e.startswith(("$ORIGIN/", "/usr/")) for e in entries), runpath
            # Native code for A100 (8.0) and H100 (9.0), PTX for newer GPUs: V100 needs a CUDA 12 toolkit.
            assert gpu_code(lib.read_bytes()) == ["compute_90", "sm_80", "sm_90"], lib
    finally:
        shutil.rmtree(moved, ignore_errors=True)


def test_a_cpu_build_for_one_framework_takes_the_two_framework_wheel(venv: Path) -> None:
    # The training venv's wheel (make venv-training; this test runs from that venv): built for torch and
    # TensorFlow on CPU, on the same Python ABI and pins.
    wheels = sorted((cache_root() / "wheels").glob("horovod-*/horovod-*.whl"))
    assert wheels, "no Horovod wheel in the cache: make venv-training builds one"
    env = _offline_env(DTJOB_DEVICE="cpu", DTJOB_FRAMEWORKS="tensorflow")
    done = subprocess.run(
        [str(INSTALL), str(venv / "bin" / "python")], capture_output=True, text=True, env=env, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "taking the two-framework CPU build of Horovod" in done.stderr, done.stderr[-4000:]
    assert "building Horovod" not in done.stderr, "compiled Horovod again"
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert list((site / "horovod" / "tensorflow").glob("mpi_lib*.so"))
    # The other framework's extension is gone, as in a build without it.
    assert not list((site / "horovod" / "torch").glob("mpi_lib*.so"))
    probe = "import horovod.tensorflow.keras as hvd; assert hvd.gloo_built() and hvd.mpi_built(); print('ok')"
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"},
    )
    assert ran.returncode == 0 and ran.stdout.strip().endswith("ok"), ran.stderr[-4000:]
