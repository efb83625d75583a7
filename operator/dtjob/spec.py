"""Parse a DistributedTrainingJob's spec into frozen dataclasses, applying defaults in memory.

The CRD schema and its CEL rules reject most bad input at `kubectl apply`; this module re-checks what the
operator relies on (a CRD may be older than the operator, or a field may be set through a path that skipped
validation) and raises SpecError naming the field. Defaults live here and are never written back into the
object, so GitOps tools see no drift.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dtjob.config import FRAMEWORKS, OperatorConfig
from dtjob.storage_spec import (
    Output,
    StageFrom,
    StorageSpecError,
    parse_output,
    parse_stage_from,
    resolve_destination,
)

MAX_GPUS_PER_WORKER = 8  # the largest Azure GPU VMs (ND96 series) carry 8 GPUs
MAX_WORKERS = 512
# Worker hostnames are `<job>-worker-<i>` and must stay a DNS label (63 characters).
MAX_NAME_LENGTH = 45
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CLEAN_POD_POLICIES = ("None", "Running", "All")
RUNNERS = ("horovodrun", "mpirun")
SOURCES = ("synthetic", "imagenet")

Json = dict[str, Any]
_T = TypeVar("_T")


class SpecError(ValueError):
    """A spec value the operator cannot run; `path` names the field (e.g. `spec.workers`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


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


class _Reader:
    """Typed access to one object of the spec, remembering its path for error messages."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SpecError(path, f"must be an object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def child(self, key: str) -> _Reader:
        return _Reader(self.data.get(key), self.at(key))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise SpecError(self.at(key), f"must be a string, got {value!r}")
        return value

    def required_string(self, key: str) -> str:
        value = self.string(key)
        if not value:
            raise SpecError(self.at(key), "is required")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(key, default) or default
        if value not in choices:
            raise SpecError(self.at(key), f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def integer(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(self.at(key), f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise SpecError(self.at(key), f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(self.at(key), f"must be a number, got {value!r}")
        if value < minimum:
            raise SpecError(self.at(key), f"must be >= {minimum}, got {value}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"must be true or false, got {value!r}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.data.get(key) or {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SpecError(self.at(key), "must map strings to strings")
        return dict(value)

    def string_list(self, key: str) -> tuple[str, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SpecError(self.at(key), "must be a list of strings")
        return tuple(value)

    def object_list(self, key: str) -> tuple[Json, ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise SpecError(self.at(key), "must be a list of objects")
        return tuple(dict(v) for v in value)

    def optional_object(self, key: str) -> Json | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise SpecError(self.at(key), "must be an object")
        return dict(value)


def parse_spec(body: Mapping[str, Any], config: OperatorConfig) -> JobSpec:
    """The whole object (metadata + spec) -> JobSpec with every default filled in."""
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name", ""))
    if len(name) > MAX_NAME_LENGTH or not NAME_RE.match(name):
        raise SpecError(
            "metadata.name",
            f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            f"(lowercase letters, digits, '-', starting with a letter); got {name!r}",
        )
    spec = _Reader(body.get("spec"), "spec")
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
    pull_secrets = tuple(
        _required(s, f"spec.imagePullSecrets[{i}].name")
        for i, s in enumerate(spec.object_list("imagePullSecrets"))
    )
    return JobSpec(
        name=name,
        namespace=str(metadata.get("namespace", "default")),
        framework=framework,
        image=spec.string("image") or config.image_for(framework),
        image_pull_policy=spec.string("imagePullPolicy"),
        image_pull_secrets=pull_secrets,
        command=spec.string_list("command"),
        args=spec.string_list("args"),
        env=env,
        workers=workers,
        gpus_per_worker=gpus,
        worker=_pod_overrides(spec.child("worker")),
        dataset=_dataset(spec.child("dataset"), config),
        hyperparameters=_hyperparameters(spec.child("hyperparameters")),
        placement=_placement(spec.child("placement"), config),
        launcher=_launcher(spec.child("launcher")),
        run_policy=_run_policy(spec.child("runPolicy")),
        output=_storage(lambda: parse_output(spec.data.get("output"), emulator_hosts=config.emulator_hosts)),
        checkpoints=_volume(spec.child("checkpoints"), "/checkpoints", nfs_read_only=False)
        if spec.has("checkpoints")
        else None,
        automount_service_account_token=spec.boolean("automountServiceAccountToken", False),
    )


def _storage(parse: Callable[[], _T]) -> _T:
    """Run a storage_spec parser, re-raising its errors as SpecError (same field path and message)."""
    try:
        return parse()
    except StorageSpecError as err:
        raise SpecError(err.path, err.message) from None


def _required(item: Json, path: str) -> str:
    value = item.get("name")
    if not isinstance(value, str) or not value:
        raise SpecError(path, "is required")
    return value


def _pod_overrides(r: _Reader) -> PodOverrides:
    return PodOverrides(
        annotations=r.string_map("podAnnotations"),
        labels=r.string_map("podLabels"),
        resources=r.optional_object("resources"),
    )


def _volume(v: _Reader, default_mount: str, nfs_read_only: bool) -> DataVolume:
    """An NFS share or an existing PVC with its mount path (spec.dataset.volume, spec.checkpoints)."""
    nfs = pvc = None
    if v.has("nfs"):
        n = v.child("nfs")
        nfs = NfsVolume(
            n.required_string("server"), n.required_string("path"), n.boolean("readOnly", nfs_read_only)
        )
    if v.has("persistentVolumeClaim"):
        p = v.child("persistentVolumeClaim")
        pvc = PvcVolume(p.required_string("claimName"), p.boolean("readOnly", False))
    if nfs and pvc:
        raise SpecError(v.path, "set either nfs or persistentVolumeClaim, not both")
    if not nfs and not pvc:
        raise SpecError(v.path, "must set nfs or persistentVolumeClaim")
    mount_path = v.string("mountPath", default_mount) or default_mount
    if not mount_path.startswith("/"):
        raise SpecError(v.at("mountPath"), f"must be an absolute path, got {mount_path!r}")
    return DataVolume(nfs=nfs, pvc=pvc, mount_path=mount_path)


def _dataset(r: _Reader, config: OperatorConfig) -> Dataset:
    source = r.choice("source", SOURCES, "synthetic")
    volume = _volume(r.child("volume"), "/data", nfs_read_only=True) if r.has("volume") else None
    if source == "imagenet" and volume is None:
        raise SpecError("spec.dataset.volume", "is required when spec.dataset.source is imagenet")
    default_dir = volume.mount_path if volume else "/data"
    data_dir = r.string("dataDir", default_dir) or default_dir
    stage = _storage(lambda: parse_stage_from(r.data.get("stageFrom"), emulator_hosts=config.emulator_hosts))
    staging = None
    if stage is not None:
        if volume is None:
            raise SpecError(
                "spec.dataset.volume", "is required with spec.dataset.stageFrom (the stager writes to it)"
            )
        destination = _storage(lambda: resolve_destination(stage, volume.mount_path, data_dir))
        annotations = r.child("stageFrom").string_map("podAnnotations")
        staging = Staging(stage, destination, annotations)
    return Dataset(source=source, volume=volume, data_dir=data_dir, staging=staging)


def _hyperparameters(r: _Reader) -> Hyperparameters:
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
        label_smoothing=r.number("labelSmoothing", d.label_smoothing),
        amp=r.boolean("amp", d.amp),
        fp16_allreduce=r.boolean("fp16Allreduce", d.fp16_allreduce),
        channels_last=r.boolean("channelsLast", d.channels_last),
        image_size=r.integer("imageSize", d.image_size, minimum=8) or d.image_size,
        log_interval=r.integer("logInterval", d.log_interval, minimum=1) or d.log_interval,
        seed=r.integer("seed", d.seed, minimum=0) or 0,
    )


def _placement(r: _Reader, config: OperatorConfig) -> Placement:
    pool = r.string("nodePool", config.gpu_pool) or config.gpu_pool
    selector = {"kubernetes.azure.com/agentpool": pool}
    selector.update(r.string_map("nodeSelector"))
    gpu_toleration: Json = {
        "key": config.gpu_taint_key,
        "operator": "Equal",
        "value": config.gpu_taint_value,
        "effect": "NoSchedule",
    }
    tolerations = (gpu_toleration, *(t for t in r.object_list("tolerations") if t != gpu_toleration))
    launcher = r.child("launcher")
    launcher_pool = launcher.string("nodePool", config.cpu_pool) or config.cpu_pool
    launcher_selector = {"kubernetes.azure.com/agentpool": launcher_pool}
    launcher_selector.update(launcher.string_map("nodeSelector"))
    return Placement(
        node_selector=selector,
        tolerations=tolerations,
        affinity=r.optional_object("affinity"),
        launcher_node_selector=launcher_selector,
        launcher_tolerations=launcher.object_list("tolerations"),
    )


def _launcher(r: _Reader) -> Launcher:
    return Launcher(
        runner=r.choice("runner", RUNNERS, "horovodrun"),
        run_as_worker=r.boolean("runAsWorker", False),
        mpi_args=r.string_list("mpiArgs") or (),
        pod=_pod_overrides(r),
    )


def _run_policy(r: _Reader) -> RunPolicy:
    d = RunPolicy()
    s = r.child("scheduling")
    return RunPolicy(
        backoff_limit=r.integer("backoffLimit", d.backoff_limit, minimum=0) or 0,
        active_deadline_seconds=r.integer("activeDeadlineSeconds", None, minimum=1),
        ttl_seconds_after_finished=r.integer("ttlSecondsAfterFinished", None, minimum=0),
        clean_pod_policy=r.choice("cleanPodPolicy", CLEAN_POD_POLICIES, d.clean_pod_policy),
        suspend=r.boolean("suspend", False),
        scheduling=Scheduling(
            scheduler_name=s.string("schedulerName"),
            queue_name=s.string("queueName"),
            pod_group=s.string("podGroup"),
        ),
    )
