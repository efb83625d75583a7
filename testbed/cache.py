"""Where the Makefile's builds and downloads live: $DTJOB_CACHE, by default ~/.cache/dtjob."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("DTJOB_CACHE", Path.home() / ".cache" / "dtjob"))
