"""The operator's resident memory, as the attacks that try to fill it measure it."""

from __future__ import annotations

import re
import time
from pathlib import Path


def resident(pid: int) -> int:
    """VmRSS of a process, in bytes."""
    return _status_bytes(pid, "VmRSS")


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
    return _status_bytes(pid, "VmHWM")


def _status_bytes(pid: int, field: str) -> int:
    """One of a process's memory figures in /proc/PID/status (kB there), in bytes."""
    match = re.search(rf"^{field}:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert match, f"no {field} for process {pid}"
    return int(match.group(1)) * 1024
