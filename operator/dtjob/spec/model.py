"""The parsed spec of a DistributedTrainingJob: frozen dataclasses with every default filled in. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtjob.contract import training
from dtjob.spec import validators
from dtjob.spec.storage import Output, StageFrom

Json = dict[str, Any]
# custom: any program (`command`) in any image, with no dtjob_train flags unless asked.
CUSTOM = "custom"
FRAMEWORKS = (*training.FRAMEWORKS, CUSTOM)
# Long enough for a scheduler to place a gang that fits; a pool scaling up from zero may need longer.
DEFAULT_GANG_TIMEOUT_SECONDS = 60


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
    """spec.hyperparameters; the trainers' defaults (dtjob.contract.training) except epochs."""

    # batchSizePerGpu as given; None: the batch that fits the precision (see batch_size_per_gpu).
    given_batch_size_per_gpu: int | None = None
    # One epoch: a job that says nothing is a quick check of the world, not the trainers' 90-epoch recipe.
    epochs: int = 1
    steps_per_epoch: int | None = None
    learning_rate: float = training.DEFAULT_BASE_LR  # per LR_REFERENCE_BATCH images of the global batch
    warmup_epochs: float = training.DEFAULT_WARMUP_EPOCHS
    momentum: float = training.DEFAULT_MOMENTUM
    weight_decay: float = training.DEFAULT_WEIGHT_DECAY
    label_smoothing: float = training.DEFAULT_LABEL_SMOOTHING
    amp: bool = training.DEFAULT_AMP
    amp_dtype: str = training.DEFAULT_AMP_DTYPE
    fp16_allreduce: bool = training.DEFAULT_FP16_ALLREDUCE
    channels_last: bool = training.DEFAULT_CHANNELS_LAST
    xla: bool = training.DEFAULT_XLA  # TensorFlow and Keras
    data_loader: str = training.DEFAULT_DATA_LOADER  # PyTorch's input pipeline: auto, DataLoader or DALI
    compile: str = training.DEFAULT_COMPILE  # PyTorch: torch.compile's mode, auto or eager
    image_size: int = training.DEFAULT_IMAGE_SIZE
    log_interval: int = training.DEFAULT_LOG_INTERVAL
    seed: int = training.DEFAULT_SEED

    @property
    def batch_size_per_gpu(self) -> int:
        """The per-GPU batch: as given, else the trainers' default for the precision."""
        if self.given_batch_size_per_gpu is not None:
            return self.given_batch_size_per_gpu
        return training.default_batch(self.amp)


@dataclass(frozen=True)
class Placement:
    node_selector: Mapping[str, str]
    tolerations: tuple[Json, ...]
    affinity: Json | None
    launcher_node_selector: Mapping[str, str]
    launcher_tolerations: tuple[Json, ...]


@dataclass(frozen=True)
class PodTemplate:
    """spec.worker.template or spec.launcher.template, checked (dtjob.spec.template); dtjob.desired.template
    merges it over the pod the operator builds."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    spec: Json = field(default_factory=dict)  # a fragment of a Kubernetes PodSpec

    @property
    def images(self) -> frozenset[str]:
        """The images of the containers and init containers the template adds (each has one: parse checks)."""
        containers = [*(self.spec.get("initContainers") or ()), *(self.spec.get("containers") or ())]
        return frozenset(str(c["image"]) for c in containers if c.get("image"))


@dataclass(frozen=True)
class PodOverrides:
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Json | None = None
    template: PodTemplate | None = None

    @property
    def pod_labels(self) -> dict[str, str]:
        """podLabels with the template's labels over them (the operator's own go over both), less Kueue's."""
        return _without_kueue({**self.labels, **(self.template.labels if self.template else {})})

    @property
    def pod_annotations(self) -> dict[str, str]:
        """podAnnotations with the template's annotations over them, less Kueue's."""
        return _without_kueue({**self.annotations, **(self.template.annotations if self.template else {})})


def _without_kueue(keys: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in keys.items() if not validators.kueue_key_the_operator_sets(k)}


@dataclass(frozen=True)
class Launcher:
    runner: str = "horovodrun"
    run_as_worker: bool = False
    mpi_args: tuple[str, ...] = ()
    pod: PodOverrides = field(default_factory=PodOverrides)
    # The MPI the image carries, for runner mpirun: its launcher command line and hostfile format.
    mpi_implementation: str = "OpenMPI"


# How long a torchrun world's workers wait for each other at the rendezvous (torchrun's own default: 600 s).
DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS = 900
MAX_RENDEZVOUS_TIMEOUT_SECONDS = 86400


@dataclass(frozen=True)
class Torchrun:
    """spec.torchrun: the world runs under torchrun (torch.distributed), not MPI: no launcher, no SSH. Each
    worker's torchrun agent starts processes_per_worker processes; worker 0's hosts the rendezvous store."""

    processes_per_worker: int
    rendezvous_timeout_seconds: int = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS


# How long an elastic world may train below spec.elastic.minWorkers before the operator restarts it.
DEFAULT_ELASTIC_TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class Elastic:
    """spec.elastic: Horovod Elastic. A lost worker is replaced while the others train on; spec.workers is
    the size the operator aims for, and the world trains with anything from min_workers to max_workers."""

    min_workers: int
    max_workers: int
    timeout_seconds: int = DEFAULT_ELASTIC_TIMEOUT_SECONDS
    # Steps between the trainers' in-memory commits (--commit-every); None: the trainers' default.
    commit_every_steps: int | None = None


@dataclass(frozen=True)
class Gang:
    """runPolicy.scheduling.gang: the operator creates the gang scheduler's PodGroup for the world."""

    scheduler: str  # coscheduling (scheduler-plugins) | volcano
    # The coscheduling PodGroup's own timeout, and for either scheduler how long the workers may stay
    # unplaced before the job says why (condition GangScheduled, event GangScheduleTimeout).
    schedule_timeout_seconds: int = DEFAULT_GANG_TIMEOUT_SECONDS
    queue: str | None = None  # a Volcano Queue


TOPOLOGY_REQUIRED = "required"
TOPOLOGY_PREFERRED = "preferred"
TOPOLOGY_MODES = (TOPOLOGY_REQUIRED, TOPOLOGY_PREFERRED)


@dataclass(frozen=True)
class Topology:
    """runPolicy.scheduling.topology: the workers share one domain of a node label (a rack, a placement
    group), so the world's all-reduce stays on one switch."""

    key: str  # the node label key whose value names the domain
    mode: str = TOPOLOGY_REQUIRED  # required: wait for one domain; preferred: split when none has room

    @property
    def required(self) -> bool:
        return self.mode == TOPOLOGY_REQUIRED


@dataclass(frozen=True)
class Scheduling:
    scheduler_name: str | None = None
    queue_name: str | None = None
    pod_group: str | None = None
    gang: Gang | None = None
    topology: Topology | None = None
    # Not a field of the resource: False where a Workload of its own admits the world (a MultiKueue copy, the
    # pod templates of a dispatched job's Workload) or where a pod joins no group (spec.managed_by.unqueued).
    kueue_pod_group: bool = True


@dataclass(frozen=True)
class RunPolicy:
    backoff_limit: int = 3
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: str = "Running"
    suspend: bool = False
    scheduling: Scheduling = field(default_factory=Scheduling)
    # A world whose pods cannot start (unschedulable, image pull, config error) fails after this long.
    startup_deadline_seconds: int | None = None
    # A running world that prints no new progress record (a step or epoch further) for this long is hung (a
    # rank waiting forever on a collective, a data loader's deadlock): it is restarted, counted.
    progress_deadline_seconds: int | None = None
    # OnFailure: any failure restarts the world. ExitCode: a launcher exit code in permanent_exit_codes is
    # the user's code failing, so the job fails without a restart; signals and infrastructure restart.
    restart_policy: str = "OnFailure"
    permanent_exit_codes: tuple[tuple[int, int], ...] = ((1, 127),)

    def is_permanent(self, exit_code: int | None) -> bool:
        """Whether the launcher's exit code fails the job for good under this policy."""
        if self.restart_policy != "ExitCode" or exit_code is None:
            return False
        return any(low <= exit_code <= high for low, high in self.permanent_exit_codes)


@dataclass(frozen=True)
class InstallerRegistry:
    """The installer's registry: its pull Secrets (DTJOB_IMAGE_PULL_SECRETS) and the images the installer
    configured (the training images, the stager's). Those Secrets are the registry's credentials: they go
    only to pods that run nothing but those images, and must exist in the job's namespace, as the spec's
    own must."""

    pull_secrets: tuple[str, ...] = ()
    images: frozenset[str] = frozenset()


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
    gpus_per_worker: int  # 0: a CPU job, placed on the CPU pool
    slots_per_worker: int  # MPI ranks per worker (default: one per GPU, or 1)
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
    # With a user's command: also pass the flags built from dataset and hyperparameters (dtjob_train's).
    append_training_flags: bool = False
    elastic: Elastic | None = None
    installer_registry: InstallerRegistry = field(default_factory=InstallerRegistry)
    # On a worker cluster, Kueue's copy of a dispatched job: its own Workload there, which admitted it (the
    # label or annotation kueue.x-k8s.io/prebuilt-workload-name); its world joins no pod group of Kueue's.
    prebuilt_workload: str | None = None
    prebuilt_field: str = ""  # where the job names it: the label's field, or the annotation's
    # An elastic copy Kueue admitted in part: the workers its Workload asks for (spec.workers is then the
    # admitted count, the size its world aims for); None otherwise.
    workload_workers: int | None = None
    # A world Kueue admitted as one pod group keeps the size it was made with (spec.workers is then that
    # size): spec.workers as edited since, which applies at the next world; None otherwise.
    edited_workers: int | None = None
    torchrun: Torchrun | None = None  # spec.torchrun: the world runs under torchrun instead of MPI

    def pull_secrets(self, pod: PodOverrides) -> tuple[str, ...]:
        """The pull Secrets of a worker or launcher pod (`pod`: spec.worker or spec.launcher.pod): the spec's,
        then the installer's when every image the pod runs (spec.image, its template's containers) is one the
        installer configured. A job that brings its own image brings its own pull Secrets."""
        images = {self.image, *(pod.template.images if pod.template else ())}
        registry = self.installer_registry
        installers = registry.pull_secrets if images <= registry.images else ()
        return tuple(dict.fromkeys(self.image_pull_secrets + installers))

    @property
    def stager_pull_secrets(self) -> tuple[str, ...]:
        """The staging pod's: the installer's, whose stager image it runs (none when nothing is staged)."""
        return self.installer_registry.pull_secrets if self.dataset.staging is not None else ()

    @property
    def every_pull_secret(self) -> tuple[str, ...]:
        """Every pull Secret any of the job's pods names: what must exist before the first is created."""
        pods = (*self.pull_secrets(self.worker), *self.pull_secrets(self.launcher.pod))
        return tuple(dict.fromkeys((*pods, *self.stager_pull_secrets)))

    @property
    def total_slots(self) -> int:
        hosts = self.workers + (1 if self.launcher.run_as_worker else 0)
        return hosts * self.slots_per_worker
