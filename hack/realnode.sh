#!/usr/bin/env bash
# A local cluster whose nodes run containers for real: the same control plane as hack/cluster.sh (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler from kwokctl's binary runtime, no kwok controller),
# plus two real nodes shaped like an AKS cluster, each a kubelet with its own containerd + runc + CNI bridge:
#   aks-gpu-...    labelled and tainted like an AKS GPU pool (sku=gpu:NoSchedule), advertising nvidia.com/gpu
#                  as an extended resource as the NVIDIA device plugin would (containers get no GPU here);
#   aks-system-... the CPU system pool, where launchers, the stager and the operator run.
# kube-proxy (iptables) gives pods the `kubernetes` Service, and CoreDNS serves cluster.local from the API
# server, so `<pod>.<service>.<ns>.svc.cluster.local` resolves in pods as it does on AKS.
#
# Everything lives inside a network namespace: the caller's, which must have no route out (`make test` runs
# pytest in a fresh one, see hack/netns.sh), so the node address, the pods and every port stay off this
# machine's real interfaces.
#
#   hack/realnode.sh up | down | status | kubeconfig | import-images IMAGE... | tag-image IMAGE NAME
#
# `up` is idempotent; `down` stops every process it started and removes the mounts, sockets and interfaces.
# containerd's image store is kept in the cache (an image imported once is not imported again).
#
# Clusters of different names coexist, each in a network namespace of its own (the demo's beside `make
# test`'s): what they share is keyed by the name (the cache's realnode/NAME and kwok/clusters/NAME, hence
# containerd's root, state, sockets and shims) or lives in the namespace (the bridge, the node address, every
# port, iptables); pod network namespaces are mounted under the node's containerd state, not the machine's
# /run/netns, so `down` removes only its own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${DTJOB_CACHE:-$HOME/.cache/dtjob}
name=${REAL_CLUSTER_NAME:-dtjob-real}
k8s_bin=$cache/bin/kubernetes-$K8S_VERSION
kwokctl=$cache/bin/kwok-$KWOK_VERSION/kwokctl
coredns=$cache/bin/coredns-$COREDNS_VERSION/coredns
export KWOK_WORKDIR=$cache/kwok
export PATH=$k8s_bin:$PATH
cluster_dir=$KWOK_WORKDIR/clusters/$name
kubeconfig=$cluster_dir/kubeconfig.yaml
# Images (containerd content) survive `down`; everything else of a running node lives under run/.
store=$cache/realnode/$name
run=$store/run

# The node network: the nodes' address sits on one end of a veth pair (the CNI bridge plugin wants its bridge
# to hold the pods' gateway address only); the bridge is the pods' gateway. Each node's pods take their own
# range of one subnet, so pods on different nodes talk over the bridge without routes, and reach the nodes'
# address (the API server, DNS, Azurite) through their gateway.
bridge=dtjob0
node_link=dtjob-node
node_ip=10.224.0.1
node_cidr=10.224.0.1/16
pod_gateway=10.244.0.1
pod_cidr=10.244.0.0/16
service_cidr=10.0.0.0/16
service_ip=10.0.0.1
nodes=(gpu system)
gpu_node=aks-gpu-27182818-vmss000000
system_node=aks-system-27182818-vmss000000
gpus_per_node=${REAL_GPUS_PER_NODE:-4}

log() { printf '[realnode] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=cache-lock.sh
source "$here/cache-lock.sh"
# shellcheck source=ports-lock.sh
source "$here/ports-lock.sh"
# shellcheck source=kwokctl-create.sh
source "$here/kwokctl-create.sh"
kctl() { kubectl --kubeconfig "$kubeconfig" "$@"; }

node_name() { local n=$1; [[ $n == gpu ]] && echo "$gpu_node" || echo "$system_node"; }
node_index() { [[ $1 == gpu ]] && echo 1 || echo 2; }
sock() { echo "$run/$1/containerd.sock"; }

isolated() {
  # A namespace of the test bed: no default route and no address outside loopback and our bridge.
  ! ip route show default | grep -q . &&
    ! ip -o addr show | awk '$2 != "lo" && $2 != "'$bridge'" && $2 != "'$node_link'" && $3 == "inet"' | grep -q .
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# A process left by an earlier run whose namespace is gone (a crashed `make test`) still answers on its unix
# socket: it is reused only when it lives in this network namespace, and stopped otherwise.
pid_here() { [[ $(readlink "/proc/$(cat "$1")/ns/net" 2>/dev/null) == "$(readlink /proc/self/ns/net)" ]]; }

start_bg() { # name pidfile logfile cmd...
  local what=$1 pidfile=$2 logfile=$3; shift 3
  if pid_alive "$pidfile"; then
    pid_here "$pidfile" && return
    log "stopping a $what left in another network namespace"
    stop_pidfile "$pidfile"
  fi
  "$@" >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  log "started $what (pid $!, log $logfile)"
}

stop_pidfile() { # pidfile
  local pidfile=$1 pid
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

wait_until() { # seconds description command...
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what"
    sleep 0.5
  done
}

network_up() {
  ip link set lo up
  if ! ip link show "$node_link" >/dev/null 2>&1; then
    ip link add "$node_link" type veth peer name "$node_link-p"
  fi
  ip addr replace "$node_cidr" dev "$node_link"
  ip link set "$node_link-p" up
  ip link set "$node_link" up
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip addr replace "$pod_gateway/16" dev "$bridge"
  ip link set "$bridge" up
}

pause_image() {
  # The sandbox image: a static pause(2) loop (hack/realnode/pause.c) packed as a one-layer image. Made under
  # its own lock into names of this run's own, the archive renamed into place whole. Run it in a subshell
  # ($(pause_image)), which releases the lock before anything long-lived starts.
  local out=$store/images
  local key
  key=$(cat "$here/realnode/pause.c" "$here/realnode/oci_image.py" | sha256sum | cut -c1-16)
  if ! cache_hit "realnode-$name-pause-$key" "the pause image $key" test -f "$out/pause-$key.tar"; then
    mkdir -p "$out"
    # shellcheck disable=SC2064 # the names now: the trap runs when this subshell ends, after the function
    trap "rm -f $(printf '%q ' "$out/pause.tmp.$$" "$out/pause-$key.tar.tmp.$$")" EXIT
    gcc -static -O2 -o "$out/pause.tmp.$$" "$here/realnode/pause.c"
    python3 "$here/realnode/oci_image.py" --name "$PAUSE_IMAGE" --entrypoint /pause \
      --file "pause=$out/pause.tmp.$$" "$out/pause-$key.tar.tmp.$$" >/dev/null
    mv -T "$out/pause-$key.tar.tmp.$$" "$out/pause-$key.tar"
    rm -f "$out/pause.tmp.$$"
  fi
  echo "$out/pause-$key.tar"
}
PAUSE_IMAGE=localhost/dtjob/pause:3.10

write_node_config() { # node
  local n=$1 dir=$run/$1 index
  index=$(node_index "$n")
  mkdir -p "$dir/net.d" "$dir/ipam" "$dir/pod-logs" "$dir/kubelet" "$store/$n/containerd"
  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$store/$n/containerd"
state = "$dir/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$store/$n/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Pods' network namespaces under this node's state, where down() unmounts them: in the machine's shared
  # /run/netns they would be indistinguishable from another cluster's.
  netns_mounts_under_state_dir = true
  # This machine denies negative oom_score_adj; without this every sandbox fails to start.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/net.d"
EOF
  cat >"$dir/net.d/10-dtjob.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dtjob",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$pod_gateway",
                     "rangeStart": "10.244.$index.2", "rangeEnd": "10.244.$index.254"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  local taints=""
  [[ $n == gpu ]] && taints='registerWithTaints: [{key: sku, value: gpu, effect: NoSchedule}]'
  # Two kubelets share the namespace: each takes its own ports.
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $((10250 + index * 10))
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((10248 + index * 10))
containerRuntimeEndpoint: unix://$dir/containerd.sock
podLogsDir: $dir/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $cluster_dir/pki/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [$node_ip]
clusterDomain: cluster.local
resolvConf: ""
# cgroup v1 without CAP_SYS_RESOURCE: no QoS cgroups, no node allocatable enforcement, no eviction.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 50
$taints
EOF
}

node_labels() { # node
  local n=$1 pool mode
  [[ $n == gpu ]] && { pool=gpu; mode=user; } || { pool=system; mode=system; }
  local labels="agentpool=$pool,kubernetes.azure.com/agentpool=$pool,kubernetes.azure.com/mode=$mode"
  labels+=",type=real,topology.kubernetes.io/region=local,topology.kubernetes.io/zone=0"
  [[ $n == gpu ]] && labels+=",node.kubernetes.io/instance-type=Standard_NC24s_v3,kubernetes.azure.com/accelerator=nvidia"
  [[ $n == system ]] && labels+=",node.kubernetes.io/instance-type=Standard_D4s_v5"
  echo "$labels"
}

control_plane_up() {
  if [[ -f $kubeconfig ]] && kctl get --raw /readyz >/dev/null 2>&1; then
    log "control plane of '$name' already running"
    return
  fi
  [[ -d $cluster_dir ]] && "$kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true
  log "starting control plane '$name' (kubernetes $K8S_VERSION, etcd $ETCD_VERSION)"
  local config=$store/kwokctl.yaml
  mkdir -p "$store"
  # The API server listens on the node network too (pods reach it through the kubernetes Service) and
  # dials kubelets with the admin client certificate, which the kubelets' x509 authenticator trusts.
  cat >"$config" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  bindAddress: 127.0.0.1
  kubeApiserverCertSANs: [$service_ip, $node_ip]
componentsPatches:
  - name: kube-apiserver
    extraArgs:
      - {key: bind-address, value: 0.0.0.0}
      - {key: advertise-address, value: $node_ip}
      - {key: service-cluster-ip-range, value: $service_cidr}
      - {key: kubelet-client-certificate, value: $cluster_dir/pki/admin.crt}
      - {key: kubelet-client-key, value: $cluster_dir/pki/admin.key}
      - {key: kubelet-preferred-address-types, value: InternalIP}
  - name: kube-controller-manager
    extraArgs:
      - {key: service-cluster-ip-range, value: $service_cidr}
  # Nothing here is worth an fsync; image imports writing gigabytes would stall etcd's and time the API out.
  - name: etcd
    extraArgs:
      - {key: unsafe-no-fsync, value: "true"}
EOF
  ports_lock
  kwokctl_create "$name" --disable kwok-controller --config "$config"
  ports_unlock
}

containerd_up() { # node
  local n=$1 dir=$run/$1
  start_bg "containerd ($n)" "$dir/containerd.pid" "$dir/containerd.log" \
    containerd --config "$dir/containerd.toml"
  wait_until 60 "containerd ($n)" ctr --address "$(sock "$n")" version
}

import_into() { # node archive...
  local n=$1; shift
  # Under the containerd's import lock, as hack/build-images.sh import takes it; in a subshell, so the lock
  # is released here and never inherited by the node's daemons.
  (
    import_lock "$(sock "$n")"
    for archive in "$@"; do
      ctr --address "$(sock "$n")" -n k8s.io images import "$archive" >/dev/null
    done
  )
}

layer_dir() { # node committed-snapshot-key: the directory containerd unpacked that layer into
  local ctr_=(ctr --address "$(sock "$1")" -n k8s.io snapshots --snapshotter overlayfs) view="dtjob-layer-dir-$$"
  # A read-only view's first lower directory is the snapshot's own (a one-layer view is a bind mount of it).
  "${ctr_[@]}" view --mounts "$view" "$2" 2>/dev/null |
    sed -n -e 's/.*"lowerdir=\([^:"]*\).*/\1/p' -e 's/.*"Source": "\(\/[^"]*\)".*/\1/p' | head -n 1
  "${ctr_[@]}" rm "$view" 2>/dev/null || true
}

share_layers() {
  # Every node's containerd unpacks an image into snapshots of its own: the PyTorch image alone is about
  # 6 GB per node. A committed snapshot is never written again (a container writes to its own upper
  # directory), so identical files of committed layers, across the nodes, can be one inode: the cluster
  # holds each image's files once. Only committed snapshots, asked of containerd, are linked.
  local dirs=() n key dir
  for n in "${nodes[@]}"; do
    while read -r key; do
      dir=$(layer_dir "$n" "$key")
      [[ -n $dir && -d $dir ]] && dirs+=("$dir")
    done < <(ctr --address "$(sock "$n")" -n k8s.io snapshots --snapshotter overlayfs ls | awk '$3 == "Committed" { print $1 }')
  done
  ((${#dirs[@]} > 0)) || return 0
  hardlink --quiet --respect-xattrs --minimum-size 16K "${dirs[@]}" ||
    log "could not link the nodes' identical image files; each node keeps its own copy"
}

kubelet_up() { # node
  local n=$1 dir=$run/$1 node
  node=$(node_name "$n")
  start_bg "kubelet ($node)" "$dir/kubelet.pid" "$dir/kubelet.log" \
    kubelet --config "$dir/kubelet.yaml" --kubeconfig "$kubeconfig" --hostname-override "$node" \
    --node-ip "$node_ip" --root-dir "$dir/kubelet" --cert-dir "$dir/kubelet/pki" \
    --node-labels "$(node_labels "$n")" --v=1
}

advertise_gpus() {
  # What the NVIDIA device plugin would do on AKS: the node advertises nvidia.com/gpu (kubelet keeps it and
  # derives allocatable from it). Containers get no GPU: the frameworks train on CPU.
  kctl patch node "$gpu_node" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$gpus_per_node\"}]" >/dev/null
}

coredns_up() {
  local dir=$run/dns
  mkdir -p "$dir"
  cat >"$dir/Corefile" <<EOF
.:53 {
    bind $node_ip
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
EOF
  start_bg coredns "$dir/coredns.pid" "$dir/coredns.log" "$coredns" -conf "$dir/Corefile"
}

write_if_changed() { # file: stdin, written only where it differs from the file
  local tmp=$1.tmp.$$
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

kube_proxy_up() {
  local dir=$run/proxy
  mkdir -p "$dir"
  # kube-proxy exits once its config file is written to: a second `up` must leave a running one's alone.
  write_if_changed "$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: $gpu_node
mode: iptables
clusterCIDR: $pod_cidr
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Both nodes share this namespace's bridge, where br_netfilter may be absent: masquerade every Service hop so
# replies come back through the proxy's conntrack. Conntrack limits and timeouts stay as the namespace has them.
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start_bg kube-proxy "$dir/kube-proxy.pid" "$dir/kube-proxy.log" kube-proxy --config "$dir/kube-proxy.yaml"
}

node_ready() { # node name
  [[ $(kctl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

up() {
  for b in kube-apiserver kubelet kube-proxy kubectl; do
    [[ -x $k8s_bin/$b ]] || die "missing $k8s_bin/$b: run hack/build-control-plane.sh (make control-plane)"
  done
  [[ -x $coredns ]] || die "missing $coredns: run hack/build-control-plane.sh coredns"
  for b in containerd runc ctr iptables; do command -v "$b" >/dev/null || die "$b not found (hack/install-debs.sh)"; done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || die "CNI plugins missing (containernetworking-plugins)"
  [[ $(id -u) == 0 ]] || die "the real node needs root (containerd, runc, mounts)"
  isolated || die "refusing to start: this network namespace has a route or address out; run inside hack/netns.sh"
  if [[ -d $run ]] && ! { [[ -f $kubeconfig ]] && kctl get --raw /readyz >/dev/null 2>&1; }; then
    # A run whose namespace this one cannot reach (an interrupted `make test`): its containers, kubelets and
    # mounts go first, so nothing of it keeps running beside the new cluster.
    log "clearing an earlier run of '$name' that this network namespace cannot reach"
    down
  fi
  network_up
  sysctl -qw net.ipv4.ip_forward=1
  mkdir -p "$run"
  local pause
  pause=$(pause_image)
  for n in "${nodes[@]}"; do write_node_config "$n"; done
  control_plane_up
  for n in "${nodes[@]}"; do
    containerd_up "$n"
    import_into "$n" "$pause"
  done
  for n in "${nodes[@]}"; do kubelet_up "$n"; done
  coredns_up
  kube_proxy_up
  for n in "${nodes[@]}"; do
    wait_until 120 "node $(node_name "$n") Ready" node_ready "$(node_name "$n")"
  done
  advertise_gpus
  wait_until 60 "nvidia.com/gpu allocatable on $gpu_node" \
    bash -c "[[ \$(kubectl --kubeconfig '$kubeconfig' get node '$gpu_node' -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') == '$gpus_per_node' ]]"
  log "nodes ready: $gpu_node (gpu, $gpus_per_node nvidia.com/gpu), $system_node (system)"
  log "kubeconfig: $kubeconfig"
}

remove_pods() {
  # Let the kubelets tear their pods down (volumes unmounted, sandboxes and their network namespaces
  # removed) before they stop.
  [[ -f $kubeconfig ]] && kctl get --raw /readyz >/dev/null 2>&1 || return 0
  kctl delete pods --all-namespaces --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    [[ -z $(kctl get pods -A -o name 2>/dev/null) ]] && break
    sleep 1
  done
}

stop_containers() { # node: whatever the kubelet left, stopped through containerd itself
  local n=$1 address
  address=$(sock "$n")
  [[ -S $address ]] || return 0
  local ctrs
  ctrs=$(ctr --address "$address" -n k8s.io containers ls -q 2>/dev/null || true)
  for c in $ctrs; do
    ctr --address "$address" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true
  done
  sleep 1
  for c in $ctrs; do
    ctr --address "$address" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
    ctr --address "$address" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true
  done
}

unmount_under() { # dir: every mount below it, deepest first
  local dir=$1
  awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}

down() {
  remove_pods
  for n in "${nodes[@]}"; do stop_pidfile "$run/$n/kubelet.pid"; done
  for n in "${nodes[@]}"; do
    stop_containers "$n"
    stop_pidfile "$run/$n/containerd.pid"
  done
  # Shims outlive containerd: stop those of our nodes (their command line names our state directory).
  pkill -f "containerd-shim-runc-v2 .*-address $run/" 2>/dev/null || true
  stop_pidfile "$run/dns/coredns.pid"
  stop_pidfile "$run/proxy/kube-proxy.pid"
  if [[ -d $cluster_dir ]]; then "$kwokctl" delete cluster --name "$name" >/dev/null 2>&1 || true; fi
  unmount_under "$run"
  unmount_under "$store"
  for link in "$bridge" "$node_link"; do
    if ip link show "$link" >/dev/null 2>&1; then ip link delete "$link"; fi
  done
  iptables -t nat -F 2>/dev/null || true
  rm -rf "$run"
  log "stopped '$name'"
}

status() {
  if [[ -f $kubeconfig ]] && kctl get --raw /readyz >/dev/null 2>&1; then
    kctl get nodes -o wide -L kubernetes.azure.com/agentpool
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
  import-images)
    # Images hack/build-images.sh built, into every node's containerd (skipped where already there).
    shift
    for n in "${nodes[@]}"; do "$here/build-images.sh" import --address "$(sock "$n")" "$@"; done
    share_layers
    ;;
  tag-image)
    # An imported image under a second name in every node's containerd, e.g. the name a manifest gives it
    # in a registry the nodes cannot reach; a pod naming it (pull policy IfNotPresent) runs it as it is.
    [[ $# == 3 ]] || { echo "usage: $0 tag-image IMAGE NAME" >&2; exit 2; }
    for n in "${nodes[@]}"; do ctr --address "$(sock "$n")" -n k8s.io images tag --force "$2" "$3" >/dev/null; done
    ;;
  *) echo "usage: $0 up|down|status|kubeconfig|import-images IMAGE...|tag-image IMAGE NAME" >&2; exit 2 ;;
esac
