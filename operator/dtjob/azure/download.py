"""Stage a container prefix onto a local (or NFS) directory: parallel, resumable, atomic per file.

A file counts as present when it has the blob's size and either the manifest records the same blob version
(ETag or MD5) or its content hashes to the blob's Content-MD5. Everything else is downloaded to a temp file of
its own beside its destination, checked against Content-MD5 when the blob has one, and renamed into place, so
a file under its final name is always complete. A blob without Content-MD5 can be checked by its length only;
the run says how many it fetched so (`dtjob data hash` records one). A run that fails removes its temp files
and never writes the completion marker. One stager writes a destination at a time (dtjob.azure.stage_lock),
and none follows a link under it (dtjob.azure.local_tree).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from dtjob.azure.errors import StorageFailure
from dtjob.azure.leftovers import report_stale, sweep_partial_files
from dtjob.azure.local_tree import Directory, LocalTree
from dtjob.azure.manifest import (
    COMPLETE_NAME,
    LOCK_NAME,
    MANIFEST_NAME,
    PART_SUFFIX,
    Entry,
    ManifestWriter,
    parse_manifest,
)
from dtjob.azure.parallel import retry_once_on_denial, run_bounded
from dtjob.azure.progress import Progress
from dtjob.azure.stage_lock import DEFAULT_LOCK_WAIT_S, destination_lock
from dtjob.contract.transfer_report import WAITING_PHASE, ExitCode, ProgressSnapshot
from dtjob.datasets.imagenet_layout import is_marker
from dtjob.names import directory_prefix

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

ClientFactory = Callable[[], "ContainerClient"]
HASH_BLOCK = 4 * 1024 * 1024
# Without a lock (a volume that keeps none) the sweep spares temp files another live stager may be writing.
UNLOCKED_SWEEP_AGE_S = 3600.0


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the blob name
    rel: str  # its path under the destination
    size: int
    etag: str
    md5: str | None  # base64 Content-MD5, when the blob has one


def relative_path(blob_name: str, prefix: str) -> str | None:
    """The destination-relative path of a blob, None for directory markers; refuses names that would
    escape the destination."""
    rel = blob_name[len(prefix) :]
    if not rel or rel.endswith("/"):
        return None
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or any(p in ("..", ".") for p in parts) or "\\" in rel or "\0" in rel:
        raise StorageFailure(ExitCode.STORAGE, f"blob name {blob_name!r} would escape the destination")
    return rel


def refuse_bookkeeping_name(remote: RemoteFile) -> None:
    """Refuse a blob whose local path is one of the stager's own files: the manifest and the completion
    marker at the destination's root, a lock file (it marks a destination) or a temp file (swept as a killed
    run's leftover)."""
    name = PurePosixPath(remote.rel).name
    if remote.rel in (MANIFEST_NAME, COMPLETE_NAME) or name == LOCK_NAME or name.endswith(PART_SUFFIX):
        raise StorageFailure(
            ExitCode.USAGE,
            f"blob name {remote.name!r} collides with the stager's own bookkeeping files "
            f"({MANIFEST_NAME}, {COMPLETE_NAME}, {LOCK_NAME}, *{PART_SUFFIX}): rename or remove it",
        )


def _md5_b64(raw: bytes | bytearray | None) -> str | None:
    return base64.b64encode(bytes(raw)).decode() if raw else None


def list_remote(client: ContainerClient, prefix: str) -> list[RemoteFile]:
    files = []
    for blob in client.list_blobs(name_starts_with=prefix or None):
        rel = relative_path(blob.name, prefix)
        if rel is None:
            continue
        md5 = _md5_b64(blob.content_settings.content_md5 if blob.content_settings else None)
        files.append(RemoteFile(blob.name, rel, int(blob.size), str(blob.etag), md5))
    return files


def fd_md5_b64(fd: int) -> str:
    """The MD5 of the whole file open at `fd` (read with pread: its offset stays where it was)."""
    digest = hashlib.md5(usedforsecurity=False)
    offset = 0
    while block := os.pread(fd, HASH_BLOCK, offset):
        digest.update(block)
        offset += len(block)
    return base64.b64encode(digest.digest()).decode()


def file_md5_b64(path: Path) -> str:
    with path.open("rb") as f:
        return fd_md5_b64(f.fileno())


def is_present(directory: Directory, name: str, remote: RemoteFile, entry: Entry | None) -> bool:
    """Whether `name` in `directory` is a regular file holding the blob (a link there never is)."""
    if directory.regular_size(name) != remote.size:
        return False
    if entry is not None and entry.size == remote.size and _same_version(entry, remote):
        return True
    if remote.md5 is None:
        return False
    fd = directory.open(name)
    try:
        return fd_md5_b64(fd) == remote.md5
    finally:
        os.close(fd)


def _same_version(entry: Entry, remote: RemoteFile) -> bool:
    return entry.etag == remote.etag or (remote.md5 is not None and entry.md5 == remote.md5)


def report_unhashed(count: int, prefix: str) -> None:
    """One line on stderr when blobs without Content-MD5 were fetched: their bytes were not verified."""
    if count:
        print(
            f"stager: fetched {count} blob(s) under prefix {prefix!r} without Content-MD5, checked by their "
            "length only; `dtjob data hash` records one for them",
            file=sys.stderr,
            flush=True,
        )


@dataclass
class Stager:
    """One staging run: `client` returns a client for the current token, `refresh` re-reads credentials."""

    client: ClientFactory
    refresh: Callable[[], None]
    dest: Path
    progress: Progress
    subject: str  # e.g. "input container imagenet" in messages
    credentials_hint: str  # e.g. "Secret r50-sas-in"
    concurrency: int = 8
    fsync: bool = True
    large_file_bytes: int = 64 * 1024 * 1024
    range_concurrency: int = 4
    # Paths under the prefix left out (e.g. a run's `logs/` when only its results are wanted).
    skip_prefixes: tuple[str, ...] = ()
    # How long to wait for another stager writing the same destination.
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S
    # Blobs fetched in this run that had no Content-MD5 (checked by length only).
    unhashed: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self, prefix: str) -> ProgressSnapshot:
        prefix = directory_prefix(prefix)
        try:
            with (
                LocalTree(self.dest) as tree,
                destination_lock(tree.top, self.lock_wait_s, self._waiting) as locked,
            ):
                self.progress.set_phase("listing")
                self._stage(tree, prefix, locked)
        except Exception as err:
            raise self.progress.failed(err, self.subject, self.credentials_hint) from err
        self.progress.set_phase("done")
        return self.progress.snapshot()

    def _waiting(self) -> None:
        message = f"waiting for another stager writing {self.dest}"
        print(f"stager: {message}", file=sys.stderr, flush=True)
        self.progress.set_phase(WAITING_PHASE, message)

    def _stage(self, tree: LocalTree, prefix: str, locked: bool) -> None:
        # Only a run that did not finish can have left temp files; a finished tree is not walked again.
        finished_before = tree.top.exists(COMPLETE_NAME)
        tree.top.remove(COMPLETE_NAME)
        remotes = self._listing(prefix)
        entries = parse_manifest(tree.top.read_text(MANIFEST_NAME))
        if not finished_before:
            sweep_partial_files(tree, 0.0 if locked else UNLOCKED_SWEEP_AGE_S)
        self.progress.planned(len(remotes), sum(r.size for r in remotes))
        self.progress.set_phase("transferring")
        manifest = ManifestWriter(tree.top.open(MANIFEST_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        try:
            self._run_all(tree, remotes, entries, manifest)
        finally:
            manifest.close()
        report_unhashed(self.unhashed, prefix)
        report_stale(tree, {r.rel for r in remotes}, prefix)
        tree.top.write_text(COMPLETE_NAME, _marker_text(prefix, self.progress.snapshot()))

    def _listing(self, prefix: str) -> list[RemoteFile]:
        listed = retry_once_on_denial(lambda: list_remote(self.client(), prefix), self.refresh)
        # `dtjob data prepare-imagenet`'s completion markers are bookkeeping, not data.
        remotes = [r for r in listed if not r.rel.startswith(self.skip_prefixes) and not is_marker(r.rel)]
        if not remotes:
            raise StorageFailure(ExitCode.NOT_FOUND, f"{self.subject}: no blobs under prefix {prefix!r}")
        for remote in remotes:
            refuse_bookkeeping_name(remote)
        return remotes

    def _run_all(
        self, tree: LocalTree, remotes: list[RemoteFile], entries: dict[str, Entry], manifest: ManifestWriter
    ) -> None:
        def work(remote: RemoteFile, cancel: threading.Event) -> None:
            if not cancel.is_set():
                self._one(tree, remote, entries.get(remote.rel), manifest, cancel)

        run_bounded(remotes, work, self.concurrency, "stage")

    def _one(
        self,
        tree: LocalTree,
        remote: RemoteFile,
        entry: Entry | None,
        manifest: ManifestWriter,
        cancel: threading.Event,
    ) -> None:
        rel = PurePosixPath(remote.rel)
        with tree.directory(rel.parent.as_posix()) as directory:
            if is_present(directory, rel.name, remote, entry):
                self.progress.skipped(remote.size)
                if entry is None or entry.etag != remote.etag:
                    manifest.record(remote.rel, Entry(remote.size, remote.etag, remote.md5))
                return
            md5 = retry_once_on_denial(
                lambda: self._download_verified(remote, directory, rel.name, cancel), self.refresh
            )
        self.progress.file_done()
        if remote.md5 is None:
            with self._lock:
                self.unhashed += 1
        # The MD5 computed for a blob without one lets a later run know it once `dtjob data hash` records it.
        manifest.record(remote.rel, Entry(remote.size, remote.etag, remote.md5 or md5))

    def _download_verified(
        self, remote: RemoteFile, directory: Directory, name: str, cancel: threading.Event
    ) -> str:
        for _attempt in range(2):
            md5, size = self._download(remote, directory, name, cancel)
            if _verified(remote, md5, size):
                return md5
        if size != remote.size:
            raise StorageFailure(
                ExitCode.INTEGRITY,
                f"{self.subject}: {remote.name} came with {size} bytes where the listing said {remote.size} "
                "(2 attempts; changed while staging?)",
            )
        raise StorageFailure(
            ExitCode.INTEGRITY,
            f"{self.subject}: {remote.name} does not match its Content-MD5 (2 attempts)",
        )

    def _download(
        self, remote: RemoteFile, directory: Directory, name: str, cancel: threading.Event
    ) -> tuple[str, int]:
        """The blob into a temp file of its own, moved onto `name` only when verified; its MD5 and length."""
        temp, fd = directory.new_temp()
        try:
            with os.fdopen(fd, "wb") as out:
                if remote.size >= self.large_file_bytes:
                    md5 = self._download_ranges(remote, out)
                else:
                    md5 = self._download_stream(remote, out, cancel)
                out.flush()
                if self.fsync:
                    os.fsync(out.fileno())
                size = os.fstat(out.fileno()).st_size
            if _verified(remote, md5, size):
                directory.replace(temp, name)
            return md5, size
        finally:
            directory.remove(temp)

    def _download_stream(self, remote: RemoteFile, out: BinaryIO, cancel: threading.Event) -> str:
        digest = hashlib.md5(usedforsecurity=False)
        for chunk in self.client().download_blob(remote.name).chunks():
            if cancel.is_set():
                raise StorageFailure(ExitCode.STORAGE, "cancelled")
            out.write(chunk)
            digest.update(chunk)
            self.progress.add_bytes(len(chunk))
        return base64.b64encode(digest.digest()).decode()

    def _download_ranges(self, remote: RemoteFile, out: BinaryIO) -> str:
        """A large blob (a tar shard, a TFRecord file) in parallel ranges, so one big file does not leave
        the other threads idle at the end of a run; hashed from disk afterwards (ranges land out of order)."""
        sent = 0

        def hook(current: int, _total: int | None) -> None:
            nonlocal sent
            self.progress.add_bytes(current - sent)
            sent = current

        stream = self.client().download_blob(
            remote.name, max_concurrency=self.range_concurrency, progress_hook=hook
        )
        stream.readinto(out)
        out.flush()
        self.progress.add_bytes(remote.size - sent)
        return fd_md5_b64(out.fileno())


def _verified(remote: RemoteFile, md5: str, size: int) -> bool:
    """The listing's length always (a blob without Content-MD5 has only that), and its MD5 when it has one."""
    return size == remote.size and (remote.md5 is None or md5 == remote.md5)


def _marker_text(prefix: str, snapshot: ProgressSnapshot) -> str:
    body = {
        "prefix": prefix,
        "files": snapshot.files_total,
        "bytes": snapshot.bytes_total,
        "finishedAt": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return json.dumps(body) + "\n"
