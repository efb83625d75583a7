"""The chart's life in a cluster, as a platform team runs it, on the real API server: installed where the
`restricted` Pod Security Standard is enforced, its CRD upgraded by the documented step, `helm upgrade` from
the previous chart version under a running job, and `helm uninstall` leaving nothing behind but the CRD."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import CRD_FILE, Jobs, OperatorProcess
from tests.integration.test_chart import CHART, helm
from tests.tools import REPO, tool

pytestmark = pytest.mark.integration

# The last commit of chart version 0.1.0 (charts/dtjob and the crds/ it links); `helm upgrade` from it must
# leave running jobs alone. Needs the repository's history (a shallow clone lacks it).
PREVIOUS_CHART_COMMIT = "8cefa6487aa985de430621d2e40116aa29d525af"
# The CRD step before `helm upgrade` (charts/dtjob/README.md, README.md), run from the repository root.
CRD_UPGRADE = "kubectl apply --server-side --field-manager=dtjob-crds --force-conflicts -f crds/"
CRD_NAME = "distributedtrainingjobs.dtjob.io"
INSTANCE = "app.kubernetes.io/instance"


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("kubectl"), "--kubeconfig", kubeconfig, *args],
        input=stdin, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip


@pytest.fixture
def release(kubeconfig: str, core_v1: client.CoreV1Api) -> Iterator[tuple[str, str]]:
    """A release name of its own (its cluster-scoped objects are told apart by it) and a namespace for it,
    both removed at the end."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"dtjob-{suffix}", f"dtjob-system-{suffix}"
    try:
        yield name, namespace
    finally:
        subprocess.run(
            [tool("helm"), "--kubeconfig", kubeconfig, "uninstall", name, "-n", namespace, "--wait"],
            capture_output=True,
        )
        try:
            core_v1.delete_namespace(namespace)
        except ApiException as err:
            if err.status != 404:
                raise


def install(
    kubeconfig: str,
    chart: Path,
    verb: str,
    name: str,
    namespace: str,
    *sets: str,
    create: bool = False,
    reuse: bool = False,
) -> None:
    """helm install or upgrade, waiting for the Deployment; `sets` are --set values. An upgrade with `reuse`
    keeps the values set before, as charts/dtjob/README.md says to."""
    args = [verb, name, str(chart), "--namespace", namespace, "--wait", "--timeout", "120s"]
    if create:
        args.append("--create-namespace")
    if reuse:
        args.append("--reset-then-reuse-values")
    for value in sets:
        args += ["--set", value]
    helm(kubeconfig, *args)


def test_the_operator_pod_is_admitted_where_restricted_is_enforced(
    kubeconfig: str,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    release: tuple[str, str],
    namespace: str,
    simulated_pool: Any,
) -> None:
    name, release_ns = release
    labels = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}  # fmt: skip
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release_ns, labels=labels)))
    install(kubeconfig, CHART, "install", name, release_ns, f"watchNamespaces={{{namespace}}}")

    # The ReplicaSet controller created the pods (two replicas): Pod Security admission let them in.
    selector = f"{INSTANCE}={name}"
    pods = core_v1.list_namespaced_pod(release_ns, label_selector=selector).items
    assert len(pods) == 2
    events = core_v1.list_namespaced_event(release_ns).items
    assert not [e.message for e in events if e.reason == "FailedCreate"]
    replica_sets = client.AppsV1Api(api_client).list_namespaced_replica_set(release_ns).items
    assert [c.type for rs in replica_sets for c in rs.status.conditions or []] == []

    # The namespace does enforce: a pod of the Deployment's template is admitted, and refused once it allows
    # privilege escalation.
    spec = client.AppsV1Api(api_client).read_namespaced_deployment(name, release_ns).spec.template.spec
    body = client.V1Pod(metadata=client.V1ObjectMeta(name=f"{name}-probe"), spec=spec)
    core_v1.create_namespaced_pod(release_ns, body, dry_run="All")
    spec.containers[0].security_context.allow_privilege_escalation = True
    with pytest.raises(ApiException) as refused:
        core_v1.create_namespaced_pod(release_ns, body, dry_run="All")
    assert refused.value.status == 403 and "violates PodSecurity" in str(refused.value.body)


def test_helm_upgrade_keeps_the_metrics_certificate_the_chart_made_until_it_is_deleted(
    kubeconfig: str, core_v1: client.CoreV1Api, release: tuple[str, str], namespace: str, simulated_pool: Any
) -> None:
    """The chart reads its Secret back on upgrade (`lookup`): a new certificate on every upgrade would leave
    the operator serving one the ServiceMonitor's CA no longer vouches for."""
    name, release_ns = release
    watch = f"watchNamespaces={{{namespace}}}"
    install(kubeconfig, CHART, "install", name, release_ns, watch, create=True)

    def certificate() -> tuple[dict[str, str], str]:
        """The Secret's data and the ConfigMap's CA, which must be the Secret's."""
        secret = core_v1.read_namespaced_secret(f"{name}-metrics-tls", release_ns).data or {}
        ca = str((core_v1.read_namespaced_config_map(f"{name}-metrics-ca", release_ns).data or {})["ca.crt"])
        assert base64.b64decode(secret["ca.crt"]).decode() == ca
        return {k: str(v) for k, v in secret.items()}, ca

    made = certificate()
    install(kubeconfig, CHART, "upgrade", name, release_ns, watch, "logLevel=verbose")
    assert certificate() == made
    # Renewal as documented: delete the Secret, upgrade.
    core_v1.delete_namespaced_secret(f"{name}-metrics-tls", release_ns)
    install(kubeconfig, CHART, "upgrade", name, release_ns, watch)
    renewed = certificate()
    assert renewed[0]["tls.crt"] != made[0]["tls.crt"] and renewed[1] != made[1]


def strict_dry_run(
    kubeconfig: str, namespace: str, run_policy: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    spec = {"framework": "pytorch", "workers": 1, "gpusPerWorker": 1, "runPolicy": run_policy}
    job = {"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "metadata": {"name": "probe"},
           "spec": spec}  # fmt: skip
    return kubectl(
        kubeconfig, "create", "-n", namespace, "--dry-run=server", "--validate=strict", "-f", "-",
        stdin=json.dumps(job),
    )  # fmt: skip


def job_identity(jobs: Jobs, name: str) -> tuple[str, str, str]:
    job = jobs.get(name) or {}
    meta = job["metadata"]
    return meta["uid"], meta["resourceVersion"], json.dumps(job["spec"], sort_keys=True)


def test_the_documented_crd_step_upgrades_the_schema_and_leaves_jobs_alone(
    kubeconfig: str, jobs: Jobs, release: tuple[str, str], tmp_path: Path
) -> None:
    for doc in ("README.md", "charts/dtjob/README.md"):
        assert CRD_UPGRADE in (REPO / doc).read_text(), f"{doc} must document the CRD step"
    name, release_ns = release
    ns = jobs.ns
    install(kubeconfig, CHART, "install", name, release_ns, f"watchNamespaces={{{ns}}}", create=True)
    # The CRD as an older chart left it, written by Helm's create (an update, not a server-side apply):
    # runPolicy.startupDeadlineSeconds not there yet, and a field since dropped.
    crd = yaml.safe_load(CRD_FILE.read_text())
    run_policy = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "runPolicy"
    ]["properties"]
    del run_policy["startupDeadlineSeconds"]
    run_policy["retiredSeconds"] = {"type": "integer"}
    older = tmp_path / "older-crd.yaml"
    older.write_text(yaml.safe_dump(crd))
    new_field, dropped_field = {"startupDeadlineSeconds": 600}, {"retiredSeconds": 1}
    try:
        done = kubectl(kubeconfig, "replace", "--field-manager=helm", "-f", str(older))
        assert done.returncode == 0, done.stderr
        wait_for(lambda: "unknown field" in strict_dry_run(kubeconfig, ns, new_field).stderr, timeout=30,
                 what="the older schema served")  # fmt: skip
        assert strict_dry_run(kubeconfig, ns, dropped_field).returncode == 0
        jobs.create("kept", runPolicy={"backoffLimit": 1})
        before = job_identity(jobs, "kept")

        # helm upgrade alone leaves the CRD as it was.
        install(
            kubeconfig, CHART, "upgrade", name, release_ns, f"watchNamespaces={{{ns}}}", "logLevel=verbose"
        )
        assert "unknown field" in strict_dry_run(kubeconfig, ns, new_field).stderr

        done = kubectl(kubeconfig, *CRD_UPGRADE.split()[1:])
        assert done.returncode == 0, done.stderr
        wait_for(lambda: strict_dry_run(kubeconfig, ns, new_field).returncode == 0, timeout=30,
                 what="the new field accepted")  # fmt: skip
        # The schema is one field the apply takes over from Helm whole: what the new CRD drops goes too.
        assert "unknown field" in strict_dry_run(kubeconfig, ns, dropped_field).stderr

        def explain() -> str:
            done = kubectl(kubeconfig, "explain", "dtj.spec.runPolicy.startupDeadlineSeconds")
            return done.stdout if done.returncode == 0 else ""

        explained = wait_for(explain, timeout=60, what="kubectl explain of the new field")
        assert "StartupDeadlineExceeded" in explained
        assert job_identity(jobs, "kept") == before
        shown = kubectl(kubeconfig, "get", "crd", CRD_NAME, "-o", "json", "--show-managed-fields")
        live = json.loads(shown.stdout)
        managers = {(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]}
        assert ("dtjob-crds", "Apply") in managers
    finally:
        # The documented step also puts the current CRD back should the test fail half-way.
        kubectl(kubeconfig, *CRD_UPGRADE.split()[1:])


@pytest.fixture
def previous_chart(tmp_path: Path) -> Path:
    """Chart 0.1.0 from the repository's history, with the crds/ it links."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS_CHART_COMMIT, "charts/dtjob", "crds"],
        capture_output=True,
    )
    assert archive.returncode == 0, f"needs the repository's history: {archive.stderr.decode()}"
    tree = tmp_path / "previous"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    chart = tree / "charts" / "dtjob"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == "0.1.0"
    return chart


def job_and_children(jobs: Jobs, name: str) -> dict[str, tuple[str, ...]]:
    """uid, resourceVersion (and the spec) of the job and of everything it owns."""
    found: dict[str, tuple[str, ...]] = {"job": job_identity(jobs, name)}
    selector = f"dtjob.io/job-name={name}"
    listers: dict[str, Callable[..., Any]] = {
        "Pod": jobs.core.list_namespaced_pod, "Service": jobs.core.list_namespaced_service,
        "ConfigMap": jobs.core.list_namespaced_config_map, "Secret": jobs.core.list_namespaced_secret,
        "Job": jobs.batch.list_namespaced_job,
    }  # fmt: skip
    for kind, lister in listers.items():
        for item in lister(jobs.ns, label_selector=selector).items:
            found[f"{kind}/{item.metadata.name}"] = (item.metadata.uid, item.metadata.resource_version)
    return found


def test_helm_upgrade_from_the_previous_chart_leaves_a_running_job_untouched(
    kubeconfig: str,
    api_client: client.ApiClient,
    jobs: Jobs,
    release: tuple[str, str],
    previous_chart: Path,
    tmp_path: Path,
) -> None:
    name, release_ns = release
    watch = f"watchNamespaces={{{jobs.ns}}}"
    install(kubeconfig, previous_chart, "install", name, release_ns, watch, create=True)
    apps = client.AppsV1Api(api_client)
    old_template = apps.read_namespaced_deployment(name, release_ns).spec.template
    # The job and its world, made by the operator run from the test bed (kwok only simulates the chart's pod).
    operator = OperatorProcess(kubeconfig, jobs.ns, tmp_path / "operator.log")
    operator.start()
    try:
        jobs.create("survivor", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}})
        jobs.wait_phase("survivor", "Running", timeout=120)
        # The launcher pod Running and Ready: the snapshot below is of a settled world that nothing but the
        # upgrade could touch.
        wait_for(
            lambda: (pod := jobs.launcher("survivor")) is not None
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()),
            timeout=60, what="the launcher pod Ready",
        )  # fmt: skip
    finally:
        operator.stop()
    before = job_and_children(jobs, "survivor")
    assert {"Pod/survivor-worker-0", "Pod/survivor-worker-1", "Pod/survivor-launcher"} <= set(before)

    # As documented: the values set at install kept, the new chart's defaults for the rest.
    install(kubeconfig, CHART, "upgrade", name, release_ns, reuse=True)

    history = json.loads(helm(kubeconfig, "history", name, "-n", release_ns, "-o", "json"))
    current = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert [h["chart"] for h in history] == ["dtjob-0.1.0", f"dtjob-{current}"]
    assert history[-1]["status"] == "deployed"
    # The Deployment rolled out the new pod template.
    deployment = apps.read_namespaced_deployment(name, release_ns)
    assert deployment.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    assert old_template.spec.containers[0].readiness_probe is None
    assert deployment.spec.template.spec.containers[0].readiness_probe is not None
    # From one replica replaced whole (0.1.0) to two that roll one at a time.
    assert old_template.spec.containers[0].env[0].name != "POD_NAME"
    assert deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.status.updated_replicas == 2 and deployment.status.available_replicas == 2
    args = deployment.spec.template.spec.containers[0].args
    assert f"--watch-namespace={jobs.ns}" in args and "--all-namespaces" not in args
    # The job and every child are the very objects they were: not recreated, not even written.
    assert job_and_children(jobs, "survivor") == before


def labelled(kubeconfig: str, release: str, namespaced: bool) -> set[str]:
    """Every object of any listable kind labelled with the release: cluster-scoped, or in any namespace."""
    kinds = kubectl(kubeconfig, "api-resources", f"--namespaced={str(namespaced).lower()}", "--verbs=list",
                    "-o", "name")  # fmt: skip
    assert kinds.returncode == 0, kinds.stderr
    names = [k for k in kinds.stdout.split() if k not in ("events", "events.events.k8s.io")]
    scope = ["--all-namespaces"] if namespaced else []
    found = kubectl(kubeconfig, "get", ",".join(names), *scope, "-l", f"{INSTANCE}={release}", "-o", "name")
    assert found.returncode == 0, found.stderr
    return set(found.stdout.split())


def test_helm_uninstall_leaves_nothing_behind_but_the_crd(
    kubeconfig: str,
    api_client: client.ApiClient,
    release: tuple[str, str],
    namespace: str,
    simulated_pool: Any,
) -> None:
    name, release_ns = release
    install(kubeconfig, CHART, "install", name, release_ns, f"watchNamespaces={{{namespace}}}", create=True)
    cluster_scoped = labelled(kubeconfig, name, namespaced=False)
    assert cluster_scoped == {
        f"clusterrole.rbac.authorization.k8s.io/{name}-discovery",
        f"clusterrole.rbac.authorization.k8s.io/{name}-edit",
        f"clusterrole.rbac.authorization.k8s.io/{name}-view",
        f"clusterrolebinding.rbac.authorization.k8s.io/{name}-discovery",
        f"clusterrole.rbac.authorization.k8s.io/{name}-metrics-auth",
        f"clusterrolebinding.rbac.authorization.k8s.io/{name}-metrics-auth",
        f"clusterrole.rbac.authorization.k8s.io/{name}-metrics-reader",
        # The apply-time NFS check and the operator's guard.
        *(f"validatingadmissionpolicy{binding}.admissionregistration.k8s.io/{name}-{policy}"
          for policy in ("nfs-shares", "operator-guard") for binding in ("", "binding")),
    }  # fmt: skip
    assert f"role.rbac.authorization.k8s.io/{name}" in labelled(kubeconfig, name, namespaced=True)

    helm(kubeconfig, "uninstall", name, "--namespace", release_ns, "--wait")
    assert labelled(kubeconfig, name, namespaced=False) == set()
    wait_for(
        lambda: not labelled(kubeconfig, name, namespaced=True), timeout=60, what="namespaced objects gone"
    )
    # By design: the CRD stays, and with it every job and its data.
    crd = kubectl(kubeconfig, "get", "crd", CRD_NAME, "-o", "name")
    assert crd.returncode == 0, crd.stderr
