#!/usr/bin/env bash
# The Azure CLI (the azure-cli package from PyPI, pinned) in a venv of its own, for the AKS guide's test, which
# checks every `az` command and flag the guide shows against the CLI's own parser, offline, inside the
# test bed's network namespace (tests/integration/test_aks_guide.py). Its own venv: azure-cli pins its
# azure-mgmt-* and azure-core versions, which must not move the project's.
#
#   hack/azure-cli-venv.sh DIR VERSION PYTHON
#
# Built under a lock (hack/cache-lock.sh) into a temporary directory beside DIR, then moved into place whole,
# so a second run at the same time waits and finds it ready, and an interrupted build leaves nothing at DIR.
# The venv survives the move as long as nothing in it runs through a shebang pip wrote: `bin/az` is rewritten as
# a bash script that runs the python beside it, and the test runs `DIR/bin/python` itself. .ready, written
# last, marks it whole.
set -euo pipefail
dir=${1:?usage: $0 DIR VERSION PYTHON}
version=${2:?usage: $0 DIR VERSION PYTHON}
python=${3:?usage: $0 DIR VERSION PYTHON}
export DTJOB_CACHE=${DTJOB_CACHE:-$HOME/.cache/dtjob}
log() { echo "[azure-cli] $*"; }
# shellcheck source=hack/cache-lock.sh
source "$(dirname "$0")/cache-lock.sh"

if cache_hit "azure-cli-$(basename "$dir")" "the Azure CLI $version" test -f "$dir/.ready"; then
  exit 0
fi
log "installing azure-cli $version into $dir"
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp"
"$tmp/bin/python" -m pip install -q --upgrade pip
"$tmp/bin/python" -m pip install -q "azure-cli==$version"
# pip wrote the temporary name into bin/az's shebang: a wrapper that runs the python beside it instead.
cat >"$tmp/bin/az" <<'EOF'
#!/usr/bin/env bash
AZ_INSTALLER=${AZ_INSTALLER:-PIP} exec "$(dirname "$(realpath "$0")")/python" -m azure.cli "$@"
EOF
chmod 755 "$tmp/bin/az"
log "azure-cli-core $("$tmp/bin/python" -c 'import azure.cli.core as c; print(c.__version__)')" \
  "on $("$tmp/bin/python" --version)"
touch "$tmp/.ready"
chmod 755 "$tmp"
rm -rf "$dir"
mv -T "$tmp" "$dir"
trap - EXIT
log "$dir ready ($(du -sh "$dir" | cut -f1))"
# Drop the venvs of other versions: a changed pin builds a new one.
find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 -type d ! -name "$(basename "$dir")" ! -name '*.tmp.*' \
  -exec rm -rf {} +
