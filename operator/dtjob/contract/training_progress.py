"""Training progress from the launcher's log: the last `DTJOB_PROGRESS {json}` line rank 0 printed.

Rank 0 prints one such line per log interval (see training/dtjob_train/progress.py); horovodrun and mpirun
forward every rank's stdout to the launcher, sometimes behind a rank tag such as `[1,0]<stdout>:`. Pure.

Percent done and the ETA come from the record alone. Steps done count from the record's epoch and step, which
a resumed run takes from its checkpoint; the rate is the trainer's own (`stepsPerSec`: steps over wall-clock
time since this launch's first step), so it never holds time from before a restart, and a world of another
size (always a new launch) measures its own. A trainer without that field that gives the images per step of
all ranks (`globalBatch`) is timed by its images/sec instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from dtjob.printable import printable
from dtjob.timefmt import format_span

# The trainers' progress line (dtjob_train.progress): this prefix, a space, the record.
PROGRESS_PREFIX = "DTJOB_PROGRESS"
# The record is flat JSON. mpirun's --tag-output sometimes writes the next tag on the same line, after the
# record (`...}[1,0]<stdout>:`), so nothing may be required after the closing brace.
PROGRESS_LINE = re.compile(PROGRESS_PREFIX + r" (\{[^{}]*\})")
INT64_MAX = 2**63 - 1
# How the summary ends when an ETA is known (estimate() and without_eta() agree on it).
ETA_SUFFIX = re.compile(r" ETA \S+$")
# RFC 3339 with nanoseconds and an offset is 35 characters.
UPDATED_AT_MAX_CHARS = 40


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
    # An RFC 3339 time, as the trainer writes it; the log is the job's own, so a long string is cut, not
    # copied into status whole (up to the tail's 64 KiB).
    progress["updatedAt"] = printable(str(record.get("updatedAt") or "")[:UPDATED_AT_MAX_CHARS])
    rate = f"{images_per_sec:.0f}" if math.isfinite(images_per_sec) else str(images_per_sec)
    summary = f"epoch {epoch}/{epochs} step {step}/{steps} {rate} img/s loss {loss:.3f}"
    progress["summary"] = summary + _add_estimate(progress, record)
    return progress


def _add_estimate(progress: dict[str, Any], record: dict[str, Any]) -> str:
    """Percent done, the ETA and what they rest on, into `progress`; returns the summary's tail for them."""
    steps_per_sec = measured_steps_per_sec(record)
    for key in ("worldSize", "globalBatch"):  # which world measured the rate, and what a step is
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT64_MAX:
            progress[key] = value
    if steps_per_sec is not None:
        progress["stepsPerSec"] = float(f"{steps_per_sec:.4g}")
    epoch, epochs, step, steps = (progress[k] for k in ("epoch", "epochs", "step", "stepsPerEpoch"))
    percent, eta = estimate(epoch, epochs, step, steps, steps_per_sec)
    tail = ""
    if percent is not None:
        progress["percent"] = percent
        tail += f" {percent:.1f}%"
    if eta is not None:
        progress["etaSeconds"], progress["eta"] = eta, format_span(eta)
        tail += f" ETA {progress['eta']}"
    return tail


def _positive(value: Any) -> float | None:
    """A finite number above zero (never a bool), or None: an optional field that is unusable is left out."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value) if not isinstance(value, int) or abs(value) <= INT64_MAX else math.inf
    return number if math.isfinite(number) and number > 0 else None


def measured_steps_per_sec(record: dict[str, Any]) -> float | None:
    """The run's rate in steps/sec: the trainer's `stepsPerSec`, None until it has measured one (null in a
    first record, a NaN or infinite rate). Only a trainer that has no such field is timed by `imagesPerSec`
    over `globalBatch`: the last interval's rate, maybe a warm-up's, is no pace for one that has."""
    if "stepsPerSec" in record:
        return _positive(record["stepsPerSec"])
    images, batch = _positive(record.get("imagesPerSec")), _positive(record.get("globalBatch"))
    return None if images is None or batch is None else images / batch


def estimate(
    epoch: int, epochs: int, step: int, steps_per_epoch: int, steps_per_sec: float | None
) -> tuple[float | None, int | None]:
    """(percent of the planned steps done, floored to 0.1 so 100.0 means finished; seconds left at the rate,
    rounded up). epoch is 1-based, step counts the steps done in it. No percent for a run with no steps
    planned; no ETA without a rate, or for one too slow to count; a finished run is 100% with 0 left."""
    planned = epochs * steps_per_epoch
    if planned <= 0:
        return None, None
    done = min(max(epoch - 1, 0) * steps_per_epoch + min(step, steps_per_epoch), planned)
    percent = done * 1000 // planned / 10
    if done == planned:
        return percent, 0
    if steps_per_sec is None or not math.isfinite(steps_per_sec) or steps_per_sec <= 0:
        return percent, None
    seconds = (planned - done) / steps_per_sec
    return percent, (math.ceil(seconds) if seconds <= INT64_MAX else None)


def without_eta(progress: Mapping[str, Any]) -> dict[str, Any]:
    """The progress with its ETA taken out (field and summary), for when no world trains at the pace it was
    timed at (a restart, a suspend, a failure). Percent done stays true."""
    kept = {k: v for k, v in progress.items() if k not in ("etaSeconds", "eta")}
    if isinstance(kept.get("summary"), str):
        kept["summary"] = ETA_SUFFIX.sub("", kept["summary"])
    return kept
