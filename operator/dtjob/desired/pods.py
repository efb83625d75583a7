"""Worker Pods (sshd + GPUs + data) and the launcher Pod (horovodrun/mpirun) of one world attempt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dtjob import gang, names
from dtjob.desired.command import (
    LAUNCHER_DEFAULT_ENV,
    LAUNCHER_MPI_ENV,
    elastic_worker_script,
    launcher_script,
    rank_env,
    worker_sshd_script,
)
from dtjob.desired.common import (
    MPI_DIR,
    OUTPUT_DIR,
    SSH_DIR,
    SSH_KEY_FILE,
    SSH_PORT,
    TRAINING_UID,
    Json,
    container_security_context,
    held_until_workers_ready,
    metadata,
    pod_security_context,
    sas_mount_path,
)
from dtjob.desired.template import merge_pod_spec, template_annotations
from dtjob.desired.topology import worker_with_topology
from dtjob.desired.torchrun import RENDEZVOUS_PORT, torchrun_worker_script
from dtjob.names import Access
from dtjob.spec import validators as rules
from dtjob.spec.parse import DataVolume, JobSpec, PodOverrides

GPU_RESOURCE = rules.GPU_RESOURCE
# Group-readable: kubelet writes Secret files owned by root with group fsGroup, so the pod's user reads them
# through its group. The ssh client only rejects a too-open identity file that the calling user owns (openssh
# sshkey_perm_ok: st_uid == getuid() && mode & 077), and the workers' sshd runs with StrictModes=no.
# A worker on a node that went NotReady or unreachable is evicted after this long instead of the default five
# minutes: its rank is gone, and the world restarts only once the pod is (WorkerLost, counted once).
NODE_LOST_TOLERATION_SECONDS = 30
SSH_KEY_MODE = 0o440
SCRIPT_MODE = 0o555
# Each pod gets only the half of the job's key pair it uses: the launcher the private key it logs in with (it
# starts every rank's daemon itself: plm_rsh_no_tree_spawn), workers the authorized_keys their sshd checks.
AUTHORIZED_KEYS = "authorized_keys"
WORKER_SSH_FILES = (AUTHORIZED_KEYS,)
LAUNCHER_SSH_FILES = (SSH_KEY_FILE,)


# A pod that asks for no GPU may still land where the NVIDIA container runtime is the default, and the
# training image asks that runtime for every GPU (NVIDIA_VISIBLE_DEVICES=all, as the CUDA images do): blanked,
# it gets none, whatever the job's env says (this entry comes after it, and the last one wins).
def _hidden_gpus() -> Json:
    return {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}


def worker_pod(spec: JobSpec, owner: Json, index: int, attempt: int, avoid_nodes: Sequence[str] = ()) -> Json:
    name = names.worker_name(spec.name, index)
    labels = {
        **spec.worker.pod_labels,
        **_pod_labels(spec, names.ROLE_WORKER, attempt),
        names.WORKER_INDEX_LABEL: str(index),
        names.MPI_HOST_LABEL: "true",
    }
    if spec.torchrun is not None:
        labels[names.WORLD_SIZE_LABEL] = str(spec.workers)
    container: Json = {
        "name": names.WORKER_CONTAINER,
        "image": spec.image,
        **_worker_program(spec, index, str(owner.get("uid", "")), attempt),
        "env": _env(spec) if spec.gpus_per_worker else [*_env(spec), _hidden_gpus()],
        "resources": _gpu_resources(spec.worker, spec.gpus_per_worker),
        "volumeMounts": _mounts(spec, with_hostfile=False, rank0=_rank0_worker(spec, index)),
        # Not a read-only root filesystem: sshd mints its host key in /tmp; the ranks write /tmp and $HOME.
        "securityContext": container_security_context(),
    }
    _pull_policy(spec, container)
    pod_spec: Json = {
        "hostname": name,
        "subdomain": names.service_name(spec.name),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # No selector for a CPU job on the default CPU pool (""): any node it tolerates.
        **({"nodeSelector": dict(spec.placement.node_selector)} if spec.placement.node_selector else {}),
        "tolerations": _worker_tolerations(spec),
        "containers": [container],
        "volumes": _volumes(spec, with_hostfile=False, rank0=_rank0_worker(spec, index)),
    }
    _common_pod_spec(spec, pod_spec, gpu_placement=True)
    _pull_secrets(spec, spec.worker, pod_spec)
    pod_spec, annotations = _with_template(spec.worker, pod_spec, names.WORKER_CONTAINER)
    pod_spec = worker_with_topology(spec, pod_spec)
    pod_spec = off_nodes(pod_spec, avoid_nodes)
    annotations = {**annotations, **gang.pod_annotations(spec, names.ROLE_WORKER)}
    # Only ever what the operator added, whatever the job's annotations say: a value of the job's own would
    # have an unplaced worker made again at every reconcile, for a node that was never flagged.
    annotations.pop(names.AVOIDED_NODES_ANNOTATION, None)
    if avoid_nodes:
        annotations[names.AVOIDED_NODES_ANNOTATION] = ",".join(sorted(avoid_nodes))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, spec.namespace, labels, owner, annotations),
        "spec": pod_spec,
    }


def worker_scheduling(spec: JobSpec) -> tuple[list[Json], Json | None]:
    """The tolerations and affinity of the workers' pods, their template's merged in: which nodes they may
    land on (preflight and a waiting gang's pool room count only those)."""
    pod_spec = worker_pod(spec, {}, 0, 0)["spec"]
    return list(pod_spec.get("tolerations") or ()), pod_spec.get("affinity")


def _worker_program(spec: JobSpec, index: int, uid: str, attempt: int) -> Json:
    """The worker's command, ports and probe: sshd for an MPI world (Ready once sshd accepts connections, and
    the launcher is created only after every worker is Ready); torchrun for a torchrun world, whose worker 0
    takes the others' rendezvous (Ready as soon as it runs: its name must resolve for the others to join)."""
    if spec.torchrun is not None:
        program: Json = {"command": ["/bin/sh", "-c", torchrun_worker_script(spec, index, uid, attempt)]}
        if index == 0:
            program["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]
        return program
    return {
        "command": ["/bin/sh", "-c", elastic_worker_script() if spec.elastic else worker_sshd_script()],
        "ports": [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": SSH_PORT},
            "initialDelaySeconds": 1,
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
    }


def off_nodes(pod_spec: Json, nodes: Sequence[str]) -> Json:
    """The pod kept off `nodes` (those whose conditions say they cannot keep a worker): `metadata.name NotIn`
    added to every required node selector term, the job's own included (terms are ORed, so each needs it)."""
    if not nodes:
        return pod_spec
    away = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    affinity = dict(pod_spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or ()] or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or ()), away]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return {**pod_spec, "affinity": affinity}


def launcher_pod(spec: JobSpec, owner: Json, attempt: int) -> Json:
    """The launcher's pod, made with its world's workers and held (names.LAUNCH_GATE) until every one of them
    is Ready. The operator makes it itself, not through a batch Job: a world's restarts are the operator's
    (runPolicy.backoffLimit), so a Job would add only kube-controller-manager's queue to every job's start."""
    name = names.launcher_name(spec.name)
    on_gpu = spec.launcher.run_as_worker
    labels = {
        **spec.launcher.pod.pod_labels,
        **_pod_labels(spec, names.ROLE_LAUNCHER, attempt),
        names.WORLD_SIZE_LABEL: str(spec.workers),
    }
    own = _env(spec)
    named = {str(e["name"]) for e in own}
    defaults = [(k, v) for k, v in LAUNCHER_DEFAULT_ENV if k not in named]
    env = [{"name": k, "value": v} for k, v in (*LAUNCHER_MPI_ENV, *defaults)] + own
    if on_gpu:
        labels[names.MPI_HOST_LABEL] = "true"
        resources = _gpu_resources(spec.launcher.pod, spec.gpus_per_worker)
    else:
        env.append(_hidden_gpus())
        resources = _quantities(spec.launcher.pod.resources)
    container: Json = {
        "name": names.LAUNCHER_CONTAINER,
        "image": spec.image,
        "command": ["/bin/sh", "-c", launcher_script(spec, str(owner.get("uid", "")))],
        "env": env,
        "resources": resources,
        "volumeMounts": _mounts(spec, with_hostfile=True, with_data=on_gpu, rank0=_rank0_launcher(spec)),
        # Not a read-only root filesystem: the launcher writes $HOME/.ssh/config, horovodrun and ranks /tmp.
        "securityContext": container_security_context(),
    }
    _pull_policy(spec, container)
    pod_spec: Json = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": _volumes(spec, with_hostfile=True, with_data=on_gpu, rank0=_rank0_launcher(spec)),
    }
    _place_launcher(spec, pod_spec, name)
    _common_pod_spec(spec, pod_spec, gpu_placement=on_gpu)
    _pull_secrets(spec, spec.launcher.pod, pod_spec)
    pod_spec, annotations = _with_template(spec.launcher.pod, pod_spec, names.LAUNCHER_CONTAINER)
    if on_gpu:  # one of the world's hosts: it joins the workers' domain (with Kueue, Kueue places it there)
        pod_spec = worker_with_topology(spec, pod_spec)
    pod_spec = held_until_workers_ready(pod_spec)  # made with its world, it starts once every worker is Ready
    annotations = {**annotations, **gang.pod_annotations(spec, names.ROLE_LAUNCHER)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, spec.namespace, labels, owner, annotations),
        "spec": pod_spec,
    }


def _place_launcher(spec: JobSpec, pod_spec: Json, name: str) -> None:
    """A launcher that runs as a worker goes where the workers go, as one of the world's hosts; otherwise to
    the launcher's own (CPU) placement."""
    if spec.launcher.run_as_worker:
        pod_spec["hostname"] = name
        pod_spec["subdomain"] = names.service_name(spec.name)
        if spec.placement.node_selector:
            pod_spec["nodeSelector"] = dict(spec.placement.node_selector)
        pod_spec["tolerations"] = _worker_tolerations(spec)
    else:
        if spec.placement.launcher_node_selector:  # none on the default CPU pool (""): any untainted node
            pod_spec["nodeSelector"] = dict(spec.placement.launcher_node_selector)
        if spec.placement.launcher_tolerations:
            pod_spec["tolerations"] = [dict(t) for t in spec.placement.launcher_tolerations]


def _with_template(pod: PodOverrides, pod_spec: Json, main: str) -> tuple[Json, dict[str, str]]:
    """The pod's spec and annotations with the job's template (if any) merged over them."""
    annotations = pod.pod_annotations
    if pod.template is None:
        return pod_spec, annotations
    merged = merge_pod_spec(pod_spec, pod.template.spec, main)
    return merged, template_annotations(annotations, pod.template.spec, main)


def _worker_tolerations(spec: JobSpec) -> list[Json]:
    """The spec's tolerations, plus a short stay on a lost node unless the spec tolerates those itself."""
    tolerations = [dict(t) for t in spec.placement.tolerations]
    own = {t.get("key") for t in tolerations}
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if taint not in own:
            tolerations.append({
                "key": taint, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": NODE_LOST_TOLERATION_SECONDS,
            })  # fmt: skip
    return tolerations


def _rank0_worker(spec: JobSpec, index: int) -> bool:
    """Worker 0 runs rank 0 (which checkpoints and uploads results) unless the launcher runs ranks itself;
    in an elastic world rank 0 moves to another worker when its host is lost, so every worker may."""
    if spec.elastic is not None:
        return True
    return index == 0 and not spec.launcher.run_as_worker


def _rank0_launcher(spec: JobSpec) -> bool:
    return spec.launcher.run_as_worker


def _pod_labels(spec: JobSpec, role: str, attempt: int) -> dict[str, str]:
    labels = names.labels(spec.name, role, role)
    labels[names.ATTEMPT_LABEL] = str(attempt)
    labels.update(gang.pod_labels(spec, role))
    return labels


def _common_pod_spec(spec: JobSpec, pod_spec: Json, gpu_placement: bool) -> None:
    # The MPI world runs as the training images' user: sshd, ssh and the ranks alike.
    pod_spec["securityContext"] = pod_security_context(TRAINING_UID)
    # Nothing in the world talks to the Kubernetes API: no token in the pods unless the job asks for one.
    pod_spec["automountServiceAccountToken"] = spec.automount_service_account_token
    scheduler_name = gang.scheduler_name(spec)
    if scheduler_name:
        pod_spec["schedulerName"] = scheduler_name
    if gpu_placement and spec.placement.affinity:
        pod_spec["affinity"] = spec.placement.affinity


def _pull_secrets(spec: JobSpec, pod: PodOverrides, pod_spec: Json) -> None:
    """The spec's pull Secrets, and the installer's where the pod runs only the installer's images."""
    secrets = spec.pull_secrets(pod)
    if secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in secrets]


def _pull_policy(spec: JobSpec, container: Json) -> None:
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy


def _env(spec: JobSpec) -> list[Json]:
    return rank_env(spec)


def _gpu_resources(pod: PodOverrides, gpus: int) -> Json:
    """The pod's resources with gpusPerWorker as its nvidia.com/gpu; a CPU job (0) asks for none."""
    resources = _quantities(pod.resources)
    if gpus == 0:
        for kind in resources.values():
            kind.pop(GPU_RESOURCE, None)
        return resources
    resources.setdefault("limits", {})[GPU_RESOURCE] = str(gpus)
    if GPU_RESOURCE in resources.get("requests", {}):
        resources["requests"][GPU_RESOURCE] = str(gpus)
    return resources


def _quantities(resources: Json | None) -> dict[str, Any]:
    """Resource quantities as strings (the API's canonical form; the schema also accepts integers)."""
    return {
        kind: {name: str(value) for name, value in values.items()}
        for kind, values in (resources or {}).items()
        if isinstance(values, dict)
    }


def _mounts(spec: JobSpec, with_hostfile: bool, with_data: bool = True, rank0: bool = False) -> list[Json]:
    mounts: list[Json] = [
        *([] if spec.torchrun is not None else [{"name": "ssh", "mountPath": SSH_DIR, "readOnly": True}]),
        {"name": "output", "mountPath": OUTPUT_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if with_hostfile:
        mounts.append({"name": "mpi", "mountPath": MPI_DIR, "readOnly": True})
    volume = spec.dataset.volume
    if with_data and volume is not None:
        read_only = volume.nfs.read_only if volume.nfs else bool(volume.pvc and volume.pvc.read_only)
        mounts.append({"name": rules.DATA_VOLUME, "mountPath": volume.mount_path, "readOnly": read_only})
    if rank0 and spec.output is not None:
        mounts.append(sas_volume_mount(Access.OUTPUT))
    if rank0 and spec.checkpoints is not None:
        mounts.append({"name": rules.CHECKPOINTS_VOLUME, "mountPath": spec.checkpoints.mount_path})
    return mounts


def _volumes(spec: JobSpec, with_hostfile: bool, with_data: bool = True, rank0: bool = False) -> list[Json]:
    ssh_files = LAUNCHER_SSH_FILES if with_hostfile else WORKER_SSH_FILES
    ssh: Json = {
        "name": "ssh",
        "secret": {
            "secretName": names.ssh_secret_name(spec.name),
            "defaultMode": SSH_KEY_MODE,
            "items": [{"key": f, "path": f} for f in ssh_files],
        },
    }
    volumes: list[Json] = [
        *([] if spec.torchrun is not None else [ssh]),  # a torchrun world has no SSH key
        {"name": "output", "emptyDir": {}},
        # NCCL and PyTorch data loaders share memory through /dev/shm, which defaults to 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if with_hostfile:
        volumes.append(
            {
                "name": "mpi",
                "configMap": {"name": names.hostfile_name(spec.name), "defaultMode": SCRIPT_MODE},
            }
        )
    data = data_volume(spec)
    if with_data and data is not None:
        volumes.append(data)
    if rank0 and spec.output is not None:
        volumes.append(sas_volume(spec.name, Access.OUTPUT))
    if rank0 and spec.checkpoints is not None:
        volumes.append(pod_volume(rules.CHECKPOINTS_VOLUME, spec.checkpoints))
    return volumes


def sas_volume(job: str, access: Access) -> Json:
    """The pod volume for `<job>-sas-in|out`; group-readable only (the pod's fsGroup)."""
    return {
        "name": f"sas-{access.value}",
        "secret": {"secretName": names.sas_secret_name(job, access), "defaultMode": 0o440},
    }


def sas_volume_mount(access: Access) -> Json:
    """Mounted as a directory, never with subPath: subPath mounts do not receive Secret updates, and the
    token must follow rotation."""
    return {"name": f"sas-{access.value}", "mountPath": sas_mount_path(access), "readOnly": True}


def data_volume(spec: JobSpec) -> Json | None:
    """The pod volume named `data` for spec.dataset.volume (workers, and writable for the stager)."""
    volume = spec.dataset.volume
    return pod_volume(rules.DATA_VOLUME, volume) if volume is not None else None


def pod_volume(name: str, volume: DataVolume) -> Json:
    if volume.nfs:
        nfs = volume.nfs
        return {"name": name, "nfs": {"server": nfs.server, "path": nfs.path, "readOnly": nfs.read_only}}
    assert volume.pvc is not None
    claim = {"claimName": volume.pvc.claim_name, "readOnly": volume.pvc.read_only}
    return {"name": name, "persistentVolumeClaim": claim}
