"""Stage a container prefix onto a local (or NFS) directory: parallel, resumable, atomic per file.

A file counts as present when it has the blob's size and either the manifest records the same blob version
(ETag or MD5) or its content hashes to the blob's Content-MD5. Everything else is downloaded to a hidden temp
name beside its destination, checked against Content-MD5 when the blob has one, and renamed into place, so a
file under its final name is always complete. A blob without Content-MD5 can be checked by its length only;
the run says how many it fetched so (`dtjob data hash` records one). A run that fails removes its temp files
and never writes the completion marker.
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
from dtjob.azure.manifest import (
    COMPLETE_NAME,
    MANIFEST_NAME,
    PART_SUFFIX,
    Entry,
    ManifestWriter,
    load_manifest,
)
from dtjob.azure.parallel import retry_once_on_denial, run_bounded
from dtjob.azure.progress import Progress
from dtjob.contract.transfer_report import ExitCode, ProgressSnapshot
from dtjob.datasets.imagenet_layout import is_marker
from dtjob.names import directory_prefix

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

ClientFactory = Callable[[], "ContainerClient"]
HASH_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the blob name
    rel: str  # its path under the destination
    size: int
    etag: str
    md5: str | None  # base64 Content-MD5, when the blob has one


# How many stale local paths the stager names in its report (the count covers all of them).
STALE_SHOWN = 10


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
    marker at the destination's root, or a temp file (swept as a killed run's leftover)."""
    if remote.rel in (MANIFEST_NAME, COMPLETE_NAME) or PurePosixPath(remote.rel).name.endswith(PART_SUFFIX):
        raise StorageFailure(
            ExitCode.USAGE,
            f"blob name {remote.name!r} collides with the stager's own bookkeeping files "
            f"({MANIFEST_NAME}, {COMPLETE_NAME}, *{PART_SUFFIX}): rename or remove it",
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


def file_md5_b64(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return base64.b64encode(digest.digest()).decode()


def is_present(local: Path, remote: RemoteFile, entry: Entry | None) -> bool:
    try:
        if local.stat().st_size != remote.size:
            return False
    except FileNotFoundError:
        return False
    if entry is not None and entry.size == remote.size and _same_version(entry, remote):
        return True
    return remote.md5 is not None and file_md5_b64(local) == remote.md5


def _same_version(entry: Entry, remote: RemoteFile) -> bool:
    return entry.etag == remote.etag or (remote.md5 is not None and entry.md5 == remote.md5)


def sweep_partial_files(dest: Path) -> int:
    """Remove temp files a killed run left behind."""
    removed = 0
    for dirpath, _dirs, names in os.walk(dest):
        for name in names:
            if name.endswith(PART_SUFFIX):
                (Path(dirpath) / name).unlink(missing_ok=True)
                removed += 1
    return removed


def stale_files(dest: Path, listed: set[str]) -> list[str]:
    """Files under dest that the listing no longer has (its own bookkeeping aside), sorted."""
    stale = []
    for dirpath, _dirs, names in os.walk(dest):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(dest).as_posix()
            if rel in (MANIFEST_NAME, COMPLETE_NAME) or name.endswith(PART_SUFFIX) or rel in listed:
                continue
            stale.append(rel)
    return sorted(stale)


def report_stale(dest: Path, listed: set[str], prefix: str, shown: int = STALE_SHOWN) -> list[str]:
    """Stale files are kept, never deleted (the destination may hold what a job or a person put there), and
    reported on stderr: how many, and the first few paths."""
    stale = stale_files(dest, listed)
    if stale:
        more = f" and {len(stale) - shown} more" if len(stale) > shown else ""
        print(
            f"stager: kept {len(stale)} local file(s) under {dest} that are not under prefix {prefix!r}: "
            f"{', '.join(stale[:shown])}{more}",
            file=sys.stderr,
            flush=True,
        )
    return stale


def report_unhashed(count: int, prefix: str) -> None:
    """One line on stderr when blobs without Content-MD5 were fetched: their bytes were not verified."""
    if count:
        print(
            f"stager: fetched {count} blob(s) under prefix {prefix!r} without Content-MD5, checked by their "
            "length only; `dtjob data hash` records one for them",
            file=sys.stderr,
            flush=True,
        )


def part_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{PART_SUFFIX}")


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
    # Blobs fetched in this run that had no Content-MD5 (checked by length only).
    unhashed: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self, prefix: str) -> ProgressSnapshot:
        prefix = directory_prefix(prefix)
        try:
            self.dest.mkdir(parents=True, exist_ok=True)
            marker = self.dest / COMPLETE_NAME
            # Only a run that did not finish can have left temp files; a finished tree is not walked again.
            finished_before = marker.exists()
            marker.unlink(missing_ok=True)
            listed = retry_once_on_denial(lambda: list_remote(self.client(), prefix), self.refresh)
            # `dtjob data prepare-imagenet`'s completion markers are bookkeeping, not data.
            remotes = [r for r in listed if not r.rel.startswith(self.skip_prefixes) and not is_marker(r.rel)]
            if not remotes:
                raise StorageFailure(ExitCode.NOT_FOUND, f"{self.subject}: no blobs under prefix {prefix!r}")
            for remote in remotes:
                refuse_bookkeeping_name(remote)
            entries = load_manifest(self.dest / MANIFEST_NAME)
            if not finished_before:
                sweep_partial_files(self.dest)
            self.progress.planned(len(remotes), sum(r.size for r in remotes))
            self.progress.set_phase("transferring")
            manifest = ManifestWriter(self.dest / MANIFEST_NAME)
            try:
                self._run_all(remotes, entries, manifest)
            finally:
                manifest.close()
            report_unhashed(self.unhashed, prefix)
            report_stale(self.dest, {r.rel for r in remotes}, prefix)
            snapshot = self.progress.snapshot()
            _write_marker(marker, prefix, snapshot)
        except Exception as err:
            raise self.progress.failed(err, self.subject, self.credentials_hint) from err
        self.progress.set_phase("done")
        return self.progress.snapshot()

    def _run_all(
        self, remotes: list[RemoteFile], entries: dict[str, Entry], manifest: ManifestWriter
    ) -> None:
        def work(remote: RemoteFile, cancel: threading.Event) -> None:
            if not cancel.is_set():
                self._one(remote, entries.get(remote.rel), manifest, cancel)

        run_bounded(remotes, work, self.concurrency, "stage")

    def _one(
        self, remote: RemoteFile, entry: Entry | None, manifest: ManifestWriter, cancel: threading.Event
    ) -> None:
        final = self.dest / remote.rel
        if is_present(final, remote, entry):
            self.progress.skipped(remote.size)
            if entry is None or entry.etag != remote.etag:
                manifest.record(remote.rel, Entry(remote.size, remote.etag, remote.md5))
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        md5 = retry_once_on_denial(lambda: self._download_verified(remote, final, cancel), self.refresh)
        self.progress.file_done()
        if remote.md5 is None:
            with self._lock:
                self.unhashed += 1
        # The MD5 computed for a blob without one lets a later run know it once `dtjob data hash` records it.
        manifest.record(remote.rel, Entry(remote.size, remote.etag, remote.md5 or md5))

    def _download_verified(self, remote: RemoteFile, final: Path, cancel: threading.Event) -> str:
        for _attempt in range(2):
            md5, size = self._download(remote, final, cancel)
            if _verified(remote, md5, size):
                return md5
        part_path(final).unlink(missing_ok=True)
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

    def _download(self, remote: RemoteFile, final: Path, cancel: threading.Event) -> tuple[str, int]:
        """The blob into its temp file, moved into place only when verified; its MD5 and length."""
        part = part_path(final)
        try:
            with part.open("wb") as out:
                if remote.size >= self.large_file_bytes:
                    md5 = self._download_ranges(remote, out)
                else:
                    md5 = self._download_stream(remote, out, cancel)
                out.flush()
                if self.fsync:
                    os.fsync(out.fileno())
                size = os.fstat(out.fileno()).st_size
            if _verified(remote, md5, size):
                part.replace(final)
            return md5, size
        finally:
            part.unlink(missing_ok=True)

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
        return file_md5_b64(Path(out.name))


def _verified(remote: RemoteFile, md5: str, size: int) -> bool:
    """The listing's length always (a blob without Content-MD5 has only that), and its MD5 when it has one."""
    return size == remote.size and (remote.md5 is None or md5 == remote.md5)


def _write_marker(marker: Path, prefix: str, snapshot: ProgressSnapshot) -> None:
    body = {
        "prefix": prefix,
        "files": snapshot.files_total,
        "bytes": snapshot.bytes_total,
        "finishedAt": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    tmp = marker.with_name(marker.name + PART_SUFFIX)
    tmp.write_text(json.dumps(body) + "\n")
    tmp.replace(marker)
