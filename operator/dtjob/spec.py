"""Parse a DistributedTrainingJob's spec into frozen dataclasses, applying defaults in memory.

The CRD schema and its CEL rules reject most bad input at `kubectl apply`; this module re-checks what the
operator relies on (a CRD may be older than the operator, or a field may be set through a path that skipped
validation) and raises SpecError naming the field. Defaults live here and are never written back into the
object, so GitOps tools see no drift.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtjob import validators as rules
from dtjob.config import FRAMEWORKS, OperatorConfig
from dtjob.spec_reader import Reader, SpecError
from dtjob.storage_spec import Output, StageFrom, parse_output, parse_stage_from, resolve_destination

__all__ = ["SpecError"]  # spec_reader's; callers keep importing it from here

MAX_GPUS_PER_WORKER = 8  # the largest Azure GPU VMs (ND96 series) carry 8 GPUs
MAX_WORKERS = 512
# Worker hostnames are `<job>-worker-<i>` and must stay a DNS label (63 characters).
MAX_NAME_LENGTH = 45
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CLEAN_POD_POLICIES = ("None", "Running", "All")
RUNNERS = ("horovodrun", "mpirun")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SOURCES = ("synthetic", "imagenet")
# Deadlines and TTLs: 68 years, the batch Job's own int32 bound, so date arithmetic never overflows.
MAX_DURATION_SECONDS = 2**31 - 1

Json = dict[str, Any]


@dataclass(frozen=True)
class NfsVolume:
    server: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class PvcVolume:
    claim_name: str
    read_only: bool


@dataclass(frozen=True)
class DataVolume:
    nfs: NfsVolume | None
    pvc: PvcVolume | None
    mount_path: str


@dataclass(frozen=True)
class Staging:
    """spec.dataset.stageFrom with its destination resolved against the data volume."""

    source: StageFrom
    destination: str
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    source: str
    volume: DataVolume | None
    # Directory holding train/ and val/, inside the mounted volume.
    data_dir: str
    staging: Staging | None = None


@dataclass(frozen=True)
class Hyperparameters:
    batch_size_per_gpu: int = 64
    epochs: int = 1
    steps_per_epoch: int | None = None
    learning_rate: float = 0.0125
    warmup_epochs: float = 5.0
    momentum: float = 0.9
    weight_decay: float = 5e-5
    label_smoothing: float = 0.1
    amp: bool = True
    fp16_allreduce: bool = True
    channels_last: bool = True
    image_size: int = 224
    log_interval: int = 10
    seed: int = 42


@dataclass(frozen=True)
class Placement:
    node_selector: Mapping[str, str]
    tolerations: tuple[Json, ...]
    affinity: Json | None
    launcher_node_selector: Mapping[str, str]
    launcher_tolerations: tuple[Json, ...]


@dataclass(frozen=True)
class PodOverrides:
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Json | None = None


@dataclass(frozen=True)
class Launcher:
    runner: str = "horovodrun"
    run_as_worker: bool = False
    mpi_args: tuple[str, ...] = ()
    pod: PodOverrides = field(default_factory=PodOverrides)


@dataclass(frozen=True)
class Scheduling:
    scheduler_name: str | None = None
    queue_name: str | None = None
    pod_group: str | None = None


@dataclass(frozen=True)
class RunPolicy:
    backoff_limit: int = 3
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: str = "Running"
    suspend: bool = False
    scheduling: Scheduling = field(default_factory=Scheduling)


@dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str
    framework: str
    image: str
    image_pull_policy: str | None
    image_pull_secrets: tuple[str, ...]
    command: tuple[str, ...] | None
    args: tuple[str, ...] | None
    env: tuple[Json, ...]
    workers: int
    gpus_per_worker: int
    worker: PodOverrides
    dataset: Dataset
    hyperparameters: Hyperparameters
    placement: Placement
    launcher: Launcher
    run_policy: RunPolicy
    output: Output | None = None
    # Where rank 0 keeps checkpoints, so a restarted world resumes instead of starting over.
    checkpoints: DataVolume | None = None
    # Mount the namespace's default ServiceAccount token into workers and launcher (off: they need no API).
    automount_service_account_token: bool = False

    @property
    def total_slots(self) -> int:
        hosts = self.workers + (1 if self.launcher.run_as_worker else 0)
        return hosts * self.gpus_per_worker


def parse_spec(body: Mapping[str, Any], config: OperatorConfig) -> JobSpec:
    """The whole object (metadata + spec) -> JobSpec with every default filled in."""
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name", ""))
    if len(name) > MAX_NAME_LENGTH or not NAME_RE.fullmatch(name):
        raise SpecError(
            "metadata.name",
            f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            f"(lowercase letters, digits, '-', starting with a letter); got {name!r}",
        )
    spec = Reader(body.get("spec"), "spec")
    if not spec.has("framework"):
        raise SpecError("spec.framework", f"is required (one of {', '.join(FRAMEWORKS)})")
    framework = spec.choice("framework", FRAMEWORKS, "")
    workers = spec.integer("workers", None, minimum=1)
    if workers is None:
        raise SpecError("spec.workers", "is required")
    if workers > MAX_WORKERS:
        raise SpecError("spec.workers", f"must be <= {MAX_WORKERS}, got {workers}")
    gpus = spec.integer("gpusPerWorker", 1, minimum=1) or 1
    if gpus > MAX_GPUS_PER_WORKER:
        raise SpecError(
            "spec.gpusPerWorker", f"must be <= {MAX_GPUS_PER_WORKER} (GPUs on one node), got {gpus}"
        )
    env = spec.object_list("env")
    for i, item in enumerate(env):
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise SpecError(f"spec.env[{i}].name", "is required")
        if not rules.matches(rules.ENV_NAME, item["name"]):
            raise SpecError(
                f"spec.env[{i}].name",
                f"{item['name']!r} is not a valid environment variable name (letters, digits, '_', '-', '.', "
                "not starting with a digit)",
            )
    pull_secrets = tuple(
        _required(s, f"spec.imagePullSecrets[{i}].name")
        for i, s in enumerate(spec.object_list("imagePullSecrets"))
    )
    for i, secret in enumerate(pull_secrets):
        if (problem := rules.name_problem(secret, subdomain=True)) is not None:
            raise SpecError(f"spec.imagePullSecrets[{i}].name", problem)
    data = _dataset(spec.child("dataset"), config)
    return JobSpec(
        name=name,
        namespace=str(metadata.get("namespace", "default")),
        framework=framework,
        image=spec.checked("image", rules.image_problem) or config.image_for(framework),
        image_pull_policy=spec.choice("imagePullPolicy", PULL_POLICIES, "") or None,
        image_pull_secrets=pull_secrets,
        command=spec.string_list("command"),
        args=spec.string_list("args"),
        env=env,
        workers=workers,
        gpus_per_worker=gpus,
        worker=_pod_overrides(spec.child("worker")),
        dataset=data,
        hyperparameters=_hyperparameters(spec.child("hyperparameters")),
        placement=_placement(spec.child("placement"), config),
        launcher=_launcher(spec.child("launcher")),
        run_policy=_run_policy(spec.child("runPolicy")),
        output=parse_output(spec.data.get("output"), emulator_hosts=config.emulator_hosts),
        checkpoints=_checkpoints(spec.child("checkpoints"), data) if spec.has("checkpoints") else None,
        automount_service_account_token=spec.boolean("automountServiceAccountToken", False),
    )


def _required(item: Json, path: str) -> str:
    value = item.get("name")
    if not isinstance(value, str) or not value:
        raise SpecError(path, "is required")
    return value


def _pod_overrides(r: Reader) -> PodOverrides:
    return PodOverrides(
        annotations=r.labels("podAnnotations", values_are_labels=False),
        labels=r.labels("podLabels"),
        resources=_resources(r),
    )


def _resources(r: Reader) -> Json | None:
    """Container resources: qualified resource names, each a quantity (an integer or a quantity string)."""
    resources = r.optional_object("resources")
    if resources is None:
        return None
    for kind in ("limits", "requests"):
        values = resources.get(kind) or {}
        path = f"{r.at('resources')}.{kind}"
        if not isinstance(values, Mapping):
            raise SpecError(path, "must be an object")
        if len(values) > rules.MAX_MAP_ENTRIES:
            raise SpecError(path, f"must have at most {rules.MAX_MAP_ENTRIES} entries")
        for name, quantity in values.items():
            problem = rules.label_key_problem(str(name))
            if problem is not None:
                raise SpecError(f"{path}[{name}]", problem)
            if isinstance(quantity, bool) or not isinstance(quantity, int | str):
                raise SpecError(f"{path}[{name}]", f"must be a quantity, got {quantity!r}")
            if isinstance(quantity, str) and not rules.matches(rules.QUANTITY, quantity):
                raise SpecError(
                    f"{path}[{name}]", f"{quantity!r} is not a quantity (e.g. 2, 500m, 16Gi, 1.5e3)"
                )
    return resources


def _volume(r: Reader, default_mount: str, nfs_read_only: bool) -> DataVolume:
    """An NFS share or an existing PVC with its mount path (spec.dataset.volume, spec.checkpoints)."""
    nfs = pvc = None
    if r.has("nfs"):
        n = r.child("nfs")
        server, path = n.required_string("server"), n.required_string("path")
        if len(server) > rules.NFS_SERVER_MAX or not rules.matches(rules.NFS_SERVER, server):
            raise SpecError(n.at("server"), f"must be a host name or an IP address, got {server!r}")
        if len(path) > rules.PATH_MAX or not rules.matches(rules.NFS_PATH, path):
            raise SpecError(
                n.at("path"),
                f"must be '/' or an absolute path without empty, '.' or '..' segments; got {path!r}",
            )
        nfs = NfsVolume(server, path, n.boolean("readOnly", nfs_read_only))
    if r.has("persistentVolumeClaim"):
        p = r.child("persistentVolumeClaim")
        claim = p.required_string("claimName")
        if (problem := rules.name_problem(claim, subdomain=True)) is not None:
            raise SpecError(p.at("claimName"), problem)
        pvc = PvcVolume(claim, p.boolean("readOnly", False))
    if nfs and pvc:
        raise SpecError(r.path, "set either nfs or persistentVolumeClaim, not both")
    if not nfs and not pvc:
        raise SpecError(r.path, "must set nfs or persistentVolumeClaim")
    mount_path = r.checked("mountPath", rules.path_problem) or default_mount
    reserved = rules.reserved_mount(mount_path)
    if reserved is not None:
        raise SpecError(
            r.at("mountPath"),
            f"{mount_path!r} collides with {reserved}, which the operator mounts itself "
            f"(reserved: {', '.join(rules.RESERVED_MOUNT_PATHS)})",
        )
    return DataVolume(nfs=nfs, pvc=pvc, mount_path=mount_path)


def _checkpoints(r: Reader, data: Dataset) -> DataVolume:
    volume = _volume(r, "/checkpoints", nfs_read_only=False)
    if volume.nfs is not None and volume.nfs.read_only:
        raise SpecError(r.at("nfs.readOnly"), "must be false: rank 0 writes its checkpoints there")
    if volume.pvc is not None and volume.pvc.read_only:
        raise SpecError(
            r.at("persistentVolumeClaim.readOnly"), "must be false: rank 0 writes its checkpoints there"
        )
    if data.volume is not None and data.volume.mount_path == volume.mount_path:
        raise SpecError(
            r.at("mountPath"), f"{volume.mount_path!r} is spec.dataset.volume's mount path too: use another"
        )
    return volume


def _dataset(r: Reader, config: OperatorConfig) -> Dataset:
    source = r.choice("source", SOURCES, "synthetic")
    volume = _volume(r.child("volume"), "/data", nfs_read_only=True) if r.has("volume") else None
    if source == "imagenet" and volume is None:
        raise SpecError("spec.dataset.volume", "is required when spec.dataset.source is imagenet")
    default_dir = volume.mount_path if volume else "/data"
    data_dir = r.checked("dataDir", rules.path_problem) or default_dir
    if volume is not None and source == "imagenet" and not _inside(data_dir, volume.mount_path):
        raise SpecError(
            r.at("dataDir"), f"{data_dir!r} is outside spec.dataset.volume's mount path {volume.mount_path!r}"
        )
    stage = parse_stage_from(r.data.get("stageFrom"), emulator_hosts=config.emulator_hosts)
    staging = None
    if stage is not None:
        if volume is None:
            raise SpecError(
                "spec.dataset.volume", "is required with spec.dataset.stageFrom (the stager writes to it)"
            )
        destination = resolve_destination(stage, volume.mount_path, data_dir)
        if source != "imagenet":
            raise SpecError(
                r.at("stageFrom"),
                "applies only to spec.dataset.source imagenet (synthetic data reads nothing)",
            )
        annotations = r.child("stageFrom").labels("podAnnotations", values_are_labels=False)
        staging = Staging(stage, destination, annotations)
    return Dataset(source=source, volume=volume, data_dir=data_dir, staging=staging)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def _hyperparameters(r: Reader) -> Hyperparameters:
    d = Hyperparameters()
    return Hyperparameters(
        batch_size_per_gpu=r.integer("batchSizePerGpu", d.batch_size_per_gpu, minimum=1)
        or d.batch_size_per_gpu,
        epochs=r.integer("epochs", d.epochs, minimum=1) or d.epochs,
        steps_per_epoch=r.integer("stepsPerEpoch", None, minimum=1),
        learning_rate=r.number("learningRate", d.learning_rate),
        warmup_epochs=r.number("warmupEpochs", d.warmup_epochs),
        momentum=r.number("momentum", d.momentum),
        weight_decay=r.number("weightDecay", d.weight_decay),
        label_smoothing=r.number("labelSmoothing", d.label_smoothing, below=1.0),
        amp=r.boolean("amp", d.amp),
        fp16_allreduce=r.boolean("fp16Allreduce", d.fp16_allreduce),
        channels_last=r.boolean("channelsLast", d.channels_last),
        image_size=r.integer("imageSize", d.image_size, minimum=8) or d.image_size,
        log_interval=r.integer("logInterval", d.log_interval, minimum=1) or d.log_interval,
        seed=r.integer("seed", d.seed, minimum=0, maximum=rules.MAX_SEED) or 0,
    )


def _placement(r: Reader, config: OperatorConfig) -> Placement:
    pool = r.checked("nodePool", _node_pool_problem) or config.gpu_pool
    selector = {"kubernetes.azure.com/agentpool": pool}
    selector.update(r.labels("nodeSelector"))
    gpu_toleration: Json = {
        "key": config.gpu_taint_key,
        "operator": "Equal",
        "value": config.gpu_taint_value,
        "effect": "NoSchedule",
    }
    tolerations = (gpu_toleration, *(t for t in r.tolerations("tolerations") if t != gpu_toleration))
    launcher = r.child("launcher")
    launcher_pool = launcher.checked("nodePool", _node_pool_problem) or config.cpu_pool
    launcher_selector = {"kubernetes.azure.com/agentpool": launcher_pool}
    launcher_selector.update(launcher.labels("nodeSelector"))
    return Placement(
        node_selector=selector,
        tolerations=tolerations,
        affinity=r.optional_object("affinity"),
        launcher_node_selector=launcher_selector,
        launcher_tolerations=launcher.tolerations("tolerations"),
    )


def _node_pool_problem(pool: str) -> str | None:
    if rules.matches(rules.NODE_POOL, pool):
        return None
    return (
        f"{pool!r} is not an AKS node pool name (1-12 lowercase letters and digits, starting with a letter)"
    )


def _launcher(r: Reader) -> Launcher:
    return Launcher(
        runner=r.choice("runner", RUNNERS, "horovodrun"),
        run_as_worker=r.boolean("runAsWorker", False),
        mpi_args=r.string_list("mpiArgs") or (),
        pod=_pod_overrides(r),
    )


def _run_policy(r: Reader) -> RunPolicy:
    d = RunPolicy()
    s = r.child("scheduling")
    return RunPolicy(
        backoff_limit=r.integer("backoffLimit", d.backoff_limit, minimum=0) or 0,
        active_deadline_seconds=r.integer(
            "activeDeadlineSeconds", None, minimum=1, maximum=MAX_DURATION_SECONDS
        ),
        ttl_seconds_after_finished=r.integer(
            "ttlSecondsAfterFinished", None, minimum=0, maximum=MAX_DURATION_SECONDS
        ),
        clean_pod_policy=r.choice("cleanPodPolicy", CLEAN_POD_POLICIES, d.clean_pod_policy),
        suspend=r.boolean("suspend", False),
        scheduling=Scheduling(
            scheduler_name=s.checked("schedulerName", lambda n: rules.name_problem(n, subdomain=True)),
            queue_name=s.checked("queueName", lambda n: rules.name_problem(n, subdomain=False)),
            pod_group=s.checked("podGroup", lambda n: rules.name_problem(n, subdomain=False)),
        ),
    )
