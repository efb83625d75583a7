"""A download's destination directory, written without following a symbolic link.

The root (the volume's mount point and the destination the operator gives, or the directory a user names) is
trusted; nothing under it is: another job on the same volume can put a link where a directory, a file or the
stager's own bookkeeping belongs. So every name under the root is opened from its directory's descriptor
with O_NOFOLLOW, one component at a time, and a link swapped in mid-run is not followed either. A link or a
non-regular file where a directory or bookkeeping is expected fails the run, naming it; a link at a data
file's name is replaced by the file (renaming onto a name replaces the link, never its target). Temp files
get random names and are created with O_EXCL, so no one can have put anything at their names beforehand.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath

from dtjob.azure.errors import StorageFailure
from dtjob.azure.manifest import PART_SUFFIX
from dtjob.contract.transfer_report import ExitCode

LINK_REFUSED = "the stager follows no link under its destination; remove it"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted at a file's name returns at once (and is then refused), never hangs.
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# The mode open() and mkdir() give by default: the umask decides, so the training pods' user reads the data.
_FILE_MODE = 0o666


class Directory:
    """One directory under the root, held open by its descriptor; `path` only names it in messages."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def close(self) -> None:
        os.close(self.fd)

    def failure(self, err: OSError, name: str) -> StorageFailure:
        """The failure to show for `err` on `name`: one that names a link for what it is."""
        where = self.path / name
        # O_NOFOLLOW refuses a link with ELOOP, and with ENOTDIR where O_DIRECTORY is asked for too.
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and self._is_link(name):
            return StorageFailure(ExitCode.LOCAL_IO, f"{where} is a symbolic link: {LINK_REFUSED}")
        return StorageFailure(ExitCode.LOCAL_IO, f"local I/O error {where}: {err.strerror or err}")

    def subdirectory(self, name: str) -> Directory:
        """The subdirectory `name`, made if missing; the caller closes it."""
        try:
            try:
                fd = os.open(name, _DIRECTORY, dir_fd=self.fd)
            except FileNotFoundError:  # tried first: a rerun over a million files makes no directory
                with suppress(FileExistsError):
                    os.mkdir(name, dir_fd=self.fd)
                fd = os.open(name, _DIRECTORY, dir_fd=self.fd)
        except OSError as err:
            raise self.failure(err, name) from err
        return Directory(fd, self.path / name)

    def regular_size(self, name: str) -> int | None:
        """The size of the regular file `name`; None when there is none (a link there is not one)."""
        st = self._lstat(name)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def exists(self, name: str) -> bool:
        """Whether anything, a link included, is at `name`."""
        return self._lstat(name) is not None

    def open(self, name: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file `name` (O_CREAT in `flags` makes it); refuses anything else."""
        try:
            fd = os.open(name, flags | _FILE, _FILE_MODE, dir_fd=self.fd)
        except OSError as err:
            raise self.failure(err, name) from err
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StorageFailure(ExitCode.LOCAL_IO, f"{self.path / name} is not a regular file; remove it")
        return fd

    def read_text(self, name: str) -> str:
        """The file's text, "" when nothing is at its name."""
        if not self.exists(name):
            return ""
        with os.fdopen(self.open(name), encoding="utf-8", errors="replace") as f:
            return f.read()

    def new_temp(self) -> tuple[str, int]:
        """A new temp file under a random name (its name, and a read-write descriptor)."""
        name = f".{secrets.token_hex(8)}{PART_SUFFIX}"
        return name, self.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)

    def replace(self, temp: str, name: str) -> None:
        """Move `temp` onto `name`: whatever was at `name`, a link included, is replaced, never followed."""
        try:
            os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as err:
            raise self.failure(err, name) from err

    def remove(self, name: str) -> None:
        """Unlink `name` (a link itself, not its target) when it is there."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise self.failure(err, name) from err

    def write_text(self, name: str, text: str) -> None:
        """Replace `name` with `text` as a whole: written to a temp file, then renamed onto it."""
        temp, fd = self.new_temp()
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            self.replace(temp, name)
        finally:
            self.remove(temp)

    def _is_link(self, name: str) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise self.failure(err, name) from err


class LocalTree:
    """The destination's root, held open for a run: `top` for its own files, `directory()` for the others."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.top = Directory(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), root)

    def __enter__(self) -> LocalTree:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.top.close()

    @contextmanager
    def directory(self, rel: str) -> Iterator[Directory]:
        """The directory `rel` under the root ("" for the root), each component made as needed and opened
        without following a link."""
        current = Directory(os.dup(self.top.fd), self.root)
        try:
            for name in PurePosixPath(rel).parts:
                parent, current = current, current.subdirectory(name)
                parent.close()
            yield current
        finally:
            current.close()

    def walk(self) -> Iterator[tuple[str, list[str], list[str], int]]:
        """os.fwalk from the root, which never descends into a link: (the directory relative to the root, ""
        for the root; its subdirectories, which the caller may prune; its other names; its descriptor)."""
        for dirpath, dirs, names, fd in os.fwalk(".", dir_fd=self.top.fd):
            rel = PurePosixPath(dirpath).as_posix()
            yield ("" if rel == "." else rel), dirs, names, fd
