"""The operator's resident memory, as the attacks that try to fill it measure it."""

from __future__ import annotations

import re
import time
from pathlib import Path


def resident(pid: int) -> int:
    """VmRSS of a process, in bytes."""
    match = re.search(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert match
    return int(match.group(1)) * 1024


def peak_growth(pid: int, before: int, seconds: float) -> int:
    """How far above `before` the process's resident memory rose over the next `seconds`, sampled twice a
    second: what a watch delivers shows within a second or two, and what is kept stays."""
    peak = before
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, resident(pid))
        time.sleep(0.5)
    return peak - before


def peak_resident(pid: int) -> int:
    """VmHWM of a process, the most it has been resident, in bytes."""
    match = re.search(r"^VmHWM:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert match
    return int(match.group(1)) * 1024
