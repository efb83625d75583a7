"""`make demo-down` and `make clean-cache` leave nothing behind: no process, mount, network namespace or
interface of the demo's real-node cluster, and with clean-cache, no cache.

The demo's cluster is brought up for real (hack/realnode.sh up: a control plane, two kubelets with their
containerds, DNS, kube-proxy) in a named network namespace of its own, from a cache of its own whose built
binaries are the test bed's (a symlink, so clean-cache removes the link, never the binaries).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from testbed.cache import cache_root
from testbed.processes import processes_of
from tests.e2e.conftest import REPO, _isolated

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _run(*argv: str, env: dict[str, str]) -> None:
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def _leftovers(cache: Path, netns: str) -> list[str]:
    """Everything of the demo cluster that still exists on this machine."""
    found: list[str] = []
    if Path("/run/netns", netns).exists():
        found.append(f"network namespace {netns}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4]
        if mount_point.startswith(str(cache)) or mount_point == f"/run/netns/{netns}":
            found.append(f"mount {mount_point}")
    found += [f"process {pid}: {cmdline[:160]}" for pid, cmdline in processes_of(cache).items()]
    return found


def _links() -> set[str]:
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in shown.splitlines()}


@pytest.mark.parametrize("target", ["demo-down", "clean-cache"])
def test_the_demos_cluster_leaves_nothing_behind(target: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, runc, mounts)")
    if not _isolated():
        pytest.skip("the real node runs only inside the test bed's network namespace: run `make test`")
    built = cache_root() / "bin"
    if not built.is_dir():
        pytest.skip("needs the built control plane: run `make control-plane`")
    # A short path: containerd's socket lies deep inside the cache, and a unix socket's path has 107 bytes.
    cache = Path(tempfile.mkdtemp(prefix="dtjob-left-"))
    (cache / "bin").symlink_to(built)
    suffix = uuid.uuid4().hex[:6]
    netns, cluster = f"dtjob-left-{suffix}", f"left-{suffix}"
    env = {**os.environ, "DTJOB_CACHE": str(cache)}
    links_before = _links()
    make_vars = [f"DEMO_NETNS={netns}", f"DEMO_CLUSTER={cluster}", f"DTJOB_CACHE={cache}"]
    try:
        _run(
            str(REPO / "hack" / "netns.sh"), "exec", netns,
            "env", f"REAL_CLUSTER_NAME={cluster}", str(REPO / "hack" / "realnode.sh"), "up",
            env=env,
        )  # fmt: skip
        running = _leftovers(cache, netns)
        assert any(item.startswith("process") for item in running), running
        assert any(item.startswith("mount") for item in running), running

        _run("make", "--no-print-directory", target, *make_vars, env=env)

        assert _leftovers(cache, netns) == []
        assert _links() == links_before
        if target == "clean-cache":
            assert not cache.exists()
        else:
            assert (cache / "bin").is_symlink()
        assert built.is_dir(), "clean-cache followed the symlink into the test bed's binaries"
    finally:
        if _leftovers(cache, netns):
            subprocess.run(["make", "--no-print-directory", "demo-down", *make_vars], cwd=REPO, env=env)
        shutil.rmtree(cache, ignore_errors=True)
