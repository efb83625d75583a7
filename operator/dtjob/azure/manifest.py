"""The staging manifest: which files a destination already holds, and from which blob version.

An append-only JSON-lines file, one line per finished file, flushed as files land: a stager killed at any
moment leaves a valid manifest (a torn last line is ignored), and a dataset of a million files costs one short
append per file instead of rewriting a large document.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import IO

MANIFEST_NAME = ".dtjob-manifest.jsonl"
COMPLETE_NAME = ".dtjob-staged.json"
PART_SUFFIX = ".dtjob-part"
# Locked by the stager writing the destination (dtjob.azure.stage_lock): a directory holding one is one.
LOCK_NAME = ".dtjob-stage.lock"


@dataclass(frozen=True)
class Entry:
    size: int
    etag: str
    md5: str | None  # base64, as Blob Storage reports Content-MD5


def parse_manifest(text: str) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for line in text.splitlines():
        try:
            raw = json.loads(line)
            entries[raw["path"]] = Entry(int(raw["size"]), str(raw["etag"]), raw.get("md5"))
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill mid-append
    return entries


class ManifestWriter:
    """Appends entries from many threads to the file open at `fd` (for appending); each line is written with
    one write() and flushed."""

    def __init__(self, fd: int) -> None:
        self._file: IO[str] = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, rel_path: str, entry: Entry) -> None:
        line = json.dumps({"path": rel_path, "size": entry.size, "etag": entry.etag, "md5": entry.md5})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
