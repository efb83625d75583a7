"""Paths of the pinned test-bed binaries (built by hack/build-control-plane.sh), independent of PATH."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from testbed.cache import cache_root

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
    cache = cache_root()
    pinned = cache / "bin" / f"{component}-{pinned_versions()[version_key]}" / name
    if pinned.is_file():
        return str(pinned)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is neither built ({pinned}) nor on PATH: run `make control-plane`")
    return found


def kstatus() -> str:
    """hack/build-kstatus.sh's build of the kstatus program (cached under a hash of its sources)."""
    source = REPO / "hack" / "kstatus"
    digest = hashlib.sha256(b"".join((source / f).read_bytes() for f in ("go.mod", "go.sum", "main.go")))
    cache = cache_root()
    built = cache / "bin" / f"kstatus-{digest.hexdigest()[:12]}" / "kstatus"
    if not built.is_file():
        raise FileNotFoundError(f"kstatus is not built ({built}): run `make control-plane`")
    return str(built)
