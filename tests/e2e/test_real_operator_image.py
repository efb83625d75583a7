"""The operator as a platform team runs it: its own image, installed by the Helm chart (ServiceAccount, RBAC,
in-cluster config through the kubernetes Service, liveness probe), running a real job to the end.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import REPO, Jobs
from tests.e2e.conftest import IMAGES, NODE_IP, RealCluster
from tests.e2e.real_jobs import (
    assert_trained_together,
    blob_names,
    create_tiny_job,
    new_container,
    run_metrics,
    wait_finished,
)
from tests.tools import tool

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _helm(kubeconfig: str, *args: str) -> str:
    done = subprocess.run(
        [tool("helm"), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture
def installed_operator(real_cluster: RealCluster, real_namespace: str) -> Iterator[str]:
    """`helm install` of charts/dtjob with the locally built operator image, watching the test namespace."""
    release_ns = f"dtjob-system-{uuid.uuid4().hex[:6]}"
    repository, tag = IMAGES["operator"].rsplit(":", 1)
    _helm(
        real_cluster.kubeconfig, "install", "dtjob", str(REPO / "charts" / "dtjob"),
        "--namespace", release_ns, "--create-namespace", "--wait", "--timeout", "180s",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"trainingImages.pytorch={IMAGES['pytorch']}",
        "--set", f"trainingImages.tensorflow={IMAGES['tensorflow']}",
        "--set", f"trainingImages.keras={IMAGES['tensorflow']}",
        "--set", f"stagerImage={IMAGES['stager']}",
        "--set", f"emulatorHosts={{{NODE_IP}}}",
        "--set", f"storagePolicy.accounts={{{DEV_ACCOUNT_NAME}}}",
        "--set", "storagePolicy.writeContainers={*}",
        "--set", f"watchNamespaces={{{real_namespace}}}",
        "--set", "progressSeconds=3",
        "--set", "logLevel=verbose",
    )  # fmt: skip
    try:
        yield release_ns
    finally:
        core = client.CoreV1Api(real_cluster.api)
        pods = core.list_namespaced_pod(release_ns).items
        for pod in pods:
            pod_name = str(pod.metadata.name)
            log = core.read_namespaced_pod_log(pod_name, release_ns, tail_lines=80)
            print(f"--- operator pod {pod_name}:\n{log}")
        _helm(real_cluster.kubeconfig, "uninstall", "dtjob", "--namespace", release_ns, "--wait")
        core.delete_namespace(release_ns)


def test_operator_installed_by_helm_from_its_image_runs_a_real_job(
    real_cluster: RealCluster,
    real_jobs: Jobs,
    installed_operator: str,
    node_azurite: Azurite,
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    pod = core.list_namespaced_pod(installed_operator).items[0]
    # Ready and live under its probe, as the non-root user the chart sets, on the system pool.
    assert pod.spec.security_context.run_as_user == 65532
    assert pod.spec.node_name.startswith("aks-system-")
    # Its /metrics is HTTPS and refuses a caller without a token (the API server's service proxy sends none).
    with pytest.raises(client.ApiException) as refused:
        core.connect_get_namespaced_service_proxy_with_path(
            "https:dtjob-metrics:metrics", installed_operator, "metrics"
        )
    assert refused.value.status == 401 and 'realm="dtjob metrics"' in str(refused.value.headers), (
        refused.value
    )
    container = new_container(node_azurite)
    name = "in-cluster"
    started = time.monotonic()
    create_tiny_job(real_jobs, name, node_azurite, container)
    wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    print(f"[e2e] job under the Helm-installed operator succeeded in {time.monotonic() - started:.0f}s")
    assert_trained_together(run_metrics(node_azurite, container, real_jobs, name))
    uid = real_jobs.get(name)["metadata"]["uid"]
    # The operator in its pod reached Azurite too: it uploaded every pod's log. The logs land one blob at a
    # time, so wait for the whole set rather than the first.
    prefix = f"runs/{real_jobs.ns}/{name}/{uid}/logs/"

    def every_log() -> list[str] | None:
        logs = list(blob_names(node_azurite, container, prefix))
        workers = [n for n in logs if n.endswith((f"{name}-worker-0.log", f"{name}-worker-1.log"))]
        launchers = [n for n in logs if n == f"{prefix}{name}-launcher.log"]
        return logs if len(workers) == 2 and launchers else None

    wait_for(every_log, timeout=60, what="the launcher's and both workers' logs uploaded by the operator")
    statuses = core.read_namespaced_pod(str(pod.metadata.name), installed_operator).status.container_statuses
    restarts = sum(int(s.restart_count) for s in statuses or [])
    assert restarts == 0, "the operator restarted (liveness probe or crash)"
