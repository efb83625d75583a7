#!/usr/bin/env bash
# Builds dtjob's five images for a registry and pushes them as REGISTRY/dtjob/NAME:TAG, the names the Helm
# chart gives jobs and the operator (global.imageRegistry=REGISTRY, tags = the chart's appVersion).
#
#   hack/push-images.sh REGISTRY [TAG]       e.g. hack/push-images.sh mlregistry.azurecr.io
#
# Log in first (az acr login --name mlregistry, or buildah/docker login). Environment:
#   DTJOB_PUSH_NAMES       the images (default: operator stager mpi horovod-pytorch horovod-tensorflow)
#   DTJOB_PUSH_FROM        gpu (default): each Dockerfile built as a GPU cluster needs it, with docker when there
#                          is one, else buildah: horovod-pytorch on debian:bookworm-slim (the Dockerfile's
#                          defaults: CUDA torch, NCCL Horovod, DALI, nvcc from PyPI), horovod-tensorflow on CUDA
#                          12's devel and base images (PyPI has no CUDA 12 nvcc);
#                          testbed: the images hack/build-images.sh built on this machine (horovod-pytorch is the
#                          same GPU build on a local Debian base; horovod-tensorflow is its CPU form; what the
#                          tests push)
#   DTJOB_PUSH_TLS_VERIFY  true (default); false only for a plain-http registry on loopback
#
# AKS nodes are amd64: the gpu builds are linux/amd64 whatever this machine is. On another architecture (an
# arm64 laptop) that takes amd64 emulation: Docker Desktop has it built in; buildah, and docker on Linux, need
# QEMU's registered with binfmt_misc (apt-get install qemu-user-static, or
# `docker run --privileged --rm tonistiigi/binfmt --install amd64`), and the script refuses without it rather
# than push images whose first exec on a node fails with "exec format error". Emulated builds are slow
# (Horovod's compile: an hour or more). testbed images are this machine's own architecture: amd64 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
die() { printf '[push-images] %s\n' "$*" >&2; exit 1; }
log() { printf '[push-images] %s\n' "$*" >&2; }

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 REGISTRY [TAG]"
registry=${1%/}
tag=${2:-$(awk '/^appVersion:/ { gsub(/"/, "", $2); print $2 }' "$repo/charts/dtjob/Chart.yaml")}
[[ $registry =~ ^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$ ]] || die "REGISTRY must be a registry host, like myacr.azurecr.io, not '$registry'"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "TAG '$tag' is not an image tag"
read -r -a names <<<"${DTJOB_PUSH_NAMES:-operator stager mpi horovod-pytorch horovod-tensorflow}"
from=${DTJOB_PUSH_FROM:-gpu}
tls=${DTJOB_PUSH_TLS_VERIFY:-true}
[[ $tls == true || $tls == false ]] || die "DTJOB_PUSH_TLS_VERIFY must be true or false"

dockerfile_of() {
  case $1 in
    operator | stager | mpi) echo "images/$1/Dockerfile" ;;
    horovod-pytorch | horovod-tensorflow) echo images/horovod/Dockerfile ;;
    *) die "no image '$1' (operator, stager, mpi, horovod-pytorch, horovod-tensorflow)" ;;
  esac
}
gpu_args_of() { # the build arguments a registry build takes beyond the Dockerfile's defaults
  case $1 in
    # PyPI has no CUDA 12 nvcc: TensorFlow's Horovod compiles on CUDA's devel image and runs on its base.
    horovod-tensorflow)
      echo "--build-arg FRAMEWORK=tensorflow --build-arg BUILD_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu22.04" \
        "--build-arg RUNTIME_IMAGE=nvidia/cuda:12.8.1-base-ubuntu22.04 --build-arg NVIDIA_REQUIRE_CUDA=cuda>=12.8"
      ;;
  esac
}

for name in "${names[@]}"; do dockerfile_of "$name" >/dev/null; done

platform=linux/amd64
host_arch=$(uname -m)
amd64_emulation() { # whether this Linux runs amd64 binaries through binfmt_misc (QEMU, or Rosetta in a VM)
  local entry
  for entry in /proc/sys/fs/binfmt_misc/*; do
    [[ -f $entry && $(basename "$entry") =~ ^(qemu-x86_64|x86_64|rosetta)$ ]] || continue
    grep -qx enabled "$entry" && return 0
  done
  return 1
}
if [[ $host_arch != x86_64 && $host_arch != amd64 ]]; then
  case $from in
    testbed)
      die "the test bed's images are built for this machine ($host_arch); AKS nodes need $platform:" \
        "use DTJOB_PUSH_FROM=gpu"
      ;;
    gpu)
      # Docker on macOS or Windows builds in its own Linux VM, which brings the emulation; elsewhere it must be
      # registered on this kernel.
      if ! { [[ $(uname -s) != Linux ]] && command -v docker >/dev/null; } && ! amd64_emulation; then
        die "this machine is $host_arch and AKS nodes need $platform images, but no amd64 emulation is" \
          "registered (/proc/sys/fs/binfmt_misc has no qemu-x86_64): apt-get install qemu-user-static, or" \
          "docker run --privileged --rm tonistiigi/binfmt --install amd64; then run this again"
      fi
      log "building $platform images on $host_arch through emulation: expect it to take hours"
      ;;
  esac
fi
for name in "${names[@]}"; do
  ref=$registry/dtjob/$name:$tag
  case $from in
    gpu)
      # shellcheck disable=SC2046  # the arguments split on purpose
      if command -v docker >/dev/null; then
        log "$name: docker build ($platform) -> $ref"
        docker build --platform "$platform" -f "$(dockerfile_of "$name")" $(gpu_args_of "$name") \
          -t "$ref" "$repo"
        docker push "$ref"
      else
        log "$name: buildah bud ($platform) -> $ref"
        buildah bud --platform "$platform" --layers -f "$(dockerfile_of "$name")" $(gpu_args_of "$name") \
          -t "$ref" "$repo"
        buildah push --tls-verify="$tls" "$ref" "docker://$ref"
      fi
      ;;
    testbed)
      layout=$("$here/build-images.sh" layout "$name")
      source_ref=$("$here/build-images.sh" refs "$name")
      log "$name: $source_ref (built here) -> $ref"
      skopeo copy --quiet --dest-tls-verify="$tls" "oci:$layout:$source_ref" "docker://$ref"
      ;;
    *) die "DTJOB_PUSH_FROM must be gpu or testbed, not '$from'" ;;
  esac
  echo "$ref"
done
