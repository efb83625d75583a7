#!/usr/bin/env bash
# System layer of the Horovod images: Python 3.11, OpenMPI, sshd for the MPI launcher, and the unprivileged
# user that runs training. Works on the Ubuntu 22.04 CUDA bases and on Debian 12 (bookworm, the local CPU
# base): both carry every package below under the same name.
#   install-system.sh build          adds the compilers and tools the Horovod build needs (build stage)
#   install-system.sh runtime [gpu]  runtime libraries only (final stage); gpu adds the RDMA userspace
#                                    (libibverbs and its providers), through which NCCL uses InfiniBand on
#                                    the ND-series VMs
set -euo pipefail
stage=${1:?usage: install-system.sh build|runtime [cpu|gpu]}
device=${2:-cpu}
export DEBIAN_FRONTEND=noninteractive
# shellcheck source=/dev/null
. /etc/os-release
case "$ID:$VERSION_ID" in
  ubuntu:22.04 | debian:12) ;;
  *) echo "[install-system] warning: made for Ubuntu 22.04 and Debian 12, this is $PRETTY_NAME" >&2 ;;
esac
pkgs=(python3.11 python3.11-venv openmpi-bin openssh-server openssh-client ca-certificates tini)
[[ $stage == build ]] && pkgs+=(python3.11-dev libopenmpi-dev cmake g++ make patch binutils patchelf)
[[ $stage == runtime && $device == gpu ]] && pkgs+=(libibverbs1 ibverbs-providers)
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/cache/debconf/*-old

# The training user: MPI runs as this user over ssh between pods (no root, no passwords).
id -u dtjob >/dev/null 2>&1 || useradd --create-home --uid 1000 --shell /bin/bash dtjob
mkdir -p /run/sshd
# Host keys are generated at container start (entrypoint), never baked into the image.
rm -f /etc/ssh/ssh_host_*
echo "[install-system] $stage: ${pkgs[*]} on $PRETTY_NAME" >&2
