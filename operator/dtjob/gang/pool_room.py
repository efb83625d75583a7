"""The free GPUs of the pool a gang waits for, which its schedule timeout's message names. Pure; the observer
reads the nodes and their pods."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Json = Mapping[str, Any]


@dataclass(frozen=True)
class PoolRoom:
    """The free GPUs of the pool a gang waits for, read when its schedule timeout passes: one entry per node
    of the pool that takes new pods (allocatable minus what the pods bound there request)."""

    selector: str  # the pool's node selector, as the message names it
    free: tuple[int, ...]


def pool_room(
    selector: str,
    nodes: Iterable[Json],
    pods_by_node: Mapping[str, Iterable[Json]],
    resource: str,
    skip: Callable[[Json], bool],
) -> PoolRoom:
    """Free `resource` per node that takes new pods: allocatable minus the requests of the pods bound there
    that have not ended, leaving out those `skip` names (the waiting job's own)."""
    free = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        name = str((node.get("metadata") or {}).get("name", ""))
        allocatable = _count(((node.get("status") or {}).get("allocatable") or {}).get(resource))
        used = sum(
            _pod_request(pod, resource)
            for pod in pods_by_node.get(name, ())
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not skip(pod)
        )
        free.append(max(allocatable - used, 0))
    return PoolRoom(selector, tuple(free))


def pod_view(resource: str, label: str) -> Callable[[Json], dict[str, Any]]:
    """What pool_room reads of a pod bound to a pool node (its `resource`, its `label`), kept as the LIST of
    the node's pods is read: those are every tenant's pods, whose labels, annotations and status may be
    large."""

    def view(pod: Json) -> dict[str, Any]:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k == label}

        def requests(containers: Iterable[Json]) -> list[dict[str, Any]]:
            out = []
            for container in containers:
                resources = container.get("resources") or {}
                asked = {kind: {resource: resources[kind][resource]} for kind in ("requests", "limits")
                         if resource in (resources.get(kind) or {})}  # fmt: skip
                out.append({"resources": asked})
            return out

        return {
            "metadata": {"namespace": meta.get("namespace"), "labels": labels},
            "spec": {"containers": requests(spec.get("containers") or ()),
                     "initContainers": requests(spec.get("initContainers") or ())},
            "status": {"phase": (pod.get("status") or {}).get("phase")},
        }  # fmt: skip

    return view


def _pod_request(pod: Json, resource: str) -> int:
    """What a pod requests of an extended resource: its containers' sum, or its largest init container's."""
    spec = pod.get("spec") or {}

    def request(container: Json) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
        return _count(value)

    containers = sum(request(c) for c in spec.get("containers") or ())
    return max([containers, *(request(c) for c in spec.get("initContainers") or ())])


def _count(value: Any) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0
