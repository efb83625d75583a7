"""What a destination holds besides the files a download lists: temp files a killed run left (swept) and files
the listing no longer has (kept, and named on stderr). Both walk the tree with os.fwalk, which never
descends into a link."""

from __future__ import annotations

import os
import sys
import time
from pathlib import PurePosixPath

from dtjob.azure.local_tree import LocalTree
from dtjob.azure.manifest import COMPLETE_NAME, LOCK_NAME, MANIFEST_NAME, PART_SUFFIX

# How many stale local paths the stager names in its report (the count covers all of them).
STALE_SHOWN = 10


def sweep_partial_files(tree: LocalTree, older_than_s: float = 0.0) -> int:
    """Remove the temp files a killed run left: all of them while this stager holds the destination's lock,
    otherwise only those untouched for `older_than_s` seconds (a live stager's temp file is being written).
    A directory holding a lock file of its own is another destination, swept by its own stager."""
    cutoff = time.time() - older_than_s
    removed = 0
    for rel, dirs, names, fd in tree.walk():
        if rel and LOCK_NAME in names:
            dirs.clear()
            continue
        for name in names:
            if not name.endswith(PART_SUFFIX):
                continue
            try:
                if older_than_s <= 0 or os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
            except FileNotFoundError:
                pass
    return removed


def stale_files(tree: LocalTree, listed: set[str]) -> list[str]:
    """Files under the root that the listing no longer has (the stager's bookkeeping aside), sorted."""
    stale = []
    for rel, _dirs, names, _fd in tree.walk():
        for name in names:
            path = (PurePosixPath(rel) / name).as_posix()
            bookkeeping = path in (MANIFEST_NAME, COMPLETE_NAME) or name == LOCK_NAME
            if bookkeeping or name.endswith(PART_SUFFIX) or path in listed:
                continue
            stale.append(path)
    return sorted(stale)


def report_stale(tree: LocalTree, listed: set[str], prefix: str, shown: int = STALE_SHOWN) -> list[str]:
    """Stale files are kept, never deleted (the destination may hold what a job or a person put there), and
    reported on stderr: how many, and the first few paths."""
    stale = stale_files(tree, listed)
    if stale:
        more = f" and {len(stale) - shown} more" if len(stale) > shown else ""
        print(
            f"stager: kept {len(stale)} local file(s) under {tree.root} that are not under prefix "
            f"{prefix!r}: {', '.join(stale[:shown])}{more}",
            file=sys.stderr,
            flush=True,
        )
    return stale
