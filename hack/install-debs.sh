#!/usr/bin/env bash
# Installs the Debian packages a fresh machine lacks; a no-op when all are present.
#   OpenMPI, OpenSSH, cmake, g++, patch, patchelf: Horovod's build (patchelf: its GPU build) and the training
#   tests (horovodrun --mpi, sshd).
#   containerd, runc, CNI plugins, iptables: the real node (hack/realnode.sh); kube-proxy programs iptables.
#   buildah, debootstrap: the images, built from images/ Dockerfiles without a Docker engine; skopeo pushes
#   them to a registry (hack/push-images.sh).
#   lua5.1: runs the Argo CD health check (docs/gitops.md) in the chart tests.
set -euo pipefail
pkgs=(openmpi-bin libopenmpi-dev openssh-client openssh-server iproute2 cmake g++ patch patchelf
  containerd runc containernetworking-plugins iptables buildah debootstrap lua5.1 skopeo)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "[deps] installing ${missing[*]}" >&2
sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
