"""The API requests of one client, as the API server itself counts them.

The client under test runs as a ServiceAccount of its own (bound to cluster-admin, as an operator's wide
role would be). Three FlowSchemas classify that account's requests, its writes (create, update, patch,
delete), its reads (get, list, watch) and its Lease renewals, into a priority level of their own, so the API
server's `apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}` counts them apart from
everything else on the cluster: kwok's pod statuses, the scheduler's bindings, the Job controller's pods,
the bench's own creates and watches. A watch counts once, when it is opened; a log read is long-running,
which flow control leaves alone, and is not counted. The count needs API Priority and Fairness on
(`CLUSTER_APF=1` for hack/cluster.sh).

The priority level is as wide as the built-in ones together (its nominal shares), so classifying the
client's requests never queues them: a run measures the client, not the classification.
"""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

IDENTITY = "bench-operator"
NAMESPACE = "default"
FLOWCONTROL = ("flowcontrol.apiserver.k8s.io", "v1")
WRITES = f"{IDENTITY}-writes"
READS = f"{IDENTITY}-reads"
VERBS = {WRITES: ["create", "update", "patch", "delete", "deletecollection"], READS: ["get", "list", "watch"]}
# Leader election's Lease renewals, a write every few seconds whatever the jobs do, counted apart (before the
# other two): dtjob runs here without it, mpi-operator always with it.
LEASES = f"{IDENTITY}-leases"
# Before every built-in schema but `exempt` (1) and `probes` (2), neither of which a ServiceAccount matches.
PRECEDENCE = 100
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"
TOKEN_SECONDS = 4 * 3600


@dataclass(frozen=True)
class Requests:
    """Requests the client made: writes and reads (of anything but Leases), and those of its Leases."""

    writes: float
    reads: float
    leases: float = 0.0

    def __sub__(self, other: Requests) -> Requests:
        return Requests(self.writes - other.writes, self.reads - other.reads, self.leases - other.leases)


def set_up(api: client.ApiClient, admin_kubeconfig: str) -> Path:
    """The account, its binding, its priority level and schemas (each kept if it exists); returns a
    kubeconfig that acts as it (a token of TOKEN_SECONDS), for the client under test."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    custom = client.CustomObjectsApi(api)
    _tolerating(409, core.create_namespaced_service_account, NAMESPACE, {"metadata": {"name": IDENTITY}})
    _tolerating(409, rbac.create_cluster_role_binding, {
        "metadata": {"name": IDENTITY},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": NAMESPACE}],
    })  # fmt: skip
    _tolerating(409, custom.create_cluster_custom_object, *FLOWCONTROL, "prioritylevelconfigurations", {
        "apiVersion": "/".join(FLOWCONTROL), "kind": "PriorityLevelConfiguration",
        "metadata": {"name": IDENTITY},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 250, "lendablePercent": 0,
            "limitResponse": {
                "type": "Queue", "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 50},
            },
        }},
    })  # fmt: skip
    account = {"kind": "ServiceAccount", "serviceAccount": {"name": IDENTITY, "namespace": NAMESPACE}}
    _tolerating(409, custom.create_cluster_custom_object, *FLOWCONTROL, "flowschemas", {
        "apiVersion": "/".join(FLOWCONTROL), "kind": "FlowSchema", "metadata": {"name": LEASES},
        "spec": {
            "priorityLevelConfiguration": {"name": IDENTITY},
            "matchingPrecedence": PRECEDENCE - 1,
            "rules": [{"subjects": [account], "resourceRules": [{
                "verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "namespaces": ["*"],
            }]}],
        },
    })  # fmt: skip
    for schema, verbs in VERBS.items():
        # Discovery (/api, /apis) is a read too.
        non_resource = [{"verbs": ["get"], "nonResourceURLs": ["*"]}] if schema == READS else []
        _tolerating(409, custom.create_cluster_custom_object, *FLOWCONTROL, "flowschemas", {
            "apiVersion": "/".join(FLOWCONTROL), "kind": "FlowSchema", "metadata": {"name": schema},
            "spec": {
                "priorityLevelConfiguration": {"name": IDENTITY},
                "matchingPrecedence": PRECEDENCE,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [account],
                    "resourceRules": [{"verbs": verbs, "apiGroups": ["*"], "resources": ["*"],
                                       "namespaces": ["*"], "clusterScope": True}],
                    "nonResourceRules": non_resource,
                }],
            },
        })  # fmt: skip
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    token = core.create_namespaced_service_account_token(IDENTITY, NAMESPACE, request).status.token
    return kubeconfig_as(admin_kubeconfig, str(token))


def tear_down(api: client.ApiClient, account_kubeconfig: Path) -> None:
    """Everything set_up made, and the kubeconfig it wrote."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    custom = client.CustomObjectsApi(api)
    for schema in (LEASES, *VERBS):
        _tolerating(404, custom.delete_cluster_custom_object, *FLOWCONTROL, "flowschemas", schema)
    _tolerating(
        404, custom.delete_cluster_custom_object, *FLOWCONTROL, "prioritylevelconfigurations", IDENTITY
    )
    _tolerating(404, rbac.delete_cluster_role_binding, IDENTITY)
    _tolerating(404, core.delete_namespaced_service_account, IDENTITY, NAMESPACE)
    account_kubeconfig.unlink(missing_ok=True)


def counting(admin_kubeconfig: str) -> bool:
    """Whether the API server counts what it dispatches: without API Priority and Fairness it counts nothing,
    and every client would read as making no request."""
    return f"{DISPATCHED}{{" in _metrics(admin_kubeconfig)


def dispatched(admin_kubeconfig: str) -> Requests:
    """The account's requests the API server has dispatched so far."""
    return counted(_metrics(admin_kubeconfig))


def counted(metrics_text: str) -> Requests:
    """The account's counters on the API server's metrics page."""
    return Requests(
        _counter(metrics_text, WRITES), _counter(metrics_text, READS), _counter(metrics_text, LEASES)
    )


def settled(admin_kubeconfig: str, quiet_s: float = 5.0, timeout_s: float = 180.0) -> Requests:
    """The count once the client has made no request for `quiet_s` (it finished what the jobs asked of it),
    or at `timeout_s`. Lease renewals do not count as activity."""
    last, since = dispatched(admin_kubeconfig), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = dispatched(admin_kubeconfig)
        if (now.writes, now.reads) != (last.writes, last.reads):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    return last


def _counter(metrics_text: str, schema: str) -> float:
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(DISPATCHED + "{") and f'flow_schema="{schema}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metrics(admin_kubeconfig: str) -> str:
    argv = ["kubectl", "--kubeconfig", admin_kubeconfig, "get", "--raw", "/metrics"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _tolerating(status: int, call: Any, *args: Any) -> None:
    """call(*args), where an answer of `status` is as good as success (409: it exists; 404: it is gone)."""
    try:
        call(*args)
    except client.ApiException as e:
        if e.status != status:
            raise


def kubeconfig_as(admin_kubeconfig: str, token: str) -> Path:
    """The admin kubeconfig's current cluster (server, CA), with the token as its only user."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = dict(next(c for c in admin["clusters"] if c["name"] == current["cluster"])["cluster"])
    ca = cluster.pop("certificate-authority", None)
    if ca is not None:  # inline, so the file stands alone
        cluster["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": IDENTITY,
        "clusters": [{"name": IDENTITY, "cluster": cluster}],
        "users": [{"name": IDENTITY, "user": {"token": token}}],
        "contexts": [{"name": IDENTITY, "context": {"cluster": IDENTITY, "user": IDENTITY}}],
    }  # fmt: skip
    handle, name = tempfile.mkstemp(prefix=f"{IDENTITY}-", suffix=".kubeconfig")
    os.close(handle)
    path = Path(name)
    path.write_text(yaml.safe_dump(config))
    return path


def per_job(requests: Requests, jobs: int) -> str:
    leases = f" (and {requests.leases:.0f} of its Lease)" if requests.leases else ""
    return f"{requests.writes / jobs:.2f} writes, {requests.reads / jobs:.2f} reads per job{leases}"
