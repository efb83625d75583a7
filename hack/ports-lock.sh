# shellcheck shell=bash
# One lock for everything that picks or frees a local control plane's ports (sourced, bash; needs
# cache-lock.sh). kwokctl picks a cluster's ports by scanning down from 32767 for one nothing listens on at
# that moment: two clusters created at once could pick the same port, and so could a cluster created while a
# fault test has another cluster's API server stopped (testbed/controlplane.py takes this lock around its
# restart). The lock's descriptor must be closed for the commands run under it (`cmd {ports_fd}>&-`), or the
# daemons they start would hold it.
#
#   ports_lock     take it (waiting while another cluster is being created or restarted)
#   ports_unlock   release it

ports_fd=
ports_lock() {
  local file
  file=$(cache_lock_file cluster-ports)
  mkdir -p "$(dirname "$file")"
  exec {ports_fd}>>"$file"
  flock "$ports_fd"
}
ports_unlock() {
  if [[ -n $ports_fd ]]; then exec {ports_fd}>&-; fi
  ports_fd=
}
