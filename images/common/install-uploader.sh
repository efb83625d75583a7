#!/usr/bin/env bash
# Installs the results uploader (`python -m dtjob.stager upload`) into a training image's environment: the
# launcher runs it on the pod that ran rank 0 once training ends. Only the dtjob package and the Blob client
# it needs; none of the operator's own dependencies. The trainers import dtjob.contract.training from it too.
#   install-uploader.sh PYTHON SOURCE_DIR     (SOURCE_DIR holds pyproject.toml and operator/)
set -euo pipefail
python=$1
src=$2
# The same range the package's `azure` extra pins.
blob=$(sed -n 's/^ *"\(azure-storage-blob[^"]*\)",*$/\1/p' "$src/pyproject.toml")
[[ -n $blob ]] || { echo "install-uploader: no azure-storage-blob pin in $src/pyproject.toml" >&2; exit 1; }
"$python" -m pip install -q --no-deps "$src"
"$python" -m pip install -q "$blob"
"$python" -m dtjob.stager upload --help >/dev/null
# The trainers (dtjob_train) import the training contract from the same package.
"$python" -c "import dtjob.contract.training"
echo "[install-uploader] dtjob.stager upload ready ($blob)" >&2
