"""The local control plane and its simulated AKS GPU pool behave like the real thing where the operator cares:
scheduling by GPUs and taints, garbage collection, Jobs, and pods that fail or succeed on cue."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.sim_logs import append_log, serve_pod_log
from tests.tools import tool

pytestmark = pytest.mark.integration

GPU_TOLERATION = client.V1Toleration(key="sku", operator="Equal", value="gpu", effect="NoSchedule")


def gpu_pod(
    name: str, gpus: int, *, tolerate: bool = True, annotations: dict[str, str] | None = None
) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            restart_policy="Never",
            node_selector={"kubernetes.azure.com/agentpool": "gpu"},
            tolerations=[GPU_TOLERATION] if tolerate else None,
            containers=[
                client.V1Container(
                    name="main",
                    image="example.invalid/train:1",
                    resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
                )
            ],
        ),
    )


def pod_condition(core_v1: client.CoreV1Api, namespace: str, name: str, type_: str) -> Any:
    pod = core_v1.read_namespaced_pod(name, namespace)
    return next((c for c in pod.status.conditions or [] if c.type == type_), None)


def test_pools_have_aks_shape(core_v1: client.CoreV1Api, simulated_pool: list[client.V1Node]) -> None:
    for node in simulated_pool:
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        assert node.metadata.labels["kubernetes.azure.com/accelerator"] == "nvidia"
        assert node.metadata.labels["node.kubernetes.io/instance-type"] == "Standard_NC24s_v3"
        assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("sku", "gpu", "NoSchedule")]
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
    system = core_v1.list_node(label_selector="kubernetes.azure.com/agentpool=system").items
    assert system, "the CPU system pool is missing"
    assert all("nvidia.com/gpu" not in n.status.allocatable and not n.spec.taints for n in system)


def test_kubectl_talks_to_the_cluster_over_loopback(
    kubeconfig: str, simulated_pool: list[client.V1Node]
) -> None:
    server = subprocess.run(
        [
            tool("kubectl"),
            "--kubeconfig",
            kubeconfig,
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert server.startswith("https://127.0.0.1:"), server
    names = subprocess.run(
        [
            tool("kubectl"),
            "--kubeconfig",
            kubeconfig,
            "get",
            "nodes",
            "-l",
            "kubernetes.azure.com/agentpool=gpu",
            "-o",
            "name",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(names) == sorted(f"node/{n.metadata.name}" for n in simulated_pool)


def test_pod_with_toleration_lands_on_a_gpu_node(
    core_v1: client.CoreV1Api, namespace: str, simulated_pool: list[client.V1Node]
) -> None:
    core_v1.create_namespaced_pod(namespace, gpu_pod("fits", 4))
    ready = wait_for(
        lambda: getattr(pod_condition(core_v1, namespace, "fits", "Ready"), "status", None) == "True",
        timeout=60,
        what="pod Ready",
    )
    assert ready
    pod = core_v1.read_namespaced_pod("fits", namespace)
    assert pod.status.phase == "Running"
    assert pod.spec.node_name in {n.metadata.name for n in simulated_pool}


def test_pod_without_toleration_stays_pending(
    core_v1: client.CoreV1Api, namespace: str, simulated_pool: list[client.V1Node]
) -> None:
    core_v1.create_namespaced_pod(namespace, gpu_pod("untolerated", 1, tolerate=False))
    cond = wait_for(
        lambda: pod_condition(core_v1, namespace, "untolerated", "PodScheduled"),
        timeout=60,
        what="scheduler verdict",
    )
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    # Every GPU node turns it away for its sku=gpu:NoSchedule taint (the system nodes for the selector).
    assert f"{len(simulated_pool)} node(s) had untolerated taint" in cond.message
    assert core_v1.read_namespaced_pod("untolerated", namespace).status.phase == "Pending"


def test_pod_asking_more_gpus_than_a_node_has_is_unschedulable(
    core_v1: client.CoreV1Api, namespace: str, simulated_pool: list[client.V1Node]
) -> None:
    core_v1.create_namespaced_pod(namespace, gpu_pod("too-big", 5))
    cond = wait_for(
        lambda: pod_condition(core_v1, namespace, "too-big", "PodScheduled"),
        timeout=60,
        what="scheduler verdict",
    )
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond.message
    assert core_v1.read_namespaced_pod("too-big", namespace).spec.node_name is None


def test_deleting_an_owner_deletes_its_dependents(core_v1: client.CoreV1Api, namespace: str) -> None:
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(
        api_version="v1",
        kind="ConfigMap",
        name="owner",
        uid=str(owner.metadata.uid),
        block_owner_deletion=True,
    )
    core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref]))
    )
    core_v1.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        names = [c.metadata.name for c in core_v1.list_namespaced_config_map(namespace).items]
        return "dependent" not in names

    assert wait_for(dependent_gone, timeout=60, what="garbage collection of the dependent")


@pytest.mark.parametrize(("outcome", "exit_code"), [("Failed", 1), ("Succeeded", 0)])
def test_pod_ends_on_cue(
    core_v1: client.CoreV1Api,
    namespace: str,
    simulated_pool: list[client.V1Node],
    outcome: str,
    exit_code: int,
) -> None:
    core_v1.create_namespaced_pod(namespace, gpu_pod("cued", 1))
    wait_for(
        lambda: core_v1.read_namespaced_pod("cued", namespace).status.phase == "Running",
        timeout=60,
        what="pod Running",
    )
    # The cue arrives while the pod runs, as a test would fail a worker mid-job.
    core_v1.patch_namespaced_pod(
        "cued", namespace, {"metadata": {"annotations": {"sim.dtjob.io/outcome": outcome}}}
    )
    phase = wait_for(
        lambda: (
            (p := core_v1.read_namespaced_pod("cued", namespace).status.phase) in {"Failed", "Succeeded"}
            and p
        ),
        timeout=60,
        what=f"pod {outcome}",
    )
    assert phase == outcome
    state = core_v1.read_namespaced_pod("cued", namespace).status.container_statuses[0].state
    assert state.terminated.exit_code == exit_code


def test_failed_pod_carries_its_cued_termination_message(
    core_v1: client.CoreV1Api, namespace: str, simulated_pool: list[client.V1Node]
) -> None:
    message = '{"phase": "failed", "reason": "input SAS denied (403): check \\"sas-in\\""}'
    cues = {"sim.dtjob.io/outcome": "Failed", "sim.dtjob.io/termination-message": message}
    core_v1.create_namespaced_pod(namespace, gpu_pod("talks", 1, annotations=cues))
    wait_for(
        lambda: core_v1.read_namespaced_pod("talks", namespace).status.phase == "Failed",
        timeout=60,
        what="pod Failed",
    )
    state = core_v1.read_namespaced_pod("talks", namespace).status.container_statuses[0].state
    assert state.terminated.message == message


def test_uncued_worker_pod_keeps_running(
    core_v1: client.CoreV1Api, namespace: str, simulated_pool: list[client.V1Node]
) -> None:
    core_v1.create_namespaced_pod(
        namespace, gpu_pod("steady", 1, annotations={"sim.dtjob.io/ready-after": "100ms"})
    )
    wait_for(
        lambda: core_v1.read_namespaced_pod("steady", namespace).status.phase == "Running",
        timeout=60,
        what="pod Running",
    )
    # A pod that no Job owns is a long-lived MPI worker: nothing but a cue or a delete ends it.
    time.sleep(3.0 + 2.0)  # past the run time after which a Job-owned pod would have succeeded
    assert core_v1.read_namespaced_pod("steady", namespace).status.phase == "Running"


def test_job_pods_complete_through_the_job_controller(
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    namespace: str,
    simulated_pool: list[client.V1Node],
) -> None:
    batch = client.BatchV1Api(api_client)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="launcher"),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations={"sim.dtjob.io/run-duration": "1s"}),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    node_selector={"kubernetes.azure.com/agentpool": "system"},
                    containers=[client.V1Container(name="launcher", image="example.invalid/launcher:1")],
                ),
            ),
        ),
    )
    batch.create_namespaced_job(namespace, job)

    def complete() -> bool:
        status = batch.read_namespaced_job_status("launcher", namespace).status
        return any(c.type == "Complete" and c.status == "True" for c in status.conditions or [])

    assert wait_for(complete, timeout=90, what="Job Complete")
    pods = core_v1.list_namespaced_pod(namespace, label_selector="job-name=launcher").items
    assert [p.status.phase for p in pods] == ["Succeeded"]


def test_control_plane_listens_on_loopback_only(local_control_plane: Path) -> None:
    workdir = str(local_control_plane)
    pids = {p.name for p in Path("/proc").iterdir() if p.name.isdigit() and workdir in _cmdline(p)}
    assert pids, f"no process of the local control plane found under {workdir}"
    listeners = subprocess.run(
        ["ss", "-Hltnp"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    ours = [line for line in listeners if any(f"pid={pid}," in line for pid in pids)]
    assert ours, "the control plane's processes listen on no TCP port"
    for line in ours:
        local_address = line.split()[3]
        assert local_address.startswith("127.0.0.1:"), line


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_simulated_pod_serves_its_log_through_the_api_server(
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    namespace: str,
    simulated_pool: list[client.V1Node],
    tmp_path: Path,
) -> None:
    core_v1.create_namespaced_pod(namespace, gpu_pod("talker", 1))
    log = tmp_path / "talker.log"
    append_log(log, "epoch 1 step 10 loss 6.9")
    serve_pod_log(api_client, namespace, "talker", "main", log)
    wait_for(
        lambda: core_v1.read_namespaced_pod("talker", namespace).status.phase == "Running",
        timeout=60,
        what="pod Running",
    )
    assert wait_for(
        lambda: (
            core_v1.read_namespaced_pod_log("talker", namespace, container="main")
            == "epoch 1 step 10 loss 6.9\n"
        ),
        timeout=30,
        what="the pod's log",
    )
    append_log(log, "epoch 1 step 20 loss 6.1")
    assert wait_for(
        lambda: (
            core_v1.read_namespaced_pod_log("talker", namespace, tail_lines=1) == "epoch 1 step 20 loss 6.1\n"
        ),
        timeout=30,
        what="the appended line",
    )
