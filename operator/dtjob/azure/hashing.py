"""Record a Content-MD5 on the blobs under a prefix that have none, so downloads verify their bytes and not
only their length.

Other tools (azcopy without --put-md5, Storage Explorer, any Put Block List upload) leave a blob without
Content-MD5. Each such blob is read, hashed, and given its MD5 with Set Blob Properties, its other content
settings kept. The read and the write are both conditioned on the ETag the listing gave, so a blob rewritten
meanwhile is never given the hash of bytes it no longer holds: it is left without one and reported.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from dtjob.azure.errors import describe_storage_error
from dtjob.azure.parallel import run_bounded
from dtjob.azure.progress import Progress

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient, ContentSettings

T = TypeVar("T")

# What each step needs of the credentials, named in the error when storage refuses it.
NEEDS_LIST = "list permission (l in a SAS; any Storage Blob Data role)"
NEEDS_READ = "read permission on the blobs (r in a SAS; Storage Blob Data Reader or above)"
NEEDS_WRITE = "write permission on the blobs (w in a SAS; Storage Blob Data Contributor or above)"


@dataclass(frozen=True)
class Listed:
    """One blob version as the listing gave it."""

    name: str
    size: int
    etag: str
    settings: ContentSettings  # content type, encoding, language, disposition, cache control, MD5

    @property
    def has_md5(self) -> bool:
        return bool(self.settings.content_md5)


class Outcome(Enum):
    HASHED = "hashed"
    HAD_ONE = "already had one"
    CHANGED = "changed meanwhile"


def list_blobs(client: ContainerClient, prefix: str) -> list[Listed]:
    """Every blob under `prefix` (directory markers aside), with the listed version's content settings."""
    return [
        Listed(blob.name, int(blob.size), str(blob.etag), blob.content_settings)
        for blob in client.list_blobs(name_starts_with=prefix or None)
        if not blob.name.endswith("/")
    ]


def read_md5(client: ContainerClient, blob: Listed, on_bytes: Callable[[int], None]) -> bytes | None:
    """The MD5 of the listed version's bytes, or None when the blob changed or went away since the listing.

    The SDK conditions every range after the first on the first one's ETag, so one version is read whole."""
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

    digest = hashlib.md5(usedforsecurity=False)
    try:
        stream = client.get_blob_client(blob.name).download_blob(
            etag=blob.etag, match_condition=MatchConditions.IfNotModified
        )
        for chunk in stream.chunks():
            digest.update(chunk)
            on_bytes(len(chunk))
    except (ResourceModifiedError, ResourceNotFoundError):
        return None
    return digest.digest()


def record_md5(client: ContainerClient, blob: Listed, md5: bytes) -> bool:
    """Store `md5` as the blob's Content-MD5, keeping its other content settings (Set Blob Properties clears
    whatever it is not given), only while the blob is still the version listed; False when it is not."""
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
    from azure.storage.blob import ContentSettings

    kept = blob.settings
    settings = ContentSettings(
        content_type=kept.content_type,
        content_encoding=kept.content_encoding,
        content_language=kept.content_language,
        content_disposition=kept.content_disposition,
        cache_control=kept.cache_control,
        content_md5=bytearray(md5),
    )
    try:
        client.get_blob_client(blob.name).set_http_headers(
            settings, etag=blob.etag, match_condition=MatchConditions.IfNotModified
        )
    except (ResourceModifiedError, ResourceNotFoundError):
        return False
    return True


@dataclass
class Summary:
    hashed: int = 0
    had_one: int = 0
    changed: list[str] = field(default_factory=list)  # names of blobs rewritten or deleted meanwhile


@dataclass
class Hasher:
    """One run over a prefix: list, then hash and record every blob without Content-MD5 in parallel."""

    client: ContainerClient
    progress: Progress
    subject: str  # e.g. "container datasets" in messages
    credentials_hint: str
    concurrency: int = 8
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self, prefix: str) -> Summary:
        summary = Summary()
        try:
            listed = self._step("listing the blobs", NEEDS_LIST, lambda: list_blobs(self.client, prefix))
            todo = [b for b in listed if not b.has_md5]
            summary.had_one = len(listed) - len(todo)
            self.progress.planned(len(listed), sum(b.size for b in listed))
            self.progress.skipped_files(summary.had_one, sum(b.size for b in listed if b.has_md5))
            self.progress.set_phase("transferring")

            def work(blob: Listed, cancel: threading.Event) -> None:
                if cancel.is_set():
                    return
                outcome = self.hash_one(blob)
                with self._lock:
                    if outcome is Outcome.HASHED:
                        summary.hashed += 1
                    elif outcome is Outcome.CHANGED:
                        summary.changed.append(blob.name)

            run_bounded(todo, work, self.concurrency, "hash")
        except Exception as err:
            raise self.progress.failed(err, self.subject, self.credentials_hint) from err
        summary.changed.sort()
        self.progress.set_phase("done")
        return summary

    def hash_one(self, blob: Listed) -> Outcome:
        """Read one listed blob and record its MD5; CHANGED when it is no longer the version listed."""
        if blob.has_md5:
            return Outcome.HAD_ONE
        read = 0

        def on_bytes(size: int) -> None:
            nonlocal read
            read += size
            self.progress.add_bytes(size)

        md5 = self._step(f"reading {blob.name}", NEEDS_READ, lambda: read_md5(self.client, blob, on_bytes))
        record = f"recording the Content-MD5 of {blob.name}"
        if md5 is None or not self._step(record, NEEDS_WRITE, lambda: record_md5(self.client, blob, md5)):
            # Passed over, so the bar still reaches its end.
            self.progress.skipped(max(blob.size - read, 0))
            return Outcome.CHANGED
        self.progress.file_done()
        return Outcome.HASHED

    def _step(self, what: str, needs: str, action: Callable[[], T]) -> T:
        """Run one step; a failure names the step and, on a denial, the permission it needs."""
        try:
            return action()
        except Exception as err:
            hint = f"{self.credentials_hint}; recording hashes needs {needs}"
            raise describe_storage_error(err, f"{self.subject}: {what}", hint) from err
