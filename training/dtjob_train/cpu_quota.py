"""The CPUs a container's CFS quota lets this process use (a pod's `limits.cpu`).

A pod with a CPU limit keeps every core of its node in its affinity mask: only the quota says it may use, say,
12 of 96. Threads sized by the mask alone are throttled for most of each period. Read from cgroup v2's
`cpu.max` (AKS nodes) or v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`, along the process's cgroup path up
to the root this process sees: a limit on the pod's cgroup holds for its containers too."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 mounts the cpu controller alone or beside cpuacct, under one of these names.
V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def quota_cpus(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """Whole CPUs the tightest quota on this process's cgroup path allows (at least 1); None: no quota."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = [q for q in (_v2_quota(lines, root), _v1_quota(lines, root)) if q is not None]
    return max(1, math.floor(min(quotas))) if quotas else None


def _v2_quota(lines: list[str], root: Path) -> float | None:
    path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    return _tightest(_along(root, path), _read_v2)


def _v1_quota(lines: list[str], root: Path) -> float | None:
    fields = [line.split(":", 2) for line in lines]  # id, controllers, path
    path = next((f[2] for f in fields if len(f) == 3 and "cpu" in f[1].split(",")), None)
    mount = next((root / name for name in V1_CPU_MOUNTS if (root / name).is_dir()), None)
    if path is None or mount is None:
        return None
    return _tightest(_along(mount, path), _read_v1)


def _along(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its parents up to the mount. In a container whose /proc/self/cgroup names the
    host's path, that folder is absent and the mount itself is the container's cgroup."""
    folder = mount / path.strip("/")
    found = [folder, *folder.parents]
    return [d for d in found if d == mount or (mount in d.parents and d.is_dir())]


def _tightest(folders: list[Path], read: Callable[[Path], float | None]) -> float | None:
    quotas = [q for q in (read(d) for d in folders) if q is not None]
    return min(quotas) if quotas else None


def _read_v2(folder: Path) -> float | None:
    """`cpu.max`: "<quota> <period>" in microseconds, or "max <period>"."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return _ratio(quota, period)


def _read_v1(folder: Path) -> float | None:
    """`cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`."""
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None  # "max"
    return q / p if q > 0 and p > 0 else None
