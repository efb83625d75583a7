#!/usr/bin/env bash
# Installs the Debian packages a fresh machine lacks; a no-op when all are present.
set -euo pipefail
pkgs=(openmpi-bin libopenmpi-dev openssh-client openssh-server iproute2 cmake g++ patch)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "[deps] installing ${missing[*]}" >&2
sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
