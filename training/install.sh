#!/usr/bin/env bash
# Installs what the training code needs into the environment of the given python: the pinned frameworks
# (training/requirements*.txt) and Horovod 0.28.1 built from its sdist with training/patches applied.
# The same script runs in CI and in the image Dockerfiles, so the tests prove what the images ship.
#
#   training/install.sh PYTHON
#
# Environment it honours:
#   DTJOB_FRAMEWORKS  frameworks to install and build Horovod for: "torch tensorflow" (default), "torch",
#                     or "tensorflow" (TensorFlow 2 + Keras 2 via tf_keras).
#   DTJOB_DEVICE      cpu (default) or gpu: gpu takes the CUDA TensorFlow wheel and builds Horovod's
#                     collective ops on NCCL (HOROVOD_GPU_OPERATIONS=NCCL unless set).
#   DTJOB_CACHE       cache root (default ~/.cache/dtjob); the built wheel lives in $DTJOB_CACHE/wheels/.
#   HOROVOD_*         passed to Horovod's build as usual (e.g. HOROVOD_CUDA_HOME, HOROVOD_NCCL_HOME).
# Idempotent: a stamp in the environment records what was installed, so a second run returns at once.
set -euo pipefail

PY=${1:?usage: training/install.sh PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
frameworks=${DTJOB_FRAMEWORKS:-torch tensorflow}
device=${DTJOB_DEVICE:-cpu}
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
horovod_version=0.28.1
patch_file=$here/patches/horovod-$horovod_version.patch

log() { echo "[training/install] $*" >&2; }
die() { log "error: $*"; exit 1; }

case $device in cpu | gpu) ;; *) die "DTJOB_DEVICE must be cpu or gpu, got '$device'" ;; esac
with_torch=0 with_tf=0
for fw in $frameworks; do
  case $fw in
    torch | pytorch) with_torch=1 ;;
    tensorflow | keras) with_tf=1 ;;
    *) die "DTJOB_FRAMEWORKS: unknown framework '$fw' (choose from: torch tensorflow)" ;;
  esac
done
[[ $with_torch$with_tf != 00 ]] || die "DTJOB_FRAMEWORKS is empty"

# Requirement files for this selection; the GPU TensorFlow is the same release with its CUDA libraries.
reqs=("$here/requirements.txt")
[[ $with_torch == 1 ]] && reqs+=("$here/requirements-torch.txt")
tf_spec=""
if [[ $with_tf == 1 ]]; then
  tf_version=$(sed -n 's/^tensorflow-cpu==//p' "$here/requirements-tensorflow.txt")
  [[ -n $tf_version ]] || die "no tensorflow-cpu pin in requirements-tensorflow.txt"
  if [[ $device == gpu ]]; then tf_spec="tensorflow[and-cuda]==$tf_version"; else reqs+=("$here/requirements-tensorflow.txt"); fi
fi

horovod_env=$(env | grep '^HOROVOD_' | sort || true)
# The wheel depends on what goes into the build; the stamp also on this script and the other pins.
# Bump build_recipe when a change here alters how Horovod is built.
build_recipe=1
python_version=$("$PY" -c 'import sys; print(sys.version)')
build_key=$(cat "${reqs[@]:1}" "$patch_file" \
  <(echo "$build_recipe|$horovod_version|$frameworks|$device|$tf_spec|$horovod_env|$python_version") |
  sha256sum | cut -c1-16)
key=$(cat "$0" "${reqs[@]}" "$here/requirements-tf-keras.txt" <(echo "$build_key") | sha256sum | cut -c1-16)
prefix=$("$PY" -c 'import sys; print(sys.prefix)')
stamp=$prefix/.dtjob-training-$key
if [[ -f $stamp ]]; then
  exit 0
fi

# Every downloaded wheel is kept in a wheelhouse (torch's CUDA build alone is several GB), so the next venv
# installs from disk; pip download skips files it already has.
wheelhouse=$cache/wheels/pypi
mkdir -p "$wheelhouse"
req_args=()
for r in "${reqs[@]}"; do req_args+=(-r "$r"); done
log "installing frameworks ($frameworks, $device)"
"$PY" -m pip download -q --disable-pip-version-check -d "$wheelhouse" "${req_args[@]}" ${tf_spec:+"$tf_spec"}
pip=("$PY" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheelhouse")
"${pip[@]}" "${req_args[@]}" ${tf_spec:+"$tf_spec"}
if [[ $with_tf == 1 ]]; then
  # --no-deps: tf_keras requires `tensorflow`, which would install the full wheel next to tensorflow-cpu.
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$wheelhouse" -r "$here/requirements-tf-keras.txt"
  "${pip[@]}" --no-deps -r "$here/requirements-tf-keras.txt"
fi

# Horovod: one wheel per (frameworks, device, framework pins, patch, python, HOROVOD_* flags), built once.
wheel_dir=$cache/wheels/horovod-$horovod_version-$build_key
if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
  command -v cmake >/dev/null || die "cmake is needed to build Horovod (apt-get install cmake)"
  command -v mpicxx >/dev/null || log "warning: no mpicxx, Horovod is built without MPI (Gloo only)"
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  log "building Horovod $horovod_version (several minutes; cached in $wheel_dir)"
  "$PY" -m pip download -q --no-deps --no-binary horovod -d "$build" "horovod==$horovod_version"
  tar -xzf "$build/horovod-$horovod_version.tar.gz" -C "$build"
  src=$build/horovod-$horovod_version
  patch -d "$src" -p1 -s <"$patch_file"
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
  if command -v mpicxx >/dev/null; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  if [[ $with_torch == 1 ]]; then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
  if [[ $with_tf == 1 ]]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
  if [[ $device == gpu ]]; then
    export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL} HOROVOD_NCCL_LINK=${HOROVOD_NCCL_LINK:-SHARED}
  fi
  export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
  # --no-build-isolation: build against the torch/TF just installed, not a fresh unpinned one.
  (cd "$src" && TF_USE_LEGACY_KERAS=1 "$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$build/dist" . \
    >"$build/build.log" 2>&1) &
  builder=$!
  started=$SECONDS
  # A heartbeat with the last compiled file, so a long build is visibly alive.
  while kill -0 "$builder" 2>/dev/null; do
    sleep 30
    if kill -0 "$builder" 2>/dev/null; then
      last=$(grep -o '[A-Za-z0-9_]*\.cc' "$build/build.log" | tail -n 1 || true)
      log "still building Horovod: $((SECONDS - started))s${last:+, at $last}"
    fi
  done
  wait "$builder" || {
    tail -n 60 "$build/build.log" >&2
    die "Horovod build failed (last 60 lines of its log above)"
  }
  log "Horovod built in $((SECONDS - started))s"
  mkdir -p "$wheel_dir"
  mv "$build"/dist/horovod-*.whl "$wheel_dir/"
fi
# Horovod's declared deps (cloudpickle, psutil, pyyaml, packaging, cffi) are pinned in requirements.txt.
"${pip[@]}" --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl

check="import horovod"
[[ $with_torch == 1 ]] && check+="; import horovod.torch as h; assert h.gloo_built()"
[[ $with_tf == 1 ]] && check+="; import horovod.tensorflow.keras as k; assert k.gloo_built()"
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "$check" || die "Horovod does not import after install"
rm -f "$prefix"/.dtjob-training-*
touch "$stamp"
log "done (horovod $horovod_version: $frameworks, $device)"
