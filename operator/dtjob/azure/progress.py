"""Transfer progress: the counters the transfer threads share, snapshotted as dtjob.contract.transfer_report's
ProgressSnapshot for the stager to publish."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from dtjob.azure.errors import StorageFailure, describe_storage_error
from dtjob.contract.transfer_report import ProgressSnapshot


@dataclass
class Progress:
    """Counters shared by the transfer threads."""

    phase: str = "listing"
    files_total: int = 0
    files_done: int = 0
    files_skipped: int = 0
    bytes_total: int = 0
    bytes_done: int = 0
    bytes_skipped: int = 0
    reason: str = ""
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def planned(self, files: int, size: int) -> None:
        with self._lock:
            self.files_total += files
            self.bytes_total += size

    def skipped(self, size: int) -> None:
        with self._lock:
            self.files_skipped += 1
            self.bytes_skipped += size

    def skipped_files(self, files: int, size: int) -> None:
        """A batch already done before this run (a prepared class counted by its marker)."""
        with self._lock:
            self.files_skipped += files
            self.bytes_skipped += size

    def add_bytes(self, size: int) -> None:
        with self._lock:
            self.bytes_done += size

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1

    def set_phase(self, phase: str, reason: str = "") -> None:
        with self._lock:
            self.phase, self.reason = phase, reason

    def failed(self, err: Exception, subject: str, credentials_hint: str) -> StorageFailure:
        """Record why a transfer failed, in the words describe_storage_error finds; the caller raises it."""
        failure = describe_storage_error(err, subject, credentials_hint)
        self.set_phase("failed", failure.reason)
        return failure

    def snapshot(self) -> ProgressSnapshot:
        with self._lock:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            return ProgressSnapshot(
                phase=self.phase,
                files_total=self.files_total,
                files_done=self.files_done,
                files_skipped=self.files_skipped,
                bytes_total=self.bytes_total,
                bytes_done=self.bytes_done,
                bytes_skipped=self.bytes_skipped,
                elapsed_s=round(elapsed, 3),
                bytes_per_s=round(self.bytes_done / elapsed, 1),
                reason=self.reason,
            )
