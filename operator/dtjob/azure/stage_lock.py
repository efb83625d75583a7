"""One stager per destination: an exclusive lock on `.dtjob-stage.lock` in the destination, held for the run.

The jobs of a sweep stage the same dataset onto the same volume; the second stager waits for the first (and
then finds its files there) instead of writing beside it. The lock is a POSIX record lock (fcntl F_SETLK,
through fcntl.lockf): NFSv4 (Azure Files NFS 4.1, an NFS server VM) takes it to the server as a LOCK
operation, so stagers on different nodes exclude each other, and the server lets go of a dead client's lock
when its lease expires. flock() is no better there: the Linux NFS client emulates it with the same byte-range
locks, and with `local_lock=flock` only on the one node. A lock dies with its process, so a killed stager
leaves none behind. The lock file itself is never removed: a stager that removed it would let a third lock
a new file while the second holds the old one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dtjob.azure.errors import StorageFailure
from dtjob.azure.local_tree import Directory
from dtjob.azure.manifest import LOCK_NAME
from dtjob.contract.transfer_report import ExitCode

# A staging run takes minutes to hours (ImageNet's 150 GB at 10 MB/s: about 4 hours); a waiter gives up
# after this long rather than hang on a stager that hangs.
DEFAULT_LOCK_WAIT_S = 6 * 3600.0
LOCK_POLL_S = 1.0
# A volume that keeps no locks (an NFSv3 export without lockd, some FUSE file systems) answers so.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
_HELD = frozenset({errno.EACCES, errno.EAGAIN})


@contextmanager
def destination_lock(top: Directory, wait_s: float, waiting: Callable[[], None]) -> Iterator[bool]:
    """Hold the destination's lock for the block: True while held, False on a volume that keeps no locks.
    While another stager holds it, `waiting()` is called once and the lock is tried every second, for at
    most `wait_s` seconds (then StorageFailure LOCAL_IO)."""
    fd = top.open(LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        yield _acquire(fd, wait_s, waiting, str(top.path / LOCK_NAME))
    finally:
        os.close(fd)  # lets the lock go


def _acquire(fd: int, wait_s: float, waiting: Callable[[], None], where: str) -> bool:
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as err:
            if err.errno in _NO_LOCKS:
                print(
                    f"stager: {where} cannot be locked ({err.strerror}): another stager on this destination "
                    "is not kept out; temp files are each stager's own all the same",
                    file=sys.stderr,
                    flush=True,
                )
                return False
            if err.errno not in _HELD:
                raise StorageFailure(ExitCode.LOCAL_IO, f"cannot lock {where}: {err.strerror}") from err
        if time.monotonic() >= deadline:
            raise StorageFailure(
                ExitCode.LOCAL_IO, f"another stager still holds {where} after a wait of {wait_s:.0f}s"
            )
        if not waited:
            waiting()
            waited = True
        time.sleep(LOCK_POLL_S)
