"""The worker's sshd script, run for real: the launcher logs in with the job's key and nothing else works.

sshd listens on every interface of the pod, so the test runs it inside a private network namespace, where
"every interface" is a loopback nobody else can reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from dtjob.desired.command import worker_sshd_script
from dtjob.sshkeys import generate_keypair

SSHD = Path("/usr/sbin/sshd")
pytestmark = pytest.mark.skipif(
    not SSHD.exists() or shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs openssh-server (make deps) and root for a private network namespace",
)

# Inside the namespace: bring loopback up, start the worker script, wait for the port, try the logins.
DRIVER = """set -u
ip link set lo up 2>/dev/null || ifconfig lo up
sh -c "$SSHD_SCRIPT" >"$WORK/sshd.log" 2>&1 &
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
ssh_as() { ssh -F /dev/null -i "$1" -p "$PORT" -o BatchMode=yes -o StrictHostKeyChecking=no \
  -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "$(id -un)@127.0.0.1" echo rank-ready; }
echo "job key: $(ssh_as "$WORK/id_ed25519" 2>&1)"
echo "other key: $(ssh_as "$WORK/other" 2>&1 | tail -1)"
kill %1
"""


def test_the_job_key_logs_in_and_another_key_does_not(tmp_path: Path) -> None:
    job, other = generate_keypair("job"), generate_keypair("other")
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir()
    (ssh_dir / "authorized_keys").write_text(job.public_openssh)
    for name, key in (("id_ed25519", job), ("other", other)):
        (tmp_path / name).write_text(key.private_openssh)
        (tmp_path / name).chmod(0o400)
    script = worker_sshd_script(ssh_dir=str(ssh_dir), state_dir=str(tmp_path / "state"), port=2222)

    result = subprocess.run(
        ["unshare", "--net", "--fork", "bash", "-c", DRIVER],
        env={**os.environ, "SSHD_SCRIPT": script, "WORK": str(tmp_path), "PORT": "2222"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    sshd_log = (tmp_path / "sshd.log").read_text() if (tmp_path / "sshd.log").exists() else ""
    assert "job key: rank-ready" in result.stdout, result.stdout + result.stderr + sshd_log
    assert "other key: " in result.stdout and "Permission denied" in result.stdout, result.stdout
    # The per-pod host key was minted where an unprivileged user can write.
    assert (tmp_path / "state" / "ssh_host_ed25519_key").exists()
