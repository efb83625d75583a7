#!/usr/bin/env bash
# Installs Azurite (the Azure Storage emulator) from the npm registry into
#   ${DTJOB_CACHE:-~/.cache/dtjob}/azurite-<version>/
# and prints the path of its azurite-blob binary. A second run finds it and installs nothing.
# The version comes from hack/versions.env (3.35.x is the newest that runs on Node 20).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
prefix=$cache/azurite-$AZURITE_VERSION
bin=$prefix/node_modules/.bin/azurite-blob

log() { printf '[install-azurite] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"

installed() { [[ -x $bin && -f $prefix/.ready ]]; }
# One installer of a version at a time (parallel test sessions); the second finds the first one's result.
if cache_hit "azurite-$AZURITE_VERSION" "azurite $AZURITE_VERSION" installed; then
  echo "$bin"
  exit 0
fi
command -v npm >/dev/null || { log "npm not found: install Node.js 20+ first"; exit 1; }
log "installing azurite@$AZURITE_VERSION into $prefix"
# Install into a scratch directory and move it into place, so an interrupted install never looks cached.
tmp=$(mktemp -d "$cache/.azurite-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error --omit=dev "azurite@$AZURITE_VERSION" >&2
[[ -x $tmp/node_modules/.bin/azurite-blob ]] || { log "azurite-blob missing after install"; exit 1; }
touch "$tmp/.ready"
rm -rf "$prefix"
mv -T "$tmp" "$prefix"
trap - EXIT
echo "$bin"
