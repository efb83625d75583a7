#!/usr/bin/env bash
# Builds hack/kstatus (the kstatus library of sigs.k8s.io/cli-utils, at the version its go.mod pins) into
#   $DTJOB_CACHE/bin/kstatus-<key>/kstatus
# where <key> hashes its sources, so an edit builds a new one and a second run builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Go's caches in a directory of this run's own, removed at the end (hack/go-scratch.sh).
[[ -n ${DTJOB_GO_SCRATCH:-} ]] || exec "$here/go-scratch.sh" "$0" "$@"
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
src=$here/kstatus
key=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)
out=$cache/bin/kstatus-$key
log() { printf '[build-kstatus] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
# Its modules, unlike the rest of Go's caches, stay in the cache (keyed like the binary, a few hundred MB):
# tests/unit/test_cache_builds.py builds kstatus from them with no network.
modules=$cache/go-mod/kstatus-$key
if ! cache_hit "kstatus-modules-$key" "kstatus $key's modules" test -f "$modules/.ready"; then
  # Go writes its module cache read-only.
  for dir in "$modules.tmp" "$modules"; do [[ ! -e $dir ]] || { chmod -R u+w "$dir"; rm -rf "$dir"; }; done
  mkdir -p "$modules.tmp" # go creates none for a module without dependencies
  (cd "$src" && GOMODCACHE=$modules.tmp go mod download)
  touch "$modules.tmp/.ready"
  mv -T "$modules.tmp" "$modules"
  cache_unlock "kstatus-modules-$key"
fi
export GOMODCACHE=$modules
if cache_hit "kstatus-$key" "kstatus $key" test -x "$out/kstatus"; then
  log "kstatus $key cached"
  exit 0
fi
log "building kstatus $key"
mkdir -p "$out"
cd "$src"
trap 'rm -f "$out/kstatus.tmp.$$"' EXIT
# A name of this run's own, renamed into place whole: a reader never sees half a binary.
go build -trimpath -ldflags "-s -w" -o "$out/kstatus.tmp.$$" .
mv -T "$out/kstatus.tmp.$$" "$out/kstatus"
