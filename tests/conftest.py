"""Shared fixtures: a real Kubernetes API server for integration tests.

`kubeconfig` resolves, in this order: $KUBECONFIG (an existing cluster: kind, AKS, ...); the local control
plane if it is already running (left running afterwards); otherwise it starts the local control plane with
hack/cluster.sh and stops it when the session ends.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from dtjob.kube.connect import ApiClient
from kubernetes import client, config

from testbed.kube_wait import wait_for
from testbed.kueue import KueueRelease, releases
from testbed.operator_harness import operator_client
from tests.tools import tool

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "hack" / "cluster.sh"


def _cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER_SCRIPT), *args], check=True, text=True, capture_output=True)


def _local_cluster_running(kubeconfig: str) -> bool:
    if not Path(kubeconfig).exists():
        return False
    probe = subprocess.run(
        [tool("kubectl"), "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    existing = os.environ.get("KUBECONFIG")
    if existing:
        yield existing
        return
    local = _cluster("kubeconfig").stdout.strip()
    if _local_cluster_running(local):
        _cluster("up")  # reconciles the node pools only
        yield local
        return
    _cluster("up")
    try:
        yield local
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "down"], check=False, capture_output=True)


@pytest.fixture(scope="session")
def api_client(kubeconfig: str) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    return api


@pytest.fixture(scope="session")
def operator_api(kubeconfig: str) -> ApiClient:
    return operator_client(kubeconfig)


@pytest.fixture(scope="session")
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def namespace(core_v1: client.CoreV1Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core_v1.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"dtjob.io/test": "true"}))
    )
    try:
        yield name
    finally:
        core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def simulated_pool(core_v1: client.CoreV1Api) -> list[client.V1Node]:
    """The simulated AKS GPU pool; skips tests that need kwok's simulation on a real cluster."""
    nodes = core_v1.list_node(label_selector="kubernetes.azure.com/agentpool=gpu,type=kwok").items
    if not nodes:
        pytest.skip("needs the simulated AKS GPU pool of the local control plane")
    wait_for(
        lambda: all(
            c.status == "True"
            for n in core_v1.list_node(label_selector="type=kwok").items
            for c in n.status.conditions or []
            if c.type == "Ready"
        ),
        timeout=60,
        what="simulated nodes Ready",
    )
    return list(nodes)


@pytest.fixture(scope="session")
def local_control_plane(kubeconfig: str) -> Path:
    """The working directory of the local control plane; skips when the tests run against another cluster."""
    local = Path(_cluster("kubeconfig").stdout.strip())
    if Path(kubeconfig).resolve() != local.resolve():
        pytest.skip("needs the local control plane (KUBECONFIG points at another cluster)")
    return local.parent


@pytest.fixture(params=releases(), ids=str)
def kueue_release(request: pytest.FixtureRequest) -> KueueRelease:
    """Each Kueue release the tests run (testbed.kueue.releases): a test taking it runs once per release."""
    return cast(KueueRelease, request.param)


# Where a run's time went, by tier (tests/<tier>/...): setup, call and teardown of every test, printed at the
# end of the run beside --durations, so each CI log says which tier to look at first.
_TIER_SECONDS: defaultdict[str, float] = defaultdict(float)
_TIER_TESTS: defaultdict[str, set[str]] = defaultdict(set)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0].split("::")[0]
    _TIER_SECONDS[tier] += report.duration
    _TIER_TESTS[tier].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TIER_SECONDS:
        return
    terminalreporter.section("time by tier (setup + call + teardown)")
    for tier, seconds in sorted(_TIER_SECONDS.items(), key=lambda item: -item[1]):
        count = len(_TIER_TESTS[tier])
        terminalreporter.write_line(f"{tier:<14} {seconds / 60:6.1f} min  {count:5d} tests")
