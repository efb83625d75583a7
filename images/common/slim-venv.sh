#!/usr/bin/env bash
# Drops what a training image's environment does not need at run time: bytecode caches (the venv is not
# writable for the training user, so Python compiles in memory either way) and the debug symbols of Horovod's
# extensions.
#   slim-venv.sh VENV
set -euo pipefail
venv=${1:?usage: slim-venv.sh VENV}
find "$venv" -name __pycache__ -prune -exec rm -rf {} +
if command -v strip >/dev/null; then
  find "$venv"/lib/python3*/site-packages/horovod -name '*.so' -exec strip --strip-debug {} +
else
  echo "[slim-venv] no strip (binutils): Horovod's extensions keep their debug symbols" >&2
fi
echo "[slim-venv] $venv: $(du -sh "$venv" | cut -f1)" >&2
