#!/usr/bin/env bash
# The local control plane: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler started by
# kwokctl's binary runtime from the binaries hack/build-control-plane.sh cached, with kwok faking an AKS cluster
# (a CPU system pool and a GPU pool; see hack/sim_nodes.py and hack/kwok/stages.yaml). All on 127.0.0.1.
#
#   hack/cluster.sh up | down | status | kubeconfig
#
# `up` is idempotent: a healthy running cluster is kept and only its node pools are reconciled.
# Pool shape: SYSTEM_POOL_SIZE, GPU_POOL_SIZE, GPU_VM_SIZE, SYSTEM_VM_SIZE (see hack/sim_nodes.py); CLUSTER_APF=1
# keeps the API server's request limits and API Priority and Fairness on; SIM_MANY_PODS=1 has kwok play pods'
# stages 32 at a time (hack/kwok/many-pods.yaml), for benchmarks of thousands of pods.
# CONTROLLER_MANAGER_QPS=N gives kube-controller-manager's controllers a client rate of N a second (burst 2N)
# in place of Kubernetes' default 20: its Job controller makes every launcher Job's pod (mpi-operator's; dtjob
# makes its launcher pods itself) and every staging Job's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
name=${CLUSTER_NAME:-dtjob}
k8s_bin=$cache/bin/kubernetes-$K8S_VERSION
kwokctl=$cache/bin/kwok-$KWOK_VERSION/kwokctl
export KWOK_WORKDIR=$cache/kwok
export PATH=$k8s_bin:$PATH
kubeconfig=$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml
configs=("$here/kwok/kwokctl.yaml" "$here/kwok/stages.yaml")
[[ ${SIM_MANY_PODS:-} == 1 ]] && configs+=("$here/kwok/many-pods.yaml")
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"
# shellcheck source=ports-lock.sh
source "$here/ports-lock.sh"
# shellcheck source=kwokctl-create.sh
source "$here/kwokctl-create.sh"
# kwokctl's --disable-qps-limits also turns API Priority and Fairness off; CLUSTER_APF=1 keeps both on, as on
# a real cluster (bench.api_requests counts a client's requests by the FlowSchemas that classify them).
qps_flags=(--disable-qps-limits)
[[ ${CLUSTER_APF:-} == 1 ]] && qps_flags=()
if [[ -n ${CONTROLLER_MANAGER_QPS:-} ]]; then
  [[ $CONTROLLER_MANAGER_QPS =~ ^[1-9][0-9]*$ ]] || { echo "CONTROLLER_MANAGER_QPS: a whole number of requests a second, not '$CONTROLLER_MANAGER_QPS'" >&2; exit 2; }
  qps_flags+=(--extra-args "kube-controller-manager=kube-api-qps=$CONTROLLER_MANAGER_QPS"
             --extra-args "kube-controller-manager=kube-api-burst=$((2 * CONTROLLER_MANAGER_QPS))")
fi
# A cluster remembers the hash of the configuration and binaries it was created from; `up` recreates it when
# they change, so an edited Stage or a new pinned version takes effect.
config_hash=$( (cat "${configs[@]}" "$here/versions.env"; echo "${qps_flags[*]}") | sha256sum | cut -c1-16)
config_stamp=$KWOK_WORKDIR/clusters/$name/dtjob-config-hash

log() { printf '[cluster] %s\n' "$*" >&2; }
kctl() { kubectl --kubeconfig "$kubeconfig" "$@"; }

healthy() {
  [[ -f $kubeconfig ]] && kctl get --raw /readyz >/dev/null 2>&1
}

reconcile_nodes() {
  local nodes
  nodes=$(python3 "$here/sim_nodes.py")
  kctl apply -f - <<<"$nodes" >/dev/null
  # Scale down: remove simulated pool nodes that the current pool sizes no longer name.
  local wanted
  wanted=$(python3 -c 'import json,sys; print("\n".join(i["metadata"]["name"] for i in json.load(sys.stdin)["items"]))' <<<"$nodes")
  for n in $(kctl get nodes -l type=kwok -o name | sed 's#node/##'); do
    grep -qx "$n" <<<"$wanted" || kctl delete node "$n" --wait=false >/dev/null
  done
  # Polled, not `kubectl wait --for=condition=Ready`, which fails at once on a node that has no conditions yet.
  local deadline=$((SECONDS + 120)) not_ready
  while :; do
    not_ready=$(kctl get nodes -l type=kwok \
      -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
      grep -cv '=True$' || true)
    [[ $not_ready == 0 ]] && break
    ((SECONDS < deadline)) || { log "$not_ready simulated nodes not Ready after 120s"; exit 1; }
    sleep 0.5
  done
  log "nodes: $(kctl get nodes -l kubernetes.azure.com/agentpool=system -o name | wc -l) system," \
    "$(kctl get nodes -l kubernetes.azure.com/agentpool=gpu -o name | wc -l) gpu (${GPU_VM_SIZE:-Standard_NC24s_v3})"
}

up() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x $k8s_bin/$b ]] || { log "missing $k8s_bin/$b: run hack/build-control-plane.sh (make control-plane)"; exit 1; }
  done
  if healthy && [[ $(cat "$config_stamp" 2>/dev/null) == "$config_hash" ]]; then
    log "cluster '$name' already running"
  else
    if [[ -d $KWOK_WORKDIR/clusters/$name ]]; then
      log "replacing cluster '$name' (stopped, or created from another configuration)"
      "$kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true
    fi
    log "starting cluster '$name' (kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
    ports_lock
    config_flags=()
    for config in "${configs[@]}"; do config_flags+=(--config "$config"); done
    kwokctl_create "$name" "${config_flags[@]}" "${qps_flags[@]}"
    ports_unlock
    echo "$config_hash" >"$config_stamp"
  fi
  reconcile_nodes
  log "kubeconfig: $kubeconfig"
}

down() {
  if [[ -d $KWOK_WORKDIR/clusters/$name ]]; then
    "$kwokctl" delete cluster --name "$name" >&2
  else
    log "no cluster '$name'"
  fi
}

status() {
  if healthy; then
    kctl get nodes -L kubernetes.azure.com/agentpool,node.kubernetes.io/instance-type
  else
    log "cluster '$name' is not running"
    return 1
  fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  kubeconfig) echo "$kubeconfig" ;;
  *) echo "usage: $0 up|down|status|kubeconfig" >&2; exit 2 ;;
esac
