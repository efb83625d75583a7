"""Training progress from the launcher's log: the last `DTJOB_PROGRESS {json}` line rank 0 printed.

Rank 0 prints one such line per log interval (see training/dtjob_train/progress.py); horovodrun and mpirun
forward every rank's stdout to the launcher, sometimes behind a rank tag such as `[1,0]<stdout>:`. Pure.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# The trainers' progress line (dtjob_train.progress): this prefix, a space, the record.
PROGRESS_PREFIX = "DTJOB_PROGRESS"
# The record is flat JSON. mpirun's --tag-output sometimes writes the next tag on the same line, after the
# record (`...}[1,0]<stdout>:`), so nothing may be required after the closing brace.
PROGRESS_LINE = re.compile(PROGRESS_PREFIX + r" (\{[^{}]*\})")
INT64_MAX = 2**63 - 1


def latest_progress(log_text: str) -> dict[str, Any] | None:
    """The newest well-formed progress record in the log, as `status.progress`; None if there is none."""
    for line in reversed(log_text.splitlines()):
        match = PROGRESS_LINE.search(line)
        if match is None:
            continue
        try:
            record = json.loads(match.group(1))
        except ValueError:
            # A line cut by the log tail or interleaved with another rank's output (JSONDecodeError), or an
            # integer too long for Python to convert (a plain ValueError).
            continue
        progress = _status_progress(record)
        if progress is not None:
            return progress
    return None


def _status_progress(record: Any) -> dict[str, Any] | None:
    if not isinstance(record, dict):
        return None
    try:
        # int() of an infinite float (json reads `Infinity` and `1e999` as one) raises OverflowError.
        epoch, epochs = int(record["epoch"]), int(record["epochs"])
        step, steps = int(record["step"]), int(record["stepsPerEpoch"])
        images_per_sec = float(record["imagesPerSec"])
        loss = float(record["loss"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if not all(0 <= n <= INT64_MAX for n in (epoch, epochs, step, steps)):
        return None  # status holds int64 counters: the API server refuses a patch with anything larger
    progress: dict[str, Any] = {"epoch": epoch, "epochs": epochs, "step": step, "stepsPerEpoch": steps}
    # A diverged run reports a NaN or infinite loss (Python's json writes them as NaN/Infinity): status is
    # JSON, which has no such numbers, and the API server refuses the whole patch. The field is left out and
    # the summary says what rank 0 saw.
    if math.isfinite(images_per_sec):
        progress["imagesPerSec"] = round(images_per_sec, 1)
    if math.isfinite(loss):
        progress["loss"] = round(loss, 4)
    progress["updatedAt"] = str(record.get("updatedAt") or "")
    rate = f"{images_per_sec:.0f}" if math.isfinite(images_per_sec) else str(images_per_sec)
    progress["summary"] = f"epoch {epoch}/{epochs} step {step}/{steps} {rate} img/s loss {loss:.3f}"
    return progress
