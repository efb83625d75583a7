#!/usr/bin/env bash
# Unpacks Debian's container registry (the CNCF distribution registry, package docker-registry) into
#   ${DTJOB_CACHE:-~/.cache/dtjob}/registry-<version>/
# and prints the path of its binary: the tests push images to one that they start on 127.0.0.1. The package
# is downloaded and unpacked, never installed, so no registry service is ever set up or started on the
# machine. A second run finds it and does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
version=$(apt-cache policy docker-registry 2>/dev/null | awk '/Candidate:/ { print $2 }')
[[ -n $version && $version != "(none)" ]] || { echo "[install-registry] no docker-registry package in apt" >&2; exit 1; }
prefix=$cache/registry-${version//[^A-Za-z0-9._-]/_}
bin=$prefix/usr/bin/docker-registry

log() { printf '[install-registry] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"

installed() { [[ -x $bin && -f $prefix/.ready ]]; }
if cache_hit "registry-$version" "the registry $version" installed; then
  echo "$bin"
  exit 0
fi
log "unpacking docker-registry $version into $prefix"
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.registry-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "docker-registry=$version" >/dev/null)
dpkg-deb -x "$tmp"/docker-registry_*.deb "$tmp/root"
[[ -x $tmp/root/usr/bin/docker-registry ]] || { log "no usr/bin/docker-registry in the package"; exit 1; }
touch "$tmp/root/.ready"
rm -rf "$prefix"
mv -T "$tmp/root" "$prefix"
echo "$bin"
