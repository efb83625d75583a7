"""The real node's image store: each node's containerd unpacks an image into snapshots of its own, and
hack/realnode.sh import-images then links the identical files of their committed snapshots, so a cluster
holds the PyTorch image's files once, not once per node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.cache import cache_root
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

SNAPSHOTS = Path("containerd/io.containerd.snapshotter.v1.overlayfs/snapshots")
# The largest file of the PyTorch image, in the layer that installs its venv.
TORCH_CUDA = "*/fs/opt/venv/lib/python3*/site-packages/torch/lib/libtorch_cuda.so"


def test_the_nodes_hold_one_copy_of_the_pytorch_images_files(real_cluster: RealCluster) -> None:
    store = cache_root() / "realnode" / os.environ.get("REAL_CLUSTER_NAME", "dtjob-real")
    copies = {node: sorted((store / node / SNAPSHOTS).glob(TORCH_CUDA)) for node in ("gpu", "system")}
    assert all(len(paths) == 1 for paths in copies.values()), copies
    gpu, system = (paths[0].stat() for paths in copies.values())
    assert (gpu.st_dev, gpu.st_ino) == (system.st_dev, system.st_ino), "each node holds a copy of its own"
    assert gpu.st_nlink >= 2
