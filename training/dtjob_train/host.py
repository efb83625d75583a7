"""Where a rank runs on its host: its GPU (or none), and its share of the host's cores."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from dtjob.contract.training import EXPECT_GPU_ENV

from .cpu_quota import quota_cpus

EXIT_NO_GPU = 3


class NoGpuError(RuntimeError):
    """GPUs were asked for, and this rank sees none."""


def expect_gpu(environ: Mapping[str, str]) -> bool:
    return environ.get(EXPECT_GPU_ENV, "").strip().lower() not in ("", "0", "false", "no")


def gpu_for_rank(local_rank: int, gpus: int, *, expect: bool) -> int | None:
    """The GPU this rank uses (None: train on CPU).

    Ranks on one host share its GPUs round-robin (local rank modulo the count), so more ranks than GPUs still
    start. With no GPU visible, a job that asked for GPUs fails instead of training on CPU, 100 times slower,
    without a word: the node's driver or device plugin is broken, or the image is a CPU build.
    """
    if gpus > 0:
        return local_rank % gpus
    if expect:
        raise NoGpuError(
            f"{EXPECT_GPU_ENV} is set (the job asks for GPUs) but no GPU is visible to this rank: "
            "check the node's NVIDIA driver and device plugin and that the image is a GPU build; "
            f"set {EXPECT_GPU_ENV}=0 in the job's env to train on CPU"
        )
    return None


def pick_gpu(local_rank: int, gpus: int) -> int | None:
    """gpu_for_rank with the expectation from the environment; a missing GPU exits this rank with a message
    naming its host (unlike bad input, it may be one node's problem)."""
    try:
        return gpu_for_rank(local_rank, gpus, expect=expect_gpu(os.environ))
    except NoGpuError as e:
        print(f"error: {socket.gethostname()} local rank {local_rank}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_NO_GPU) from None


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, which a container's CPU set narrows), fewer when
    its container's CPU quota (a pod's `limits.cpu`) allows fewer."""
    mask = len(os.sched_getaffinity(0))
    quota = quota_cpus()
    return mask if quota is None else min(mask, quota)


def cores_per_rank(local_size: int, cpus: int | None = None) -> int:
    """This rank's share of the cores it may use (usable_cpus), split evenly among the ranks on its host; at
    least 1."""
    available = usable_cpus() if cpus is None else cpus
    return max(1, available // max(local_size, 1))


def cpu_threads_per_rank(local_size: int) -> int:
    """Compute threads of a rank training on CPU: its share of the cores, so two ranks on one node do not
    oversubscribe it.

    DTJOB_THREADS_PER_RANK overrides it (the scaling benchmark gives every rank one core).
    """
    override = os.environ.get("DTJOB_THREADS_PER_RANK")
    if override:
        return max(1, int(override))
    return cores_per_rank(local_size)
