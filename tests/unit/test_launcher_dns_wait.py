"""The launcher waits until every MPI host's name resolves before mpirun starts (a worker can be Ready before
the cluster DNS serves its record), and fails naming the host that never resolved. The shell runs for real;
a stand-in getent on PATH plays the cluster DNS, so nothing leaves this machine."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from dtjob.desired.command import launcher_script, wait_for_host_names
from dtjob.desired.common import HOSTFILE

from tests.unit.operator_fixtures import job_spec

# Resolves the names listed in $KNOWN_HOSTS_FILE; a name appears there once the "DNS" has caught up.
FAKE_GETENT = """#!/bin/sh
[ "$1" = hosts ] && grep -qx "$2" "$KNOWN_HOSTS_FILE"
"""


def run_wait(tmp_path: Path, hostfile_text: str, known: list[str], seconds: int) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    getent = bin_dir / "getent"
    getent.write_text(FAKE_GETENT)
    getent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hostfile_text)
    known_file = tmp_path / "known"
    known_file.write_text("".join(f"{h}\n" for h in known))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KNOWN_HOSTS_FILE": str(known_file)}
    script = wait_for_host_names(str(hostfile), seconds) + "echo all-resolved\n"
    return subprocess.Popen(["/bin/sh", "-c", script], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip


def test_names_that_resolve_pass_at_once_in_both_hostfile_formats(tmp_path: Path) -> None:
    hosts = ["rn50-worker-0.rn50-workers.ns.svc", "rn50-worker-1.rn50-workers.ns.svc"]
    for text in (f"{hosts[0]} slots=4\n{hosts[1]} slots=4\n", f"{hosts[0]}:4\n{hosts[1]}:4\n"):
        proc = run_wait(tmp_path, text, hosts, seconds=5)
        out, err = proc.communicate(timeout=10)
        assert (proc.returncode, out, err) == (0, "all-resolved\n", "")


def test_the_launcher_waits_for_a_name_that_resolves_late(tmp_path: Path) -> None:
    late = "rn50-worker-1.rn50-workers.ns.svc"
    proc = run_wait(tmp_path, f"rn50-worker-0.x slots=1\n{late} slots=1\n", ["rn50-worker-0.x"], seconds=30)
    time.sleep(1.5)
    assert proc.poll() is None, "mpirun would have started before every host resolved"
    with (tmp_path / "known").open("a") as known:
        known.write(f"{late}\n")
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out == "all-resolved\n"


def test_a_name_that_never_resolves_fails_naming_it(tmp_path: Path) -> None:
    proc = run_wait(tmp_path, "rn50-worker-0.x slots=1\nrn50-worker-1.x slots=1\n", ["rn50-worker-0.x"], 2)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 1 and out == ""
    assert err == "dtjob: MPI host rn50-worker-1.x does not resolve after 2 s\n"


def test_the_launcher_script_waits_on_the_mounted_hostfile_before_mpirun() -> None:
    script = launcher_script(job_spec())
    assert script.index(f"sed -e 's/[: ].*//' {HOSTFILE}") < script.index("exec horovodrun")
    assert subprocess.run(["/bin/sh", "-n", "-c", script], check=False).returncode == 0
