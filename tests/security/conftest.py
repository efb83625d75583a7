"""The attack suite's cluster: the chart's RBAC rendered by real helm and applied, two tenants with their own
tokens, and the operator running with the chart's ServiceAccount token and environment.

A module tunes the install through `chart_sets` (helm --set values) and the operator through
`operator_env`. Attacks act with a tenant's client (`tenant_a.jobs()`, the chart's edit role; `"admin"`, the
built-in admin role); checks read with the cluster admin's (`api_client`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from testbed.operator_harness import Jobs, OperatorProcess, install_crd
from testbed.tenancy import Tenant, TenantCluster, service_account_token, tenant_cluster, token_kubeconfig
from tests.integration.api_history import ApiHistory, api_history
from tests.tools import tool


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            # `integration` says a test needs the control plane; an attack on the stager's volume needs none.
            if "kubeconfig" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.security)


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    """helm --set values of the install under attack; a module overrides it."""
    return ()


@pytest.fixture
def operator_env() -> dict[str, str]:
    """Environment on top of the chart's; a module overrides it (an Azurite endpoint's host, say)."""
    return {}


@pytest.fixture
def cluster(
    kubeconfig: str,
    api_client: client.ApiClient,
    simulated_pool: Any,
    tmp_path: Path,
    chart_sets: tuple[str, ...],
) -> Iterator[TenantCluster]:
    install_crd(kubeconfig)
    with tenant_cluster(kubeconfig, api_client, tool("helm"), tmp_path, *chart_sets) as installed:
        yield installed


@pytest.fixture
def operator_api(cluster: TenantCluster) -> client.ApiClient:
    """A client holding the operator's ServiceAccount token, as a thief of it would."""
    token = service_account_token(cluster.core, cluster.release_ns, cluster.service_account)
    path = token_kubeconfig(cluster.admin_kubeconfig, token, cluster.workdir / "stolen.kubeconfig")
    stolen: client.ApiClient = config.new_client_from_config(config_file=path)
    return stolen


@pytest.fixture
def tenant_a(cluster: TenantCluster) -> Tenant:
    return cluster.tenant()


@pytest.fixture
def tenant_b(cluster: TenantCluster) -> Tenant:
    return cluster.tenant()


@pytest.fixture
def admin_jobs(api_client: client.ApiClient, tenant_a: Tenant) -> Jobs:
    """The cluster admin's view of tenant A's namespace: what the checks read."""
    return Jobs(api_client, tenant_a.namespace)


@pytest.fixture
def history(api_client: client.ApiClient, tenant_a: Tenant) -> Iterator[ApiHistory]:
    """Every pod and batch Job the API server shows in tenant A's namespace, from before the attack on."""
    with api_history(api_client, tenant_a.namespace) as seen:
        yield seen


@pytest.fixture
def operator(
    cluster: TenantCluster, tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, operator_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """The operator as the chart runs it, with its ServiceAccount's token, watching both tenants."""
    proc = cluster.operator([tenant_a.namespace, tenant_b.namespace], tmp_path / "operator.log", operator_env)
    proc.start()
    wait_leading(proc)
    try:
        yield proc
    finally:
        proc.stop()


def wait_leading(proc: OperatorProcess) -> None:
    from testbed.kube_wait import wait_for

    if proc.leader_elect:
        wait_for(proc.leading, timeout=60, what=f"the operator leading (log: {proc.log_path})")
