#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy and caches the binaries per version:
#   $DTJOB_CACHE/bin/<component>-<version>/<binary>
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet and kube-proxy come from k8s.io/kubernetes, whose go.mod
# replaces its staging modules with ./staging paths; a small local module re-points each of them at its v0.Y.Z tag.
# A second run finds every binary and builds nothing. Each entry (a component at a version) is built under its
# own lock (hack/cache-lock.sh), one entry after the other: a second run building the same entry at once waits
# for the first and finds its binaries, and a binary is written under a name of this run's own
# (<binary>.tmp.<pid>) and renamed into place whole.
# Not built by default (targets named on the command line, see the Makefile's gang-schedulers): the gang
# schedulers the integration tests run beside the control plane, scheduler-plugins' kube-scheduler with its
# PodGroup CRD, and Volcano's PodGroup CRD (no Volcano scheduler: its PodGroup is checked against the CRD), and
# prometheus-operator's ServiceMonitor CRD (the chart's ServiceMonitor is checked against it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Go's caches in a directory of this run's own, removed at the end (hack/go-scratch.sh).
[[ -n ${DTJOB_GO_SCRATCH:-} ]] || exec "$here/go-scratch.sh" "$0" "$@"
# shellcheck source=versions.env
source "$here/versions.env"
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

log() { printf '[build-control-plane] %s\n' "$*" >&2; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"

# A name of this run's own beside FINAL (then `mv -T` onto it); whatever an interrupted build of this run
# leaves under such names goes when it ends ($$ is the script's, in the subshells too).
tmp_name() { echo "$1.tmp.$$"; }
trap 'rm -rf "$cache"/bin/*/*.tmp.$$ "$cache"/bin/*/crds/*.tmp.$$ "$cache"/crds/*/*.tmp.$$' EXIT

build_kubernetes() {
  local out=$cache/bin/kubernetes-$K8S_VERSION
  # kubelet and kube-proxy serve the real node (hack/realnode.sh); the rest the control plane.
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
  local missing=()
  all_built() {
    missing=()
    for b in "${want[@]}"; do [[ -x $out/$b ]] || missing+=("$b"); done
    [[ ${#missing[@]} -eq 0 ]]
  }
  cache_hit "kubernetes-$K8S_VERSION" "kubernetes $K8S_VERSION" all_built &&
    { log "kubernetes $K8S_VERSION cached"; return; }
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging_tag=v0.${K8S_VERSION#v1.}
  local work=$cache/build/kubernetes-$K8S_VERSION
  mkdir -p "$work" "$out"
  cd "$work"
  local upstream_mod
  upstream_mod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  {
    echo "module dtjob.local/kubernetes-build"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # One replace per staging module, taken from this release's own go.mod (the list changes between releases).
    sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*#\1#p' "$upstream_mod" |
      while read -r m; do echo "replace $m => $m $staging_tag"; done
  } > go.mod
  log "resolving k8s.io/kubernetes $K8S_VERSION ($(grep -c '^replace' go.mod) staging modules at $staging_tag)"
  local pkgs=()
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b@$K8S_VERSION"); done
  go get "${pkgs[@]}"
  local vpkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version tmp
  local ld="-s -w"
  for p in $vpkg $cpkg; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${missing[@]}"; do
    log "building $b $K8S_VERSION"
    tmp=$(tmp_name "$out/$b")
    go build -trimpath -ldflags "$ld" -o "$tmp" "k8s.io/kubernetes/cmd/$b"
    mv -T "$tmp" "$out/$b"
  done
}

build_etcd() {
  local out=$cache/bin/etcd-$ETCD_VERSION
  cache_hit "etcd-$ETCD_VERSION" "etcd $ETCD_VERSION" test -x "$out/etcd" &&
    { log "etcd $ETCD_VERSION cached"; return; }
  local work=$cache/build/etcd-$ETCD_VERSION
  mkdir -p "$work" "$out"
  cd "$work"
  printf 'module dtjob.local/etcd-build\n\ngo 1.26.0\n' > go.mod
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  local tmp
  tmp=$(tmp_name "$out/etcd")
  go build -trimpath -ldflags "-s -w" -o "$tmp" go.etcd.io/etcd/server/v3
  mv -T "$tmp" "$out/etcd"
}

go_install() { # name version package...
  local name=$1 version=$2; shift 2
  local out=$cache/bin/$name-$version
  all_installed() {
    local p
    for p in "$@"; do [[ -x $out/$(basename "$p") ]] || return 1; done
  }
  cache_hit "$name-$version" "$name $version" all_installed "$@" && { log "$name $version cached"; return; }
  mkdir -p "$out"
  local p bin
  for p in "$@"; do
    bin=$(basename "$p")
    log "building $bin $version"
    go_install_into "$out/$bin" -ldflags "-s -w" "$p@$version"
  done
}

go_install_into() { # FINAL ARGS...: `go install ARGS` into a directory of this run's own, renamed onto FINAL whole
  local final=$1 dir
  shift
  dir=$(tmp_name "$final")
  mkdir "$dir"
  GOBIN=$dir go install -trimpath "$@"
  mv -T "$dir/$(basename "$final")" "$final"
  rm -rf "$dir"
}

build_kwok() {
  go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
}

build_coredns() {
  # Cluster DNS for the real node: serves cluster.local from the API server (its kubernetes plugin).
  go_install coredns "$COREDNS_VERSION" github.com/coredns/coredns
}

build_helm() {
  # helm prints its version from ldflags; without them `helm version` says v3.x-unreleased.
  local out=$cache/bin/helm-$HELM_VERSION
  cache_hit "helm-$HELM_VERSION" "helm $HELM_VERSION" test -x "$out/helm" &&
    { log "helm $HELM_VERSION cached"; return; }
  mkdir -p "$out"
  log "building helm $HELM_VERSION"
  # The Kubernetes version `helm template` and `helm lint` assume is that of helm's own client-go.
  local helm_mod client_go
  helm_mod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  client_go=$(sed -n 's#^\s*k8s\.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_mod")
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$client_go"
  done
  go_install_into "$out/helm" -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_scheduler_plugins() {
  # scheduler-plugins' go.mod pins its k8s.io staging modules with replace directives, which `go install
  # module@version` refuses: the released module is copied out of the module cache and built in place. Its
  # replace directives are re-pointed from its own Kubernetes patch release to the test bed's (K8S_VERSION, the
  # same minor), so the scheduler embeds the very kube-scheduler the control plane runs and shares its modules.
  # Its PodGroup CRD comes from the same module (config/crd/bases).
  local v=$SCHEDULER_PLUGINS_VERSION
  local out=$cache/bin/scheduler-plugins-$v
  local crd=scheduling.x-k8s.io_podgroups.yaml
  built() { [[ -x $out/kube-scheduler && -f $out/crds/$crd ]]; }
  if cache_hit "scheduler-plugins-$v" "scheduler-plugins $v" built; then
    log "scheduler-plugins $v cached"; return
  fi
  local src
  src=$(go mod download -json "sigs.k8s.io/scheduler-plugins@$v" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  local work=$cache/build/scheduler-plugins-$v
  rm -rf "$work"
  mkdir -p "$work" "$out/crds"
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  cd "$work"
  local own_k8s
  own_k8s=$(sed -n 's#^\s*k8s\.io/kubernetes => k8s\.io/kubernetes \(v1\.[0-9.]*\)$#\1#p' go.mod)
  [[ ${own_k8s%.*} == "${K8S_VERSION%.*}" ]] ||
    { log "scheduler-plugins $v is built for kubernetes $own_k8s, not ${K8S_VERSION%.*}.x"; exit 1; }
  sed -i -e "s#^\(\s*\(replace \)\?k8s\.io/[a-z0-9-]*\( => k8s\.io/[a-z0-9-]*\)\?\) v0\.${own_k8s#v1.}\b#\1 v0.${K8S_VERSION#v1.}#" \
    -e "s#k8s\.io/kubernetes $own_k8s#k8s.io/kubernetes $K8S_VERSION#g" go.mod
  log "building scheduler-plugins kube-scheduler $v (kubernetes $K8S_VERSION)"
  # The Kubernetes version it embeds, as for the control plane: its compatibility-version check reads it.
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  local tmp
  tmp=$(tmp_name "$out/crds/$crd")
  cp "config/crd/bases/$crd" "$tmp"
  mv -T "$tmp" "$out/crds/$crd"
  tmp=$(tmp_name "$out/kube-scheduler")
  go build -trimpath -ldflags "$ld" -o "$tmp" ./cmd/scheduler
  mv -T "$tmp" "$out/kube-scheduler"
  cd / && rm -rf "$work"
}

build_volcano_crds() {
  # Volcano's CRDs live in its main module (volcano.sh/apis carries the Go types only); nothing is built.
  local out=$cache/crds/volcano-$VOLCANO_VERSION crd=scheduling.volcano.sh_podgroups.yaml
  cache_hit "volcano-crds-$VOLCANO_VERSION" "volcano $VOLCANO_VERSION CRDs" test -f "$out/$crd" &&
    { log "volcano $VOLCANO_VERSION CRDs cached"; return; }
  local src tmp
  src=$(go mod download -json "volcano.sh/volcano@$VOLCANO_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  mkdir -p "$out"
  tmp=$(tmp_name "$out/$crd")
  cp "$src/config/crd/volcano/bases/$crd" "$tmp"
  chmod u+w "$tmp"
  mv -T "$tmp" "$out/$crd"
  log "volcano $VOLCANO_VERSION CRDs copied"
}

build_volcano_scheduler() {
  # Volcano's scheduler (vc-scheduler), for the tests where Volcano itself places the world, and every CRD of
  # Volcano's module beside it (PodGroup, Queue and the kinds its scheduler watches). Like scheduler-plugins,
  # its go.mod pins the k8s.io staging modules with replace directives, so the module is built in place; it
  # keeps its own Kubernetes libraries (v1.30 for Volcano v1.10: its scheduler plugins are written against
  # that kube-scheduler). The scheduler needs no controller or webhook for a PodGroup made by the operator.
  local v=$VOLCANO_VERSION
  local out=$cache/bin/volcano-$v
  built() { [[ -x $out/vc-scheduler && -f $out/crds/scheduling.volcano.sh_queues.yaml ]]; }
  if cache_hit "volcano-scheduler-$v" "volcano scheduler $v" built; then
    log "volcano scheduler $v cached"; return
  fi
  local src
  src=$(go mod download -json "volcano.sh/volcano@$v" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  local work=$cache/build/volcano-$v.$$
  rm -rf "$work"
  mkdir -p "$work" "$out/crds"
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  cd "$work"
  log "building volcano scheduler $v"
  local tmp
  for crd in config/crd/volcano/bases/*.yaml; do
    tmp=$(tmp_name "$out/crds/$(basename "$crd")")
    cp "$crd" "$tmp"
    mv -T "$tmp" "$out/crds/$(basename "$crd")"
  done
  tmp=$(tmp_name "$out/vc-scheduler")
  go build -trimpath -ldflags "-s -w" -o "$tmp" ./cmd/scheduler
  mv -T "$tmp" "$out/vc-scheduler"
  cd / && rm -rf "$work"
}

build_servicemonitor_crd() {
  # prometheus-operator's CRDs live in its main module, as Volcano's do; nothing is built.
  local v=$PROMETHEUS_OPERATOR_VERSION
  local out=$cache/crds/prometheus-operator-$v crd=monitoring.coreos.com_servicemonitors.yaml
  cache_hit "prometheus-operator-crds-$v" "prometheus-operator $v CRDs" test -f "$out/$crd" &&
    { log "prometheus-operator $v CRDs cached"; return; }
  local src tmp
  src=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$v" |
    sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  mkdir -p "$out"
  tmp=$(tmp_name "$out/$crd")
  cp "$src/example/prometheus-operator-crd/$crd" "$tmp"
  chmod u+w "$tmp"
  mv -T "$tmp" "$out/$crd"
  log "prometheus-operator $v CRDs copied"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(kubernetes etcd kwok helm coredns)
# A subshell per entry: its lock is released when the entry is built, before the next one's is taken.
for t in "${targets[@]}"; do ("build_$t"); done
