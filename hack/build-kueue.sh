#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy and caches it per version, with
# the module's CRDs and webhook manifest beside it, for the tests that admit jobs through a real Kueue:
#   $DTJOB_CACHE/bin/kueue-<version>/kueue
#   $DTJOB_CACHE/bin/kueue-<version>/crds/*.yaml, webhook-manifests.yaml
# A second run finds them and builds nothing.
#   hack/build-kueue.sh [VERSION...]    (default: the pinned $KUEUE_VERSION and the newest, $KUEUE_NEWEST_VERSION)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Go's caches in a directory of this run's own, removed at the end (hack/go-scratch.sh).
[[ -n ${DTJOB_GO_SCRATCH:-} ]] || exec "$here/go-scratch.sh" "$0" "$@"
# shellcheck source=versions.env
source "$here/versions.env"
if (($# == 0)); then
  for version in "$KUEUE_VERSION" "$KUEUE_NEWEST_VERSION"; do "$0" "$version"; done
  exit 0
fi
KUEUE_VERSION=$1
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
out=$cache/bin/kueue-$KUEUE_VERSION
log() { printf '[build-kueue] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"
built() { [[ -x $out/kueue && -f $out/webhook-manifests.yaml ]]; }
if cache_hit "kueue-$KUEUE_VERSION" "kueue $KUEUE_VERSION" built; then
  log "kueue $KUEUE_VERSION cached"
  exit 0
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out"
src=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
# A local module requiring the exact version: `go install pkg@version` would also ask the proxy for the module's
# version list (for its deprecation notice), which a proxy serving only exact versions refuses.
work=$cache/build/kueue-$KUEUE_VERSION
mkdir -p "$work"
cd "$work"
printf 'module dtjob.local/kueue-build\n\ngo 1.25.0\n' > go.mod
go get "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
log "building kueue $KUEUE_VERSION"
# Names of this run's own, renamed into place whole; the manifest last, as it marks the entry built.
trap 'rm -f "$out/kueue.tmp.$$" "$out/webhook-manifests.yaml.tmp.$$"' EXIT
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  -o "$out/kueue.tmp.$$" sigs.k8s.io/kueue/cmd/kueue
mkdir -p "$out/crds"
cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
cp "$src/config/components/webhook/manifests.yaml" "$out/webhook-manifests.yaml.tmp.$$"
chmod -R u+w "$out"
mv -T "$out/kueue.tmp.$$" "$out/kueue"
mv -T "$out/webhook-manifests.yaml.tmp.$$" "$out/webhook-manifests.yaml"
