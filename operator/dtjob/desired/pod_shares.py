"""Which NFS shares a pod the operator creates mounts, each with the spec field that put it there, and which
of them the namespace's list (dtjob.spec.nfs_shares) refuses. Judged on the object about to be created, like
its Secrets (dtjob.desired.pod_trust): the dataset's and checkpoints' volumes, and whatever a template adds.
Pure.

Two kinds of volume name a share themselves: `nfs` (server, path), and an inline `csi` volume of the
Kubernetes NFS CSI driver (volumeAttributes server, share and subDir), which the `restricted` Pod Security
level admits where it refuses `nfs`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob.desired import pod_origin
from dtjob.spec.nfs_shares import NfsShares
from dtjob.spec.parse import JobSpec

NFS_CSI_DRIVER = "nfs.csi.k8s.io"


@dataclass(frozen=True)
class MountedShare:
    field: str  # the spec field that asked for it, else the object's own path
    server: str
    path: str


@dataclass(frozen=True)
class RefusedShare:
    field: str
    message: str


def refused_shares(
    spec: JobSpec, objects: Sequence[Mapping[str, Any]], shares: NfsShares
) -> list[RefusedShare]:
    """Every share `objects` mount that `shares` refuses, once per field."""
    if shares.any_share:
        return []
    refused: dict[str, RefusedShare] = {}
    for obj in objects:
        for mounted in mounted_shares(spec, obj):
            why = shares.refusal(mounted.server, mounted.path)
            if why is not None:
                refused.setdefault(mounted.field, RefusedShare(mounted.field, why))
    return list(refused.values())


def mounts_a_share(objects: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any of `objects` mounts an NFS share (so the namespace's list is worth reading)."""
    return any(_shares(pod_origin.pod_spec(obj)[0], "") for obj in objects)


def mounted_shares(spec: JobSpec, obj: Mapping[str, Any]) -> list[MountedShare]:
    pod_spec, path = pod_origin.pod_spec(obj)
    template_at = pod_origin.template_path(obj)
    template = pod_origin.template_spec(spec, template_at) or {}
    from_template = {
        (name, server, share): field
        for field, name, server, share in _shares(template, f"{template_at}.spec")
    }
    own = {
        name: field
        for name, field, volume in (
            ("data", "spec.dataset.volume.nfs", spec.dataset.volume),
            ("checkpoints", "spec.checkpoints.nfs", spec.checkpoints),
        )
        if volume is not None and volume.nfs is not None
    }
    found = []
    for field, name, server, share in _shares(pod_spec, path):
        origin = from_template.get((name, server, share)) or own.get(name)
        found.append(MountedShare(origin or f"{pod_origin.describe(obj)} {field}", server, share))
    return found


def _shares(pod_spec: Mapping[str, Any], path: str) -> list[tuple[str, str, str, str]]:
    """(field, volume name, server, path) of each volume of `pod_spec` that names an NFS share."""
    return list(_each_share(pod_spec.get("volumes"), path))


def _each_share(volumes: Any, path: str) -> Iterator[tuple[str, str, str, str]]:
    if not isinstance(volumes, list):
        return
    for i, volume in enumerate(volumes):
        if not isinstance(volume, Mapping):
            continue
        name, at = str(volume.get("name", "")), f"{path}.volumes[{i}]"
        nfs, csi = volume.get("nfs"), volume.get("csi")
        if isinstance(nfs, Mapping):
            yield f"{at}.nfs", name, str(nfs.get("server", "")), str(nfs.get("path", ""))
        elif isinstance(csi, Mapping) and csi.get("driver") == NFS_CSI_DRIVER:
            attributes = csi.get("volumeAttributes") or {}
            share, sub_dir = str(attributes.get("share", "")), str(attributes.get("subDir", ""))
            joined = f"{share.rstrip('/')}/{sub_dir}" if sub_dir else share
            yield f"{at}.csi", name, str(attributes.get("server", "")), joined
