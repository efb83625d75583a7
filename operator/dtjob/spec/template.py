"""Parsing a pod template (spec.worker.template, spec.launcher.template): what the operator must know is right
before dtjob.desired.template merges it over the pod it builds. Pure.

The CRD carries Kubernetes' own PodSpec schema, so the API server has checked the template's shape at apply,
and the API server checks the rest of it when the pod is created. This refuses, naming the field, what the
operator owns (dtjob.spec.validators) and what would leave a world that never ends (a plain container beside
the launcher's, which its Job would wait for). The CRD's CEL rules refuse most of it at apply already, with
the same words; this repeats them for a CRD older than the operator, and adds what a CEL rule cannot say
within the API server's cost budget (a list inside the list of containers: the launcher's environment, the
mount paths) or at all (the data volume's mount path, set elsewhere in the spec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtjob import names
from dtjob.spec import validators as rules
from dtjob.spec.model import Json, PodTemplate
from dtjob.spec.reader import Reader, SpecError

TEMPLATE_FIELDS = ("metadata", "spec")
METADATA_FIELDS = ("labels", "annotations")
EMPTY_DIR_FIELDS = ("medium", "sizeLimit")


def parse_template(r: Reader, main: str) -> PodTemplate | None:
    """`template` of the pod overrides `r` (spec.worker or spec.launcher); `main` names the operator's own
    container of that pod (names.WORKER_CONTAINER or names.LAUNCHER_CONTAINER)."""
    if not r.has("template"):
        return None
    template = r.child("template")
    _only(template, TEMPLATE_FIELDS, "a pod template has metadata and spec")
    meta = template.child("metadata")
    _only(meta, METADATA_FIELDS, "of a template's metadata, only labels and annotations apply")
    labels = meta.labels("labels")
    for key in labels:
        if rules.owned_label(key):
            raise SpecError(
                f"{meta.at('labels')}[{key}]",
                f"keys under {rules.OWNED_LABEL_PREFIX} and {', '.join(rules.OWNED_LABELS)} are set by the "
                "operator (it finds its pods by them)",
            )
    annotations = meta.labels("annotations", values_are_labels=False)
    spec = template.child("spec")
    for key, why in rules.TEMPLATE_OWNED_POD_FIELDS.items():
        if spec.has(key):
            raise SpecError(spec.at(key), why)
    if spec.has("ephemeralContainers"):
        raise SpecError(spec.at("ephemeralContainers"), "cannot be set when a pod is created")
    containers = _containers(spec, "containers")
    init = _containers(spec, "initContainers")
    for path, container in containers:
        name = container["name"]
        if name == main:
            _check_main(path, container, main)
        elif main == names.LAUNCHER_CONTAINER:
            raise SpecError(path, rules.LAUNCHER_ALONE_WHY)
        else:
            _needs_image(path, container)
    taken = {c["name"] for _, c in containers}
    for path, container in init:
        if container["name"] == main or container["name"] in taken:
            raise SpecError(f"{path}.name", f"{container['name']!r} names a container of the pod already")
        _needs_image(path, container)
    _volumes(spec)
    return PodTemplate(labels=labels, annotations=annotations, spec=dict(spec.data))


def check_mount_paths(template: PodTemplate | None, main: str, path: str, taken: Sequence[str]) -> None:
    """The operator's container may not mount a template volume where the operator mounts one of the job's
    (`taken`: the data and checkpoint volumes' mount paths); `path` is the template's field."""
    if template is None:
        return
    for i, container in enumerate(template.spec.get("containers") or ()):
        if container.get("name") != main:
            continue
        for j, mount in enumerate(container.get("volumeMounts") or ()):
            if mount.get("mountPath") in taken:
                raise SpecError(
                    f"{path}.spec.containers[{i}].volumeMounts[{j}].mountPath",
                    f"{mount['mountPath']!r} is where the operator mounts the job's data or checkpoints",
                )


def _only(r: Reader, fields: tuple[str, ...], why: str) -> None:
    for key in r.data:
        if key not in fields:
            raise SpecError(r.at(str(key)), f"is not a field here ({why})")


def _containers(spec: Reader, key: str) -> list[tuple[str, Json]]:
    """(path, container) of each item of the list `key`, every one named, no name twice."""
    found: list[tuple[str, Json]] = []
    seen: set[str] = set()
    for i, container in enumerate(spec.object_list(key)):
        path = f"{spec.at(key)}[{i}]"
        name = container.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{path}.name", "is required (containers merge by name)")
        if name in seen:
            raise SpecError(f"{path}.name", f"{name!r} appears twice")
        seen.add(name)
        found.append((path, container))
    return found


def _needs_image(path: str, container: Mapping[str, Any]) -> None:
    if not isinstance(container.get("image"), str) or not container["image"]:
        raise SpecError(f"{path}.image", rules.IMAGE_REQUIRED_WHY)


def _check_main(path: str, container: Json, main: str) -> None:
    """The operator's own container: its owned fields, the GPU limit, the launcher's MPI environment and the
    paths it mounts the operator's volumes at."""
    owned = dict(rules.TEMPLATE_OWNED_CONTAINER_FIELDS)
    if main == names.WORKER_CONTAINER:
        owned.update(rules.TEMPLATE_OWNED_WORKER_FIELDS)
    for key, why in owned.items():
        if key in container:
            raise SpecError(f"{path}.{key}", why)
    item = Reader(container, path)
    resources = item.child("resources")
    for kind in ("limits", "requests"):
        values = resources.optional_object(kind) or {}
        if rules.GPU_RESOURCE in values:
            raise SpecError(f"{resources.at(kind)}[{rules.GPU_RESOURCE}]", rules.GPU_WHY)
    for j, env in enumerate(item.object_list("env")):
        name = env.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{path}.env[{j}].name", "is required")
        if main == names.LAUNCHER_CONTAINER and name in rules.LAUNCHER_OWNED_ENV:
            raise SpecError(
                f"{path}.env[{j}]",
                f"{name} is set by the operator (the launcher's MPI settings, or its GPUs hidden off the "
                "GPU pool)",
            )
    for j, mount in enumerate(item.object_list("volumeMounts")):
        mount_path = mount.get("mountPath")
        if not isinstance(mount_path, str) or not mount_path:
            raise SpecError(f"{path}.volumeMounts[{j}].mountPath", "is required")
        reserved = rules.reserved_mount(mount_path.rstrip("/") or "/")
        if reserved is not None:
            raise SpecError(
                f"{path}.volumeMounts[{j}].mountPath",
                f"{mount_path!r} is, lies inside or contains {reserved}, which the operator mounts itself",
            )


def _volumes(spec: Reader) -> None:
    seen: set[str] = set()
    for i, volume in enumerate(spec.object_list("volumes")):
        path = f"{spec.at('volumes')}[{i}]"
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{path}.name", "is required")
        if name in seen:
            raise SpecError(f"{path}.name", f"{name!r} appears twice")
        seen.add(name)
        if name == rules.SHARED_MEMORY_VOLUME:
            _shared_memory(path, volume)
        elif name in rules.OPERATOR_VOLUMES:
            raise SpecError(f"{path}.name", f"{name!r} is taken: {rules.OPERATOR_VOLUME_WHY}")


def _shared_memory(path: str, volume: Json) -> None:
    """`dshm`, the operator's /dev/shm, may only say how large it is: an emptyDir in memory, its sizeLimit."""
    if set(volume) - {"name", "emptyDir"} or not isinstance(volume.get("emptyDir"), Mapping):
        raise SpecError(path, rules.SHARED_MEMORY_WHY)
    empty_dir = Reader(volume["emptyDir"], f"{path}.emptyDir")
    _only(empty_dir, EMPTY_DIR_FIELDS, rules.SHARED_MEMORY_WHY)
    if empty_dir.string("medium") not in (None, "Memory"):
        raise SpecError(empty_dir.at("medium"), f"must be Memory: {rules.SHARED_MEMORY_WHY}")
