"""Upload a local tree under a blob prefix: parallel, resumable (a blob with the same size and Content-MD5 is
left alone), every blob stored with its Content-MD5 so downloads can verify it and the stager can skip it."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dtjob.azure.download import RemoteFile, file_md5_b64, list_remote
from dtjob.azure.errors import StorageFailure
from dtjob.azure.manifest import PART_SUFFIX
from dtjob.azure.parallel import retry_once_on_denial, run_bounded
from dtjob.azure.progress import Progress
from dtjob.contract.results_upload import manifest_text
from dtjob.contract.transfer_report import ExitCode, ProgressSnapshot
from dtjob.names import directory_prefix

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


@dataclass(frozen=True)
class LocalFile:
    path: Path
    rel: str  # POSIX path under the root
    size: int


def walk_tree(root: Path) -> list[LocalFile]:
    """Every regular file under `root`, checked readable up front so a bad tree fails before any upload."""
    if not root.is_dir():
        raise StorageFailure(ExitCode.USAGE, f"{root} is not a directory")
    files: list[LocalFile] = []
    unreadable: list[str] = []

    def on_error(err: OSError) -> None:
        unreadable.append(f"{err.filename}: {err.strerror}")

    for dirpath, _dirs, names in os.walk(root, onerror=on_error):
        for name in sorted(names):
            path = Path(dirpath) / name
            if path.is_symlink() and not path.exists():
                unreadable.append(f"{path}: broken symbolic link")
                continue
            if name.endswith(PART_SUFFIX) or not path.is_file():
                continue
            try:
                with path.open("rb"):
                    pass
                files.append(LocalFile(path, path.relative_to(root).as_posix(), path.stat().st_size))
            except OSError as err:
                unreadable.append(f"{path}: {err.strerror}")
    if unreadable:
        shown = "; ".join(unreadable[:3]) + (
            f" (and {len(unreadable) - 3} more)" if len(unreadable) > 3 else ""
        )
        raise StorageFailure(
            ExitCode.LOCAL_IO, f"cannot read {len(unreadable)} file(s) under {root}: {shown}"
        )
    return files


def blob_name(prefix: str, rel: str) -> str:
    return directory_prefix(prefix) + rel


@dataclass
class Uploader:
    client: Callable[[], ContainerClient]
    refresh: Callable[[], None]
    progress: Progress
    subject: str  # e.g. "output container results"
    credentials_hint: str
    concurrency: int = 8
    # Skip files already uploaded with the same size and MD5, which takes listing the prefix first. Off for
    # a write-only SAS (a job's output SAS carries no list permission): every file is uploaded.
    skip_existing: bool = True
    # With a name: once every file is up, a manifest of them (dtjob.contract.results_upload) is written last
    # under it, so storage says the tree is complete. A local file of that name is not uploaded.
    manifest: str | None = None

    def run(self, root: Path, prefix: str) -> ProgressSnapshot:
        try:
            files = [f for f in walk_tree(root) if f.rel != self.manifest]
            remote: dict[str, RemoteFile] = {}
            if self.skip_existing:
                listed = retry_once_on_denial(
                    lambda: list_remote(self.client(), directory_prefix(prefix)), self.refresh
                )
                remote = {r.name: r for r in listed}
            self.progress.planned(len(files), sum(f.size for f in files))
            self.progress.set_phase("transferring")

            def work(local: LocalFile, cancel: threading.Event) -> None:
                if not cancel.is_set():
                    self._one(local, blob_name(prefix, local.rel), remote.get(blob_name(prefix, local.rel)))

            run_bounded(files, work, self.concurrency, "upload")
            if self.manifest is not None:
                text = manifest_text({f.rel: f.size for f in files}).encode()
                name = blob_name(prefix, self.manifest)
                retry_once_on_denial(
                    lambda: self.client().upload_blob(name, text, overwrite=True), self.refresh
                )
        except Exception as err:
            raise self.progress.failed(err, self.subject, self.credentials_hint) from err
        self.progress.set_phase("done")
        return self.progress.snapshot()

    def _one(self, local: LocalFile, name: str, existing: RemoteFile | None) -> None:
        md5 = file_md5_b64(local.path)
        if existing is not None and existing.size == local.size and existing.md5 == md5:
            self.progress.skipped(local.size)
            return
        retry_once_on_denial(lambda: self._put(local, name, md5), self.refresh)
        self.progress.file_done()

    def _put(self, local: LocalFile, name: str, md5: str) -> None:
        sent = 0

        def hook(current: int, _total: int | None) -> None:
            nonlocal sent
            self.progress.add_bytes(current - sent)
            sent = current

        from azure.storage.blob import ContentSettings

        settings = ContentSettings(content_md5=bytearray(base64.b64decode(md5)))
        with local.path.open("rb") as data:
            self.client().upload_blob(
                name, data, length=local.size, overwrite=True, content_settings=settings, progress_hook=hook
            )
        self.progress.add_bytes(local.size - sent)
