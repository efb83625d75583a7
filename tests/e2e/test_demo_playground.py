"""`make demo` leaves a playground: its cluster, operator and Azurite keep running; `make kubectl` reaches the
cluster; the second example the demo offers (examples/custom-script-cpu.yaml, a few iterations fewer) runs
to success on it; and `make demo-down` leaves nothing running.

The demo runs under names of its own (network namespace, cluster, state dir: $CLUSTER_NAME-pg), beside the
e2e tier's real-node cluster and any developer's demo (clusters of different names in different network
namespaces share nothing, see hack/realnode.sh). Its image store (about 6 GB: the PyTorch image, its
files shared by the two nodes) is kept in the cache as every real node's is, so the next run imports no image
it already holds (importing them took minutes of both cores in each run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from testbed import pidfile
from testbed.cache import cache_root
from testbed.processes import processes_of
from tests.e2e.conftest import REPO, _isolated

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NAME = f"{os.environ.get('CLUSTER_NAME', 'dtjob')}-pg"
MAKE_VARS = [f"DEMO_NETNS={NAME}", f"DEMO_CLUSTER={NAME}"]
NAMESPACE = "dtjob-demo"  # hack/demo.py's
EXAMPLE = REPO / "examples" / "custom-script-cpu.yaml"
JOB_SECONDS = 600.0


def _make(*args: str, env: dict[str, str], timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args, *MAKE_VARS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, (
            f"make {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def _kubectl(args: str, env: dict[str, str]) -> str:
    return _make("-s", "kubectl", f"ARGS={args}", env=env)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()  # empty for a zombie
    except OSError:
        return b""


def _shrunk_example(path: Path) -> Path:
    """The example with fewer and smaller iterations: the job is the same, its run shorter."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "DistributedTrainingJob":
            doc["spec"]["args"] = ["--batch-size", "8", "--num-warmup-batches", "1",
                                   "--num-batches-per-iter", "2", "--num-iters", "2"]  # fmt: skip
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _wait_for_job(name: str, env: dict[str, str]) -> str:
    deadline = time.monotonic() + JOB_SECONDS
    phase = ""
    while time.monotonic() < deadline:
        phase = _kubectl(f"get dtj {name} -n {NAMESPACE} -o jsonpath={{.status.phase}}", env).strip()
        if phase in ("Succeeded", "Failed"):
            return phase
        time.sleep(3)
    return phase or "no phase"


def _leftovers(cache: Path, state: Path, pids: dict[int, bytes]) -> list[str]:
    found = [f"pidfile {p}" for p in state.glob("*.pid")]
    found += [f"process {pid}: {cmd[:120]!r}" for pid, cmd in pids.items() if _cmdline(pid) == cmd]
    if Path("/run/netns", NAME).exists():
        found.append(f"network namespace {NAME}")
    node_dirs = [cache / "realnode" / NAME / "run", cache / "kwok" / "clusters" / NAME]
    for directory in node_dirs:
        found += [f"process {pid}: {cmd[:120]}" for pid, cmd in processes_of(directory).items()]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4]
        if mount_point.startswith(str(node_dirs[0])) or mount_point == f"/run/netns/{NAME}":
            found.append(f"mount {mount_point}")
    return found


def test_make_demo_leaves_a_playground_that_demo_down_removes(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, runc, mounts)")
    if not _isolated():
        pytest.skip("the real node runs only inside the test bed's network namespace: run `make test`")
    cache = cache_root()
    state = cache / "demo" / NAME
    # One step of the demo's own job; the phases go to a log of the test's, not to `make test`'s.
    env = {**os.environ, "DEMO_STEPS": "1", "DTJOB_PHASE_LOG": str(tmp_path / "phases.log")}
    pids: dict[int, bytes] = {}
    try:
        shown = _make("demo", env=env, timeout=1500)
        assert "result: Succeeded" in shown, shown
        for name in ("operator", "azurite"):
            pid = pidfile.running(state / f"{name}.pid")
            assert pid is not None, f"the demo's {name} is not running after `make demo`"
            pids[pid] = _cmdline(pid)
        # The demo says how to try the example, with this demo's names.
        vars_ = " ".join(MAKE_VARS)
        offered = f'make kubectl {vars_} ARGS="apply -n {NAMESPACE} -f {EXAMPLE.relative_to(REPO)}"'
        assert offered in shown, shown

        assert "resnet50-pytorch-synthetic" in _kubectl("get dtj -A", env)
        _kubectl(f"apply -n {NAMESPACE} -f {_shrunk_example(tmp_path / EXAMPLE.name)}", env)
        phase = _wait_for_job("my-benchmark", env)
        launcher = _make(
            "-s", "kubectl", f"ARGS=logs -n {NAMESPACE} my-benchmark-launcher", env=env, check=False
        )
        assert phase == "Succeeded", (
            f"{phase}\n{_kubectl(f'describe dtj my-benchmark -n {NAMESPACE}', env)}\n{launcher}\n"
            f"{(state / 'operator.log').read_text(errors='replace')[-4000:]}"
        )
        assert "Total img/sec on 2 CPU(s)" in launcher, launcher
    finally:
        _make("demo-down", env=env, timeout=300, check=False)
        left = _leftovers(cache, state, pids)
        if left:
            _make("demo-down", env=env, timeout=300, check=False)
        else:
            shutil.rmtree(state, ignore_errors=True)
    assert left == []
