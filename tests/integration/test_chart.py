"""The Helm chart, rendered and installed by real helm into the real API server, with least-privilege RBAC."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from dtjob.config import DEFAULT_LOG_CAP_BYTES, load_config
from kubernetes import client

from testbed.kube_wait import wait_for
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration
CHART = REPO / "charts" / "dtjob"


def helm(kubeconfig: str, *args: str) -> str:
    result = subprocess.run(
        [tool("helm"), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def render(*sets: str) -> list[dict[str, Any]]:
    args = [tool("helm"), "template", "dtjob", str(CHART), "--namespace", "dtjob-system", "--include-crds"]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def can_i(
    kubeconfig: str,
    service_account: str,
    verb: str,
    resource: str,
    namespace: str | None,
    subresource: str | None = None,
) -> bool:
    scope = ["-n", namespace] if namespace else []
    if subresource:
        scope.append(f"--subresource={subresource}")
    result = subprocess.run(
        [
            tool("kubectl"),
            "--kubeconfig",
            kubeconfig,
            "auth",
            "can-i",
            verb,
            resource,
            "--as",
            service_account,
            *scope,
        ],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() == "yes"


def test_lint_is_clean() -> None:
    result = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_ships_the_one_crd_source() -> None:
    docs = render()
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    source = yaml.safe_load((REPO / "crds" / "dtjob.io_distributedtrainingjobs.yaml").read_text())
    assert crds == [source]


def test_cluster_wide_by_default_and_scoped_when_namespaces_are_listed() -> None:
    default = render()
    assert {d["kind"] for d in default if d["kind"].endswith("Role")} == {"ClusterRole"}
    deployment = next(d for d in default if d["kind"] == "Deployment")
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    scoped = render("watchNamespaces={ml-a,ml-b}")
    roles = sorted(d["metadata"]["namespace"] for d in scoped if d["kind"] == "Role")
    assert roles == ["ml-a", "ml-b"]
    args = next(d for d in scoped if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--namespace=ml-a" in args and "--namespace=ml-b" in args and "--all-namespaces" not in args


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env}


def test_storage_policy_and_network_policy_reach_the_operator() -> None:
    default = operator_env(render())
    # Safe defaults: no storage account, any container of an allowed one, no explicit client ID, no policy.
    assert default["DTJOB_ALLOWED_STORAGE_ACCOUNTS"] == ""
    assert default["DTJOB_ALLOWED_STORAGE_CONTAINERS"] == "*"
    assert default["DTJOB_ALLOWED_CLIENT_IDS"] == ""
    assert default["DTJOB_NETWORK_POLICY"] == "false"
    client_id = "0b7f7c3e-1d2a-4c5b-9e8f-123456789abc"
    env = operator_env(render(
        "storagePolicy.accounts={teamadata,shared}", "storagePolicy.containers={runs}",
        f"storagePolicy.clientIds={{{client_id}}}", "networkPolicy.enabled=true",
    ))  # fmt: skip
    assert env["DTJOB_ALLOWED_STORAGE_ACCOUNTS"] == "teamadata,shared"
    assert env["DTJOB_ALLOWED_STORAGE_CONTAINERS"] == "runs"
    assert env["DTJOB_ALLOWED_CLIENT_IDS"] == client_id
    assert env["DTJOB_NETWORK_POLICY"] == "true"


def test_the_log_cap_reaches_the_operator_as_whole_bytes() -> None:
    # Helm reads numbers as floats: unconverted, 64 MiB would render as 6.7108864e+07 (refused at start).
    assert int(operator_env(render())["DTJOB_LOG_CAP_BYTES"]) == DEFAULT_LOG_CAP_BYTES
    assert operator_env(render("podLogCapBytes=1048576"))["DTJOB_LOG_CAP_BYTES"] == "1048576"


RELIABILITY_SETTINGS = (
    "resync_seconds", "reconcile_workers", "reconcile_slow_seconds",
    "kube_connect_timeout_seconds", "kube_timeout_seconds", "kube_retries",
    "azure_connect_timeout_seconds", "azure_timeout_seconds", "azure_retries",
)  # fmt: skip


def test_resync_workers_and_deadlines_reach_the_operator_config() -> None:
    chart, code = load_config(operator_env(render())), load_config({})
    # The chart's defaults are the operator's own.
    assert {k: getattr(chart, k) for k in RELIABILITY_SETTINGS} == {
        k: getattr(code, k) for k in RELIABILITY_SETTINGS
    }
    tuned = load_config(operator_env(render(
        "resyncSeconds=15", "reconcileWorkers=4", "slowReconcileSeconds=5",
        "timeouts.kubernetes.readSeconds=7", "timeouts.storage.retries=0",
    )))  # fmt: skip
    assert (tuned.resync_seconds, tuned.reconcile_workers, tuned.reconcile_slow_seconds) == (15, 4, 5)
    assert (tuned.kube_timeout_seconds, tuned.azure_retries) == (7, 0)


@pytest.fixture
def release(kubeconfig: str, core_v1: client.CoreV1Api) -> Iterator[tuple[str, str]]:
    namespace = f"dtjob-system-{uuid.uuid4().hex[:6]}"
    name = "dtjob"
    try:
        yield name, namespace
    finally:
        subprocess.run(
            [tool("helm"), "--kubeconfig", kubeconfig, "uninstall", name, "-n", namespace, "--wait"],
            capture_output=True,
        )
        core_v1.delete_namespace(namespace)


def test_install_runs_the_operator_with_least_privilege(
    kubeconfig: str,
    api_client: client.ApiClient,
    release: tuple[str, str],
    namespace: str,
    simulated_pool: list[client.V1Node],
) -> None:
    name, release_ns = release
    helm(
        kubeconfig,
        "install",
        name,
        str(CHART),
        "--namespace",
        release_ns,
        "--create-namespace",
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--wait",
        "--timeout",
        "120s",
    )

    apps = client.AppsV1Api(api_client)
    deployment = apps.read_namespaced_deployment(name, release_ns)
    assert deployment.status.available_replicas == 1
    pods = client.CoreV1Api(api_client).list_namespaced_pod(release_ns).items
    # The operator lands on the system pool, never on a GPU node.
    assert [p.spec.node_name.startswith("aks-system-") for p in pods] == [True]

    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "distributedtrainingjobs.dtjob.io"
    )
    assert crd.spec.names.short_names == ["dtj", "dtjob"]

    sa = f"system:serviceaccount:{release_ns}:{name}"
    assert can_i(kubeconfig, sa, "create", "pods", namespace)
    assert can_i(kubeconfig, sa, "patch", "distributedtrainingjobs.dtjob.io", namespace, subresource="status")
    assert can_i(kubeconfig, sa, "create", "jobs.batch", namespace)
    assert can_i(kubeconfig, sa, "list", "customresourcedefinitions.apiextensions.k8s.io", None)
    # Scoped to the watched namespace, and no more than the operator needs.
    assert not can_i(kubeconfig, sa, "create", "pods", "default")
    assert not can_i(kubeconfig, sa, "delete", "nodes", None)
    assert not can_i(kubeconfig, sa, "create", "clusterrolebindings.rbac.authorization.k8s.io", None)
    # The job itself is never written (status only), nor Secrets listed, nor pods or Jobs patched.
    assert not can_i(kubeconfig, sa, "patch", "distributedtrainingjobs.dtjob.io", namespace)
    assert not can_i(kubeconfig, sa, "list", "secrets", namespace)
    assert not can_i(kubeconfig, sa, "patch", "pods", namespace)
    assert not can_i(kubeconfig, sa, "patch", "jobs.batch", namespace)
    assert can_i(kubeconfig, sa, "get", "namespaces", None)

    helm(kubeconfig, "uninstall", name, "--namespace", release_ns, "--wait")
    wait_for(
        lambda: not apps.list_namespaced_deployment(release_ns).items, timeout=60, what="Deployment removed"
    )
    # Helm keeps CRDs on uninstall, so jobs (and their data) survive an operator upgrade or removal.
    assert client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "distributedtrainingjobs.dtjob.io"
    )
