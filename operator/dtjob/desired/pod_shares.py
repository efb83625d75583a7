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
from dataclasses import dataclass, replace
from typing import Any

from dtjob.desired import pod_origin
from dtjob.spec import validators as rules
from dtjob.spec.nfs_shares import NfsShares
from dtjob.spec.parse import JobSpec

NFS_CSI_DRIVER = "nfs.csi.k8s.io"
# The NFS CSI driver's volume attributes the check reads, lowercased as the driver reads them.
CSI_ATTRIBUTES = frozenset({"server", "share", "subdir", "mountoptions"})
# Mount options that tune a mount and cannot move it to another host or export (unlike mountaddr, mounthost,
# port or mountport, which send the mount's requests elsewhere).
SAFE_MOUNT_OPTIONS = frozenset({
    "nfsvers", "vers", "minorversion", "hard", "soft", "softreval", "timeo", "retrans", "rsize", "wsize",
    "nconnect", "max_connect", "resvport", "noresvport", "ac", "noac", "actimeo", "acregmin", "acregmax",
    "acdirmin", "acdirmax", "lookupcache", "cto", "nocto", "lock", "nolock", "intr", "nointr", "sec", "fsc",
    "nofsc", "ro", "rw", "sync", "async", "atime", "noatime", "diratime", "nodiratime", "relatime", "noexec",
    "nosuid", "nodev", "local_lock", "sharecache", "nosharecache",
})  # fmt: skip


@dataclass(frozen=True)
class MountedShare:
    field: str  # the spec field that asked for it, else the object's own path
    name: str  # the volume's
    server: str
    path: str
    problem: str | None = None  # why what it mounts cannot be told: refused by any list but `*`


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
            problem = mounted.problem and f"{mounted.problem} ({shares.describe()})"
            why = problem or shares.refusal(mounted.server, mounted.path)
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
        (found.name, found.server, found.path): found.field
        for found in _shares(template, f"{template_at}.spec")
    }
    own = {
        name: field
        for name, field, volume in (
            (rules.DATA_VOLUME, "spec.dataset.volume.nfs", spec.dataset.volume),
            (rules.CHECKPOINTS_VOLUME, "spec.checkpoints.nfs", spec.checkpoints),
        )
        if volume is not None and volume.nfs is not None
    }
    found = _shares(pod_spec, path)
    origins = [from_template.get((f.name, f.server, f.path)) or own.get(f.name) for f in found]
    return [
        replace(f, field=origin or f"{pod_origin.describe(obj)} {f.field}")
        for f, origin in zip(found, origins, strict=True)
    ]


def _shares(pod_spec: Mapping[str, Any], path: str) -> list[MountedShare]:
    """Each volume of `pod_spec` that names an NFS share."""
    return list(_each_share(pod_spec.get("volumes"), path))


def _each_share(volumes: Any, path: str) -> Iterator[MountedShare]:
    if not isinstance(volumes, list):
        return
    for i, volume in enumerate(volumes):
        if not isinstance(volume, Mapping):
            continue
        name, at = str(volume.get("name", "")), f"{path}.volumes[{i}]"
        nfs, csi = volume.get("nfs"), volume.get("csi")
        if isinstance(nfs, Mapping):
            yield MountedShare(f"{at}.nfs", name, str(nfs.get("server", "")), str(nfs.get("path", "")))
        elif isinstance(csi, Mapping) and csi.get("driver") == NFS_CSI_DRIVER:
            yield _csi_share(f"{at}.csi", name, csi.get("volumeAttributes") or {})


def _csi_share(field: str, name: str, given: Mapping[str, Any]) -> MountedShare:
    """The share an NFS CSI volume mounts, its attributes read as the driver reads them: without case (its
    `subdir` is `subDir`, `SubDir`...). What the check cannot judge is refused: a key that is not plain ASCII
    (cases fold differently in Go), one named twice in two cases (which counts is the driver's map order),
    any key but server, share, subDir and mountOptions, a `${...}` placeholder in subDir (the driver fills it
    from other attributes), and a mount option that could move the mount to another host or export."""

    def refused(why: str) -> MountedShare:
        return MountedShare(field, name, "", "", f"NFS CSI volumeAttributes: {why}")

    attributes: dict[str, str] = {}
    for key, value in given.items():
        if not isinstance(key, str) or not key.isascii() or not isinstance(value, str):
            return refused(f"{key!r} must be an ASCII key with a text value")
        lowered = key.lower()
        if lowered in attributes:
            return refused(f"{lowered!r} is named twice, in two cases")
        if lowered not in CSI_ATTRIBUTES:
            return refused(f"{key!r} is not one the NFS list can judge (server, share, subDir, mountOptions)")
        attributes[lowered] = value
    share, sub_dir = attributes.get("share", ""), attributes.get("subdir", "")
    if "${" in sub_dir:
        return refused(f"subDir {sub_dir!r} holds a placeholder")
    options = [o.strip() for o in attributes.get("mountoptions", "").split(",") if o.strip()]
    moved = [o for o in options if o.split("=", 1)[0].lower() not in SAFE_MOUNT_OPTIONS]
    if moved:
        return refused(f"mount options {', '.join(moved)} are not among those the list allows")
    joined = f"{share.rstrip('/')}/{sub_dir}" if sub_dir else share
    return MountedShare(field, name, attributes.get("server", ""), joined)
