#!/usr/bin/env bash
# Container entrypoint for workers and the launcher.
#   worker:   `entrypoint.sh worker`   starts sshd in the foreground with keys from the mounted Secret.
#   launcher: `entrypoint.sh <command>` sets up the ssh client and runs the command (horovodrun/mpirun).
# The operator mounts the SSH Secret at $DTJOB_SSH_DIR (default /etc/dtjob/ssh) with id_ed25519,
# id_ed25519.pub and authorized_keys (mode 0400); sshd_config reads authorized_keys from there.
set -euo pipefail
ssh_dir=${DTJOB_SSH_DIR:-/etc/dtjob/ssh}
for f in id_ed25519 authorized_keys; do
  [[ -r $ssh_dir/$f ]] || { echo "entrypoint: $ssh_dir/$f is missing (is the SSH Secret mounted?)" >&2; exit 2; }
done

# Client side: the MPI launcher connects to every worker on port 2222 with the shared key.
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

if [[ ${1:-} == worker ]]; then
  mkdir -p /tmp/ssh
  [[ -f /tmp/ssh/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N "" -f /tmp/ssh/ssh_host_ed25519_key
  exec /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
fi
exec "$@"
