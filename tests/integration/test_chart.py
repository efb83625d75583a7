"""The Helm chart, rendered and installed by real helm into the real API server, with least-privilege RBAC."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob.cli.operator import DEFAULT_METRICS_PORT
from dtjob.config import (
    DEFAULT_IMAGES,
    DEFAULT_LOG_CAP_BYTES,
    DEFAULT_STAGER_IMAGE,
    ElectionTimings,
    load_config,
)
from kubernetes import client

from testbed.cache import cache_root
from testbed.gang_scheduler import delete_crd, install_crd_file, pinned
from testbed.kube_wait import wait_for
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration
CHART = REPO / "charts" / "dtjob"
LEASE_ROLE = "dtjob-leader-election"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"


def helm(kubeconfig: str, *args: str) -> str:
    result = subprocess.run(
        [tool("helm"), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def template(
    *sets: str, json_sets: tuple[str, ...] = (), namespace: str = "dtjob-system"
) -> subprocess.CompletedProcess[str]:
    args = [tool("helm"), "template", "dtjob", str(CHART), "--namespace", namespace, "--include-crds"]
    for value in sets:
        args += ["--set", value]
    for value in json_sets:
        args += ["--set-json", value]
    return subprocess.run(args, capture_output=True, text=True)


def render(
    *sets: str, json_sets: tuple[str, ...] = (), namespace: str = "dtjob-system"
) -> list[dict[str, Any]]:
    done = template(*sets, json_sets=json_sets, namespace=namespace)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kind(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == name]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    return found


def job_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles for the jobs' objects (the leader election's Role aside)."""
    return [d for d in docs if d["kind"].endswith("Role") and d["metadata"]["name"] != LEASE_ROLE]


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
    assert {d["kind"] for d in job_roles(default)} == {"ClusterRole"}
    deployment = next(d for d in default if d["kind"] == "Deployment")
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    scoped = render("watchNamespaces={ml-a,ml-b}")
    roles = sorted(d["metadata"]["namespace"] for d in job_roles(scoped) if d["kind"] == "Role")
    assert roles == ["ml-a", "ml-b"]
    args = next(d for d in scoped if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--watch-namespace=ml-a" in args and "--watch-namespace=ml-b" in args
    assert "--all-namespaces" not in args and not any(a.startswith("--namespace") for a in args)


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def test_storage_policy_and_network_policy_reach_the_operator() -> None:
    default = operator_env(render())
    # Safe defaults: no storage account, reading any container of an allowed one, writing none, no explicit
    # client ID, no policy.
    assert default["DTJOB_ALLOWED_STORAGE_ACCOUNTS"] == ""
    assert default["DTJOB_READ_CONTAINERS"] == "*"
    assert default["DTJOB_WRITE_CONTAINERS"] == ""
    assert default["DTJOB_ALLOWED_CLIENT_IDS"] == ""
    assert default["DTJOB_NETWORK_POLICY"] == "false"
    client_id = "0b7f7c3e-1d2a-4c5b-9e8f-123456789abc"
    env = operator_env(render(
        "storagePolicy.accounts={teamadata,shared}", "storagePolicy.readContainers={imagenet}",
        "storagePolicy.writeContainers[0]=results-{namespace}",
        f"storagePolicy.clientIds={{{client_id}}}", "networkPolicy.enabled=true",
    ))  # fmt: skip
    assert env["DTJOB_ALLOWED_STORAGE_ACCOUNTS"] == "teamadata,shared"
    assert env["DTJOB_READ_CONTAINERS"] == "imagenet"
    assert env["DTJOB_WRITE_CONTAINERS"] == "results-{namespace}"
    # The former name of readContainers still works.
    assert operator_env(render("storagePolicy.containers={runs}"))["DTJOB_READ_CONTAINERS"] == "runs"
    assert env["DTJOB_ALLOWED_CLIENT_IDS"] == client_id
    assert env["DTJOB_NETWORK_POLICY"] == "true"
    # Tokens live as long as each job asks (up to 7 days) unless the installer caps them.
    assert default["DTJOB_SAS_LIFETIME_MAX_SECONDS"] == "0"
    capped = operator_env(render("storagePolicy.maxSasLifetimeSeconds=3600"))
    assert load_config(capped).sas_lifetime_max_seconds == 3600
    # A values file's number is a float to helm (rendered 1e+06 from a million before the schema's bound and
    # int64): the longest cap the schema takes reaches the operator as a whole number of seconds.
    week = operator_env(render(json_sets=("storagePolicy.maxSasLifetimeSeconds=604800",)))
    assert week["DTJOB_SAS_LIFETIME_MAX_SECONDS"] == "604800"
    # Any NFS share by default; a list the installer sets reaches the operator, an empty one too (none).
    assert default["DTJOB_NFS_SHARES"] == "*"
    shares = operator_env(render("storagePolicy.nfsShares={10.0.0.4:/export/a,files.internal}"))
    assert load_config(shares).nfs_shares.entries == ("10.0.0.4:/export/a", "files.internal")
    assert operator_env(render(json_sets=("storagePolicy.nfsShares=[]",)))["DTJOB_NFS_SHARES"] == ""


def nfs_policy(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,), (binding,) = (
        [d for d in kind(docs, k) if d["metadata"]["name"].endswith("-nfs-shares")]
        for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    )
    return policy, binding


def test_the_nfs_share_policy_reads_the_operators_list_and_binds_the_namespaces_it_serves() -> None:
    """The admission policy (its CEL run by the API server in tests/security/test_nfs_admission.py) embeds the
    list the operator reads, binds every namespace of a cluster-wide install and only the served ones of a
    scoped install, fails open (the operator judges either way), and is left out when turned off."""
    for docs, shares in (
        (render(), "*"),
        (
            render("storagePolicy.nfsShares={10.0.0.4:/export/a,files.internal}"),
            "10.0.0.4:/export/a,files.internal",
        ),
        (render(json_sets=("storagePolicy.nfsShares=[]",)), ""),
    ):
        policy, binding = nfs_policy(docs)
        assert operator_env(docs)["DTJOB_NFS_SHARES"] == shares
        entries = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "entries")
        assert f": {json.dumps(shares)})" in entries, entries
        assert policy["spec"]["failurePolicy"] == "Ignore"
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    _, scoped = nfs_policy(render("watchNamespaces={ml-a,ml-b}"))
    selector = scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-a", "ml-b"]}]
    off = render("admissionPolicy.enabled=false")
    assert not [d for d in off if d["metadata"]["name"].endswith("-nfs-shares")]


def test_requiring_a_pod_security_level_is_asked_for_and_binds_the_served_namespaces() -> None:
    """Off by default (it refuses jobs in every namespace not labelled yet); its CEL runs in the real API
    server in tests/security/test_pod_security_required.py."""
    assert not [d for d in render() if d["metadata"]["name"].endswith("-pod-security")]
    docs = render("admissionPolicy.requirePodSecurity=true", "watchNamespaces={ml}")
    policies = [d for d in docs if d["metadata"]["name"].endswith("-pod-security")]
    assert sorted(d["kind"] for d in policies) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    binding = next(d for d in policies if d["kind"] == "ValidatingAdmissionPolicyBinding")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml"]}]


def test_the_operator_guard_binds_the_operators_own_service_account_and_fails_closed() -> None:
    """The guard's CEL runs in the real API server in tests/security/test_operator_guard.py (and every attack
    there runs the operator under it); here: whom it binds, where, and that it can be turned off."""
    docs = render(
        "serviceAccount.name=dtjob-op", "operatorGuard.protectedNamespaces={kube-system,calico-system}"
    )
    guards = [d for d in kind(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"].endswith("-guard")]
    assert len(guards) == 1
    guard = guards[0]["spec"]
    assert guard["failurePolicy"] == "Fail"
    (condition,) = guard["matchConditions"]
    assert (
        condition["expression"]
        == 'request.userInfo.username == "system:serviceaccount:dtjob-system:dtjob-op"'
    )
    assert '["kube-system","calico-system"]' in guard["validations"][0]["expression"]
    off = render("operatorGuard.enabled=false")
    assert not [d for d in off if d["metadata"]["name"].endswith("-operator-guard")]

    def validations(*sets: str) -> list[str]:
        (policy,) = [d for d in kind(render(*sets), "ValidatingAdmissionPolicy")
                     if d["metadata"]["name"].endswith("-guard")]  # fmt: skip
        return [v["expression"] for v in policy["spec"]["validations"]]

    # null drops the key (helm), which the schema lets by: no namespace protected, and CEL that compiles.
    assert validations("operatorGuard.protectedNamespaces=null")[0] == "!(request.namespace in [])"
    assert not [e for e in validations() if e.startswith("request.namespace in")]
    assert 'request.namespace in ["ml","cv"]' in validations("watchNamespaces={ml,cv}")
    assert not [e for e in validations() if "pod-security.kubernetes.io/enforce" in e]
    assert [e for e in validations("admissionPolicy.requirePodSecurity=true")
            if "pod-security.kubernetes.io/enforce" in e]  # fmt: skip
    refused = template("admissionPolicy.enabled=false", "admissionPolicy.requirePodSecurity=true")
    assert refused.returncode != 0 and "needs admissionPolicy.enabled" in refused.stderr


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


# A mistyped key or a value of the wrong kind fails `helm template` (and install, upgrade, lint) naming it,
# instead of being ignored or reaching the operator.
SCHEMA_REFUSALS = {
    "imge.tag=1.0": "imge",
    "timeouts.kubernetes.readSecond=3": "readSecond",
    "resources.limit.memory=1Gi": "limit",
    "storagePolicy.account={a}": "account",
    "reconcileWorkers=many": "/reconcileWorkers",
    "reconcileWorkers=0": "/reconcileWorkers",
    "logLevel=loud": "/logLevel",
    "podLogCapBytes=1024": "/podLogCapBytes",
    "livenessPort=70000": "/livenessPort",
    "image.pullPolicy=Sometimes": "/image/pullPolicy",
    "networkPolicy.enabled=yes please": "/networkPolicy/enabled",
    "topologySpreadConstraints[0].whenUnsatisfiable=Maybe": "/topologySpreadConstraints/0/whenUnsatisfiable",
    "metrics.port=0": "/metrics/port",
    "metrics.servicemonitor.enabled=true": "servicemonitor",
    "metrics.serviceMonitor.interval=often": "/metrics/serviceMonitor/interval",
    "metrics.azureMonitor.caKey=../ca.crt": "/metrics/azureMonitor/caKey",
    "storagePolicy.maxSasLifetimeSeconds=60": "/storagePolicy/maxSasLifetimeSeconds",
    "storagePolicy.nfsShares={10.0.0.4:export}": "/storagePolicy/nfsShares/0",
    # An empty `from` lets every source in: /metrics names every namespace's jobs.
    "operatorNetworkPolicy.metricsFrom={}": "/operatorNetworkPolicy/metricsFrom",
    # Every pod of the release namespace that names no account runs as `default`: never the operator's rights.
    "serviceAccount.name=default": "/serviceAccount/name",
}


@pytest.mark.parametrize("value", SCHEMA_REFUSALS)
def test_the_values_schema_names_what_is_wrong(value: str) -> None:
    done = template(value)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "schema" in done.stderr and SCHEMA_REFUSALS[value] in done.stderr, done.stderr


def test_the_values_schema_covers_every_default_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(values)
    nested = [k for k, v in values.items() if isinstance(v, dict) and v and k != "global"]
    for key in nested:
        # Free-form Kubernetes objects (affinity, security contexts, ...) are left to the API server's schema.
        if schema["properties"][key].get("properties"):
            assert set(values[key]) <= set(schema["properties"][key]["properties"]), key
    render()  # the defaults pass


def images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every image the operator runs or puts into jobs, as the operator's own config reads them."""
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    config = load_config(operator_env(docs))
    found = {fw: config.image_for(fw) for fw in ("pytorch", "tensorflow", "keras")}
    return {"operator": deployment["spec"]["template"]["spec"]["containers"][0]["image"], **found,
            "stager": config.stager_image}  # fmt: skip


def test_images_default_to_the_app_version_and_the_operators_own_defaults() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    found = images(render())
    assert found["operator"] == f"ghcr.io/dtjob/operator:{app_version}"
    assert {fw: found[fw] for fw in DEFAULT_IMAGES} == DEFAULT_IMAGES
    assert found["stager"] == DEFAULT_STAGER_IMAGE
    assert all(image.endswith(f":{app_version}") for image in found.values())
    assert images(render("image.tag=1.2.3"))["operator"] == "ghcr.io/dtjob/operator:1.2.3"


def test_global_image_registry_rewrites_every_image_the_chart_names() -> None:
    mirrored = images(render("global.imageRegistry=myacr.azurecr.io"))
    assert mirrored == {
        "operator": "myacr.azurecr.io/dtjob/operator:0.1.0",
        "pytorch": "myacr.azurecr.io/dtjob/horovod-pytorch:0.1.0",
        "tensorflow": "myacr.azurecr.io/dtjob/horovod-tensorflow:0.1.0",
        "keras": "myacr.azurecr.io/dtjob/horovod-tensorflow:0.1.0",
        "stager": "myacr.azurecr.io/dtjob/stager:0.1.0",
    }
    digest = "sha256:" + "a" * 64
    custom = images(render(
        "global.imageRegistry=mirror.example.com:5000/", f"image.digest={digest}",
        "trainingImages.pytorch=localhost/team/pt:2.1", "trainingImages.tensorflow=team/tf",
        "trainingImages.keras=keras", f"stagerImage=docker.io/library/stager@{digest}",
    ))  # fmt: skip
    assert custom == {
        "operator": f"mirror.example.com:5000/dtjob/operator@{digest}",
        "pytorch": "mirror.example.com:5000/team/pt:2.1",
        "tensorflow": "mirror.example.com:5000/team/tf:0.1.0",
        "keras": "mirror.example.com:5000/keras:0.1.0",
        "stager": f"mirror.example.com:5000/library/stager@{digest}",
    }


def test_the_pod_is_restricted_probed_and_spread_over_zones() -> None:
    deployment = next(d for d in render() if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["periodSeconds"] == 20
    # A preference for zones, selecting this release's operator pods.
    assert pod["topologySpreadConstraints"] == [{
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }]  # fmt: skip
    assert "priorityClassName" not in pod

    tuned = next(d for d in render(
        "priorityClassName=system-cluster-critical", "readinessProbe.periodSeconds=3",
        "podSecurityContext.fsGroup=65532", json_sets=("topologySpreadConstraints=[]",),
    ) if d["kind"] == "Deployment")["spec"]["template"]["spec"]  # fmt: skip
    assert tuned["priorityClassName"] == "system-cluster-critical"
    assert tuned["containers"][0]["readinessProbe"]["periodSeconds"] == 3
    assert tuned["securityContext"]["fsGroup"] == 65532
    assert "topologySpreadConstraints" not in tuned
    own = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"team": "ml"}}}  # fmt: skip
    docs = render(json_sets=(f"topologySpreadConstraints=[{json.dumps(own)}]",))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["topologySpreadConstraints"] == [own]  # a selector of one's own is kept as written


def test_metrics_port_service_and_container_port() -> None:
    docs = render()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert f"--metrics-port={DEFAULT_METRICS_PORT}" in container["args"]
    assert {"name": "metrics", "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"} in container["ports"]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["metadata"]["name"] == "dtjob-metrics"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": DEFAULT_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # The Service selects the operator's pods.
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # Opt-in: no ServiceMonitor (it needs prometheus-operator's CRDs) and no dashboard ConfigMap; the one
    # ConfigMap is the CA of the metrics server's certificate.
    assert not kind(docs, "ServiceMonitor")
    assert [d["metadata"]["name"] for d in kind(docs, "ConfigMap")] == ["dtjob-metrics-ca"]

    moved = render("metrics.port=9102")
    container = next(d for d in moved if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert "--metrics-port=9102" in container["args"]
    assert {"name": "metrics", "containerPort": 9102, "protocol": "TCP"} in container["ports"]
    assert next(d for d in moved if d["kind"] == "Service")["spec"]["ports"][0]["port"] == 9102


def test_metrics_disabled_leaves_no_port_open() -> None:
    docs = render(
        "metrics.enabled=false", "metrics.serviceMonitor.enabled=true", "metrics.dashboard.enabled=true"
    )
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert "--metrics-port=0" in container["args"]
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert not [d for d in docs if d["kind"] in ("Service", "ServiceMonitor", "ConfigMap")]


def test_the_service_monitor_scrapes_the_metrics_service() -> None:
    docs = render(
        "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=15s",
        "metrics.serviceMonitor.scrapeTimeout=10s", "metrics.serviceMonitor.labels.release=prometheus",
    )  # fmt: skip
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    service = next(d for d in docs if d["kind"] == "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["dtjob-system"]}
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "honorLabels": True,
            "interval": "15s",
            "scrapeTimeout": "10s",
            "scheme": "https",
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            # The certificate the chart made, verified (tests/security/test_install_defaults.py).
            "tlsConfig": {
                "ca": {"configMap": {"name": "dtjob-metrics-ca", "key": "ca.crt"}},
                "serverName": "dtjob-metrics.dtjob-system.svc",
            },
        }
    ]
    plain = render("metrics.secure=false", "metrics.serviceMonitor.enabled=true")
    endpoint = next(d for d in plain if d["kind"] == "ServiceMonitor")["spec"]["endpoints"][0]
    assert "scheme" not in endpoint and "bearerTokenFile" not in endpoint


def monitor_tls(*sets: str) -> dict[str, Any]:
    docs = render("metrics.serviceMonitor.enabled=true", *sets)
    tls: dict[str, Any] = kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]["tlsConfig"]
    return tls


def test_the_service_monitor_verifies_a_certificate_of_the_installers_and_skips_only_when_told() -> None:
    server_name = "dtjob-metrics.dtjob-system.svc"
    # cert-manager's Secret carries the CA that issued it as ca.crt.
    assert monitor_tls("metrics.certSecret=operator-metrics-tls") == {
        "ca": {"secret": {"name": "operator-metrics-tls", "key": "ca.crt"}},
        "serverName": server_name,
    }
    # A key of the installer's replaces the chart's whole: one CA source, never a ConfigMap and a Secret.
    mine = monitor_tls(
        "metrics.certSecret=operator-metrics-tls", "metrics.serviceMonitor.tlsConfig.ca.secret.name=corp-ca",
        "metrics.serviceMonitor.tlsConfig.ca.secret.key=root.pem",
    )  # fmt: skip
    assert mine == {"ca": {"secret": {"name": "corp-ca", "key": "root.pem"}}, "serverName": server_name}
    skipped = monitor_tls("metrics.serviceMonitor.tlsConfig.insecureSkipVerify=true")
    assert skipped["insecureSkipVerify"] is True


def server_dry_run(kubeconfig: str, objects: list[dict[str, Any]]) -> str:
    """`kubectl apply --dry-run=server --validate=strict` of `objects`: the API server's schemas judge them;
    its output."""
    applied = subprocess.run(
        [tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "--validate=strict",
         "-f", "-"],
        input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    return applied.stdout


def prometheus_operator_crd() -> Path:
    """prometheus-operator's ServiceMonitor CRD, as make gang-schedulers caches it."""
    version = pinned("PROMETHEUS_OPERATOR_VERSION")
    crds = cache_root() / "crds" / f"prometheus-operator-{version}"
    return crds / "monitoring.coreos.com_servicemonitors.yaml"


@pytest.fixture
def service_monitor_crd(kubeconfig: str) -> Iterator[None]:
    """prometheus-operator's ServiceMonitor CRD (cached by make gang-schedulers), served for the test."""
    install_crd_file(kubeconfig, prometheus_operator_crd(), SERVICE_MONITOR_CRD)
    try:
        yield
    finally:
        delete_crd(kubeconfig, SERVICE_MONITOR_CRD)


@pytest.mark.parametrize(
    "sets", [(), ("metrics.certSecret=operator-metrics-tls",)], ids=["made", "certSecret"]
)
def test_prometheus_operators_crd_accepts_the_service_monitor_and_it_names_what_exists(
    kubeconfig: str, namespace: str, service_monitor_crd: None, sets: tuple[str, ...]
) -> None:
    docs = render("metrics.serviceMonitor.enabled=true", *sets, namespace=namespace)
    objects = [d for d in docs if d["kind"] in ("ServiceMonitor", "Service", "ConfigMap", "Secret")]
    applied = server_dry_run(kubeconfig, objects)
    assert "servicemonitor.monitoring.coreos.com/dtjob created (server dry run)" in applied
    [monitor] = kind(docs, "ServiceMonitor")
    ca = monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]
    [(source, ref)] = ca.items()
    if sets:  # the installer's own Secret: not the chart's to render
        assert (source, ref) == ("secret", {"name": "operator-metrics-tls", "key": "ca.crt"})
        return
    # The CA the scraper reads is in the ServiceMonitor's namespace, as prometheus-operator requires.
    found = next(d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["name"])
    assert source == "configMap" and found["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    assert found["data"][ref["key"]].startswith("-----BEGIN CERTIFICATE-----")


AZURE_MONITOR_CRD = "servicemonitors.azmonitoring.coreos.com"


def test_the_azure_monitor_service_monitor_scrapes_as_its_own_reader_and_verifies_the_operator() -> None:
    docs = render("metrics.azureMonitor.enabled=true", "metrics.azureMonitor.interval=1m")
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]  # prometheus-operator's stays off
    service = next(d for d in docs if d["kind"] == "Service")
    assert monitor["apiVersion"] == "azmonitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    limits = ("labelLimit", "labelNameLengthLimit", "labelValueLengthLimit")
    assert [monitor["spec"][k] for k in limits] == [63, 511, 1023]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["interval"] == "1m" and endpoint["honorLabels"] is True
    # Its token: a Secret of the monitor's own namespace that the API server fills for a ServiceAccount the
    # chart binds to the metrics reader, and to nothing else.
    credentials = endpoint["authorization"]["credentials"]
    secret = next(d for d in kind(docs, "Secret") if d["metadata"]["name"] == credentials["name"])
    assert credentials["key"] == "token" and secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert account in {d["metadata"]["name"] for d in kind(docs, "ServiceAccount")}
    bindings = [
        d for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s["name"] == account for s in d.get("subjects") or ())
    ]  # fmt: skip
    assert [b["roleRef"]["name"] for b in bindings] == ["dtjob-metrics-reader"]
    reader = next(d for d in kind(docs, "ClusterRole") if d["metadata"]["name"] == "dtjob-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # The CA from where the managed stack reads TLS material, for the metrics Service's name.
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "ama-metrics-mtls-secret", "key": "dtjob-metrics-ca.crt"}},
        "serverName": "dtjob-metrics.dtjob-system.svc",
    }
    # Plain HTTP: no token to send, so no identity either.
    plain = render("metrics.secure=false", "metrics.azureMonitor.enabled=true")
    [endpoint] = kind(plain, "ServiceMonitor")[0]["spec"]["endpoints"]
    assert not {"scheme", "authorization", "tlsConfig"} & set(endpoint)
    assert not [d for d in plain if "metrics-scraper" in d["metadata"]["name"]]


@pytest.fixture
def azure_monitor_crd(kubeconfig: str, tmp_path: Path) -> Iterator[None]:
    """The managed stack's ServiceMonitor CRD: prometheus-operator's under the group azmonitoring.coreos.com,
    which is all that tells them apart (Azure Monitor's documentation of its custom resources)."""
    crd = yaml.safe_load(prometheus_operator_crd().read_text())
    crd["metadata"] = {"name": AZURE_MONITOR_CRD}
    crd["spec"]["group"] = "azmonitoring.coreos.com"
    path = tmp_path / "azmonitoring-servicemonitors.yaml"
    path.write_text(yaml.safe_dump(crd))
    install_crd_file(kubeconfig, path, AZURE_MONITOR_CRD)
    try:
        yield
    finally:
        delete_crd(kubeconfig, AZURE_MONITOR_CRD)


def test_the_azure_monitor_schema_accepts_the_chart_s_monitor(
    kubeconfig: str, namespace: str, azure_monitor_crd: None
) -> None:
    docs = render("metrics.azureMonitor.enabled=true", namespace=namespace)
    [monitor] = kind(docs, "ServiceMonitor")
    applied = server_dry_run(kubeconfig, [monitor])
    assert "servicemonitor.azmonitoring.coreos.com/dtjob created (server dry run)" in applied


def test_metrics_are_secure_by_default_with_the_reviews_they_need() -> None:
    docs = render()
    pod = kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert "--metrics-secure" in pod["containers"][0]["args"]
    # The certificate the chart made for the metrics Service, mounted where the operator reads it.
    assert "--metrics-cert-dir=/etc/dtjob/metrics-tls" in pod["containers"][0]["args"]
    assert {"name": "metrics-tls", "secret": {"secretName": "dtjob-metrics-tls"}} in pod["volumes"]
    [secret] = kind(docs, "Secret")
    assert secret["metadata"]["name"] == "dtjob-metrics-tls" and secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    [ca] = kind(docs, "ConfigMap")
    assert set(ca["data"]) == {"ca.crt"} and "PRIVATE KEY" not in ca["data"]["ca.crt"]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert roles["dtjob-metrics-auth"]["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    assert roles["dtjob-metrics-reader"]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "dtjob-metrics-auth"
    )
    assert binding["subjects"][0]["name"] == "dtjob"

    mounted = render("metrics.certSecret=operator-metrics-tls")
    pod = next(d for d in mounted if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--metrics-cert-dir=/etc/dtjob/metrics-tls" in pod["containers"][0]["args"]
    assert {"name": "metrics-tls", "secret": {"secretName": "operator-metrics-tls"}} in pod["volumes"]
    assert {"name": "metrics-tls", "mountPath": "/etc/dtjob/metrics-tls", "readOnly": True} in pod[
        "containers"
    ][0]["volumeMounts"]
    assert not kind(mounted, "Secret") and not kind(mounted, "ConfigMap")

    plain = render("metrics.secure=false")
    assert "--no-metrics-secure" in container(plain)["args"]
    assert not [a for a in container(plain)["args"] if a.startswith("--metrics-cert-dir")]
    assert not kind(plain, "Secret") and not kind(plain, "ConfigMap")
    names = {d["metadata"]["name"] for d in plain if d["kind"] in ("ClusterRole", "ClusterRoleBinding")}
    assert not names & {"dtjob-metrics-auth", "dtjob-metrics-reader"}
    lint = subprocess.run(
        [tool("helm"), "lint", "--strict", str(CHART), "--set", "metrics.serviceMonitor.enabled=true",
         "--set", "metrics.dashboard.enabled=true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_dashboard_config_map_carries_the_dashboard_for_grafanas_sidecar() -> None:
    docs = render("metrics.dashboard.enabled=true", "metrics.dashboard.annotations.grafana_folder=dtjob")
    config_map = next(d for d in kind(docs, "ConfigMap") if d["metadata"]["name"] == "dtjob-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "dtjob"}
    dashboard = json.loads((CHART / "dashboards" / "dtjob.json").read_text())
    assert json.loads(config_map["data"]["dtjob.json"]) == dashboard


def test_two_replicas_elect_a_leader_and_roll_one_at_a_time_behind_a_disruption_budget() -> None:
    docs = render()
    deployment = kind(docs, "Deployment")[0]
    spec, pod = deployment["spec"], deployment["spec"]["template"]
    assert spec["replicas"] == 2
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["strategy"] == rolling
    operator = container(docs)
    assert "--leader-elect" in operator["args"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in operator["env"] if "valueFrom" in e}
    assert fields == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        # A job in the operator's namespace may not run its pods as the operator's ServiceAccount.
        "DTJOB_SERVICE_ACCOUNT": "spec.serviceAccountName",
    }
    assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    # At most one replica evicted at a time, counted among the operator's own pods.
    [budget] = kind(docs, "PodDisruptionBudget")
    assert budget["metadata"]["namespace"] == "dtjob-system"
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "an unready replica holds no drain"
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # Preferably on different nodes, and a user's affinity replaces that.
    [spread] = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    mine = kind(render("affinity.nodeAffinity.x=1"), "Deployment")[0]["spec"]["template"]["spec"]["affinity"]
    assert mine == {"nodeAffinity": {"x": 1}}
    assert not kind(render("podDisruptionBudget.enabled=false"), "PodDisruptionBudget")


def test_the_lease_is_granted_in_the_release_namespace_only() -> None:
    docs = render("watchNamespaces={ml-a}")
    roles = {d["metadata"]["name"]: d for d in kind(docs, "Role")}
    lease_role = roles[LEASE_ROLE]
    assert lease_role["metadata"]["namespace"] == "dtjob-system"
    lease = operator_env(docs)["DTJOB_LEASE_NAME"]
    assert lease_role["rules"] == [  # its own Lease by name; a create names no object to RBAC
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]  # fmt: skip
    [binding] = [d for d in kind(docs, "RoleBinding") if d["roleRef"]["name"] == LEASE_ROLE]
    assert binding["metadata"]["namespace"] == "dtjob-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dtjob", "namespace": "dtjob-system"}]
    leases = [r for d in kind(docs, "Role") + kind(docs, "ClusterRole") for r in d["rules"]
              if "leases" in r.get("resources", [])]  # fmt: skip
    assert len(leases) == 2, "no other Role or ClusterRole grants leases"


def test_one_replica_without_leader_election_and_never_more() -> None:
    single = render("leaderElection.enabled=false", "replicaCount=1")
    assert "--no-leader-elect" in container(single)["args"]
    assert LEASE_ROLE not in {d["metadata"]["name"] for d in kind(single, "Role")}
    refused = template("leaderElection.enabled=false")
    assert refused.returncode != 0 and "replicaCount above 1 needs leaderElection.enabled" in refused.stderr


def test_the_lease_and_its_timings_reach_the_operator_config() -> None:
    chart, code = load_config(operator_env(render())), load_config({})
    assert chart.election == code.election == ElectionTimings()
    assert chart.lease_name == code.lease_name == "dtjob-operator"
    tuned = load_config(operator_env(render(
        "leaderElection.leaseDurationSeconds=30", "leaderElection.renewDeadlineSeconds=20",
        "leaderElection.retryPeriodSeconds=4",
    )))  # fmt: skip
    assert tuned.election == ElectionTimings(30, 20, 4)


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
    assert deployment.status.available_replicas == 2
    pods = client.CoreV1Api(api_client).list_namespaced_pod(release_ns).items
    # The operator lands on the system pool, never on a GPU node.
    assert [p.spec.node_name.startswith("aks-system-") for p in pods] == [True, True]
    policy = client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget(name, release_ns)
    assert policy.spec.max_unavailable == 1

    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "distributedtrainingjobs.dtjob.io"
    )
    assert crd.spec.names.short_names == ["dtj", "dtjob"]

    sa = f"system:serviceaccount:{release_ns}:{name}"
    assert can_i(kubeconfig, sa, "create", "pods", namespace)
    assert can_i(kubeconfig, sa, "patch", "distributedtrainingjobs.dtjob.io", namespace, subresource="status")
    assert can_i(kubeconfig, sa, "create", "jobs.batch", namespace)
    # Scoped to the watched namespace, and no more than the operator needs: kopf serves no resource, so it
    # reads no CRDs and watches no Namespaces.
    assert not can_i(kubeconfig, sa, "list", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert not can_i(kubeconfig, sa, "watch", "namespaces", None)
    assert not can_i(kubeconfig, sa, "create", "pods", "default")
    assert not can_i(kubeconfig, sa, "delete", "nodes", None)
    assert not can_i(kubeconfig, sa, "create", "clusterrolebindings.rbac.authorization.k8s.io", None)
    # The job itself is never written (status only), nor Secrets listed, nor pods replaced, nor Jobs patched.
    # Pods are patched only to take Kueue's finalizer off the operator's own ended workers.
    assert not can_i(kubeconfig, sa, "patch", "distributedtrainingjobs.dtjob.io", namespace)
    assert not can_i(kubeconfig, sa, "list", "secrets", namespace)
    assert can_i(kubeconfig, sa, "patch", "pods", namespace)
    assert not can_i(kubeconfig, sa, "update", "pods", namespace)
    assert not can_i(kubeconfig, sa, "patch", "jobs.batch", namespace)
    assert can_i(kubeconfig, sa, "get", "namespaces", None)
    # The leader Lease, in the release namespace only, by its name (a create names none to RBAC).
    env = {e.name: e.value for e in deployment.spec.template.spec.containers[0].env}
    lease = f"leases.coordination.k8s.io/{env['DTJOB_LEASE_NAME']}"
    for verb in ("get", "update"):
        assert can_i(kubeconfig, sa, verb, lease, release_ns)
        assert not can_i(kubeconfig, sa, verb, "leases.coordination.k8s.io/another", release_ns)
        assert not can_i(kubeconfig, sa, verb, lease, namespace)
    assert can_i(kubeconfig, sa, "create", "leases.coordination.k8s.io", release_ns)
    assert not can_i(kubeconfig, sa, "create", "leases.coordination.k8s.io", namespace)
    assert not can_i(kubeconfig, sa, "delete", "leases.coordination.k8s.io", release_ns)

    helm(kubeconfig, "uninstall", name, "--namespace", release_ns, "--wait")
    wait_for(
        lambda: not apps.list_namespaced_deployment(release_ns).items, timeout=60, what="Deployment removed"
    )
    # Helm keeps CRDs on uninstall, so jobs (and their data) survive an operator upgrade or removal.
    assert client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "distributedtrainingjobs.dtjob.io"
    )


def test_the_operators_metrics_port_is_open_only_to_the_scrapers() -> None:
    docs = render()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    spec = policy["spec"]
    assert (
        spec["podSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["policyTypes"] == ["Ingress"]
    health, metrics = spec["ingress"]
    assert health == {"ports": [{"port": 8080, "protocol": "TCP"}]}  # the kubelet's probes, from the node
    assert metrics["ports"] == [{"port": DEFAULT_METRICS_PORT, "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    scrapers = render(
        json_sets=('operatorNetworkPolicy.metricsFrom=[{"podSelector":{"matchLabels":{"app":"prom"}}}]',)
    )
    policy = next(d for d in scrapers if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"][1]["from"] == [{"podSelector": {"matchLabels": {"app": "prom"}}}]
    no_metrics = next(d for d in render("metrics.enabled=false") if d["kind"] == "NetworkPolicy")
    assert len(no_metrics["spec"]["ingress"]) == 1  # only the health port
    assert not [d for d in render("operatorNetworkPolicy.enabled=false") if d["kind"] == "NetworkPolicy"]


def test_workload_identity_labels_the_pods_and_annotates_the_service_account() -> None:
    client_id = "11111111-2222-3333-4444-555555555555"
    docs = render(f"workloadIdentity.clientId={client_id}", "serviceAccount.annotations.team=ml")
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"] == {
        "azure.workload.identity/client-id": client_id,
        "team": "ml",
    }
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    plain = render()
    assert "annotations" not in next(d for d in plain if d["kind"] == "ServiceAccount")["metadata"]
    labels = next(d for d in plain if d["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert "azure.workload.identity/use" not in labels
    refused = template("workloadIdentity.clientId=not-a-guid")
    assert refused.returncode != 0 and "workloadIdentity/clientId" in refused.stderr


def test_job_pull_secrets_reach_the_operators_environment() -> None:
    environment = {
        e["name"]: e.get("value") for e in container(render("jobImagePullSecrets={acr,mirror}"))["env"]
    }
    assert environment["DTJOB_IMAGE_PULL_SECRETS"] == "acr,mirror"
    assert "DTJOB_IMAGE_PULL_SECRETS" not in {e["name"] for e in container(render())["env"]}
    assert template("jobImagePullSecrets={Bad_Name}").returncode != 0
