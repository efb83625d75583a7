"""The worker's sshd script, run for real: the launcher logs in with the job's key and nothing else works.

sshd listens on every interface of the pod, so each test runs it inside a private network namespace, where
"every interface" is a loopback nobody else can reach, and a private mount namespace with an empty tmpfs on
/run, so nothing it (or a root sshd's /run/sshd) leaves behind outlives the test or depends on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from dtjob.desired.command import worker_sshd_script
from dtjob.desired.common import TRAINING_UID
from dtjob.desired.pods import SSH_KEY_MODE
from dtjob.desired.sshkeys import generate_keypair

SSHD = Path("/usr/sbin/sshd")
pytestmark = pytest.mark.skipif(
    not SSHD.exists() or shutil.which("unshare") is None or shutil.which("setpriv") is None
    or os.geteuid() != 0,
    reason="needs openssh-server (make deps), util-linux and root for private network and mount namespaces",
)  # fmt: skip

PRIVATE_RUN = "mount -t tmpfs tmpfs /run\nip link set lo up 2>/dev/null || ifconfig lo up\n"

# Start the worker script, wait for its port, try the logins: as whoever runs it, with keys from $KEYS.
LOGINS = """set -u
sh -c "$SSHD_SCRIPT" >"$LOG" 2>&1 &
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
ssh_as() { ssh -F /dev/null -i "$1" -p "$PORT" -o BatchMode=yes -o StrictHostKeyChecking=no \\
  -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "$(id -un)@127.0.0.1" echo rank-ready; }
echo "job key: $(ssh_as "$KEYS/id_ed25519" 2>&1)"
echo "other key: $(ssh_as "$KEYS/other" 2>&1 | tail -1)"
kill %1
"""

# What a worker pod looks like to sshd and ssh: the Secret's files as kubelet writes them with fsGroup (owned
# by root, group fsGroup, the volume's defaultMode), and a process with the pod's uid, gid and fsGroup, no
# capabilities and no_new_privs (allowPrivilegeEscalation: false). The image's /etc/passwd names the user.
AS_POD_USER = """set -eu
pod=/run/pod
mkdir -p "$pod/ssh" "$pod/home" "$pod/state"
echo "root:x:0:0::/root:/bin/sh" >"$pod/passwd"
echo "dtjob:x:$POD_UID:$POD_UID::$pod/home:/bin/sh" >>"$pod/passwd"
printf 'root:x:0:\\ndtjob:x:%s:\\n' "$POD_UID" >"$pod/group"
mount --bind "$pod/passwd" /etc/passwd
mount --bind "$pod/group" /etc/group
cp "$WORK/ssh/authorized_keys" "$WORK/id_ed25519" "$WORK/other" "$pod/ssh/"
chown -R "0:$POD_UID" "$pod/ssh"
chmod 2750 "$pod/ssh"
chmod "$KEY_MODE" "$pod/ssh/"*
chown "$POD_UID:$POD_UID" "$pod/home" "$pod/state"
setpriv --reuid="$POD_UID" --regid="$POD_UID" --groups="$POD_UID" --inh-caps=-all --bounding-set=-all \\
  --no-new-privs env HOME="$pod/home" KEYS="$pod/ssh" LOG="$pod/home/sshd.log" bash -c "$LOGINS" || true
echo "host key minted: $(test -f "$pod/state/ssh_host_ed25519_key" && echo yes || echo no)"
cat "$pod/home/sshd.log" >&2
"""


def _write_keys(tmp_path: Path) -> Path:
    job, other = generate_keypair("job"), generate_keypair("other")
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir()
    (ssh_dir / "authorized_keys").write_text(job.public_openssh)
    for name, key in (("id_ed25519", job), ("other", other)):
        (tmp_path / name).write_text(key.private_openssh)
        (tmp_path / name).chmod(0o400)
    return ssh_dir


def _run(driver: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "--fork", "bash", "-c", driver],
        env={**os.environ, "PORT": "2222", **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_root_is_refused_even_with_the_job_key(tmp_path: Path) -> None:
    """Run as root (as this test is): sshd starts, but no key logs root in (PermitRootLogin no)."""
    ssh_dir = _write_keys(tmp_path)
    script = worker_sshd_script(ssh_dir=str(ssh_dir), state_dir=str(tmp_path / "state"), port=2222)
    run_sshd_existed = Path("/run/sshd").exists()

    result = _run(
        PRIVATE_RUN + LOGINS,
        {"SSHD_SCRIPT": script, "KEYS": str(tmp_path), "LOG": str(tmp_path / "sshd.log")},
    )
    sshd_log = (tmp_path / "sshd.log").read_text() if (tmp_path / "sshd.log").exists() else ""
    output = result.stdout + result.stderr + sshd_log
    job_key = next(line for line in result.stdout.splitlines() if line.startswith("job key: "))
    assert "Permission denied" in job_key and "rank-ready" not in job_key, output
    assert "other key: " in result.stdout, output
    assert "ROOT LOGIN REFUSED" in sshd_log.upper(), output
    # The per-pod host key was minted where an unprivileged user can write.
    assert (tmp_path / "state" / "ssh_host_ed25519_key").exists()
    # A root sshd's /run/sshd was made in the private /run, not on this machine.
    assert Path("/run/sshd").exists() == run_sshd_existed


@pytest.mark.parametrize(
    ("key_mode", "logs_in"),
    [(SSH_KEY_MODE, True), (0o400, False)],
    ids=["secret-mode", "owner-only-secret"],
)
def test_the_pod_user_logs_in_with_the_secret_as_kubelet_mounts_it(
    tmp_path: Path, key_mode: int, logs_in: bool
) -> None:
    """Run as the pod does: sshd and ssh as TRAINING_UID, reading the root-owned Secret files through fsGroup.
    A mode without group read (0400, owner root) leaves the user unable to read its identity or sshd its
    authorized_keys."""
    _write_keys(tmp_path)
    script = worker_sshd_script(ssh_dir="/run/pod/ssh", state_dir="/run/pod/state", port=2222)
    result = _run(
        PRIVATE_RUN + AS_POD_USER,
        {
            "SSHD_SCRIPT": script,
            "LOGINS": LOGINS,
            "WORK": str(tmp_path),
            "POD_UID": str(TRAINING_UID),
            "KEY_MODE": f"{key_mode:o}",
        },
    )
    output = result.stdout + result.stderr
    assert "host key minted: yes" in result.stdout, output
    if logs_in:
        assert "job key: rank-ready" in result.stdout, output
        assert "other key: " in result.stdout and "Permission denied" in result.stdout, output
    else:
        assert "job key: Load key" in result.stdout and "Permission denied" in result.stdout, output
