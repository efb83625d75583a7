"""Publishes progress while a transfer runs: a `DTJOB_PROGRESS {...}` line on stdout and the same JSON in a
progress file, every interval and once more at the end; the final state also goes to the termination message
file, where Kubernetes copies it into the pod's status for the operator to read."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import TextIO

from dtjob.azure.progress import Progress
from dtjob.contract.transfer_report import PROGRESS_MARKER

# Kubernetes keeps at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4000


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


class Reporter:
    def __init__(
        self,
        progress: Progress,
        interval_s: float,
        progress_file: Path | None,
        termination_file: Path | None,
        out: TextIO = sys.stdout,
    ) -> None:
        self.progress = progress
        self.interval_s = interval_s
        self.progress_file = progress_file
        self.termination_file = termination_file
        self.out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def __enter__(self) -> Reporter:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        text = self.publish()
        if self.termination_file is not None:
            try:
                self.termination_file.write_text(text[:TERMINATION_LIMIT])
            except OSError as write_err:
                print(f"cannot write the termination message: {write_err.strerror}", file=sys.stderr)

    def publish(self) -> str:
        text = self.progress.snapshot().to_json()
        print(PROGRESS_MARKER + text, file=self.out, flush=True)
        if self.progress_file is not None:
            _write_atomically(self.progress_file, text + "\n")
        return text

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()
