"""The instrument behind the benchmark's API requests per job (bench.api_requests), on the real API server:
a request of the counted account is counted once, as a write or a read, its Lease's apart, and nothing the
admin does (the bench itself, kwok, the scheduler, the controller-manager) is counted. On a control plane of
its own with API Priority and Fairness on (CLUSTER_APF=1): the shared one runs without it, and counts
nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from bench import api_requests
from bench.api_requests import Requests
from tests.conftest import CLUSTER_SCRIPT

pytestmark = pytest.mark.integration
NAMESPACE = "default"


@pytest.fixture(scope="module")
def apf_cluster() -> Iterator[str]:
    """The admin kubeconfig of a control plane with API Priority and Fairness on, stopped afterwards."""
    name = f"{os.environ.get('CLUSTER_NAME', 'dtjob')}-apf"
    env = {**os.environ, "CLUSTER_NAME": name, "CLUSTER_APF": "1"}

    def cluster(*args: str) -> str:
        done = subprocess.run(
            [str(CLUSTER_SCRIPT), *args], env=env, check=True, text=True, capture_output=True
        )
        return done.stdout.strip()

    cluster("up")
    try:
        yield cluster("kubeconfig")
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "down"], env=env, check=False, capture_output=True)


def config_map(name: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))


@pytest.fixture
def account(apf_cluster: str) -> Iterator[Path]:
    api = config.new_client_from_config(config_file=apf_cluster)
    path = api_requests.set_up(api, apf_cluster)
    try:
        yield path
    finally:
        api_requests.tear_down(api, path)


def test_the_accounts_writes_and_reads_are_counted_and_no_one_elses(apf_cluster: str, account: Path) -> None:
    kubeconfig, namespace = apf_cluster, NAMESPACE
    admin = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    counted = client.CoreV1Api(config.new_client_from_config(config_file=str(account)))
    leases = client.CoordinationV1Api(config.new_client_from_config(config_file=str(account)))
    before = api_requests.dispatched(kubeconfig)

    for i in range(3):  # the admin's: not counted
        admin.create_namespaced_config_map(namespace, config_map(f"admin-{i}"))
    admin.list_namespaced_config_map(namespace)

    counted.create_namespaced_config_map(namespace, config_map("mine"))  # writes
    counted.patch_namespaced_config_map("mine", namespace, {"data": {"a": "b"}})
    counted.read_namespaced_config_map("mine", namespace)  # reads
    counted.list_namespaced_config_map(namespace)
    counted.list_namespaced_pod(namespace)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="mine"), spec=client.V1LeaseSpec(holder_identity="x")
    )
    leases.create_namespaced_lease(namespace, lease)

    assert api_requests.dispatched(kubeconfig) - before == Requests(writes=2, reads=3, leases=1)
