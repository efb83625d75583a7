"""Transfer progress: thread-safe counters, and the JSON snapshot the stager publishes for the operator.

The stager prints one `DTJOB_PROGRESS {...}` line per interval and writes the same JSON to its progress file;
`parse_progress` finds the latest snapshot in a log tail, so the operator can surface files, bytes and rate
in the job's status without any extra channel.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

PROGRESS_MARKER = "DTJOB_PROGRESS "


@dataclass(frozen=True)
class ProgressSnapshot:
    phase: str  # listing | transferring | done | failed
    files_total: int
    files_done: int  # transferred in this run
    files_skipped: int  # already present and verified
    bytes_total: int
    bytes_done: int
    bytes_skipped: int
    elapsed_s: float
    bytes_per_s: float
    reason: str = ""

    @property
    def files_complete(self) -> int:
        return self.files_done + self.files_skipped

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def to_status(self) -> dict[str, Any]:
        """The camelCase shape for `status.staging` in the job's status."""
        return {
            "phase": self.phase,
            "filesTotal": self.files_total,
            "filesCompleted": self.files_complete,
            "filesSkipped": self.files_skipped,
            "bytesTotal": self.bytes_total,
            "bytesCompleted": self.bytes_done + self.bytes_skipped,
            "bytesPerSecond": round(self.bytes_per_s),
            **({"reason": self.reason} if self.reason else {}),
        }

    @classmethod
    def from_json(cls, text: str) -> ProgressSnapshot:
        raw = json.loads(text)
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in names})


def parse_progress(log_text: str) -> ProgressSnapshot | None:
    """The last progress snapshot in a stager log (or None when it has printed none yet)."""
    for line in reversed(log_text.splitlines()):
        start = line.find(PROGRESS_MARKER)
        if start < 0:
            continue
        try:
            return ProgressSnapshot.from_json(line[start + len(PROGRESS_MARKER) :])
        except (ValueError, TypeError):
            continue
    return None


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

    def add_bytes(self, size: int) -> None:
        with self._lock:
            self.bytes_done += size

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1

    def set_phase(self, phase: str, reason: str = "") -> None:
        with self._lock:
            self.phase, self.reason = phase, reason

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
