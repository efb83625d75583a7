"""A rank in a container with a CPU limit: its threads follow the quota, not every core of the node. The
quota is a real one: a cgroup of the kernel's with a CFS quota of half a CPU, the rank's process inside it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROBE = (
    "from dtjob_train.cpu_quota import quota_cpus; from dtjob_train.host import cpu_threads_per_rank; "
    "print(quota_cpus(), cpu_threads_per_rank(1))"
)


@pytest.fixture
def half_a_cpu() -> Iterator[Path]:
    """A new cgroup allowed 50 ms of CPU every 100 ms (a pod's `limits.cpu: 500m`), in the hierarchy that
    holds the cpu controller: cgroup v1's own mount, else v2's."""
    name = f"dtjob-test-{uuid.uuid4().hex[:8]}"
    v1 = CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        folder = v1 / name
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("50000")
    else:
        assert "cpu" in (CGROUP_ROOT / "cgroup.controllers").read_text().split(), "no cpu controller"
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+cpu")
        folder = CGROUP_ROOT / name
        folder.mkdir()
        (folder / "cpu.max").write_text("50000 100000")
    try:
        yield folder
    finally:
        folder.rmdir()  # its one process has exited


def probe(cgroup: Path | None) -> tuple[str, int]:
    """(quota_cpus(), cpu_threads_per_rank(1)) as a rank's process sees them, started in `cgroup`."""
    enter = f"echo $$ > {cgroup / 'cgroup.procs'} && " if cgroup is not None else ""
    env = {k: v for k, v in os.environ.items() if k != "DTJOB_THREADS_PER_RANK"}
    done = subprocess.run(
        ["sh", "-c", f'{enter}exec "$0" -c "$1"', sys.executable, PROBE],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    quota, threads = done.stdout.split()
    return quota, int(threads)


def test_a_rank_under_a_cpu_limit_runs_as_many_threads_as_the_quota_allows(half_a_cpu: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert cores >= 2, "the check needs a machine of more than one core"
    outside = probe(None)
    assert outside == ("None", cores), "the test's own process runs under a CPU quota"
    assert probe(half_a_cpu) == ("1", 1)
