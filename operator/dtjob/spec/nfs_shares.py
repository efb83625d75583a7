"""Which NFS shares a namespace's jobs may mount. An inline `nfs` volume names any server and export, and the
staging pod mounts the dataset's share writable: without a list, where a namespace's Pod Security level
allows inline NFS, an editor reaches every share the nodes can mount. Pure: no I/O.

One comma-separated list:
- cluster-wide, from the operator's environment (Helm `storagePolicy.nfsShares`): DTJOB_NFS_SHARES,
  default `*` (any share: the Pod Security level alone decides);
- per namespace, the Namespace's annotation `dtjob.io/nfs-shares`, which replaces it for that namespace.
  Namespaces are cluster-scoped, so only cluster administrators set it.

An entry is `server` (any export of that server) or `server:/export` (that export and every path below it,
segment by segment: `/data` does not admit `/database`). Servers compare without case, as host names do, in
ASCII only: a server name with any other letter matches nothing (Unicode case rules fold some letters to ASCII
ones, and the chart's admission policy, which says the same at apply, knows only ASCII's). An entry that is
neither matches nothing, so a typo refuses rather than admits. Entries are trimmed of white space.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

ANY = "*"
ENV_NFS_SHARES = "DTJOB_NFS_SHARES"
ANNOTATION_NFS_SHARES = "dtjob.io/nfs-shares"
DEFAULT_NFS_SHARES = ANY
_EXPORT_SEPARATOR = ":/"
# What an entry is trimmed of: white space as Go's strings.TrimSpace knows it (Unicode's White_Space), which
# CEL's trim() uses in the chart's admission policy.
_SPACE = " \t\n\r\v\f\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_SPACE += "\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True)
class NfsShare:
    server: str  # lowercase
    export: str | None  # an absolute path without a trailing slash ("/" for the root); None: any export

    def admits(self, server: str, path: str) -> bool:
        if not server.isascii() or server.lower() != self.server:
            return False
        if self.export is None or self.export == "/":
            return True
        return path == self.export or path.startswith(self.export + "/")


@dataclass(frozen=True)
class NfsShares:
    shares: tuple[NfsShare, ...]
    any_share: bool
    source: str  # where the list was set, for messages
    entries: tuple[str, ...] = ()  # as written, for messages

    def refusal(self, server: str, path: str) -> str | None:
        """Why a pod may not mount `server`:`path`, or None."""
        if self.any_share:
            return None
        clean = clean_path(path)
        if clean is None:
            return (
                f"NFS path {path!r} has '.' or '..' segments or is not absolute; with an NFS share list set "
                f"only a plain absolute path is checked ({self.describe()})"
            )
        if any(share.admits(server, clean) for share in self.shares):
            return None
        return f"NFS share {server}:{path} is not one this namespace's jobs may mount ({self.describe()})"

    def describe(self) -> str:
        shown = ", ".join(self.entries) if self.entries else "none"
        return f"allowed: {shown} ({self.source})"


def parse_shares(text: str, source: str) -> NfsShares:
    entries = tuple(dict.fromkeys(item.strip(_SPACE) for item in text.split(",") if item.strip(_SPACE)))
    shares = tuple(share for share in map(_share, entries) if share is not None)
    return NfsShares(shares, ANY in entries, source, entries)


def cluster_shares(env: Mapping[str, str]) -> NfsShares:
    """The installer's cluster-wide list (unset: any share)."""
    return parse_shares(env.get(ENV_NFS_SHARES, DEFAULT_NFS_SHARES), f"operator setting {ENV_NFS_SHARES}")


def namespace_shares(cluster: NfsShares, namespace: str, annotations: Mapping[str, str]) -> NfsShares:
    """The list that applies in `namespace`: its annotation's when it sets one, else the cluster-wide one."""
    if ANNOTATION_NFS_SHARES not in annotations:
        return cluster
    source = f"annotation {ANNOTATION_NFS_SHARES} on Namespace {namespace}"
    return parse_shares(annotations[ANNOTATION_NFS_SHARES], source)


def clean_path(path: str) -> str | None:
    """`path` with repeated and trailing slashes dropped, or None when it is relative or has '.' or '..'
    segments (what such a path reaches is the server's to say, so it is never taken as inside an export)."""
    if not path.startswith("/"):
        return None
    segments = [s for s in re.split("/+", path) if s]
    if any(s in (".", "..") for s in segments):
        return None
    return "/" + "/".join(segments)


def _share(entry: str) -> NfsShare | None:
    if entry == ANY:
        return None
    server, separator, rest = entry.partition(_EXPORT_SEPARATOR)
    if not server or not server.isascii():
        return None
    if not separator:
        return NfsShare(server.lower(), None)
    export = clean_path("/" + rest)
    return NfsShare(server.lower(), export) if export is not None else None
