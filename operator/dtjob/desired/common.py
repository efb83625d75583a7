"""Pieces shared by the builders: owner references, metadata, mount paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob import API_GROUP, API_VERSION, KIND

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
