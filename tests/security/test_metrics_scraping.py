"""/metrics names every namespace's jobs and their progress: only a scraper the installer bound to the chart's
`<release>-metrics-reader` role reads it. Attacked with the tokens a tenant has (its own ServiceAccounts'),
against the operator as the chart runs it (HTTPS, TokenReview and SubjectAccessReview by the API server)."""

from __future__ import annotations

import http.client
import re
import secrets
import ssl
import time

from dtjob.runtime.metrics_access import REVIEW_BURST, REVIEWS_PER_SECOND
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import OperatorProcess
from testbed.tenancy import EDITOR, Tenant, TenantCluster, service_account_token


def scrape(port: int, token: str | None, path: str = "/metrics") -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = (
        ssl.CERT_NONE
    )  # the operator's self-signed certificate; its verification is the chart's
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def scraper_token(cluster: TenantCluster, api_client: client.ApiClient) -> str:
    """A Prometheus's ServiceAccount, bound by the installer to the chart's metrics-reader ClusterRole."""
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    namespace, account = cluster.release_ns, "prometheus"
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
    )
    name = cluster.cluster_role("metrics-reader")
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=f"{name}-prometheus"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        )
    )
    cluster.cluster_scoped.append(("ClusterRoleBinding", f"{name}-prometheus"))
    return service_account_token(core, namespace, account)


def reviews_made(page: str) -> int:
    """The TokenReviews the operator has sent, from its own request counter."""
    pattern = r'dtjob_kube_api_request_duration_seconds_count\{resource="tokenreviews",verb="create"\} (\S+)'
    found = re.search(pattern, page)
    return int(float(found.group(1))) if found else 0


def test_a_tenants_token_reads_no_metrics_under_any_path(
    cluster: TenantCluster,
    tenant_a: Tenant,
    tenant_b: Tenant,
    operator: OperatorProcess,
    api_client: client.ApiClient,
) -> None:
    """Before: the guard reviewed the path the caller sent, and the page was served on every path; every
    authenticated user may get /version, so any pod's token read every namespace's jobs there."""
    tenant_b.jobs().create("secret-project", workers=1, gpusPerWorker=1)
    port = operator.metrics_port
    reader = scraper_token(cluster, api_client)

    def names_the_job() -> bool:
        status, page = scrape(port, reader)
        return status == 200 and f'namespace="{tenant_b.namespace}"' in page

    wait_for(names_the_job, timeout=60, what="the scraper's page naming tenant B's job")
    # A token of tenant A's: what a pod running as its ServiceAccount holds.
    attacker = tenant_a.tokens[EDITOR]
    for path in ("/version", "/healthz", "/livez", "/readyz", "/openapi/v2", "/", "/metrics/", "/metrics/x"):
        status, page = scrape(port, attacker, path)
        assert status == 404, (path, status, page[:200])
        assert tenant_b.namespace not in page and "dtjob_" not in page, path
    status, page = scrape(port, attacker)
    assert status == 403 and "dtjob_" not in page, (status, page[:200])
    # The scraper is served at /metrics only as well.
    assert scrape(port, reader, "/version")[0] == 404


def test_made_up_tokens_cannot_make_the_operator_flood_the_api_server(
    cluster: TenantCluster, tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """Before: every token the operator had not seen cost a TokenReview, however many a caller sprayed."""
    port = operator.metrics_port
    reader = scraper_token(cluster, api_client)
    assert scrape(port, reader)[0] == 200
    before = reviews_made(scrape(port, reader)[1])
    started = time.monotonic()
    answers = [scrape(port, secrets.token_urlsafe(32))[0] for _ in range(150)]
    elapsed = time.monotonic() - started
    status, page = scrape(port, reader)
    assert status == 200, "the installer's scraper, remembered, is served during the flood"
    sent = reviews_made(page) - before
    # At most the burst and one a second: the rest answered 429 without asking the API server.
    bound = REVIEW_BURST + REVIEWS_PER_SECOND * elapsed
    assert sent <= bound, f"{sent} TokenReviews for 150 made-up tokens in {elapsed:.1f} s (bound {bound:.0f})"
    assert set(answers) <= {401, 429} and answers.count(429) >= 150 - bound, answers
