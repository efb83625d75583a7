"""Fixtures of the operator's integration tests: the CRD installed, a job client, the operator running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from testbed.faultproxy import FaultProxy
from testbed.operator_harness import Jobs, OperatorProcess, install_crd


@pytest.fixture
def jobs(api_client: client.ApiClient, namespace: str, simulated_pool: Any, kubeconfig: str) -> Jobs:
    install_crd(kubeconfig)
    return Jobs(api_client, namespace)


@pytest.fixture
def operator_env() -> dict[str, str]:
    """Extra environment of the operator process; a test module overrides it to tune the operator."""
    return {}


@pytest.fixture
def operator(
    kubeconfig: str, namespace: str, tmp_path: Path, jobs: Jobs, operator_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """`python -m dtjob operator` watching the test's namespace, stopped when the test ends."""
    proc = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", env=operator_env)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def proxy(kubeconfig: str, tmp_path: Path) -> Iterator[FaultProxy]:
    """The test bed's fault proxy in front of the API server (it injects nothing until a test adds rules)."""
    with FaultProxy(kubeconfig, tmp_path / "proxy") as running:
        yield running


@pytest.fixture
def proxied_operator(
    proxy: FaultProxy, namespace: str, tmp_path: Path, jobs: Jobs, operator_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """The operator, every API call of it through the proxy; a module that wants it as its `operator`
    fixture says so."""
    process = OperatorProcess(str(proxy.kubeconfig), namespace, tmp_path / "operator.log", env=operator_env)
    process.start()
    try:
        yield process
    finally:
        process.stop()
