# shellcheck shell=bash
# One lock per cache entry, for the scripts that fill $DTJOB_CACHE (sourced, bash):
#
#   cache_hit NAME WHAT TEST...   true when TEST passes: now, without waiting, or once a build of the same
#                                 entry that is running has finished. Otherwise false, with NAME's lock held:
#                                 the caller builds the entry (into a temporary name, renamed into place last).
#   cache_lock NAME [WHAT [LINE]] take the lock $DTJOB_CACHE/locks/NAME.lock (exclusive) until cache_unlock NAME
#                                 or the end of the shell; when another process holds it, say so once (LINE, by
#                                 default "another build of WHAT is running; waiting") and wait
#   cache_unlock NAME             release it early
#   import_lock SOCKET            the lock of one containerd's image store (hack/build-images.sh import and
#                                 hack/realnode.sh both import into the nodes' containerds)
#
# Two runs building the same entry at once would write over each other's files; with the lock the second
# waits for the first and then finds its result. Readers of a finished entry take no lock and never wait, and
# different entries have different locks, so they build side by side. A script that builds several entries
# takes each entry's lock around that entry only (a subshell per entry releases it), so no two builders wait
# on each other in a cycle. Processes started while a lock is held inherit it: release it (or take it in a
# subshell) before starting anything that outlives the build, such as a daemon.
#
# The wait line goes through the caller's `log` function when it has one.

declare -gA cache_lock_fds=()

cache_lock_file() { # NAME: its lock file (the name flattened to one path component)
  echo "${DTJOB_CACHE:-$HOME/.cache/dtjob}/locks/${1//[^A-Za-z0-9._-]/_}.lock"
}

# (Local names with a prefix: cache_hit runs the caller's TEST, which must see the caller's variables.)
cache_lock() {
  local _cl_name=$1 _cl_what=${2:-$1} _cl_file _cl_fd
  local _cl_line=${3:-"another build of $_cl_what is running; waiting"}
  [[ -z ${cache_lock_fds[$_cl_name]:-} ]] || return 0 # already held by this shell
  _cl_file=$(cache_lock_file "$_cl_name")
  mkdir -p "$(dirname "$_cl_file")"
  exec {_cl_fd}>>"$_cl_file"
  if ! flock -n "$_cl_fd"; then
    if declare -F log >/dev/null; then
      log "$_cl_line"
    else
      printf '[%s] %s\n' "$(basename "$0" .sh)" "$_cl_line" >&2
    fi
    flock "$_cl_fd"
  fi
  cache_lock_fds[$_cl_name]=$_cl_fd
}

cache_unlock() {
  local _cl_fd=${cache_lock_fds[$1]:-}
  [[ -n $_cl_fd ]] || return 0
  exec {_cl_fd}>&-
  unset "cache_lock_fds[$1]"
}

cache_hit() {
  local _cl_name=$1 _cl_what=$2
  shift 2
  "$@" && return 0
  cache_lock "$_cl_name" "$_cl_what"
  "$@" && { cache_unlock "$_cl_name"; return 0; }
  return 1
}

import_lock() { # SOCKET
  cache_lock "containerd-import-$(realpath -m "$1")" "$1" "another import into $1 is running; waiting"
}
