"""Parse a DistributedTrainingJob's spec into frozen dataclasses, applying defaults in memory.

The CRD schema and its CEL rules reject most bad input at `kubectl apply`; this module re-checks what the
operator relies on (a CRD may be older than the operator, or a field may be set through a path that skipped
validation) and raises SpecError naming the field. Defaults live on the model (dtjob.spec.model, the
hyperparameters' from dtjob.contract.training, which the trainers share) and are never written back into
the object, so GitOps tools see no drift.

parse_spec reads the top level; the sections have modules of their own, all read with dtjob.spec.reader's
Reader: run (pods, launcher, run policy, hyperparameters), volumes (dataset, checkpoints) and storage (Blob
Storage). The result is dtjob.spec.model's JobSpec, re-exported here with SpecError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from dtjob.spec import validators as rules
from dtjob.spec.elastic import check_elastic_launcher, parse_elastic
from dtjob.spec.managed_by import (
    managed_by_problem,
    prebuilt_workload,
    prebuilt_workload_field,
    prebuilt_workload_problem,
    unqueued,
)
from dtjob.spec.model import (
    CUSTOM,
    FRAMEWORKS,
    Dataset,
    DataVolume,
    Elastic,
    Gang,
    Hyperparameters,
    InstallerRegistry,
    JobSpec,
    Launcher,
    NfsVolume,
    Placement,
    PodOverrides,
    PodTemplate,
    PvcVolume,
    RunPolicy,
    Scheduling,
    Staging,
)
from dtjob.spec.reader import Json, Reader, SpecError
from dtjob.spec.run import (
    parse_hyperparameters,
    parse_launcher,
    parse_placement,
    parse_pod_overrides,
    parse_run_policy,
)
from dtjob.spec.storage import parse_output
from dtjob.spec.template import check_mount_paths
from dtjob.spec.torchrun import parse_torchrun
from dtjob.spec.volumes import parse_checkpoints, parse_dataset

__all__ = [
    "DataVolume",
    "Dataset",
    "Elastic",
    "Gang",
    "Hyperparameters",
    "JobSpec",
    "Launcher",
    "NfsVolume",
    "Placement",
    "PodOverrides",
    "PodTemplate",
    "PvcVolume",
    "RunPolicy",
    "Scheduling",
    "SpecError",
    "Staging",
    "parse_spec",
]

MAX_GPUS_PER_WORKER = 8  # the largest Azure GPU VMs (ND96 series) carry 8 GPUs
MAX_SLOTS_PER_WORKER = 256  # ranks on one host: the cores of the largest CPU VMs, with room
MAX_WORKERS = 512
# Worker hostnames are `<job>-worker-<i>` and must stay a DNS label (63 characters).
MAX_NAME_LENGTH = 45
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def parse_spec(body: Mapping[str, Any], config: OperatorConfig) -> JobSpec:
    """The whole object (metadata + spec) -> JobSpec with every default filled in."""
    metadata = body.get("metadata") or {}
    name = _name(metadata)
    spec = Reader(body.get("spec"), "spec")
    framework = _framework(spec)
    workers, gpus, slots = _world(spec)
    command = spec.string_list("command")
    image = spec.checked("image", rules.image_problem)
    spec.checked("managedBy", managed_by_problem)
    if framework == CUSTOM and not command:
        raise SpecError("spec.command", "is required with framework custom (the program each rank runs)")
    if framework == CUSTOM and image is None:
        raise SpecError("spec.image", "is required with framework custom (an image with your program)")
    env = _env(spec)
    pull_secrets = _pull_secrets(spec)
    data = parse_dataset(spec.child("dataset"), config)
    worker = parse_pod_overrides(spec.child("worker"), names.WORKER_CONTAINER)
    launcher = parse_launcher(spec.child("launcher"))
    checkpoints = parse_checkpoints(spec.child("checkpoints"), data) if spec.has("checkpoints") else None
    taken = [v.mount_path for v in (data.volume, checkpoints) if v is not None]
    check_mount_paths(worker.template, names.WORKER_CONTAINER, "spec.worker.template", taken)
    check_mount_paths(launcher.pod.template, names.LAUNCHER_CONTAINER, "spec.launcher.template", taken)
    run_policy = parse_run_policy(spec.child("runPolicy"))
    elastic = parse_elastic(spec.child("elastic"), workers, MAX_WORKERS) if spec.has("elastic") else None
    if elastic is not None:
        check_elastic_launcher(launcher)
    if run_policy.scheduling.gang is not None:
        _one_scheduler_for_the_gang(worker, launcher)
    torchrun = parse_torchrun(spec, framework, gpus) if spec.has("torchrun") else None
    job = JobSpec(
        name=name,
        namespace=str(metadata.get("namespace", "default")),
        framework=framework,
        image=image or config.image_for(framework),
        image_pull_policy=spec.choice("imagePullPolicy", PULL_POLICIES, "") or None,
        image_pull_secrets=pull_secrets,
        installer_registry=InstallerRegistry(config.image_pull_secrets, config.installer_images),
        command=command,
        args=spec.string_list("args"),
        env=env,
        workers=workers,
        gpus_per_worker=gpus,
        slots_per_worker=torchrun.processes_per_worker if torchrun else slots,
        worker=worker,
        dataset=data,
        hyperparameters=parse_hyperparameters(spec.child("hyperparameters"), framework),
        placement=parse_placement(spec.child("placement"), config, gpus > 0),
        launcher=launcher,
        run_policy=run_policy,
        output=parse_output(spec.data.get("output"), emulator_hosts=config.emulator_hosts),
        checkpoints=checkpoints,
        automount_service_account_token=spec.boolean("automountServiceAccountToken", False),
        append_training_flags=spec.boolean("appendTrainingFlags", False),
        elastic=elastic,
        torchrun=torchrun,
        **_prebuilt_workload(body),
    )
    return unqueued(job) if job.prebuilt_workload else job  # a pod group would ask for its quota twice


def _prebuilt_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """On a worker, MultiKueue's copy: the Workload that holds its quota there, the job's own only, and the
    field that names it (JobSpec's fields). Its world waits until that Workload is seen admitted
    (dtjob.machine.prebuilt)."""
    problem = prebuilt_workload_problem(body)
    if problem is not None:
        raise SpecError(*problem)
    return {"prebuilt_workload": prebuilt_workload(body), "prebuilt_field": prebuilt_workload_field(body)}


def _name(metadata: Mapping[str, Any]) -> str:
    name = str(metadata.get("name", ""))
    if len(name) > MAX_NAME_LENGTH or not NAME_RE.fullmatch(name):
        raise SpecError(
            "metadata.name",
            f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            f"(lowercase letters, digits, '-', starting with a letter); got {name!r}",
        )
    return name


def _framework(spec: Reader) -> str:
    if not spec.has("framework"):
        raise SpecError("spec.framework", f"is required (one of {', '.join(FRAMEWORKS)})")
    return spec.choice("framework", FRAMEWORKS, "")


def _world(spec: Reader) -> tuple[int, int, int]:
    """(workers, GPUs per worker, MPI slots per worker)."""
    workers = spec.integer("workers", None, minimum=1)
    if workers is None:
        raise SpecError("spec.workers", "is required")
    if workers > MAX_WORKERS:
        raise SpecError("spec.workers", f"must be <= {MAX_WORKERS}, got {workers}")
    gpus = spec.integer("gpusPerWorker", 1, minimum=0)
    gpus = 1 if gpus is None else gpus
    if gpus > MAX_GPUS_PER_WORKER:
        raise SpecError(
            "spec.gpusPerWorker", f"must be <= {MAX_GPUS_PER_WORKER} (GPUs on one node), got {gpus}"
        )
    slots = spec.integer("slotsPerWorker", None, minimum=1, maximum=MAX_SLOTS_PER_WORKER) or max(gpus, 1)
    return workers, gpus, slots


def _env(spec: Reader) -> tuple[Json, ...]:
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
    return env


def _pull_secrets(spec: Reader) -> tuple[str, ...]:
    pull_secrets = tuple(
        _required(s, f"spec.imagePullSecrets[{i}].name")
        for i, s in enumerate(spec.object_list("imagePullSecrets"))
    )
    for i, secret in enumerate(pull_secrets):
        if (problem := rules.name_problem(secret, subdomain=True)) is not None:
            raise SpecError(f"spec.imagePullSecrets[{i}].name", problem)
    return pull_secrets


def _one_scheduler_for_the_gang(worker: PodOverrides, launcher: Launcher) -> None:
    """A gang's pods are placed by its scheduler: a template may not send them to another."""
    for path, pod in (("spec.worker.template", worker), ("spec.launcher.template", launcher.pod)):
        if pod.template is not None and "schedulerName" in pod.template.spec:
            raise SpecError(
                f"{path}.spec.schedulerName",
                "is set by spec.runPolicy.scheduling (with gang, the gang scheduler's name by default): "
                "set spec.runPolicy.scheduling.schedulerName instead",
            )


def _required(item: Json, path: str) -> str:
    value = item.get("name")
    if not isinstance(value, str) or not value:
        raise SpecError(path, "is required")
    return value
