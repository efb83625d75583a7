"""Pieces shared by the builders: owner references, metadata, mount paths, security contexts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob import API_GROUP, API_VERSION, KIND
from dtjob.names import LAUNCH_GATE, Access

Json = dict[str, Any]

SSH_DIR = "/etc/dtjob/ssh"
SSH_KEY_FILE = "id_ed25519"
# Above 1024, so sshd runs as the image's unprivileged training user (the dtjob images' sshd_config agrees).
SSH_PORT = 2222
MPI_DIR = "/etc/mpi"
HOSTFILE = f"{MPI_DIR}/hostfile"
DISCOVER_HOSTS = f"{MPI_DIR}/discover_hosts.sh"
OUTPUT_DIR = "/dtjob/output"
PROGRESS_FILE = f"{OUTPUT_DIR}/progress.json"
# Each SAS Secret is mounted as a directory (never with subPath, which would not follow rotation) under here.
SAS_MOUNT_ROOT = "/var/run/dtjob"

# The training images' user and group (images/common/install-system.sh: `useradd --uid 1000`, whose own group
# is 1000); it must match them. Pods name it by number: the images say `USER dtjob`, and kubelet refuses
# runAsNonRoot for a non-numeric image user. sshd and ssh need it in the image's /etc/passwd, so a custom
# spec.image needs a uid 1000 user too.
TRAINING_UID = 1000
# The stager image's user and group (images/stager/Dockerfile: `USER 65532:65532`); it must match it.
STAGER_UID = 65532


def held_until_workers_ready(pod_spec: Mapping[str, Any]) -> Json:
    """The launcher's pod spec held by the operator's gate until every worker is Ready. The gate goes first,
    where the release looks for it; a template's own gates stay after it (and hold the pod too)."""
    others = [g for g in pod_spec.get("schedulingGates") or () if g.get("name") != LAUNCH_GATE]
    return {**pod_spec, "schedulingGates": [{"name": LAUNCH_GATE}, *others]}


def sas_mount_path(access: Access) -> str:
    return f"{SAS_MOUNT_ROOT}/sas-{access.value}"


def pod_security_context(uid: int) -> Json:
    """The restricted Pod Security Standard at pod level, running as `uid` with group `uid`.

    fsGroup makes kubelet give every Secret and emptyDir file (and a PVC that supports it) that group, so
    group-readable Secret modes are readable by the pod's user; OnRootMismatch skips the recursive chown of a
    volume whose root already has it (a staged dataset can be large)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool = False) -> Json:
    """The restricted Pod Security Standard per container; a read-only root only for programs that never
    write outside their volumes."""
    context: Json = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def owner_reference(name: str, uid: str) -> Json:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: Json,
    annotations: Mapping[str, str] | None = None,
) -> Json:
    meta: Json = {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [owner]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
