#!/usr/bin/env bash
# System layer of the Horovod images (Ubuntu 22.04 CUDA base): Python 3.11, OpenMPI, sshd for the MPI
# launcher, and the unprivileged user that runs training.
#   install-system.sh build     adds the compilers and headers the Horovod build needs (build stage)
#   install-system.sh runtime   runtime libraries only (final stage)
set -euo pipefail
stage=${1:?usage: install-system.sh build|runtime}
export DEBIAN_FRONTEND=noninteractive
pkgs=(python3.11 python3.11-venv openmpi-bin openssh-server openssh-client ca-certificates tini)
[[ $stage == build ]] && pkgs+=(python3.11-dev libopenmpi-dev cmake g++ make patch)
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
rm -rf /var/lib/apt/lists/*

# The training user: MPI runs as this user over ssh between pods (no root, no passwords).
useradd --create-home --uid 1000 --shell /bin/bash dtjob
mkdir -p /run/sshd
install -m 0644 /opt/dtjob/images/common/sshd_config /etc/ssh/sshd_config
# Host keys are generated at container start (entrypoint), never baked into the image.
rm -f /etc/ssh/ssh_host_*
