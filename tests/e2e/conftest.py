"""The real node: a cluster whose pods really run (hack/realnode.sh), the images built from images/ and
imported into its containerd, Azurite on the node's address, and the operator.

These fixtures need root and a network namespace of the test bed's own (`make test` runs pytest inside one,
see hack/netns.sh); elsewhere the tests skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite, run_azurite
from testbed.operator_harness import Jobs, OperatorProcess, install_crd

REPO = Path(__file__).resolve().parents[2]
REALNODE = REPO / "hack" / "realnode.sh"
BUILD_IMAGES = REPO / "hack" / "build-images.sh"
NODE_IP = "10.224.0.1"
IMAGE_TAG = os.environ.get("DTJOB_IMAGE_TAG", "dev")
IMAGES = {
    "pytorch": f"localhost/dtjob/horovod-pytorch:{IMAGE_TAG}",
    "tensorflow": f"localhost/dtjob/horovod-tensorflow:{IMAGE_TAG}",
    "operator": f"localhost/dtjob/operator:{IMAGE_TAG}",
    "stager": f"localhost/dtjob/stager:{IMAGE_TAG}",
    "mpi": f"localhost/dtjob/mpi:{IMAGE_TAG}",
}


# The first test on the real node sets it up. On a machine whose nodes have never held the images, each
# node's containerd unpacks them (the PyTorch image is 3 GB): 11 minutes for the two nodes beside the other
# test runs on two cores, past the per-test timeout. That one test gets room for it; the others keep theirs.
REAL_NODE_SETUP_TIMEOUT_S = 1800


@pytest.hookimpl(trylast=True)  # after any reordering: the first in the run's order sets the node up
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = next((item for item in items if "real_cluster" in getattr(item, "fixturenames", ())), None)
    if first is not None:
        first.add_marker(pytest.mark.timeout(REAL_NODE_SETUP_TIMEOUT_S), append=False)  # before its own


@dataclass(frozen=True)
class RealCluster:
    kubeconfig: str
    api: client.ApiClient
    logs: Path  # where the node's components write their logs


def _isolated() -> bool:
    """Inside a network namespace with no route out (what hack/netns.sh makes)."""
    routes = subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True)
    return routes.returncode == 0 and not routes.stdout.strip()


def _realnode(*args: str, log: Path) -> str:
    with log.open("a") as out:
        done = subprocess.run([str(REALNODE), *args], stdout=subprocess.PIPE, stderr=out, text=True)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise AssertionError(f"hack/realnode.sh {' '.join(args)} failed ({done.returncode}):\n{tail}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, runc, mounts)")
    if not _isolated():
        pytest.skip("the real node runs only inside the test bed's network namespace: run `make test`")
    logs = tmp_path_factory.mktemp("realnode")
    log = logs / "realnode.log"
    try:
        _realnode("up", log=log)
        _realnode("import-images", *IMAGES.values(), log=log)
        kubeconfig = _realnode("kubeconfig", log=log)
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
        install_crd(kubeconfig)
        yield RealCluster(kubeconfig, api, logs)
    finally:
        _realnode("down", log=log)


@pytest.fixture(scope="session")
def node_azurite(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite on the node's address: the operator (here) and the pods (on the bridge) both reach it."""
    with run_azurite(tmp_path_factory.mktemp("node-azurite"), host=NODE_IP) as emulator:
        yield emulator


@pytest.fixture
def real_namespace(real_cluster: RealCluster) -> Iterator[str]:
    core = client.CoreV1Api(real_cluster.api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    # Every e2e job runs where the restricted Pod Security Standard is enforced: the API server refuses any
    # pod the operator builds that asks for more.
    labels = {"pod-security.kubernetes.io/enforce": "restricted", "dtjob.io/test": "true"}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def real_jobs(real_cluster: RealCluster, real_namespace: str) -> Jobs:
    return Jobs(real_cluster.api, real_namespace)


def operator_env() -> dict[str, str]:
    """The operator as the chart would configure it for this cluster: the locally built images, Azurite on
    the node allowed as an emulator, and progress read every few seconds (a short run ends quickly)."""
    return {
        "DTJOB_IMAGE_PYTORCH": IMAGES["pytorch"],
        "DTJOB_IMAGE_TENSORFLOW": IMAGES["tensorflow"],
        "DTJOB_IMAGE_KERAS": IMAGES["tensorflow"],
        "DTJOB_STAGER_IMAGE": IMAGES["stager"],
        "DTJOB_EMULATOR_HOSTS": NODE_IP,
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME,
        "DTJOB_WRITE_CONTAINERS": "*",
        "DTJOB_PROGRESS_SECONDS": "3",
        "DTJOB_RESYNC_SECONDS": "10",
    }


@pytest.fixture
def real_operator(
    real_cluster: RealCluster, real_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """`python -m dtjob operator` on this machine, watching the test's namespace of the real cluster."""
    proc = OperatorProcess(
        real_cluster.kubeconfig, real_namespace, tmp_path / "operator.log", env=operator_env()
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
