"""The Kubernetes side of a dtjob file server (an Azure Files NFS share): the `dataset.volume` stanza a job
uses, the PersistentVolume and bound PersistentVolumeClaim that `dtjob fileserver create --apply` writes, and
which jobs use a share (the check `dtjob fileserver delete` makes first). Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

# NFS 4.1 is the only protocol Azure Files serves NFS shares with; sec=sys because the share authorizes by
# network (the subnet rule), not by Kerberos.
NFS_MOUNT_OPTIONS = ("vers=4", "minorversion=1", "sec=sys")
FILESERVER_LABEL = "dtjob.io/fileserver"  # <account>, on the PV and PVC --apply writes
SHARE_LABEL = "dtjob.io/share"  # <share>
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Share:
    """An NFS share as a job mounts it: `server` is the account's file endpoint host, `path` is
    `/<account>/<share>`."""

    account: str
    name: str
    server: str
    size_gib: int

    @property
    def path(self) -> str:
        return f"/{self.account}/{self.name}"


def nfs_stanza(share: Share, mount_path: str = "/data") -> Json:
    """`spec.dataset.volume` for a job that mounts the share directly (an inline NFS volume)."""
    return {"mountPath": mount_path, "nfs": {"server": share.server, "path": share.path}}


def pvc_stanza(claim_name: str, mount_path: str = "/data") -> Json:
    """`spec.dataset.volume` for a job that mounts the share through the claim --apply wrote (the way for
    namespaces that enforce the restricted Pod Security level, which forbids inline NFS volumes)."""
    return {"mountPath": mount_path, "persistentVolumeClaim": {"claimName": claim_name}}


def pv_name(share: Share) -> str:
    return f"dtjob-{share.account}-{share.name}"


def _labels(share: Share) -> dict[str, str]:
    return {FILESERVER_LABEL: share.account, SHARE_LABEL: share.name, "app.kubernetes.io/managed-by": "dtjob"}


def persistent_volume(share: Share, namespace: str, claim_name: str) -> Json:
    """A static PV of the share, pre-bound to the claim (claimRef) so no other claim can take it. Retain:
    deleting the claim must never delete the data (the share outlives clusters; `dtjob fileserver delete`
    removes it)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name(share), "labels": _labels(share)},
        "spec": {
            "capacity": {"storage": f"{share.size_gib}Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": list(NFS_MOUNT_OPTIONS),
            "nfs": {"server": share.server, "path": share.path},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": claim_name,
            },
        },
    }


def persistent_volume_claim(share: Share, namespace: str, claim_name: str) -> Json:
    """The claim bound to persistent_volume's PV by name; storageClassName "" keeps a default StorageClass
    from provisioning a new volume for it instead."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name, "namespace": namespace, "labels": _labels(share)},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name(share),
            "resources": {"requests": {"storage": f"{share.size_gib}Gi"}},
        },
    }


def pv_conflict(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """Why an existing PV of the same name cannot stand for the desired one (another share, another
    claim), or None. Its capacity may differ: that is the one field a re-run updates."""
    have, want = existing.get("spec") or {}, desired["spec"]
    if have.get("nfs") != want["nfs"]:
        return f"it mounts {have.get('nfs')}, not {want['nfs']}"
    ref, want_ref = have.get("claimRef") or {}, want["claimRef"]
    if (ref.get("namespace"), ref.get("name")) != (want_ref["namespace"], want_ref["name"]):
        return f"it is bound to the claim {ref.get('namespace')}/{ref.get('name')}"
    return None


def pvc_conflict(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """Why an existing claim of the same name is not the desired one (bound to another volume), or None."""
    volume = (existing.get("spec") or {}).get("volumeName")
    if volume != desired["spec"]["volumeName"]:
        return f"it claims the volume {volume or '(any)'}, not {desired['spec']['volumeName']}"
    return None


@dataclass(frozen=True)
class ShareUse:
    """A job that mounts the share: how (`via`) and whether it has finished."""

    namespace: str
    job: str
    phase: str
    via: str

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    def __str__(self) -> str:
        return f"{self.namespace}/{self.job} ({self.phase or 'no phase yet'}; {self.via})"


def _mounts(nfs: Mapping[str, Any] | None, server: str, path: str) -> bool:
    """Whether an NFS source (server, path) lies on the share: the same host (case-insensitive, as DNS is)
    and the share's path or a directory under it."""
    if not nfs:
        return False
    host = str(nfs.get("server") or "").lower().rstrip(".")
    export = str(nfs.get("path") or "").rstrip("/") or "/"
    return host == server.lower() and (export == path or export.startswith(path + "/"))


def share_users(
    jobs: Iterable[Mapping[str, Any]],
    pvs: Iterable[Mapping[str, Any]],
    pvcs: Iterable[Mapping[str, Any]],
    server: str,
    path: str,
) -> list[ShareUse]:
    """Every DistributedTrainingJob whose dataset or checkpoints volume is on the share: an inline NFS
    volume naming it, or a claim bound to a PV that does."""
    share_pvs = {
        str((pv.get("metadata") or {}).get("name"))
        for pv in pvs
        if _mounts((pv.get("spec") or {}).get("nfs"), server, path)
    }
    share_claims = {
        (str(meta.get("namespace")), str(meta.get("name")))
        for pvc in pvcs
        if (meta := pvc.get("metadata") or {}) and ((pvc.get("spec") or {}).get("volumeName") in share_pvs)
    }
    # A PV pre-bound to a claim that does not exist yet still promises the share to that claim.
    for pv in pvs:
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if (pv.get("metadata") or {}).get("name") in share_pvs and ref.get("name"):
            share_claims.add((str(ref.get("namespace")), str(ref["name"])))
    uses = []
    for job in jobs:
        meta, spec = job.get("metadata") or {}, job.get("spec") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        phase = str((job.get("status") or {}).get("phase") or "")
        volumes = {
            "spec.dataset.volume": (spec.get("dataset") or {}).get("volume") or {},
            "spec.checkpoints": spec.get("checkpoints") or {},
        }
        for field, volume in volumes.items():
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if _mounts(volume.get("nfs"), server, path):
                uses.append(ShareUse(namespace, name, phase, f"{field}.nfs"))
            elif claim and (namespace, claim) in share_claims:
                uses.append(ShareUse(namespace, name, phase, f"{field}: claim {claim}"))
    return uses


def blocking(uses: Iterable[ShareUse]) -> list[ShareUse]:
    """The uses that keep a share from being deleted: the jobs not finished."""
    return [use for use in uses if not use.finished]
