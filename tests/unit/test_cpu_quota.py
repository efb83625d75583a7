"""The trainer's reading of its container's CPU quota, on cgroup trees laid out as the kernel shows them."""

from __future__ import annotations

from pathlib import Path

from dtjob_train.cpu_quota import quota_cpus


def v2_tree(tmp_path: Path, cgroup: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """/proc/self/cgroup naming `cgroup` on cgroup v2, and `cpu.max` in the folders of `limits`."""
    root = tmp_path / "cgroup"
    (root / cgroup.strip("/")).mkdir(parents=True, exist_ok=True)
    for folder, value in limits.items():
        (root / folder.strip("/")).mkdir(parents=True, exist_ok=True)
        (root / folder.strip("/") / "cpu.max").write_text(value + "\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::{cgroup}\n")
    return proc, root


def test_the_tightest_quota_on_the_path_holds(tmp_path: Path) -> None:
    pod, container = "/kubepods/burstable/pod1", "/kubepods/burstable/pod1/ctr"
    proc, root = v2_tree(tmp_path, container, {pod: "1200000 100000", container: "max 100000"})
    assert quota_cpus(proc, root) == 12
    proc, root = v2_tree(tmp_path / "b", container, {pod: "1200000 100000", container: "400000 100000"})
    assert quota_cpus(proc, root) == 4


def test_no_quota_anywhere_is_none(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/kubepods/besteffort/pod2/ctr", {"/kubepods": "max 100000"})
    assert quota_cpus(proc, root) is None
    assert quota_cpus(tmp_path / "no-such-file", root) is None


def test_a_fraction_rounds_down_but_never_below_one(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "250000 100000"})  # a container's own cgroup namespace
    assert quota_cpus(proc, root) == 2
    proc, root = v2_tree(tmp_path / "b", "/", {"/": "50000 100000"})
    assert quota_cpus(proc, root) == 1


def test_a_host_path_absent_in_the_container_reads_the_mount_itself(tmp_path: Path) -> None:
    """Without a cgroup namespace /proc/self/cgroup names the host's path; the container's mount is its own
    cgroup."""
    proc, root = v2_tree(tmp_path, "/", {"/": "300000 100000"})
    proc.write_text("0::/kubepods/pod3/ctr\n")
    assert quota_cpus(proc, root) == 3


def test_cgroup_v1_reads_the_cfs_quota_of_the_cpu_controller(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    folder = root / "cpu,cpuacct" / "kubepods" / "pod4"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("600000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/kubepods/pod4\n3:cpu,cpuacct:/kubepods/pod4\n0::/\n")
    assert quota_cpus(proc, root) == 6
    proc.write_text("3:cpu,cpuacct:/\n0::/\n")
    assert quota_cpus(proc, root) is None
