"""What an installer gets from the chart without asking, attacked as a tenant and as a network peer would:
the ServiceMonitor sends Prometheus's token only to a server that proves it is the operator; a namespaced
install (`watchNamespaces`) leaves the operator no Secrets or pods anywhere else; the installer's registry
credentials (`jobImagePullSecrets`) go only to pods that run the installer's own images.

One install for the module: the two tenants' namespaces are the watched ones, the ServiceMonitor is on, the
installer's pull Secret is named, and the operator serves /metrics with the certificate the chart made.
"""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from dtjob.runtime import serving_cert
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import Tenant, TenantCluster
from tests.security.test_metrics_scraping import scraper_token

Json = dict[str, Any]
INSTALLER_SECRET = "installer-registry"
# Another team's private image in the registry the installer's credentials open.
FOREIGN_IMAGE = "myacr.azurecr.io/team-b/private-model:3"


@pytest.fixture
def watched() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"watched-a-{suffix}", f"watched-b-{suffix}"


@pytest.fixture
def chart_sets(watched: tuple[str, str]) -> tuple[str, ...]:
    return (
        f"watchNamespaces={{{watched[0]},{watched[1]}}}",
        "metrics.serviceMonitor.enabled=true",
        f"jobImagePullSecrets={{{INSTALLER_SECRET}}}",
    )


@pytest.fixture
def tenant_a(cluster: TenantCluster, watched: tuple[str, str]) -> Tenant:
    return cluster.tenant(watched[0])


@pytest.fixture
def tenant_b(cluster: TenantCluster, watched: tuple[str, str]) -> Tenant:
    return cluster.tenant(watched[1])


def rendered(cluster: TenantCluster, kind: str, name: str) -> Json:
    return next(d for d in cluster.docs if d["kind"] == kind and d["metadata"]["name"] == name)


def deployment_pod(cluster: TenantCluster) -> Json:
    pod: Json = next(d for d in cluster.docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    return pod


@pytest.fixture
def operator_env(cluster: TenantCluster, tmp_path: Path) -> dict[str, str]:
    """The Secret the chart's Deployment mounts for the metrics server (if any), written where the operator
    reads it, as the kubelet would mount it."""
    pod = deployment_pod(cluster)
    if "--metrics-cert-dir=/etc/dtjob/metrics-tls" not in pod["containers"][0]["args"]:
        return {}  # the operator makes a certificate of its own at start
    volume = next(v for v in pod["volumes"] if v["name"] == "metrics-tls")
    secret = rendered(cluster, "Secret", volume["secret"]["secretName"])
    mounted = tmp_path / "metrics-tls"
    mounted.mkdir(mode=0o700)
    for key, value in secret["data"].items():
        (mounted / key).write_bytes(base64.b64decode(value))
    return {"DTJOB_METRICS_CERT_DIR": str(mounted)}


def scraper_context(cluster: TenantCluster, tls: Json) -> ssl.SSLContext:
    """A client that checks the server as the ServiceMonitor's tlsConfig tells Prometheus to."""
    context = ssl.create_default_context()
    if tls.get("insecureSkipVerify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    ca = tls["ca"]
    if "configMap" in ca:
        ref = ca["configMap"]
        pem = rendered(cluster, "ConfigMap", ref["name"])["data"][ref["key"]]
    else:
        ref = ca["secret"]
        pem = base64.b64decode(rendered(cluster, "Secret", ref["name"])["data"][ref["key"]]).decode()
    context.load_verify_locations(cadata=pem)
    return context


def scrape(context: ssl.SSLContext, port: int, server_name: str, token: str) -> int:
    """The status of GET /metrics over TLS to 127.0.0.1:`port`, the server checked for `server_name`."""
    request = (f"GET /metrics HTTP/1.1\r\nHost: {server_name}\r\nAuthorization: Bearer {token}\r\n"
               "Connection: close\r\n\r\n")  # fmt: skip
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(request.encode())
        return int(tls.recv(256).decode(errors="replace").split()[1])


def server_name(cluster: TenantCluster) -> str:
    """The metrics Service's name in cluster DNS."""
    [service] = [d for d in cluster.docs if d["kind"] == "Service"]
    return f"{service['metadata']['name']}.{cluster.release_ns}.svc"


@pytest.fixture
def impostor(cluster: TenantCluster) -> Iterator[tuple[int, list[bytes]]]:
    """A TLS server on loopback with a certificate of its own for the metrics Service's name, recording what
    it is sent."""
    cert, key = serving_cert.self_signed([server_name(cluster)])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    received.append(tls.recv(4096))
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], received
    finally:
        listener.close()
        thread.join(timeout=5)


def may_get_metrics(api_client: client.ApiClient, token: str) -> bool:
    """Whether the API server lets the token's user get /metrics yet (its RBAC cache has the binding): the
    operator remembers a verdict for a minute."""
    auth = client.AuthenticationV1Api(api_client)
    user = auth.create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
    ).status.user
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user.username, groups=user.groups,
            non_resource_attributes=client.V1NonResourceAttributes(path="/metrics", verb="get"),
        )
    )  # fmt: skip
    return bool(client.AuthorizationV1Api(api_client).create_subject_access_review(review).status.allowed)


def test_the_service_monitor_sends_prometheus_token_only_to_the_operator(
    cluster: TenantCluster,
    operator: OperatorProcess,
    api_client: client.ApiClient,
    impostor: tuple[int, list[bytes]],
) -> None:
    """Before: the ServiceMonitor skipped verification (insecureSkipVerify), so whoever could answer on the
    operator's address (a pod that took its IP, a spoofed endpoint) received Prometheus's token, which reads
    every namespace's training metrics."""
    [monitor] = [d for d in cluster.docs if d["kind"] == "ServiceMonitor"]
    [endpoint] = monitor["spec"]["endpoints"]
    tls = endpoint.get("tlsConfig") or {}
    assert endpoint["scheme"] == "https" and not tls.get("insecureSkipVerify"), tls
    name = tls["serverName"]
    assert name == server_name(cluster)
    context = scraper_context(cluster, tls)
    token = scraper_token(cluster, api_client)
    wait_for(partial(may_get_metrics, api_client, token), timeout=30, what="the scraper's binding in force")

    # The operator, with the certificate the chart made, passes the check and serves the scraper.
    assert scrape(context, operator.metrics_port, name, token) == 200
    # A server with a certificate of its own for that very name fails it before the token is sent.
    port, received = impostor
    with pytest.raises(ssl.SSLCertVerificationError):
        scrape(context, port, name, token)
    assert not any(token.encode() in r for r in received)
    # So does the operator's certificate for a name it was not issued for.
    with pytest.raises(ssl.SSLCertVerificationError):
        scrape(context, operator.metrics_port, f"{name.split('.')[0]}.elsewhere.svc", token)


def as_operator(operator: OperatorProcess) -> client.ApiClient:
    """A client with the operator's own token (the chart's ServiceAccount)."""
    api: client.ApiClient = config.new_client_from_config(config_file=operator.kubeconfig)
    return api


def refused(call: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        call(*args, **kwargs)
    except ApiException as err:
        assert err.status == 403, err
        return True
    return False


def installer_pull_secret(api_client: client.ApiClient, namespace: str) -> None:
    """The installer's part of jobImagePullSecrets: the Secret in each namespace jobs run in."""
    registry = client.V1Secret(
        metadata=client.V1ObjectMeta(name=INSTALLER_SECRET), type="kubernetes.io/dockerconfigjson",
        string_data={".dockerconfigjson": '{"auths": {}}'},
    )  # fmt: skip
    client.CoreV1Api(api_client).create_namespaced_secret(namespace, registry)


def probe_pod() -> client.V1Pod:
    container = client.V1Container(name="probe", image="busybox")
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="probe"), spec=client.V1PodSpec(containers=[container])
    )


def test_a_namespaced_install_holds_no_secrets_or_pods_outside_its_namespaces(
    cluster: TenantCluster,
    tenant_a: Tenant,
    operator: OperatorProcess,
    api_client: client.ApiClient,
) -> None:
    outside = cluster.tenant()  # a namespace the install does not serve, with a Secret of its own
    core = client.CoreV1Api(api_client)
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="db-password"), string_data={"password": "x"})
    core.create_namespaced_secret(outside.namespace, secret)

    mine = client.CoreV1Api(as_operator(operator))
    assert refused(mine.read_namespaced_secret, "db-password", outside.namespace)
    assert refused(mine.list_namespaced_secret, outside.namespace)
    assert refused(mine.list_secret_for_all_namespaces)
    assert refused(mine.create_namespaced_pod, outside.namespace, probe_pod(), dry_run="All")
    assert refused(mine.list_namespaced_pod, outside.namespace)
    assert refused(mine.list_pod_for_all_namespaces)
    # Every rule the operator holds there, as the API server resolves them: none reaches a Secret or a pod.
    review = client.AuthorizationV1Api(as_operator(operator)).create_self_subject_rules_review(
        client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace=outside.namespace))
    )
    reaching = [r for r in review.status.resource_rules
                if {"*", "secrets", "pods", "pods/exec", "pods/log"} & set(r.resources or ())]  # fmt: skip
    assert reaching == [], reaching
    # In a namespace it serves its RBAC lets it create pods (its guard, only those of a job), and a job runs.
    may = client.AuthorizationV1Api(as_operator(operator)).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb="create", resource="pods", namespace=tenant_a.namespace)))
    )  # fmt: skip
    assert may.status.allowed, may.status
    installer_pull_secret(api_client, tenant_a.namespace)
    tenant_a.jobs().create("served", workers=1, gpusPerWorker=1)
    Jobs(api_client, tenant_a.namespace).wait_phase("served", "Running", timeout=120)


def pull_secrets(pod: client.V1Pod) -> list[str]:
    return [str(s.name) for s in pod.spec.image_pull_secrets or ()]


def test_a_tenants_own_image_gets_none_of_the_installers_pull_secrets(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """Before: every pod of every job got the installer's registry credentials, so a tenant pulled any image
    they open (another team's private model) by naming it in spec.image."""
    installer_pull_secret(api_client, tenant_a.namespace)
    tenant_a.jobs().create("borrowed", workers=1, gpusPerWorker=1, image=FOREIGN_IMAGE)
    sidecar = {"template": {"spec": {"containers": [{"name": "exporter", "image": FOREIGN_IMAGE}]}}}
    tenant_a.jobs().create("sidecar", workers=1, gpusPerWorker=1, worker=sidecar)
    tenant_a.jobs().create("stock", workers=1, gpusPerWorker=1)
    jobs = Jobs(api_client, tenant_a.namespace)
    launchers: dict[str, client.V1Pod] = {}
    for name in ("borrowed", "sidecar", "stock"):
        jobs.wait_phase(name, "Running", timeout=120)
        launchers[name] = wait_for(partial(jobs.launcher, name), timeout=30, what=f"{name}'s launcher")

    [worker] = jobs.pods("borrowed", "worker")
    assert pull_secrets(worker) == [] and pull_secrets(launchers["borrowed"]) == []
    # A template container of another image keeps them off that pod; the launcher runs the installer's.
    [worker] = jobs.pods("sidecar", "worker")
    assert pull_secrets(worker) == []
    assert pull_secrets(launchers["sidecar"]) == [INSTALLER_SECRET]
    # A job on the installer's images is what they are for.
    [worker] = jobs.pods("stock", "worker")
    assert pull_secrets(worker) == [INSTALLER_SECRET]
    assert pull_secrets(launchers["stock"]) == [INSTALLER_SECRET]
