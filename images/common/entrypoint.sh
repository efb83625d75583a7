#!/usr/bin/env bash
# Container entrypoint for workers and the launcher.
#   worker:   `entrypoint.sh worker`   starts sshd in the foreground with keys from the mounted Secret.
#   launcher: `entrypoint.sh <command>` sets up the ssh client and runs the command (horovodrun/mpirun).
# The SSH Secret is mounted at $DTJOB_SSH_DIR (default /etc/dtjob/ssh), each pod with only its half of the key
# pair: workers authorized_keys (sshd_config reads it from there), the launcher id_ed25519.
set -euo pipefail
ssh_dir=${DTJOB_SSH_DIR:-/etc/dtjob/ssh}
need=id_ed25519
[[ ${1:-} == worker ]] && need=authorized_keys
[[ -r $ssh_dir/$need ]] || { echo "entrypoint: $ssh_dir/$need is missing (is the SSH Secret mounted?)" >&2; exit 2; }

if [[ ${1:-} == worker ]]; then
  mkdir -p /tmp/ssh
  [[ -f /tmp/ssh/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N "" -f /tmp/ssh/ssh_host_ed25519_key
  exec /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
fi

# Client side: the MPI launcher connects to every worker on port 2222 with the job's key.
mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
install -m 0600 "$ssh_dir/id_ed25519" "$HOME/.ssh/id_ed25519"
cat >"$HOME/.ssh/config" <<CFG
Host *
  Port 2222
  IdentityFile $HOME/.ssh/id_ed25519
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ServerAliveInterval 30
CFG
chmod 600 "$HOME/.ssh/config"
exec "$@"
