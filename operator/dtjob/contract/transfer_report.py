"""What a Blob Storage transfer reports: its exit status and its progress snapshot. Pure.

The stager (in its pod) and `dtjob data` (on a workstation) write them; the operator reads them back. The
stager prints one `DTJOB_PROGRESS {...}` line per interval, and its final snapshot is its termination message;
`parse_progress` finds the latest snapshot in a log tail, so the operator can surface files, bytes and rate in
the job's status without any extra channel.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any

from dtjob.printable import printable


class ExitCode(IntEnum):
    """Exit statuses of the stager (the operator maps them to reasons) and of the `dtjob` commands, which
    add 1 and 130 (dtjob.cli.main.EXIT_CODES, shown by `dtjob --help`)."""

    OK = 0
    USAGE = 2  # bad arguments or unreadable credential files
    DENIED = 3  # 401/403: missing, expired, tampered or under-privileged credentials
    NOT_FOUND = 4  # container missing, or nothing under the prefix
    LOCAL_IO = 5  # the destination (or source tree) could not be read or written
    STORAGE = 6  # any other storage error, after the SDK's own retries
    INTEGRITY = 7  # downloaded content does not match the blob's MD5


PROGRESS_MARKER = "DTJOB_PROGRESS "
# The phase of a stager waiting for another stager to finish writing the same destination.
WAITING_PHASE = "waiting"


@dataclass(frozen=True)
class ProgressSnapshot:
    phase: str  # waiting | listing | transferring | done | failed
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
        """ValueError for anything but an object whose fields have their types (a pod's termination message
        or log line is not trusted to be the stager's)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a progress snapshot is an object, got {type(raw).__name__}")
        fields = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        for key, value in fields.items():
            wanted = _FIELD_TYPES[str(cls.__dataclass_fields__[key].type)]
            if isinstance(value, bool) or not isinstance(value, wanted):
                raise ValueError(f"progress snapshot field {key} has the wrong type")
            if isinstance(value, str):  # it goes into the job's status: no longer than the stager writes it
                fields[key] = printable(value[:SNAPSHOT_TEXT_MAX_CHARS])
        return cls(**fields)


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float)}
# A snapshot's text (its phase, a failure's reason) as the status keeps it: the stager's reasons are one line.
SNAPSHOT_TEXT_MAX_CHARS = 512


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
