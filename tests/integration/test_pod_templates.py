"""Pod templates against the real API server: what a template sets reaches the worker pods and the launcher
Job the operator creates; what the operator owns is refused at apply (schema and CEL) or by the operator
(Failed, naming the field, nothing created); `kubectl explain` walks the template's PodSpec.

Pods are simulated by kwok; sim.dtjob.io/run-duration keeps the launcher running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from hack import gen_pod_template_schema as gen
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, kubectl

pytestmark = pytest.mark.integration

SIDECAR = {
    "name": "metrics",
    "image": "ghcr.io/example/dcgm-exporter:3.3",
    "ports": [{"containerPort": 9400, "name": "metrics"}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch", "readOnly": True}],
}
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"dtjob.io/role": "worker"}},
}


@pytest.fixture
def priority_class(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A PriorityClass (cluster-wide) of the test's own: admission refuses a pod naming a missing one."""
    scheduling = client.SchedulingV1Api(api_client)
    name = f"{namespace}-training"
    scheduling.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=1000, global_default=False)
    )
    try:
        yield name
    finally:
        scheduling.delete_priority_class(name)


def worker_template(priority: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "ml"}},
        "spec": {
            "priorityClassName": priority,
            "topologySpreadConstraints": [SPREAD],
            "hostIPC": True,
            "containers": [
                {"name": "worker",
                 "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                 "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                 "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}]},
                SIDECAR,
            ],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
                {"name": "dshm", "emptyDir": {"sizeLimit": "8Gi"}},
            ],
        },
    }  # fmt: skip


def test_a_template_reaches_the_worker_pods_and_the_launcher_pod(
    jobs: Jobs, operator: OperatorProcess, priority_class: str
) -> None:
    system = {"key": "kubernetes.azure.com/agentpool", "operator": "In", "values": ["system"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [system]}}]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    shipper = {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always"}
    launcher_template = {
        "metadata": {"annotations": {"sim.dtjob.io/run-duration": "600s"}},
        "spec": {"priorityClassName": priority_class, "affinity": affinity, "initContainers": [shipper]},
    }
    jobs.create("tmpl", worker={"template": worker_template(priority_class)},
                launcher={"template": launcher_template})  # fmt: skip
    jobs.wait_phase("tmpl", "Running", timeout=120)

    pods = jobs.live_workers("tmpl")
    assert len(pods) == 2
    for pod in pods:
        spec = pod.spec
        assert spec.priority_class_name == priority_class and spec.priority == 1000
        assert spec.host_ipc is True
        assert [c.name for c in spec.containers] == ["worker", "metrics"]
        spread = spec.topology_spread_constraints[0]
        assert (spread.topology_key, spread.when_unsatisfiable) == (SPREAD["topologyKey"], "ScheduleAnyway")
        main = spec.containers[0]
        assert main.security_context.capabilities.add == ["IPC_LOCK"]
        assert main.security_context.capabilities.drop == ["ALL"]
        assert {m.mount_path for m in main.volume_mounts} >= {"/scratch", "/dev/shm", "/etc/dtjob/ssh"}
        assert ("NCCL_IB_HCA", "mlx5") in [(e.name, e.value) for e in main.env]
        assert main.readiness_probe.tcp_socket.port == 2222 and "sshd" in main.command[2]
        assert spec.containers[1].image == SIDECAR["image"]
        volumes = {v.name: v for v in spec.volumes}
        assert volumes["scratch"].empty_dir.size_limit == "10Gi"
        assert (volumes["dshm"].empty_dir.medium, volumes["dshm"].empty_dir.size_limit) == ("Memory", "8Gi")
        assert spec.restart_policy == "Never" and spec.subdomain == "tmpl-workers"
        labels, annotations = pod.metadata.labels, pod.metadata.annotations
        assert labels["team"] == "vision" and labels["dtjob.io/role"] == "worker"
        assert annotations["example.com/owner"] == "ml"
        assert annotations["kubectl.kubernetes.io/default-container"] == "worker"

    launcher = jobs.launcher("tmpl")
    assert launcher is not None
    assert launcher.spec.priority_class_name == priority_class
    node_affinity = launcher.spec.affinity.node_affinity
    assert node_affinity.preferred_during_scheduling_ignored_during_execution[0].weight == 1
    assert [(c.name, c.restart_policy) for c in launcher.spec.init_containers] == [("log-shipper", "Always")]
    assert [c.name for c in launcher.spec.containers] == ["launcher"]
    # Created with the template's pod, the launcher pod runs: the job is Running with its world intact.
    assert launcher.status.phase == "Running"
    assert jobs.status("tmpl")["restarts"] == 0


def test_what_only_the_operator_can_refuse_fails_the_job_naming_it_and_creates_nothing(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    # A list inside the list of containers: no CEL rule can say it within the API server's cost budget.
    env = [{"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "false"}]
    jobs.create("owned", launcher={"template": {"spec": {"containers": [{"name": "launcher", "env": env}]}}})
    status = jobs.wait_phase("owned", "Failed", timeout=60)
    field = "spec.launcher.template.spec.containers[0].env[0]"
    assert status["message"].startswith(f"{field}: OMPI_MCA_plm_rsh_no_tree_spawn is set by the operator")
    failed = jobs.condition("owned", "Failed")
    assert failed and failed["reason"] == "InvalidSpec" and field in failed["message"]
    jobs.wait_event("owned", "InvalidSpec")  # posted after the status patch just read
    assert any(field in (e.message or "") for e in jobs.events("owned"))
    assert jobs.pods("owned") == [] and jobs.launcher("owned") is None
    secrets = jobs.core.list_namespaced_secret(jobs.ns, label_selector="dtjob.io/job-name=owned").items
    assert secrets == []


def test_under_pod_security_restricted_sidecars_run_and_host_ipc_fails_naming_the_template(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    # An added container runs under the operator's hardening: the level admits it as it is.
    sidecar = {"spec": {"containers": [SIDECAR], "volumes": [{"name": "scratch", "emptyDir": {}}]}}
    jobs.create(
        "side",
        worker={"template": sidecar},
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
    )
    jobs.wait_phase("side", "Running", timeout=120)

    jobs.create("hostipc", worker={"template": {"spec": {"hostIPC": True}}})
    status = jobs.wait_phase("hostipc", "Failed", timeout=60)
    assert status["message"].startswith("spec.worker.template: Pod hostipc-worker-"), status["message"]
    assert "host namespaces (hostIPC=true)" in status["message"]
    cond = jobs.condition("hostipc", "Failed")
    assert cond and cond["reason"] == "PodSecurityViolation"
    wait_for(lambda: not jobs.pods("hostipc"), timeout=30, what="no pods left behind")
    assert jobs.launcher("hostipc") is None


def manifest(name: str, **spec: Any) -> str:
    body_spec: dict[str, Any] = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4, **spec}
    return yaml.safe_dump({"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob",
                           "metadata": {"name": name}, "spec": body_spec})  # fmt: skip


APPLY_REFUSALS = [
    ({"worker": {"template": {"spec": {"restartPolicy": "OnFailure"}}}},
     "spec.worker.template.spec.restartPolicy: Forbidden: is set by the operator (Never)"),
    ({"launcher": {"template": {"spec": {"hostname": "mine"}}}},
     "spec.launcher.template.spec.hostname: Forbidden: is set by the operator"),
    ({"worker": {"template": {"spec": {"subdomain": "mine"}}}},
     "spec.worker.template.spec.subdomain: Forbidden"),
    ({"worker": {"template": {"spec": {"nodeSelector": {"zone": "1"}}}}},
     "spec.worker.template.spec.nodeSelector: Forbidden: is set by the operator: use spec.placement"),
    ({"worker": {"template": {"spec": {"nodeName": "aks-gpu-3"}}}},
     "spec.worker.template.spec.nodeName: Forbidden: is the scheduler's"),
    ({"launcher": {"template": {"spec": {"nodeName": "aks-cpu-0"}}}},
     "spec.launcher.template.spec.nodeName: Forbidden: is the scheduler's"),
    ({"worker": {"template": {"metadata": {"labels": {"dtjob.io/role": "launcher"}}}}},
     "spec.worker.template.metadata.labels: Forbidden: keys under dtjob.io/"),
    ({"launcher": {"template": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}}},
     "spec.launcher.template.metadata.labels: Forbidden"),
    ({"worker": {"template": {"spec": {"containers": [{"name": "worker", "command": ["sleep", "1d"]}]}}}},
     "spec.worker.template.spec.containers: Forbidden: the worker container's command is set by"),
    ({"launcher": {"template": {"spec": {"containers": [{"name": "launcher", "args": ["-x"]}]}}}},
     "spec.launcher.template.spec.containers: Forbidden: the launcher container's args is set by"),
    ({"worker": {"template": {"spec": {"containers": [{"name": "worker", "readinessProbe": {"exec": {}}}]}}}},
     "the worker container's readinessProbe is set by the operator"),
    ({"worker": {"template": {"spec": {"containers": [
        {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}},
     "the worker container's nvidia.com/gpu is set by the operator: use spec.gpusPerWorker"),
    ({"launcher": {"template": {"spec": {"containers": [{"name": "shipper", "image": "fluent-bit:3.1"}]}}}},
     "spec.launcher.template.spec.containers: Forbidden: the launcher's pod takes no container beside"),
    ({"worker": {"template": {"spec": {"containers": [{"name": "metrics"}]}}}},
     "image is required for a container the template adds"),
    ({"worker": {"template": {"spec": {"volumes": [{"name": "ssh", "emptyDir": {}}]}}}},
     "spec.worker.template.spec.volumes: Forbidden: a name is taken: the operator's volumes are named"),
    ({"worker": {"template": {"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}}}},
     "spec.worker.template.spec.volumes: Forbidden: dshm (/dev/shm) is the operator's emptyDir in memory"),
    # Kubernetes' own PodSpec schema: types, required fields and list keys are checked at apply.
    ({"worker": {"template": {"spec": {"containers": [{"image": "busybox:1.36"}]}}}},
     "spec.worker.template.spec.containers[0].name: Required value"),
    ({"worker": {"template": {"spec": {"hostIPC": "yes"}}}},
     "spec.worker.template.spec.hostIPC: Invalid value"),
    ({"worker": {"template": {"spec": {"containers": [{"name": "w", "imagePullPolicy": "IfNotPresnt"}]}}}},
     'spec.worker.template.spec.containers[0].imagePullPolicy: Unsupported value: "IfNotPresnt"'),
    ({"worker": {"template": {"spec": {"containers": [{"name": "a", "image": "x"},
                                                      {"name": "a", "image": "y"}]}}}},
     "spec.worker.template.spec.containers[1]: Duplicate value"),
    ({"worker": {"template": {"spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox"}]}}}},
     'unknown field "spec.worker.template.spec.ephemeralContainers"'),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "expected"), APPLY_REFUSALS, ids=[e for _, e in APPLY_REFUSALS])
def test_owned_and_malformed_template_fields_are_refused_at_apply(
    jobs: Jobs, namespace: str, kubeconfig: str, spec: dict[str, Any], expected: str
) -> None:
    done = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=manifest("refused", **spec))
    assert done.returncode != 0, f"accepted: {spec}"
    assert expected in done.stderr, done.stderr


def test_a_full_template_is_accepted_at_apply(jobs: Jobs, namespace: str, kubeconfig: str) -> None:
    proxy = {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "restartPolicy": "Always"}
    spec = {"worker": {"template": worker_template("any")},
            "launcher": {"template": {"spec": {"initContainers": [proxy]}}}}  # fmt: skip
    done = kubectl(kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-",
                   stdin=manifest("accepted", **spec))  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_kubectl_explain_walks_the_templates_pod_spec(jobs: Jobs, kubeconfig: str) -> None:
    def explained(field: str) -> str:
        def answer() -> str | None:
            done = kubectl(kubeconfig, "explain", field)
            return done.stdout if done.returncode == 0 else None

        # Discovery may lag the CRD by a few seconds.
        return wait_for(answer, timeout=30, what=f"kubectl explain {field}")

    containers = explained("dtj.spec.worker.template.spec.containers")
    for field in ("env", "volumeMounts", "securityContext", "resources", "image"):
        assert f"\n  {field}\t" in containers, containers
    assert "List of containers belonging to the pod." in " ".join(containers.split())
    spread = explained("dtj.spec.launcher.template.spec.topologySpreadConstraints")
    assert "whenUnsatisfiable" in spread and "maxSkew" in spread
    capabilities = explained("dtj.spec.worker.template.spec.containers.securityContext.capabilities.add")
    assert "Added capabilities." in capabilities
    template = " ".join(explained("dtj.spec.worker.template").split())
    assert "merged over the worker pods the operator builds" in template


def test_the_committed_snapshot_is_what_the_api_server_serves(kubeconfig: str) -> None:
    # The CRD's template schema is rendered from the snapshot (tests/unit/test_pod_template_schema.py).
    done = kubectl(kubeconfig, "get", "--raw", "/openapi/v3/api/v1")
    assert done.returncode == 0, done.stderr
    live = gen.take_snapshot(json.loads(done.stdout), "", "")["schemas"]
    assert live == gen.load_snapshot()["schemas"]
