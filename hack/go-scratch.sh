#!/usr/bin/env bash
# Runs CMD with Go's build cache, module cache and GOPATH in a directory of this run's own, removed when CMD
# ends: the binaries the Go builds make are what the cache keeps (under bin/, per version), and Go's own caches
# behind them (about 12 GB after the control plane, Kueue and scheduler-plugins) would otherwise stay on the
# disk for good. The Go build scripts re-run themselves under it; `make test` runs its Go builds, one after
# another, under a single one, so they share what each compiled. Two runs at once have different directories.
#
#   hack/go-scratch.sh CMD...
set -euo pipefail
[[ -z ${DTJOB_GO_SCRATCH:-} ]] || exec "$@" # already inside one: share it
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
mkdir -p "$cache/go-scratch"
# A run killed outright leaves its directory: the next one removes those whose process has ended.
for dir in "$cache"/go-scratch/run.*; do
  [[ -d $dir ]] || continue
  pid=${dir##*/run.}; pid=${pid%%.*}
  kill -0 "$pid" 2>/dev/null || { chmod -R u+w "$dir" 2>/dev/null || true; rm -rf "$dir"; }
done
scratch=$(mktemp -d "$cache/go-scratch/run.$$.XXXXXX")
# Go writes its module cache read-only.
trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM
export DTJOB_GO_SCRATCH=$scratch GOCACHE=$scratch/build GOMODCACHE=$scratch/mod GOPATH=$scratch/gopath
"$@"
