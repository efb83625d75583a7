from __future__ import annotations

from typing import Any

import pytest
from dtjob.config import OperatorConfig, load_config
from dtjob.spec.parse import SpecError, parse_spec

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec


def test_minimal_spec_gets_defaults_in_memory() -> None:
    body = job_body()
    spec = parse_spec(body, CONFIG)
    assert spec.image == "ghcr.io/dtjob/horovod-pytorch:0.1.0"
    assert spec.dataset.source == "synthetic" and spec.dataset.volume is None
    assert spec.run_policy.backoff_limit == 3
    assert spec.run_policy.clean_pod_policy == "Running"
    assert spec.placement.node_selector == {"kubernetes.azure.com/agentpool": "gpu"}
    assert spec.placement.tolerations[0] == {
        "key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule",
    }  # fmt: skip
    # The default CPU pool ("") selects no pool: the launcher lands on any node without a taint it lacks.
    assert spec.placement.launcher_node_selector == {}
    assert spec.total_slots == 8
    # Defaults never leak into the object: GitOps tools must see no drift.
    assert body["spec"] == {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4}


def test_image_default_comes_from_operator_config() -> None:
    config = load_config({"DTJOB_IMAGE_KERAS": "registry.example/keras:9", "DTJOB_GPU_POOL": "a100"})
    spec = parse_spec(job_body(framework="keras"), config)
    assert spec.image == "registry.example/keras:9"
    assert spec.placement.node_selector["kubernetes.azure.com/agentpool"] == "a100"
    assert parse_spec(job_body(image="mine:1"), config).image == "mine:1"


def test_runs_launcher_as_worker_adds_its_slots() -> None:
    assert job_spec(launcher={"runAsWorker": True}).total_slots == 12


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"workers": 0}, "spec.workers"),
        ({"workers": -2}, "spec.workers"),
        ({"workers": "two"}, "spec.workers"),
        ({"framework": "mxnet"}, "spec.framework"),
        ({"gpusPerWorker": 9}, "spec.gpusPerWorker"),
        ({"gpusPerWorker": -1}, "spec.gpusPerWorker"),
        ({"slotsPerWorker": 0}, "spec.slotsPerWorker"),
        ({"framework": "custom", "image": "ghcr.io/me/mpi:1"}, "spec.command"),
        ({"framework": "custom", "command": ["./bench"]}, "spec.image"),
        ({"launcher": {"mpiImplementation": "MVAPICH"}}, "spec.launcher.mpiImplementation"),
        (
            {"dataset": {"volume": {"nfs": {"server": "s", "path": "/p"},
                                    "persistentVolumeClaim": {"claimName": "c"}}}},
            "spec.dataset.volume",
        ),
        ({"dataset": {"volume": {}}}, "spec.dataset.volume"),
        ({"dataset": {"source": "imagenet"}}, "spec.dataset.volume"),
        ({"dataset": {"source": "cifar"}}, "spec.dataset.source"),
        ({"runPolicy": {"activeDeadlineSeconds": -5}}, "spec.runPolicy.activeDeadlineSeconds"),
        ({"runPolicy": {"ttlSecondsAfterFinished": -1}}, "spec.runPolicy.ttlSecondsAfterFinished"),
        ({"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit"),
        ({"runPolicy": {"cleanPodPolicy": "Sometimes"}}, "spec.runPolicy.cleanPodPolicy"),
        ({"hyperparameters": {"learningRate": -0.1}}, "spec.hyperparameters.learningRate"),
        ({"hyperparameters": {"amp": "yes"}}, "spec.hyperparameters.amp"),
        ({"env": [{"value": "x"}]}, "spec.env[0].name"),
        ({"dataset": {"volume": {"mountPath": "data", "nfs": {"server": "s", "path": "/p"}}}},
         "spec.dataset.volume.mountPath"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(changes: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as info:
        job_spec(**changes)
    assert info.value.path == path
    assert str(info.value).startswith(path + ":")


def test_missing_required_fields() -> None:
    body = job_body()
    del body["spec"]["framework"]
    with pytest.raises(SpecError, match=r"spec.framework: is required"):
        parse_spec(body, CONFIG)
    body = job_body()
    del body["spec"]["workers"]
    with pytest.raises(SpecError, match=r"spec.workers: is required"):
        parse_spec(body, CONFIG)


@pytest.mark.parametrize("name", ["Bad_Name", "1job", "x" * 46, "job-", "", "job\n"])
def test_bad_names(name: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(job_body(name=name), CONFIG)
    assert info.value.path == "metadata.name"


def test_imagenet_on_pvc() -> None:
    spec = job_spec(
        dataset={"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "imagenet"}}}
    )
    assert spec.dataset.volume is not None and spec.dataset.volume.pvc is not None
    assert spec.dataset.volume.pvc.claim_name == "imagenet"
    assert spec.dataset.volume.mount_path == "/data"
    assert spec.dataset.data_dir == "/data"


def test_a_configured_cpu_pool_and_a_jobs_own_pools_select_their_pools() -> None:
    pool = "kubernetes.azure.com/agentpool"
    configured = OperatorConfig(cpu_pool="cpu")
    cpu_job = parse_spec(job_body(gpusPerWorker=0), configured).placement
    assert (cpu_job.node_selector, cpu_job.launcher_node_selector) == ({pool: "cpu"}, {pool: "cpu"})
    own = {"nodePool": "a100", "launcher": {"nodePool": "tools"}}
    placement = parse_spec(job_body(placement=own), configured).placement
    assert (placement.node_selector, placement.launcher_node_selector) == ({pool: "a100"}, {pool: "tools"})
    # On the default CPU pool (""), a job's own launcher pool still selects it; its GPU workers keep theirs.
    placement = parse_spec(job_body(placement={"launcher": {"nodePool": "tools"}}), CONFIG).placement
    assert (placement.node_selector, placement.launcher_node_selector) == ({pool: "gpu"}, {pool: "tools"})
    on_ssd = parse_spec(job_body(gpusPerWorker=0, placement={"nodeSelector": {"disk": "ssd"}}), CONFIG)
    assert on_ssd.placement.node_selector == {"disk": "ssd"}


def test_user_tolerations_keep_the_gpu_one_once() -> None:
    gpu = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    other = {"key": "spot", "operator": "Exists"}
    spec = parse_spec(job_body(placement={"tolerations": [gpu, other]}), OperatorConfig())
    assert spec.placement.tolerations == (gpu, other)
