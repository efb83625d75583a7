#!/usr/bin/env bash
# Builds dtjob's five images for a registry and pushes them as REGISTRY/dtjob/NAME:TAG, the names the Helm
# chart gives jobs and the operator (global.imageRegistry=REGISTRY, tags = the chart's appVersion).
#
#   hack/push-images.sh REGISTRY [TAG]       e.g. hack/push-images.sh mlregistry.azurecr.io
#
# Log in first (az acr login --name mlregistry, or buildah/docker login). Environment:
#   DTJOB_PUSH_NAMES       the images (default: operator stager mpi horovod-pytorch horovod-tensorflow)
#   DTJOB_PUSH_FROM        gpu (default): each Dockerfile built as a GPU cluster needs it (its defaults: the CUDA
#                          bases and the frameworks' GPU wheels), with docker when there is one, else buildah;
#                          testbed: the images hack/build-images.sh built on this machine (CPU form: they run no
#                          GPU code; for trying a registry, and what the tests push)
#   DTJOB_PUSH_TLS_VERIFY  true (default); false only for a plain-http registry on loopback
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
    horovod-tensorflow) echo "--build-arg FRAMEWORK=tensorflow --build-arg CUDA_VERSION=12.8.1" ;;
  esac
}

for name in "${names[@]}"; do dockerfile_of "$name" >/dev/null; done
for name in "${names[@]}"; do
  ref=$registry/dtjob/$name:$tag
  case $from in
    gpu)
      # shellcheck disable=SC2046  # the arguments split on purpose
      if command -v docker >/dev/null; then
        log "$name: docker build -> $ref"
        docker build -f "$(dockerfile_of "$name")" $(gpu_args_of "$name") -t "$ref" "$repo"
        docker push "$ref"
      else
        log "$name: buildah bud -> $ref"
        buildah bud --layers -f "$(dockerfile_of "$name")" $(gpu_args_of "$name") -t "$ref" "$repo"
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
