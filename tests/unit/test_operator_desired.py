from __future__ import annotations

import shlex
from typing import Any

from dtjob import desired, names
from dtjob.config import OperatorConfig
from dtjob.desired.command import mpi_command, training_command
from dtjob.desired.common import owner_reference
from dtjob.desired.sshkeys import generate_keypair
from dtjob.reconcile.act import _pod_bearing
from dtjob.spec.managed_by import unqueued
from dtjob.state.decision import CreateLauncher

from tests.unit.operator_fixtures import job_spec

OWNER = owner_reference("rn50", "uid-1")


def _container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod_spec["containers"][0]
    return container


def test_every_child_is_labelled_and_owned() -> None:
    spec = job_spec()
    keys = generate_keypair("t")
    objects = [
        desired.ssh_secret(spec, OWNER, keys),
        desired.hostfile_config_map(spec, OWNER),
        desired.workers_service(spec, OWNER),
        desired.worker_pod(spec, OWNER, 0, 0),
        desired.launcher_pod(spec, OWNER, 0),
    ]
    for obj in objects:
        meta = obj["metadata"]
        assert meta["ownerReferences"] == [OWNER]
        assert meta["labels"][names.JOB_NAME_LABEL] == "rn50"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "dtjob-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == "rn50"
        assert meta["namespace"] == "ml"
    assert [o["metadata"]["name"] for o in objects] == [
        "rn50-ssh", "rn50-hostfile", "rn50-workers", "rn50-worker-0", "rn50-launcher",
    ]  # fmt: skip


def test_hostfile_lists_every_worker_with_its_slots() -> None:
    spec = job_spec(workers=3, gpusPerWorker=2)
    assert desired.hostfile_text(spec) == (
        "rn50-worker-0.rn50-workers.ml.svc slots=2\n"
        "rn50-worker-1.rn50-workers.ml.svc slots=2\n"
        "rn50-worker-2.rn50-workers.ml.svc slots=2\n"
    )
    cm = desired.hostfile_config_map(spec, OWNER)
    assert "discover_hosts.sh" in cm["data"]


def test_launcher_as_worker_is_first_host() -> None:
    spec = job_spec(launcher={"runAsWorker": True})
    assert desired.hostfile_text(spec).splitlines()[0] == "rn50-launcher.rn50-workers.ml.svc slots=4"
    launcher = desired.launcher_pod(spec, OWNER, 0)
    pod = launcher["spec"]
    assert pod["hostname"] == "rn50-launcher" and pod["subdomain"] == "rn50-workers"
    assert _container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert launcher["metadata"]["labels"][names.MPI_HOST_LABEL] == "true"
    assert "-np 12 " in _container(pod)["command"][2]


def test_service_is_headless_and_selects_no_pods() -> None:
    # Labels are anyone's to set: the operator publishes its own pods (dtjob.desired.hosts, test_mpi_hosts).
    svc = desired.workers_service(job_spec(), OWNER)
    assert svc["spec"]["clusterIP"] == "None"
    assert "selector" not in svc["spec"] and "publishNotReadyAddresses" not in svc["spec"]


def test_ssh_secret_holds_a_matching_keypair() -> None:
    keys = generate_keypair("dtjob-rn50")
    secret = desired.ssh_secret(job_spec(), OWNER, keys)
    data = secret["stringData"]
    assert data["id_ed25519"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert data["authorized_keys"] == data["id_ed25519.pub"]
    assert data["authorized_keys"].startswith("ssh-ed25519 ")
    assert generate_keypair("x").public_openssh != keys.public_openssh


def test_worker_pod_gets_gpus_placement_readiness_and_data() -> None:
    spec = job_spec(
        dataset={"source": "imagenet", "volume": {"nfs": {"server": "nfs.local", "path": "/export"}}},
        worker={"resources": {"requests": {"cpu": 20}}, "podAnnotations": {"a": "b"}},
        runPolicy={"scheduling": {"schedulerName": "volcano", "queueName": "gpu-queue"}},
    )
    pod = desired.worker_pod(spec, OWNER, 1, 3)
    meta, pod_spec = pod["metadata"], pod["spec"]
    assert meta["labels"][names.ATTEMPT_LABEL] == "3"
    assert meta["labels"][names.WORKER_INDEX_LABEL] == "1"
    # Kueue's pod group: every worker names its job's group and the group's size (the workers, the launcher).
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "rn50"
    assert meta["annotations"] == {"a": "b", "kueue.x-k8s.io/pod-group-total-count": "3"}
    assert pod_spec["hostname"] == "rn50-worker-1" and pod_spec["subdomain"] == "rn50-workers"
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["schedulerName"] == "volcano"
    assert pod_spec["nodeSelector"] == {"kubernetes.azure.com/agentpool": "gpu"}
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod_spec[
        "tolerations"
    ]
    container = _container(pod_spec)
    assert container["resources"] == {"requests": {"cpu": "20"}, "limits": {"nvidia.com/gpu": "4"}}
    assert container["readinessProbe"]["tcpSocket"] == {"port": 2222}
    assert "exec /usr/sbin/sshd -D" in container["command"][2]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    # Group-readable: kubelet writes the files owned by root with group fsGroup, the pod's user's group.
    assert volumes["ssh"]["secret"] == {
        "secretName": "rn50-ssh",
        "defaultMode": 0o440,
        "items": [{"key": "authorized_keys", "path": "authorized_keys"}],  # no private key on workers
    }
    assert pod_spec["securityContext"]["fsGroup"] == pod_spec["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert volumes["data"]["nfs"] == {"server": "nfs.local", "path": "/export", "readOnly": True}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}


def test_launcher_runs_on_cpu_pool_without_gpus() -> None:
    launcher = desired.launcher_pod(job_spec(launcher={"podAnnotations": {"sim": "x"}}), OWNER, 2)
    # World restarts are the operator's (runPolicy.backoffLimit): the pod itself never restarts.
    assert launcher["spec"]["restartPolicy"] == "Never"
    assert launcher["metadata"]["annotations"] == {"sim": "x", "kueue.x-k8s.io/pod-group-total-count": "3"}
    assert launcher["metadata"]["labels"][names.ATTEMPT_LABEL] == "2"
    pod = launcher["spec"]
    # The default CPU pool ("") selects none: any node without a taint it lacks (so not the GPU pool).
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod
    container = _container(pod)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""} in container["env"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/mpi", "/etc/dtjob/ssh"}
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 1000
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_launcher_keeps_host_names_resolvable_and_starts_every_daemon_itself() -> None:
    # Open MPI would shorten <job>-worker-0.<service>... to <job>-worker-0, which no pod resolves, and let
    # daemons start each other over ssh from workers that hold no client setup.
    user = {"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "0"}
    env = _container(desired.launcher_pod(job_spec(env=[user]), OWNER, 0)["spec"])["env"]
    assert {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"} in env
    # A user's own setting comes later, so it wins.
    assert env.index({"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "true"}) < env.index(user)


def test_horovodrun_command_has_np_hostfile_and_entry_point() -> None:
    spec = job_spec(hyperparameters={"batchSizePerGpu": 32, "stepsPerEpoch": 5, "amp": False})
    cmd = mpi_command(spec)
    assert cmd[:5] == ["horovodrun", "-np", "8", "--hostfile", "/etc/mpi/hostfile"]
    i = cmd.index("python")
    assert cmd[i : i + 3] == ["python", "-m", "dtjob_train.pytorch"]
    flags = cmd[i + 3 :]
    assert flags[flags.index("--batch-size") + 1] == "32"
    assert flags[flags.index("--steps-per-epoch") + 1] == "5"
    assert flags[flags.index("--data") + 1] == "synthetic"
    assert "--data-dir" not in flags
    assert "--no-amp" in flags and "--amp" not in flags and "--fp16-allreduce" in flags
    assert "--amp-dtype" not in flags and "--xla" not in flags and "--data-loader" not in flags
    assert "--progress-file" in flags
    # Every flag the training entry point is known to accept, nothing else.
    known = {
        "--data", "--data-dir", "--batch-size", "--epochs", "--steps-per-epoch", "--base-lr",
        "--warmup-epochs", "--momentum", "--weight-decay", "--label-smoothing", "--amp", "--fp16-allreduce",
        "--channels-last", "--no-amp", "--no-fp16-allreduce", "--no-channels-last", "--amp-dtype", "--xla",
        "--data-loader",
        "--checkpoint-dir", "--output-dir", "--log-interval", "--seed", "--progress-file", "--image-size",
    }  # fmt: skip
    assert {f for f in flags if f.startswith("--")} <= known


def test_mpirun_and_overrides() -> None:
    spec = job_spec(
        launcher={"runner": "mpirun", "mpiArgs": ["-mca", "btl_tcp_if_include", "eth0"]},
        env=[{"name": "NCCL_IB_DISABLE", "value": "1"}],
        command=["python", "/app/train.py"],
        args=["--fast"],
    )
    cmd = mpi_command(spec)
    assert cmd[0] == "mpirun" and "--allow-run-as-root" in cmd
    assert cmd[cmd.index("-np") + 1] == "8"
    assert "NCCL_IB_DISABLE" in cmd
    assert cmd[-3:] == ["python", "/app/train.py", "--fast"]
    assert training_command(spec) == ["python", "/app/train.py", "--fast"]


def test_every_rank_expects_a_gpu_unless_the_jobs_env_says_otherwise() -> None:
    expect = {"name": "DTJOB_EXPECT_GPU", "value": "1"}
    for runner in ("horovodrun", "mpirun"):
        spec = job_spec(launcher={"runner": runner})
        assert expect in _container(desired.worker_pod(spec, OWNER, 0, 0)["spec"])["env"]
        # The launcher carries it too: horovodrun and mpirun -x hand the launcher's values to the ranks.
        assert expect in _container(desired.launcher_pod(spec, OWNER, 0)["spec"])["env"]
    cmd = mpi_command(job_spec(launcher={"runner": "mpirun"}))
    assert cmd[cmd.index("DTJOB_EXPECT_GPU") - 1] == "-x"
    # A CPU-only cluster (the test bed) opts out: the job's own entry replaces the operator's.
    cpu = {"name": "DTJOB_EXPECT_GPU", "value": "0"}
    spec = job_spec(launcher={"runner": "mpirun"}, env=[cpu])
    env = _container(desired.worker_pod(spec, OWNER, 1, 0)["spec"])["env"]
    assert cpu in env and expect not in env
    assert mpi_command(spec).count("DTJOB_EXPECT_GPU") == 1


def test_launcher_script_is_valid_shell_around_the_command() -> None:
    spec = job_spec(framework="keras", hyperparameters={"learningRate": 0.1})
    script = _container(desired.launcher_pod(spec, OWNER, 0)["spec"])["command"][2]
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec horovodrun")
    argv = shlex.split(last)[1:]
    assert argv == mpi_command(spec)
    assert argv[argv.index("--base-lr") + 1] == "0.1"


def test_a_worker_leaves_a_lost_node_within_seconds_not_five_minutes() -> None:
    owner = owner_reference("rn50", "uid-1")
    pod = desired.worker_pod(job_spec(), owner, 0, 0)
    lost = {t["key"]: t for t in pod["spec"]["tolerations"] if t["key"].startswith("node.kubernetes.io/")}
    assert set(lost) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert all(t["tolerationSeconds"] == 30 and t["effect"] == "NoExecute" for t in lost.values())
    # The spec's own toleration for one of those taints wins.
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    mine = desired.worker_pod(job_spec(placement={"tolerations": [own]}), owner, 0, 0)
    unreachable = [t for t in mine["spec"]["tolerations"] if t["key"] == "node.kubernetes.io/unreachable"]
    assert unreachable == [own]


def test_kueues_keys_a_job_sets_on_its_pods_are_dropped_but_its_priority_class() -> None:
    """An editor's podLabels, podAnnotations or template naming Kueue's keys would put the world's pods under
    a Workload another world of the namespace holds (two worlds on one quota), or in another queue or group:
    the operator writes those alone. The CRD refuses them at apply; from a job stored before that rule they
    are dropped. The WorkloadPriorityClass stays the job's to choose."""
    theirs = {
        "kueue.x-k8s.io/prebuilt-workload-name": "dtjob-other", "kueue.x-k8s.io/queue-name": "free",
        "kueue.x-k8s.io/pod-group-name": "other", "kueue.x-k8s.io/priority-class": "urgent",
    }  # fmt: skip
    notes = {"kueue.x-k8s.io/pod-group-total-count": "1", "kueue.x-k8s.io/retriable-in-group": "false"}
    template = {"metadata": {"labels": theirs, "annotations": notes}}
    spec = job_spec(
        worker={"podLabels": theirs, "podAnnotations": notes, "template": template},
        launcher={"podLabels": theirs, "podAnnotations": notes, "template": template},
        runPolicy={"scheduling": {"queueName": "gpu-queue"}},
    )
    for pod in (desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)):
        meta = pod["metadata"]
        kueue = {k: v for k, v in {**meta["labels"], **meta["annotations"]}.items() if k.startswith("kueue.")}
        assert kueue == {
            "kueue.x-k8s.io/queue-name": "gpu-queue", "kueue.x-k8s.io/pod-group-name": "rn50",
            "kueue.x-k8s.io/pod-group-total-count": "3", "kueue.x-k8s.io/priority-class": "urgent",
        }, kueue  # fmt: skip


def test_the_launcher_joins_its_workers_kueue_group_and_a_job_without_a_queue_is_the_same_group() -> None:
    # Made with its workers, the launcher is a member of their group: Kueue admits and evicts the world whole,
    # and no default LocalQueue of the namespace makes the launcher a Workload of its own.
    spec = job_spec(workers=2, runPolicy={"scheduling": {"queueName": "gpu-queue"}})
    launcher = desired.launcher_pod(spec, OWNER, 0)["metadata"]
    worker = desired.worker_pod(spec, OWNER, 0, 0)["metadata"]
    group = {"kueue.x-k8s.io/queue-name": "gpu-queue", "kueue.x-k8s.io/pod-group-name": "rn50"}
    assert group.items() <= launcher["labels"].items() and group.items() <= worker["labels"].items()
    counts = {m["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for m in (launcher, worker)}
    assert counts == {"3"}
    # One group, one priority: the workers' WorkloadPriorityClass is the launcher's too.
    priority = {"kueue.x-k8s.io/priority-class": "urgent"}
    ranked = job_spec(worker={"podLabels": priority}, runPolicy={"scheduling": {"queueName": "gpu-queue"}})
    assert priority.items() <= desired.launcher_pod(ranked, OWNER, 0)["metadata"]["labels"].items()
    # A torchrun world has no launcher: its group is its workers.
    ddp = job_spec(workers=2, torchrun={}, runPolicy={"scheduling": {"queueName": "gpu-queue"}})
    assert desired.worker_pod(ddp, OWNER, 0, 0)["metadata"]["annotations"] == {
        "kueue.x-k8s.io/pod-group-total-count": "2"
    }
    # A job that names no queue is the same group on no queue: a namespace's default LocalQueue, if Kueue's
    # defaulting puts it there, takes the world whole.
    plain = job_spec(worker={"podLabels": priority})
    for pod in (desired.worker_pod(plain, OWNER, 0, 0), desired.launcher_pod(plain, OWNER, 0)):
        meta = pod["metadata"]
        kueue = {k: v for k, v in {**meta["labels"], **meta["annotations"]}.items() if k.startswith("kueue.")}
        assert kueue == {
            "kueue.x-k8s.io/pod-group-name": "rn50", "kueue.x-k8s.io/pod-group-total-count": "3", **priority
        }  # fmt: skip
    # A world a Workload of its own admits (a MultiKueue copy) is in no group.
    copy = unqueued(job_spec())
    for pod in (desired.worker_pod(copy, OWNER, 0, 0), desired.launcher_pod(copy, OWNER, 0)):
        meta = pod["metadata"]
        assert not [k for k in {**meta["labels"], **meta.get("annotations", {})} if k.startswith("kueue.")]


def _env_value(container: dict[str, Any], name: str) -> str | None:
    """What the container sees for `name`: the last entry wins, as the kubelet takes them."""
    return next((e.get("value") for e in reversed(container["env"]) if e["name"] == name), None)


def test_a_pod_that_asks_for_no_gpu_is_shown_none_whatever_the_job_says() -> None:
    # The training image asks the NVIDIA runtime for every GPU (NVIDIA_VISIBLE_DEVICES=all, as the CUDA images
    # do): a CPU job's worker on a node where that runtime is the default would otherwise train on GPUs that
    # belong to other pods, and the job's env and worker template must not undo the blank.
    grab = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    cpu = job_spec(gpusPerWorker=0, env=grab, worker={"template": {"spec": {"containers": [
        {"name": names.WORKER_CONTAINER, "env": grab}]}}})  # fmt: skip
    worker = _container(desired.worker_pod(cpu, OWNER, 0, 0)["spec"])
    launcher = _container(desired.launcher_pod(cpu, OWNER, 0)["spec"])
    assert _env_value(worker, "NVIDIA_VISIBLE_DEVICES") == ""
    assert _env_value(launcher, "NVIDIA_VISIBLE_DEVICES") == ""
    # A worker given GPUs sees what the device plugin gives it: the operator sets nothing.
    gpu = _container(desired.worker_pod(job_spec(gpusPerWorker=2), OWNER, 0, 0)["spec"])
    assert _env_value(gpu, "NVIDIA_VISIBLE_DEVICES") is None


def test_a_launcher_kept_outside_its_workers_kueue_group_carries_nothing_of_kueues() -> None:
    """What CreateLauncher(outside_kueue_group=True) makes: a launcher with no Kueue label or annotation."""
    spec = job_spec(workers=2, runPolicy={"scheduling": {"queueName": "gpu-queue"}})
    config = OperatorConfig()
    (inside,) = _pod_bearing(config, spec, OWNER, CreateLauncher(0)) or []
    (outside,) = _pod_bearing(config, spec, OWNER, CreateLauncher(0, outside_kueue_group=True)) or []
    assert inside["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    meta = outside["metadata"]
    assert not [k for k in {**meta["labels"], **(meta.get("annotations") or {})} if k.startswith("kueue.")]
