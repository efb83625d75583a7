"""Checkpoint files named by the number of completed epochs; the highest one is where a restart resumes.

Only rank 0 reads or writes them. The trainers broadcast the restored state to the other ranks, so the
checkpoint directory needs to exist on rank 0's volume only.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_NAME = re.compile(r"^epoch-(\d{4,})(\..+)?$")
KEEP = 2


def path_for(directory: Path, epochs_done: int, suffix: str) -> Path:
    return directory / f"epoch-{epochs_done:04d}{suffix}"


def latest(directory: Path | None) -> tuple[int, Path] | None:
    """(completed epochs, path) of the newest checkpoint, or None when there is none to resume from."""
    if directory is None or not directory.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for entry in directory.iterdir():
        m = _NAME.match(entry.name)
        # A name the temp+rename protocol left half-written starts with '.', so it never matches.
        if m:
            found.append((int(m.group(1)), entry))
    return max(found) if found else None


def prune(directory: Path, keep: int = KEEP) -> None:
    """Delete all but the newest `keep` checkpoints (a file for PyTorch, a directory for TensorFlow)."""
    entries = sorted((int(m.group(1)), e) for e in directory.iterdir() if (m := _NAME.match(e.name)))
    for _, old in entries[:-keep]:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
