"""/metrics served securely (--metrics-secure): HTTPS, and only to a caller whose bearer token the real API
server accepts and whose user may `get` /metrics, as the chart's ServiceMonitor and metrics-reader role set
it up for a Prometheus. Before: anyone who reached the port read every namespace's job names and progress."""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_METRICS_SECURE": "true"}


def token_of(core: client.CoreV1Api, namespace: str, account: str) -> str:
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
    )
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    answer = core.create_namespaced_service_account_token(account, namespace, request)
    return str(answer.status.token)


@contextlib.contextmanager
def metrics_reader(api_client: client.ApiClient, namespace: str, account: str) -> Iterator[None]:
    """The ClusterRole a Prometheus needs (as the chart's <release>-metrics-reader), bound to `account`."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    name = f"metrics-reader-{uuid.uuid4().hex[:8]}"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=name),
            rules=[client.V1PolicyRule(non_resource_urls=["/metrics"], verbs=["get"])],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        )
    )
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def scrape(port: int, token: str | None, path: str = "/metrics") -> tuple[int, dict[str, str], str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the operator's self-signed certificate
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def still_open(connection: socket.socket) -> bool:
    """Whether the other end has not closed `connection` (no end of stream to read)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:  # nothing to read yet: open
        return True
    except ConnectionError:
        return False


def test_metrics_answer_only_callers_the_api_server_lets_get_metrics(
    api_client: client.ApiClient, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(api_client)
    jobs.create("counted", workers=1, gpusPerWorker=1)
    scraper, stranger = token_of(core, namespace, "scraper"), token_of(core, namespace, "stranger")
    port = operator.metrics_port
    with metrics_reader(api_client, namespace, "scraper"):
        status, headers, _ = scrape(port, None)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (status, headers)
        assert scrape(port, "not-a-token")[0] == 401
        assert scrape(port, stranger)[0] == 403, "a valid token whose user may not get /metrics"
        # A client that connects and never speaks TLS holds one thread, never the server: the scrape is
        # answered while that client still holds its connection (the server drops a silent one only after
        # CLIENT_TIMEOUT_SECONDS), however long a busy machine takes to review the token.
        with socket.create_connection(("127.0.0.1", port)) as silent:
            status, _, body = scrape(port, scraper)
            assert still_open(silent), "the scrape was answered only once the silent client was dropped"
        assert status == 200, body
        deadline = time.monotonic() + 30
        while f'namespace="{namespace}"' not in body and time.monotonic() < deadline:
            time.sleep(1)
            status, _, body = scrape(port, scraper)
        assert status == 200 and f'namespace="{namespace}"' in body, "the page names the jobs"
    # Plain HTTP gets no page at all.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionError, TimeoutError):
            answer = plain.recv(4096)
            assert b"dtjob_" not in answer, answer[:200]


def test_the_charts_azure_monitor_scraper_reads_metrics_and_nothing_else(
    kubeconfig: str, api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The identity the chart gives Azure Managed Prometheus (metrics.azureMonitor), installed as rendered:
    the token the API server fills into its Secret reads the secure /metrics and may do nothing else."""
    release = f"dtjob-{uuid.uuid4().hex[:6]}"  # the chart names its objects after a release so named
    rendered = subprocess.run(
        [tool("helm"), "template", release, str(REPO / "charts" / "dtjob"), "--namespace", namespace,
         "--set", "metrics.azureMonitor.enabled=true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    scraper = f"{release}-metrics-scraper"
    wanted = {scraper, f"{scraper}-token", f"{release}-metrics-reader"}
    objects = [d for d in docs if d["metadata"]["name"] in wanted and d["kind"] != "ServiceMonitor"]
    assert sorted(d["kind"] for d in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
        "ServiceAccount",
    ]
    applied = subprocess.run(
        [tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "-f", "-"],
        input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    try:

        def filled() -> str | None:
            data = core.read_namespaced_secret(f"{scraper}-token", namespace).data or {}
            return base64.b64decode(data["token"]).decode() if "token" in data else None

        token = wait_for(filled, timeout=60, interval=0.5, what="the scraper's token")
        status, _, body = scrape(operator.metrics_port, token)
        assert status == 200 and "dtjob_" in body, (status, body[:200])
        # The same token asks the API server what else it may do: nothing of the namespace's.
        as_scraper = client.Configuration()
        as_scraper.host = api_client.configuration.host
        as_scraper.ssl_ca_cert = api_client.configuration.ssl_ca_cert
        as_scraper.api_key = {"authorization": f"Bearer {token}"}
        review = client.AuthorizationV1Api(client.ApiClient(as_scraper)).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        namespace=namespace, verb="get", resource="secrets"
                    )
                )
            )
        )
        assert review.status.allowed is False, "the scraper may read Secrets"
    finally:
        rbac.delete_cluster_role_binding(scraper)
        rbac.delete_cluster_role(f"{release}-metrics-reader")
