#!/usr/bin/env bash
# Builds Kubeflow's mpi-operator (the comparison in bench/versus_mpi_operator.py) from its module on the Go
# module proxy, at the exact version below, into
#   $DTJOB_CACHE/bin/mpi-operator-<version>/mpi-operator
# beside its MPIJob CRD (kubeflow.org_mpijobs.yaml, from the same module). A second run builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Go's caches in a directory of this run's own, removed at the end (hack/go-scratch.sh).
[[ -n ${DTJOB_GO_SCRATCH:-} ]] || exec "$here/go-scratch.sh" "$0" "$@"
version=${MPI_OPERATOR_VERSION:-v0.8.2}
module=github.com/kubeflow/mpi-operator
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
out=$cache/bin/mpi-operator-$version
log() { printf '[build-mpi-operator] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"
built() { [[ -x $out/mpi-operator && -s $out/kubeflow.org_mpijobs.yaml ]]; }
if cache_hit "mpi-operator-$version" "mpi-operator $version" built; then
  log "mpi-operator $version cached"
  exit 0
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
log "fetching $module@$version"
dir=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -d $dir ]] || { log "no module directory for $module@$version"; exit 1; }
work=$cache/build/mpi-operator-$version
rm -rf "$work"
mkdir -p "$work" "$out"
cp -r "$dir/." "$work/"
chmod -R u+w "$work"
crd=$(find "$work/manifests" -name 'kubeflow.org_mpijobs.yaml' | head -1)
[[ -n $crd ]] || { log "no MPIJob CRD in the module"; exit 1; }
log "building $module/cmd/mpi-operator $version"
# Names of this run's own, renamed into place whole; the binary last, as it marks the entry built.
trap 'rm -f "$out/mpi-operator.tmp.$$" "$out/kubeflow.org_mpijobs.yaml.tmp.$$"' EXIT
(cd "$work" && go build -trimpath -ldflags "-s -w" -o "$out/mpi-operator.tmp.$$" ./cmd/mpi-operator)
cp "$crd" "$out/kubeflow.org_mpijobs.yaml.tmp.$$"
mv -T "$out/kubeflow.org_mpijobs.yaml.tmp.$$" "$out/kubeflow.org_mpijobs.yaml"
mv -T "$out/mpi-operator.tmp.$$" "$out/mpi-operator"
rm -rf "$work"
log "built $out/mpi-operator"
