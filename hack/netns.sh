#!/usr/bin/env bash
# Network namespaces of the test bed: a place with loopback and no route out, where the local clusters, the
# real node's pods, Azurite and the tests talk to each other and to nothing else.
#
#   hack/netns.sh run CMD...           runs CMD in a new namespace that ends with it (`make test`)
#   hack/netns.sh exec NAME CMD...     runs CMD in the named namespace, creating it first (`make demo`, so
#                                      the demo's cluster can be looked at after the demo has finished)
#   hack/netns.sh delete NAME          removes the named namespace (stop what runs in it first)
#
# Only the network is separated (nsenter --net): processes keep this machine's filesystem, /sys and cgroups,
# which containerd, runc and the kubelet need.
set -euo pipefail

log() { printf '[netns] %s\n' "$*" >&2; }
sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo

lo_up_and_exec() {
  ip link set lo up
  exec "$@"
}

case ${1:-} in
  run)
    shift
    [[ $# -gt 0 ]] || { echo "usage: $0 run CMD..." >&2; exit 2; }
    # The child re-enters this script to bring loopback up, then becomes CMD.
    exec $sudo unshare --net --fork -- "$0" _lo_up_and_exec "$@"
    ;;
  _lo_up_and_exec)
    shift
    lo_up_and_exec "$@"
    ;;
  exec)
    name=${2:?usage: $0 exec NAME CMD...}
    shift 2
    if [[ ! -e /run/netns/$name ]]; then
      $sudo ip netns add "$name"
      $sudo ip -n "$name" link set lo up
      log "created network namespace '$name'"
    fi
    exec $sudo nsenter --net="/run/netns/$name" -- "$@"
    ;;
  delete)
    name=${2:?usage: $0 delete NAME}
    if [[ -e /run/netns/$name ]]; then $sudo ip netns delete "$name"; fi
    ;;
  *)
    echo "usage: $0 run CMD... | exec NAME CMD... | delete NAME" >&2
    exit 2
    ;;
esac
