#!/usr/bin/env bash
# Builds the images/ Dockerfiles without Docker or a registry: buildah (chroot isolation) on the local Debian
# bases of hack/base-image.sh, each exported as an OCI image layout that containerd imports. horovod-pytorch
# is the GPU image a registry gets (NCCL Horovod, CUDA torch, DALI; it runs on CPU too); horovod-tensorflow is
# built in its CPU form.
#
#   hack/build-images.sh [NAME...]     build NAMEs (default: all) and print their references, one a line
#   hack/build-images.sh refs [NAME...]   print the references only
#   hack/build-images.sh import --address SOCK [--namespace k8s.io] [--snapshotter overlayfs] NAME|REF...
#                                      import the built images into a containerd (ctr images import of the
#                                      layout as a tar stream), skipping images it already holds with the
#                                      same manifest digest
#   hack/build-images.sh layout NAME|REF   print the OCI layout directory of a built image (a registry push:
#                                      skopeo copy oci:DIR:REF docker://...; an archive: tar -C DIR -cf x.tar .)
#   hack/build-images.sh prune         drop the cached build stages and intermediate layers (disk back; the
#                                      next build installs the frameworks again, the Horovod wheel stays)
#
# NAME is operator, stager, mpi (Open MPI and MPICH, for any MPI program), horovod-pytorch or horovod-tensorflow
# (both from images/horovod/Dockerfile, with FRAMEWORK=torch or tensorflow); the reference is
# $DTJOB_IMAGE_REGISTRY/NAME:$DTJOB_IMAGE_TAG, e.g. localhost/dtjob/horovod-pytorch:dev.
#
# Cached by content: an image's key hashes exactly its inputs (its Dockerfile, every COPY source less what
# images/build.dockerignore leaves out, the base image ID, the build arguments, this script's recipe
# version). When the exported image on disk carries the same key it is not built again; otherwise buildah
# builds it with --layers, so only the steps after the first changed input run. The framework wheels
# come from the host's wheelhouse ($DTJOB_CACHE/wheels, bound as the Dockerfiles' wheel cache mount), and the
# Horovod wheel is built once per build-input key there (training/install.sh): a rebuild downloads nothing
# big and compiles nothing.
#
# One build at a time per cache (a lock; imports wait for a running build). Disk is checked before each build
# (horovod-pytorch needs about 16 GB at its peak); when short, the image's previous build is dropped first.
#
# Environment it honours:
#   DTJOB_CACHE             cache root (default ~/.cache/dtjob): buildah's storage, logs and the exported
#                           images live in $DTJOB_CACHE/buildah (make clean-cache removes them), wheels in
#                           $DTJOB_CACHE/wheels
#   DTJOB_IMAGE_REGISTRY    repository prefix (default localhost/dtjob)
#   DTJOB_IMAGE_TAG         tag (default dev)
#   DTJOB_BUILD_JOBS        images built at once (default 2)
#   DTJOB_BUILDAH_DRIVER    containers/storage driver (default overlay; vfs where overlay cannot mount)
#   DTJOB_LAYER_COMPRESSION layer compression of the exported images: gzip (default) or zstd (containerd
#                           1.5+; about as fast, 10% smaller)
#   DTJOB_PIP_CA            CA bundle pip trusts inside the builds, passed as the build secret pip-ca.pem
#                           (default: $PIP_CERT, else /etc/ssl/certs/ca-certificates.crt; so a proxy CA
#                           this machine trusts is trusted by the build too, and is never in an image)
#   DTJOB_PIP_CONF          pip.conf passed as the build secret pip.conf (default: one that names that CA)
#   DTJOB_DEBIAN_MIRROR ... passed on to hack/base-image.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
store=$cache/buildah
registry=${DTJOB_IMAGE_REGISTRY:-localhost/dtjob}
tag=${DTJOB_IMAGE_TAG:-dev}
jobs=${DTJOB_BUILD_JOBS:-2}
compression=${DTJOB_LAYER_COMPRESSION:-gzip}
all_images=(operator stager mpi horovod-pytorch horovod-tensorflow)
ignorefile=$repo/images/build.dockerignore
# Bump when a change here alters what gets built from the same inputs.
recipe=1
key_label=io.dtjob.content-key

log() { echo "[build-images] $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"

ref_of() { echo "$registry/$1:$tag"; }
build_cache_ref_of() { echo "localhost/dtjob-build-cache/$1:$tag"; } # never exported
layout_of() { # REF -> its OCI layout directory (the name flattened); DIR.digest and DIR.key lie beside it
  local flat=${1//\//_}
  echo "$store/images/${flat//:/_}.oci"
}
resolve() { # NAME or REF -> REF
  if [[ $1 == */* ]]; then echo "$1"; else check_name "$1" && ref_of "$1"; fi
}
check_name() {
  local n
  for n in "${all_images[@]}"; do [[ $1 == "$n" ]] && return 0; done
  die "unknown image '$1' (choose from: ${all_images[*]})"
}

# ------------------------------------------------------------------------------------------------- import ---
layer_digests() { # LAYOUT: the layer digests of the image manifests it holds
  python3 - "$1" <<'PY'
import json
import sys
from pathlib import Path

layout = Path(sys.argv[1])


def blob(digest: str) -> dict:
    return json.loads((layout / "blobs" / digest.replace(":", "/", 1)).read_text())


for manifest in json.loads((layout / "index.json").read_text())["manifests"]:
    for layer in blob(manifest["digest"]).get("layers", []):
        print(layer["digest"])
PY
}

import_images() {
  local address="" namespace=k8s.io snapshotter=overlayfs
  while [[ $# -gt 0 ]]; do
    case $1 in
      --address) address=${2:?--address needs a socket path}; shift 2 ;;
      --namespace) namespace=${2:?}; shift 2 ;;
      --snapshotter) snapshotter=${2:?}; shift 2 ;;
      --) shift; break ;;
      -*) die "import: unknown flag $1" ;;
      *) break ;;
    esac
  done
  [[ -n $address ]] || die "import: --address SOCK is required (the containerd's grpc socket)"
  [[ -S $address ]] || die "import: no containerd socket at $address"
  [[ $# -gt 0 ]] || set -- "${all_images[@]}"
  command -v ctr >/dev/null || die "ctr is missing (apt-get install containerd)"
  # A build replaces the exported images: wait for a running one (imports side by side are fine).
  mkdir -p "$store"
  exec 9>"$store/build.lock"
  flock -s -n 9 || { log "a build is running; waiting for it"; flock -s 9; }
  # And one import into a containerd at a time: two imports of one image would each remove the old build's
  # names and the layers' compressed copies (below) while the other one still unpacks them.
  import_lock "$address"
  local ctr=(ctr --address "$address" -n "$namespace") arg ref layout want have started names orphans
  # Heal a store that older imports left behind: CRI ID names (sha256:...) of builds no tag points at.
  mapfile -t orphans < <("${ctr[@]}" images ls | awk 'NR == 1 { next } $1 ~ /^sha256:/ { ids[$1] = $3; next }
    { named[$3] = 1 } END { for (id in ids) if (!(ids[id] in named)) print id }')
  if [[ ${#orphans[@]} -gt 0 ]]; then
    "${ctr[@]}" images rm --sync "${orphans[@]}" >/dev/null
    log "dropped ${#orphans[@]} image IDs no build of ours points at any more ($address)"
  fi
  for arg in "$@"; do
    ref=$(resolve "$arg")
    layout=$(layout_of "$ref")
    [[ -d $layout && -f $layout.digest ]] || die "$ref is not built: run hack/build-images.sh first"
    want=$(<"$layout.digest")
    have=$("${ctr[@]}" images ls "name==$ref" | awk 'NR > 1 { print $3 }')
    if [[ $have == "$want" ]]; then
      log "$ref: already in containerd ($want)"
      continue
    fi
    if [[ -n $have ]]; then
      # Another build of the same name: remove it first and wait for containerd's garbage collection, or
      # every rebuild would leave gigabytes of layers and snapshots behind on each node. The kubelet's
      # runtime (CRI) names every image it has seen a second time, by its ID (sha256:...); that name holds
      # the old build alive too, so every name of the old build goes.
      mapfile -t names < <("${ctr[@]}" images ls | awk -v digest="$have" 'NR > 1 && $3 == digest { print $1 }')
      "${ctr[@]}" images rm --sync "${names[@]}" >/dev/null
    fi
    log "$ref: importing $(du -sh "$layout" | cut -f1) into $address ($snapshotter)"
    started=$SECONDS
    # The layout as a tar stream: an OCI archive that never needs the disk space of one.
    tar -C "$layout" -cf - . | "${ctr[@]}" images import --snapshotter "$snapshotter" - >/dev/null
    have=$("${ctr[@]}" images ls "name==$ref" | awk 'NR > 1 { print $3 }')
    [[ $have == "$want" ]] || die "$ref: containerd holds '$have' after the import, expected $want"
    # The layers are unpacked into the node's snapshots, which its containers run from: their compressed
    # copies in the content store would only hold the disk twice (what CRI's discard_unpacked_layers does
    # for pulls). The manifest and config stay, so the image keeps its name, digest and ID.
    mapfile -t layers < <(layer_digests "$layout")
    if [[ ${#layers[@]} -gt 0 ]] && ! "${ctr[@]}" content rm "${layers[@]}" >/dev/null; then
      log "$ref: warning: could not drop the imported layers' compressed copies ($address)"
    fi
    log "$ref: imported in $((SECONDS - started))s"
  done
}

case ${1:-} in
  import) shift; import_images "$@"; exit 0 ;;
  layout)
    shift
    [[ $# -eq 1 ]] || die "usage: $0 layout NAME|REF"
    ref=$(resolve "$1")
    [[ -f $(layout_of "$ref").digest ]] || die "$ref is not built: run hack/build-images.sh first"
    layout_of "$ref"
    exit 0
    ;;
  refs)
    shift
    [[ $# -gt 0 ]] || set -- "${all_images[@]}"
    for n in "$@"; do check_name "$n"; ref_of "$n"; done
    exit 0
    ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

# ------------------------------------------------------------------------------------------------- build ----
[[ $(id -u) -eq 0 ]] || die "run as root (buildah's chroot isolation needs it)"
command -v buildah >/dev/null || die "buildah is missing (apt-get install buildah)"
mkdir -p "$store"/{tmp,logs,images,secrets}
# Buildah keeps its temporary files and the Dockerfiles' RUN cache mounts under $TMPDIR: the cache, not /var.
export TMPDIR=$store/tmp
buildah=(buildah --root "$store/storage" --runroot "$store/run" --storage-driver "${DTJOB_BUILDAH_DRIVER:-overlay}")

# One build at a time per cache: a second caller waits here, then finds the images built. A prune waits too,
# as it removes what a running build uses.
exec 9>"$store/build.lock"
flock -n 9 || { log "another build holds $store/build.lock; waiting"; flock 9; }

if [[ ${1:-} == prune ]]; then
  "${buildah[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/dtjob-build-cache/' |
    xargs -r "${buildah[@]}" rmi >/dev/null || true
  "${buildah[@]}" rmi --prune >/dev/null
  log "dropped the cached intermediate layers; $(du -sh "$store/storage" | cut -f1) left in $store/storage"
  exit 0
fi

[[ $# -gt 0 ]] || set -- "${all_images[@]}"
for n in "$@"; do check_name "$n"; done
# The order builds start in: the stager reuses the operator's cached build stage when it starts after it, and
# the two heavy images overlap the light ones.
order=()
for n in operator horovod-pytorch stager mpi horovod-tensorflow; do
  for m in "$@"; do [[ $m == "$n" ]] && order+=("$n") && break; done
done

# containers/image keeps a small blob-info cache for root in /var/lib/containers/cache, with no switch to
# move it: when this run makes it, this run removes it again.
[[ -e /var/lib/containers ]] && made_var_lib_containers=0 || made_var_lib_containers=1
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  # Nothing left mounted or running: working containers of interrupted builds go, with their mounts.
  "${buildah[@]}" rm --all >/dev/null 2>&1 || true
  { findmnt -rn -o TARGET | grep -F "$store/" | sort -r | while read -r m; do umount -l "$m" || true; done; } || true
  if [[ $made_var_lib_containers == 1 ]]; then rm -rf /var/lib/containers; fi
}
trap cleanup EXIT

# The bases (no-op when current) and their IDs, part of every key.
bases=$(DTJOB_CACHE=$cache "$here/base-image.sh")
base_image=$(awk 'NR == 1 { print $1 }' <<<"$bases")
base_id=$(awk 'NR == 1 { print $2 }' <<<"$bases")
python_image=$(awk 'NR == 2 { print $1 }' <<<"$bases")
python_id=$(awk 'NR == 2 { print $2 }' <<<"$bases")

build_args_of() {
  local bases="BUILD_IMAGE=$base_image RUNTIME_IMAGE=$base_image"
  case $1 in
    # The GPU image as it is pushed, the local base standing in for debian:bookworm-slim: it runs on CPU as
    # well, so every job of the tests runs the image a GPU pool gets.
    horovod-pytorch) echo "$bases DTJOB_DEVICE=gpu FRAMEWORK=torch" ;;
    # The CPU form: TensorFlow's GPU build needs a CUDA 12 devel image (images/horovod/Dockerfile).
    horovod-tensorflow) echo "$bases DTJOB_DEVICE=cpu NVIDIA_VISIBLE_DEVICES=void FRAMEWORK=tensorflow" ;;
    mpi) echo "BASE_IMAGE=$base_image PYTHON_IMAGE=$python_image" ;;
    *) echo "PYTHON_IMAGE=$python_image" ;;
  esac
}

dockerfile_of() { # NAME -> its Dockerfile; the two Horovod images build from one, FRAMEWORK telling them apart
  case $1 in
    horovod-*) echo images/horovod/Dockerfile ;;
    *) echo "images/$1/Dockerfile" ;;
  esac
}

# The COPY sources of a Dockerfile (not COPY --from), globs expanded from the repository root.
copy_sources() {
  local line word words sources m
  while read -r line; do
    read -ra words <<<"$line"
    sources=()
    for word in "${words[@]:1}"; do [[ $word == --* ]] || sources+=("$word"); done
    unset 'sources[-1]'
    for word in "${sources[@]}"; do
      m=$(cd "$repo" && compgen -G "$word" || true)
      [[ -n $m ]] || die "$1: COPY source $word matches nothing"
      echo "$m"
    done
  done < <(grep -E '^COPY[[:space:]]' "$repo/$1" | grep -v -- '--from=')
}

content_key() { # NAME
  local dockerfile
  dockerfile=$(dockerfile_of "$1")
  local -a files
  mapfile -t files < <(
    cd "$repo" && copy_sources "$dockerfile" | LC_ALL=C sort -u | while read -r src; do
      find "$src" \( -name __pycache__ -o -name '*.egg-info' -o -name .mypy_cache -o -name .pytest_cache \
        -o -name .ruff_cache \) -prune -o \( -type f -o -type l \) ! -name '*.pyc' -print
    done | LC_ALL=C sort -u
  )
  {
    echo "recipe $recipe $(buildah --version)"
    echo "args $(build_args_of "$1") bases $base_id $python_id compression $compression"
    sha256sum "$repo/$dockerfile" "$ignorefile" | cut -d' ' -f1
    # Contents and modes (install scripts must stay executable).
    (cd "$repo" && sha256sum "${files[@]}" && stat -c '%a %n' "${files[@]}")
  } | sha256sum | cut -c1-16
}

# Build secrets for pip: a CA bundle and a pip.conf naming it (images/*/Dockerfile mount them optionally).
secret_args=()
pip_ca=${DTJOB_PIP_CA:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
if [[ -n ${DTJOB_PIP_CONF:-} ]]; then
  secret_args+=(--secret "id=pip.conf,src=$DTJOB_PIP_CONF")
elif [[ -f $pip_ca ]]; then
  printf '[global]\ncert = /run/secrets/pip-ca.pem\n' >"$store/secrets/pip.conf"
  secret_args+=(--secret "id=pip.conf,src=$store/secrets/pip.conf")
fi
[[ -f $pip_ca ]] && secret_args+=(--secret "id=pip-ca.pem,src=$pip_ca")

# The Dockerfiles' wheel cache mount (target /root/.cache/dtjob/wheels) is the host's wheelhouse: buildah
# keeps a cache mount without id in $TMPDIR/buildah-cache/<target>, which points at it.
mkdir -p "$cache/wheels" "$TMPDIR/buildah-cache/root/.cache/dtjob"
wheel_link=$TMPDIR/buildah-cache/root/.cache/dtjob/wheels
if [[ ! -L $wheel_link || $(readlink "$wheel_link") != "$cache/wheels" ]]; then
  rm -rf "$wheel_link"
  ln -s "$cache/wheels" "$wheel_link"
fi

case $compression in
  gzip | zstd) push_compression=(--compression-format "$compression") ;;
  *) die "DTJOB_LAYER_COMPRESSION must be gzip or zstd, got '$compression'" ;;
esac

build_one() { # NAME KEY: build, label, export; all output to its log
  local name=$1 key=$2 ref layout arg
  ref=$(ref_of "$name")
  layout=$(layout_of "$ref")
  local -a bud=("${buildah[@]}" bud --isolation chroot --pull=never --layers --force-rm
    --ignorefile "$ignorefile" -f "$(dockerfile_of "$name")" "${secret_args[@]}")
  for arg in $(build_args_of "$name"); do bud+=(--build-arg "$arg"); done
  set -x
  # The build stage under a name of its own first: tagged, its cached layers survive the prune after the
  # build, so a change to the training code reuses the frameworks' layer instead of installing it again.
  "${bud[@]}" --target build -t "$(build_cache_ref_of "$name")" "$repo"
  "${bud[@]}" --jobs 2 --label "$key_label=$key" -t "$ref" "$repo"
  # Straight into a layout directory (an oci-archive would be written twice: a temporary layout, then the
  # tar); the previous export goes first, so the disk never holds two.
  rm -rf "$layout" "$layout.key" "$layout.digest" "$layout.digest.tmp"
  "${buildah[@]}" push --quiet "${push_compression[@]}" --digestfile "$layout.digest.tmp" "$ref" "oci:$layout:$ref"
  { set +x; } 2>/dev/null
  mv "$layout.digest.tmp" "$layout.digest"
  echo "$key" >"$layout.key"
}

# Disk a build needs at its peak, in GB (measured: 21 GB went for horovod-pytorch, whose 5.2 GB environment is
# held three times while the final stage commits (the build stage's layer, the container, the layer committed
# from it), besides PyPI's CUDA toolkit while Horovod compiles).
need_gb_of() {
  case $1 in
    horovod-pytorch) echo 22 ;;
    horovod-tensorflow) echo 7 ;;
    *) echo 1 ;;
  esac
}

# Which images need a build.
todo=()
declare -A keys=() status=() took=()
for n in "${order[@]}"; do
  copy_sources "$(dockerfile_of "$n")" >/dev/null # dies naming a COPY source that matches nothing
  keys[$n]=$(content_key "$n")
  layout=$(layout_of "$(ref_of "$n")")
  if [[ -d $layout && -f $layout.digest && $(cat "$layout.key" 2>/dev/null) == "${keys[$n]}" ]]; then
    status[$n]=cached
  else
    todo+=("$n")
  fi
done

# Up to $jobs builds at once, with a heartbeat naming each one's current step.
declare -A pid_of=() started_at=() last_step=() reclaimed=()
running() { local n; for n in "${!pid_of[@]}"; do echo "$n"; done; }
reap() { # NAME: collect a finished build
  local n=$1 rc=0
  wait "${pid_of[$n]}" || rc=$?
  unset "pid_of[$n]"
  took[$n]=$((SECONDS - started_at[$n]))
  if [[ $rc -eq 0 ]]; then
    status[$n]=built
    log "$n: built and exported in ${took[$n]}s"
  else
    status[$n]=failed
    tail -n 40 "$store/logs/$n.log" >&2
    log "$n: FAILED after ${took[$n]}s (last lines above; full log $store/logs/$n.log)"
  fi
}
queue=("${todo[@]}")
last_beat=$SECONDS
while [[ ${#queue[@]} -gt 0 || ${#pid_of[@]} -gt 0 ]]; do
  while [[ ${#queue[@]} -gt 0 && ${#pid_of[@]} -lt $jobs ]]; do
    n=${queue[0]}
    # Disk first: a build that runs out of it fails late, and takes the machine's other users with it. The
    # builds already running are counted at their full need; with too little, wait for them to finish.
    need=$(need_gb_of "$n")
    for m in $(running); do need=$((need + $(need_gb_of "$m"))); done
    free=$(df -BG --output=avail "$store" | tail -n 1 | tr -dc 0-9)
    if ((free < need)); then
      if [[ ${#pid_of[@]} -gt 0 ]]; then break; fi
      if [[ -z ${reclaimed[$n]:-} ]]; then
        # Nothing else runs, so pruning is safe: the previous build of this image goes first (its layers are
        # stale when the build stage changes; when only code changed, the rebuild is slower but fits).
        reclaimed[$n]=1
        log "$n: ${free} GB free, about ${need} GB needed: dropping its previous build and unused layers first"
        "${buildah[@]}" rmi "$(ref_of "$n")" >/dev/null 2>&1 || true
        "${buildah[@]}" rmi "$(build_cache_ref_of "$n")" >/dev/null 2>&1 || true
        "${buildah[@]}" rmi --prune >/dev/null 2>&1 || true
        continue
      fi
      queue=("${queue[@]:1}")
      status[$n]=failed
      took[$n]=0
      log "$n: needs about ${need} GB free in $store to build, has ${free} GB; not started"
      continue
    fi
    queue=("${queue[@]:1}")
    log "$n: building $(ref_of "$n") (key ${keys[$n]}; log $store/logs/$n.log)"
    (cd "$repo" && build_one "$n" "${keys[$n]}") >"$store/logs/$n.log" 2>&1 &
    pid_of[$n]=$!
    pids+=($!)
    started_at[$n]=$SECONDS
  done
  sleep 2
  for n in $(running); do
    if ! kill -0 "${pid_of[$n]}" 2>/dev/null; then reap "$n"; fi
  done
  if ((SECONDS - last_beat >= 30)); then
    last_beat=$SECONDS
    for n in $(running); do
      step=$(grep -E '^(\[[0-9]/[0-9]\] )?STEP|buildah .* push ' "$store/logs/$n.log" | tail -n 1 || true)
      if [[ $step == *" push "* ]]; then step="exporting the OCI layout"; fi
      step=${step:0:110}
      if [[ -n $step && $step != "${last_step[$n]:-}" ]]; then
        log "$n: $((SECONDS - started_at[$n]))s, $step"
        last_step[$n]=$step
      fi
    done
  fi
done

# Storage holds the current images and their build stages; layers of earlier builds go.
if [[ ${#todo[@]} -gt 0 ]]; then
  "${buildah[@]}" rmi --prune >/dev/null 2>&1 || log "warning: could not prune unused layers"
  log "buildah storage: $(du -shx "$store/storage" | cut -f1), exported images: $(du -sh "$store/images" | cut -f1)"
fi

failed=0
for n in "$@"; do
  ref=$(ref_of "$n")
  layout=$(layout_of "$ref")
  if [[ ${status[$n]} == failed ]]; then failed=1; continue; fi
  size=$("${buildah[@]}" images --format '{{.Size}}' "$ref" 2>/dev/null | head -n 1 || true)
  log "$(printf '%-20s %-7s %5ss  compressed %6s  unpacked %s' "$n" "${status[$n]}" "${took[$n]:-0}" \
    "$(du -sh "$layout" | cut -f1)" "${size:-?}")"
done
[[ $failed -eq 0 ]] || die "some images failed to build"
for n in "$@"; do ref_of "$n"; done
