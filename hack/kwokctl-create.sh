# Sourced by hack/cluster.sh and hack/realnode.sh: one way to start a control plane with kwokctl's binary
# runtime from the binaries the cache holds. Needs $kwokctl, $k8s_bin, $cache, the pinned versions and log().
#
#   kwokctl_create NAME [KWOKCTL FLAG...]
#
# kwokctl gives up when the new API server does not serve discovery yet as it installs its own CRDs
# ("failed to init crds": seen on a loaded machine). That cluster is half made, so it goes and is created once
# more.
kwokctl_create() {
  local name=$1; shift
  if ! _kwokctl_create_once "$name" "$@"; then
    log "kwokctl could not create cluster '$name': deleting it and creating it once more"
    "$kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true
    _kwokctl_create_once "$name" "$@"
  fi
}

_kwokctl_create_once() {
  local name=$1; shift
  # --kubeconfig= keeps the user's ~/.kube/config untouched. The ports lock's descriptor is closed for
  # kwokctl, so the daemons it starts do not hold the lock.
  "$kwokctl" create cluster --name "$name" --runtime binary {ports_fd}>&- \
    --kube-apiserver-binary "$k8s_bin/kube-apiserver" \
    --kube-controller-manager-binary "$k8s_bin/kube-controller-manager" \
    --kube-scheduler-binary "$k8s_bin/kube-scheduler" \
    --etcd-binary "$cache/bin/etcd-$ETCD_VERSION/etcd" \
    --kwok-controller-binary "$cache/bin/kwok-$KWOK_VERSION/kwok" \
    --kubeconfig= \
    --wait 3m "$@" >&2
}
