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
#                     collective ops on NCCL (HOROVOD_GPU_OPERATIONS=NCCL unless set), linked to the NCCL
#                     the framework itself loads (its nvidia-nccl wheel). One framework per GPU build:
#                     torch runs on CUDA 13, TensorFlow on CUDA 12.
#   DTJOB_CACHE       cache root (default ~/.cache/dtjob); the built wheel lives in $DTJOB_CACHE/wheels/.
#   DTJOB_DOWNLOAD_ONLY  1: only fill the wheelhouse ($DTJOB_CACHE/wheels/pypi) for this selection.
#   DTJOB_WITH_DALI   with torch: 1 installs NVIDIA DALI (requirements-dali.txt), 0 leaves it out; by default
#                     the GPU build has it (the trainer's GPU input pipeline) and the CPU build does not.
#   HOROVOD_*         passed to Horovod's build as usual. HOROVOD_CUDA_HOME: the CUDA toolkit to compile
#                     with (a CUDA devel image's /usr/local/cuda); unset, nvcc and the CUDA headers come from
#                     PyPI (requirements-cuda-build.txt) into the build directory only.
#                     HOROVOD_BUILD_CUDA_CC_LIST: the GPU architectures; by default those of the VM sizes
#                     the project names (V100 7.0 where the toolkit still has it, A100 8.0, H100 9.0).
# Every pip call takes constraints.txt, which pins each CUDA package the frameworks pull in.
# Idempotent: a stamp in the environment records what was installed, so a second run returns at once.
# Two runs at once wait for each other where they would write the same thing (hack/cache-lock.sh): the same
# environment, the wheelhouse, the same Horovod wheel; the second then finds the first one's result.
set -euo pipefail

PY=${1:?usage: training/install.sh PYTHON}
# Absolute, as the build runs from Horovod's source tree.
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY
here=$(cd "$(dirname "$0")" && pwd)
frameworks=${DTJOB_FRAMEWORKS:-torch tensorflow}
device=${DTJOB_DEVICE:-cpu}
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
horovod_version=0.28.1
patch_file=$here/patches/horovod-$horovod_version.patch

log() { echo "[training/install] $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -f $here/../hack/cache-lock.sh ]]; then
  # shellcheck source=../hack/cache-lock.sh
  source "$here/../hack/cache-lock.sh"
else
  # An image build copies this script without hack/: it runs without the locks there.
  cache_lock() { :; }
  cache_unlock() { :; }
  cache_hit() { shift 2; "$@"; }
fi

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
# Each framework brings its own CUDA (torch 2.13: CUDA 13; TensorFlow 2.21: CUDA 12) and Horovod links one.
[[ $device$with_torch$with_tf != gpu11 ]] ||
  die "DTJOB_DEVICE=gpu builds one framework per environment (torch: CUDA 13, tensorflow: CUDA 12): set DTJOB_FRAMEWORKS"

# Requirement files for this selection; the GPU TensorFlow is the same release with its CUDA libraries.
reqs=("$here/requirements.txt")
[[ $with_torch == 1 ]] && reqs+=("$here/requirements-torch.txt")
tf_spec=""
if [[ $with_tf == 1 ]]; then
  tf_version=$(sed -n 's/^tensorflow-cpu==//p' "$here/requirements-tensorflow.txt")
  [[ -n $tf_version ]] || die "no tensorflow-cpu pin in requirements-tensorflow.txt"
  if [[ $device == gpu ]]; then tf_spec="tensorflow[and-cuda]==$tf_version"; else reqs+=("$here/requirements-tensorflow.txt"); fi
fi

# DALI goes beside torch, not into the Horovod build key: adding it builds nothing again.
with_dali=${DTJOB_WITH_DALI:-$([[ $device == gpu ]] && echo 1 || echo 0)}
case $with_dali in 0 | 1) ;; *) die "DTJOB_WITH_DALI must be 0 or 1, got '$with_dali'" ;; esac
extra_reqs=()
[[ $with_torch$with_dali == 11 ]] && extra_reqs+=("$here/requirements-dali.txt")

horovod_env=$(env | grep '^HOROVOD_' | sort || true)
# The wheel depends on what goes into the build; the stamp also on this script and the other pins.
# Bump build_recipe when a change here alters how Horovod is built.
build_recipe=2
constraints=$here/constraints.txt
cuda_build_reqs=$here/requirements-cuda-build.txt
# The Python the wheel's extensions run on: its ABI and the C library, not its patch release, so the image's
# Debian Python 3.11 finds a wheel built on a Debian host's Python 3.11 (a wheel built against a newer glibc
# keys apart).
python_abi=$("$PY" -c 'import platform, sysconfig; print(sysconfig.get_config_var("SOABI"), *platform.libc_ver())')
build_key_of() { # FRAMEWORKS REQUIREMENT-FILES...: the key of a Horovod wheel built for them on this device
  local fws=$1
  shift
  cat "$@" "$patch_file" "$constraints" "$cuda_build_reqs" \
    <(echo "$build_recipe|$horovod_version|$fws|$device|$tf_spec|$horovod_env|$python_abi") |
    sha256sum | cut -c1-16
}
build_key=$(build_key_of "$frameworks" "${reqs[@]:1}")
key=$(cat "$0" "${reqs[@]}" ${extra_reqs[@]+"${extra_reqs[@]}"} "$here/requirements-tf-keras.txt" <(echo "$build_key") |
  sha256sum | cut -c1-16)
# Every downloaded wheel is kept in a wheelhouse (torch's CUDA build alone is several GB), so the next venv
# installs from disk, and an install with PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheelhouse> needs no network.
wheelhouse=$cache/wheels/pypi
mkdir -p "$wheelhouse"
req_args=()
for r in "${reqs[@]}" ${extra_reqs[@]+"${extra_reqs[@]}"}; do req_args+=(-r "$r"); done
req_args+=(-c "$constraints")
# PyPI's CUDA toolkit for the GPU build, unless a toolkit is given.
cuda_from_pypi=0
[[ $device == gpu && -z ${HOROVOD_CUDA_HOME:-} ]] && cuda_from_pypi=1
download=("$PY" -m pip download -q --disable-pip-version-check -d "$wheelhouse")
download_wheels() {
  "${download[@]}" "${req_args[@]}" ${tf_spec:+"$tf_spec"}
  # --no-deps: tf_keras requires `tensorflow`, which would install the full wheel next to tensorflow-cpu.
  [[ $with_tf == 0 ]] || "${download[@]}" --no-deps -r "$here/requirements-tf-keras.txt"
  [[ $cuda_from_pypi == 0 ]] || "${download[@]}" -c "$constraints" -r "$cuda_build_reqs"
  # Horovod's sdist too, so that a build with no wheel cached yet can also run offline.
  "${download[@]}" --no-deps --no-binary horovod "horovod==$horovod_version"
}

# DTJOB_DOWNLOAD_ONLY=1: fill the wheelhouse for this selection and stop (make does it before the tests,
# which run offline).
# Downloads into the wheelhouse, one run at a time: pip does not write a wheel there under a name of its own,
# and a run that found another one's half-written wheel would take it as downloaded.
wheelhouse_lock=wheels-pypi
if [[ ${DTJOB_DOWNLOAD_ONLY:-0} == 1 ]]; then
  marker=$wheelhouse/.downloaded-$key
  if ! cache_hit "$wheelhouse_lock" "the wheelhouse $wheelhouse" test -f "$marker"; then
    log "downloading wheels ($frameworks, $device)"
    download_wheels
    touch "$marker"
  fi
  exit 0
fi

prefix=$("$PY" -c 'import sys; print(sys.prefix)')
stamp=$prefix/.dtjob-training-$key
# One install into an environment at a time (its lock is named by the environment's path).
env_lock=training-env-$(printf '%s' "$prefix" | sha256sum | cut -c1-16)
if cache_hit "$env_lock" "the training environment $prefix" test -f "$stamp"; then
  exit 0
fi

log "installing frameworks ($frameworks, $device)"
cache_lock "$wheelhouse_lock" "the wheelhouse $wheelhouse"
download_wheels
cache_unlock "$wheelhouse_lock"
pip=("$PY" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheelhouse")
"${pip[@]}" "${req_args[@]}" ${tf_spec:+"$tf_spec"}
[[ $with_tf == 0 ]] || "${pip[@]}" --no-deps -r "$here/requirements-tf-keras.txt"

site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# GPU build settings, in the build directory $1: NCCL is the framework's own (site-packages/nvidia/nccl, the
# library torch and TensorFlow load), so the process holds one NCCL; the CUDA toolkit is HOROVOD_CUDA_HOME
# or, unset, the PyPI one of requirements-cuda-build.txt merged into one tree with the layout nvcc and
# CMake expect (lib64, unversioned .so names).
gpu_build_env() {
  local dir=$1 nccl=$site/nvidia/nccl toolkit lib nvcc_major cc
  [[ -f $nccl/include/nccl.h && -f $nccl/lib/libnccl.so.2 ]] ||
    die "no NCCL in $nccl: the GPU build links the framework's nvidia-nccl wheel"
  mkdir -p "$dir/nccl/lib"
  ln -s "$nccl/include" "$dir/nccl/include"
  ln -s "$nccl/lib/libnccl.so.2" "$dir/nccl/lib/libnccl.so"
  export HOROVOD_NCCL_HOME=$dir/nccl HOROVOD_NCCL_LINK=SHARED
  export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
  if [[ $cuda_from_pypi == 1 ]]; then
    log "CUDA toolkit from PyPI ($(grep -v '^#' "$cuda_build_reqs" | xargs))"
    "${pip[@]}" --target "$dir/cuda-wheels" -c "$constraints" -r "$cuda_build_reqs"
    toolkit=$dir/cuda
    mkdir -p "$toolkit"
    for d in "$dir"/cuda-wheels/nvidia/*/; do cp -a "$d". "$toolkit"/; done
    ln -s lib "$toolkit/lib64"
    for lib in "$toolkit"/lib/lib*.so.*; do
      [[ -e ${lib%%.so.*}.so ]] || ln -s "$(basename "$lib")" "${lib%%.so.*}.so"
    done
    export HOROVOD_CUDA_HOME=$toolkit
  fi
  [[ -x $HOROVOD_CUDA_HOME/bin/nvcc ]] || die "HOROVOD_CUDA_HOME=$HOROVOD_CUDA_HOME has no bin/nvcc"
  # Horovod's CMake asks torch whether it supports CUDA, and torch answers from CUDA_HOME.
  export CUDA_HOME=$HOROVOD_CUDA_HOME
  nvcc_major=$("$HOROVOD_CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  # Native code for V100 (7.0; CUDA 13 dropped Volta), A100 (8.0) and H100 (9.0, with PTX for newer GPUs).
  if ((nvcc_major >= 13)); then cc=80,90; else cc=70,80,90; fi
  export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$cc}
  if [[ $with_tf == 1 ]] && ((nvcc_major >= 13)); then
    log "warning: TensorFlow runs on CUDA 12 but this toolkit is CUDA $nvcc_major: Horovod's kernels need a" \
      "CUDA $nvcc_major driver; set HOROVOD_CUDA_HOME to a CUDA 12 toolkit for V100 and older drivers"
  fi
  log "GPU build: CUDA $nvcc_major at $HOROVOD_CUDA_HOME, architectures $HOROVOD_BUILD_CUDA_CC_LIST, NCCL of $nccl"
}

# The built wheel's libraries search the build directory's toolkit and NCCL links; point them at the
# environment's own CUDA runtime and NCCL instead, relative to where they are installed ($ORIGIN).
relocate_gpu_wheel() {
  local dist=$1 unpacked=$1/unpacked so rel up entry runpath
  command -v patchelf >/dev/null || die "patchelf is needed for the GPU build (apt-get install patchelf)"
  "$PY" -m wheel unpack -d "$unpacked" "$dist"/horovod-*.whl >/dev/null
  rm "$dist"/horovod-*.whl
  while IFS= read -r so; do
    rel=${so#"$unpacked"/horovod-*/}
    up=$(dirname "$rel" | sed 's|[^/][^/]*|..|g')
    runpath=""
    for entry in nvidia/nccl/lib nvidia/cu13/lib nvidia/cuda_runtime/lib; do
      [[ -d $site/$entry ]] && runpath+=":\$ORIGIN/$up/$entry"
    done
    while IFS= read -r -d: entry; do
      case $entry in
        "" | "$dist"/* | "$HOROVOD_CUDA_HOME"/* | "$HOROVOD_NCCL_HOME"/*) ;;
        "$site"/*) runpath+=":\$ORIGIN/$up/${entry#"$site"/}" ;;
        *) runpath+=":$entry" ;;
      esac
    done < <(printf '%s:' "$(patchelf --print-rpath "$so")")
    patchelf --set-rpath "${runpath#:}" "$so"
  done < <(find "$unpacked" -name '*.so')
  "$PY" -m wheel pack -d "$dist" "$unpacked"/horovod-* >/dev/null
}

# Horovod: one wheel per (frameworks, device, framework pins, patch, Python ABI, HOROVOD_* flags), built once.
# Moved into place whole, as a directory (a reader never sees half a wheel), under the wheel's own lock.
# A CPU build for one framework takes the two-framework CPU wheel where one is built (the training venv's,
# when make builds the CPU TensorFlow image after it): the same sources, patch, pins and Python ABI, one
# compile of Horovod fewer. The other framework's extension is removed after the install, as if never built.
unused_extension=""
if [[ $device == cpu && $with_torch$with_tf != 11 ]]; then
  both_key=$(build_key_of "torch tensorflow" "$here/requirements-torch.txt" "$here/requirements-tensorflow.txt")
  if ls "$cache/wheels/horovod-$horovod_version-$both_key"/horovod-*.whl >/dev/null 2>&1; then
    log "taking the two-framework CPU build of Horovod ($both_key) for $frameworks"
    build_key=$both_key
    if [[ $with_torch == 1 ]]; then unused_extension=tensorflow; else unused_extension=torch; fi
  fi
fi
wheel_dir=$cache/wheels/horovod-$horovod_version-$build_key
wheel_built() { ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; }
wheel_lock=horovod-$horovod_version-$build_key
if ! cache_hit "$wheel_lock" "Horovod $horovod_version ($build_key)" wheel_built; then
  command -v cmake >/dev/null || die "cmake is needed to build Horovod (apt-get install cmake)"
  command -v mpicxx >/dev/null || log "warning: no mpicxx, Horovod is built without MPI (Gloo only)"
  build=$(mktemp -d)
  staged=""
  trap 'rm -rf "$build" ${staged:+"$staged"}' EXIT
  log "building Horovod $horovod_version (several minutes; cached in $wheel_dir)"
  cache_lock "$wheelhouse_lock" "the wheelhouse $wheelhouse"
  "${download[@]}" --no-deps --no-binary horovod "horovod==$horovod_version"
  cache_unlock "$wheelhouse_lock"
  tar -xzf "$wheelhouse/horovod-$horovod_version.tar.gz" -C "$build"
  src=$build/horovod-$horovod_version
  patch -d "$src" -p1 -s <"$patch_file"
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
  if command -v mpicxx >/dev/null; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  if [[ $with_torch == 1 ]]; then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
  if [[ $with_tf == 1 ]]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
  if [[ $device == gpu ]]; then gpu_build_env "$build"; fi
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
  if [[ $device == gpu ]]; then relocate_gpu_wheel "$build/dist"; fi
  staged=$(mktemp -d "$cache/wheels/.horovod-$horovod_version-$build_key.XXXXXX")
  mv "$build"/dist/horovod-*.whl "$staged/"
  chmod 755 "$staged"
  rm -rf "$wheel_dir" # no wheel in it: what an interrupted run left
  mv -T "$staged" "$wheel_dir"
  cache_unlock "$wheel_lock"
fi
# Horovod's declared deps (cloudpickle, psutil, pyyaml, packaging, cffi) are pinned in requirements.txt.
"${pip[@]}" --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
# Importing horovod.<other framework> then fails as in a build without it ("has not been built").
[[ -z $unused_extension ]] || rm -f "$site/horovod/$unused_extension"/mpi_lib*.so

check="import horovod"
[[ $with_torch == 1 ]] && check+="; import horovod.torch as h; assert h.gloo_built()"
[[ $with_tf == 1 ]] && check+="; import horovod.tensorflow.keras as k; assert k.gloo_built()"
if [[ $device == gpu ]]; then
  [[ $with_torch == 1 ]] && check+="; assert h.nccl_built(), 'horovod.torch: built without NCCL'"
  [[ $with_tf == 1 ]] && check+="; assert k.nccl_built(), 'horovod.tensorflow: built without NCCL'"
fi
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "$check" || die "Horovod does not import after install"
rm -f "$prefix"/.dtjob-training-*
touch "$stamp"
log "done (horovod $horovod_version: $frameworks, $device)"
