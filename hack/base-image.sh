#!/usr/bin/env bash
# Local base images for building images/ without a registry (no Docker, no pulls):
#   localhost/dtjob/base:bookworm          Debian bookworm from `debootstrap --variant=minbase`, slimmed the way
#                                          debian:bookworm-slim is (no docs, man pages or locales; apt keeps no
#                                          caches). Stands in for debian:bookworm-slim, the Horovod images'
#                                          base.
#   localhost/dtjob/python:3.11-bookworm   the base plus Debian's python3.11 with venv and a `python` command:
#                                          what the operator and stager Dockerfiles need from python:3.11-slim.
#
#   hack/base-image.sh           make both if missing or out of date, print "NAME ID" per image
#
# Each image carries a label with a hash of its inputs (this script, the mirror, the suite, and for the python
# image the base's ID); a second run finds the labels match and does nothing (about a second).
#
# Environment it honours:
#   DTJOB_CACHE             cache root (default ~/.cache/dtjob); buildah's storage is $DTJOB_CACHE/buildah
#   DTJOB_BUILDAH_DRIVER    containers/storage driver (default overlay; vfs where overlay cannot mount)
#   DTJOB_DEBIAN_MIRROR     Debian mirror (default: the one this machine's apt uses, else deb.debian.org)
#   DTJOB_DEBIAN_SECURITY   security mirror (default: likewise)
#   DTJOB_BASE_IMAGE, DTJOB_PYTHON_IMAGE   the two image names (defaults above)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
store=$cache/buildah
suite=bookworm
base_image=${DTJOB_BASE_IMAGE:-localhost/dtjob/base:$suite}
python_image=${DTJOB_PYTHON_IMAGE:-localhost/dtjob/python:3.11-$suite}
key_label=io.dtjob.base-key

log() { echo "[base-image] $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (debootstrap and buildah's chroot isolation need it)"
for tool in buildah debootstrap; do command -v "$tool" >/dev/null || die "$tool is missing (apt-get install $tool)"; done

# Buildah keeps its images, its temporary files and RUN cache mounts under the cache, not in /var.
mkdir -p "$store/tmp"
export TMPDIR=$store/tmp
buildah=(buildah --root "$store/storage" --runroot "$store/run" --storage-driver "${DTJOB_BUILDAH_DRIVER:-overlay}")

# The mirror apt uses here (one-line or deb822 sources), so a machine behind its own mirror keeps using it.
apt_uri() { # $1: regex the URI's path must match
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk -v re="$1" '
      /^[[:space:]]*#/ { next }
      $1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { print $i; break } }
      $1 == "URIs:" { for (i = 2; i <= NF; i++) print $i }' |
    grep -E "$1" | head -n 1 || true
}
mirror=${DTJOB_DEBIAN_MIRROR:-$(apt_uri '/debian/?$')}
mirror=${mirror:-http://deb.debian.org/debian}
mirror=${mirror%/}
security=${DTJOB_DEBIAN_SECURITY:-$(apt_uri '/debian-security/?$')}
security=${security:-http://deb.debian.org/debian-security}
security=${security%/}

image_key() { "${buildah[@]}" inspect --type image --format "{{index .OCIv1.Config.Labels \"$key_label\"}}" "$1" 2>/dev/null || true; }
image_id() { "${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$1"; }

# containers/image keeps a small blob-info cache for root in /var/lib/containers/cache, with no switch to
# move it: when this run makes it, this run removes it again.
[[ -e /var/lib/containers ]] && made_var_lib_containers=0 || made_var_lib_containers=1
work=""
ctr=""
cleanup() {
  if [[ $made_var_lib_containers == 1 ]]; then rm -rf /var/lib/containers; fi
  [[ -n $ctr ]] && "${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true
  if [[ -n $work ]]; then
    # debootstrap mounts /proc and /sys in the target; never leave them behind.
    { findmnt -rn -o TARGET | grep -F "$work/" | sort -r | while read -r m; do umount -l "$m" || true; done; } || true
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# --- the Debian base ---------------------------------------------------------------------------------------
base_key=$(cat "$0" <(echo "$suite|$mirror|$security") | sha256sum | cut -c1-16)
if [[ $(image_key "$base_image") == "$base_key" ]]; then
  log "$base_image is up to date"
else
  work=$(mktemp -d "$store/tmp/rootfs.XXXXXX")
  rootfs=$work/rootfs
  log "debootstrap --variant=minbase $suite from $mirror (about a minute)"
  started=$SECONDS
  debootstrap --variant=minbase --arch=amd64 "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    die "debootstrap failed (last lines above)"
  }
  log "debootstrap done in $((SECONDS - started))s; slimming"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -f "$rootfs/etc/apt/sources.list"
  # What debian:bookworm-slim does (debuerreotype): apt keeps no caches, fetches no translations, keeps
  # its lists compressed; dpkg skips docs, man pages and locales of every package installed later.
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  # The same excludes applied to what debootstrap already unpacked.
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda}/*
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  # Nothing of this machine or of the bootstrap run in the image: buildah and the runtime provide
  # resolv.conf and hostname.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/debootstrap "$rootfs"/etc/machine-id \
    "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname "$rootfs"/etc/hosts
  mkdir -p "$rootfs/var/lib/apt/lists/partial"
  # A runtime that manages /etc/hosts (kubelet, buildah) replaces this; one that does not (`ctr run`) still
  # resolves localhost.
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$work/rootfs.tar" .
  rm -rf "$rootfs"

  ctr=$("${buildah[@]}" from scratch)
  "${buildah[@]}" add "$ctr" "$work/rootfs.tar" / >/dev/null
  "${buildah[@]}" config --os linux --arch amd64 --cmd /bin/bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --label "$key_label=$base_key" "$ctr"
  "${buildah[@]}" commit --quiet --rm "$ctr" "$base_image" >/dev/null
  ctr=""
  rm -rf "$work"
  work=""
  log "$base_image committed in $((SECONDS - started))s"
fi

# --- python:3.11-slim's role ---------------------------------------------------------------------------------
base_id=$(image_id "$base_image")
python_key=$(cat "$0" <(echo "$base_id") | sha256sum | cut -c1-16)
if [[ $(image_key "$python_image") == "$python_key" ]]; then
  log "$python_image is up to date"
else
  log "making $python_image (python3.11, venv, ca-certificates)"
  started=$SECONDS
  ctr=$("${buildah[@]}" from --pull=never --quiet "$base_image")
  "${buildah[@]}" run --isolation chroot "$ctr" -- sh -euc '
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3.11 python3.11-venv python-is-python3 \
      ca-certificates netbase >/dev/null
    rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/cache/debconf/*-old
    python -m venv --help >/dev/null'
  "${buildah[@]}" config --label "$key_label=$python_key" --cmd python "$ctr"
  "${buildah[@]}" commit --quiet --rm "$ctr" "$python_image" >/dev/null
  ctr=""
  log "$python_image committed in $((SECONDS - started))s"
fi

echo "$base_image $(image_id "$base_image")"
echo "$python_image $(image_id "$python_image")"
