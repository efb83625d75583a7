"""Paths of the pinned test-bed binaries (built by hack/build-control-plane.sh), independent of PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_COMPONENT_OF = {
    "kubectl": ("kubernetes", "K8S_VERSION"),
    "kube-apiserver": ("kubernetes", "K8S_VERSION"),
    "helm": ("helm", "HELM_VERSION"),
    "kwokctl": ("kwok", "KWOK_VERSION"),
    "etcd": ("etcd", "ETCD_VERSION"),
}


def pinned_versions() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (REPO / "hack" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def tool(name: str) -> str:
    """The pinned build of `name` from the cache, else whatever PATH offers."""
    component, version_key = _COMPONENT_OF[name]
    cache = Path(os.environ.get("DTJOB_CACHE", Path.home() / ".cache" / "dtjob"))
    pinned = cache / "bin" / f"{component}-{pinned_versions()[version_key]}" / name
    if pinned.is_file():
        return str(pinned)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is neither built ({pinned}) nor on PATH: run `make control-plane`")
    return found
