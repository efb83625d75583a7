"""What rank 0 tells the world: interval log lines, the progress file the operator reads, the final metrics.

Only rank 0 constructs a Reporter with ``enabled=True``; the other ranks get a silent one, so trainer code
calls it unconditionally after the collective (loss averaging) it needs.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dtjob.contract.training_progress import PROGRESS_PREFIX

from .cli import TrainConfig


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Temp file in the same directory + rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=None, separators=(",", ":"))
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# The spread, as Horovod's synthetic benchmark gives it: 1.96 standard deviations of the intervals' rates.
CONFIDENCE_Z = 1.96


@dataclass(frozen=True)
class Interval:
    """One closed log interval: the images its steps trained on and the seconds they took."""

    images: int
    seconds: float
    steps: int = 1

    @property
    def rate(self) -> float:
        return self.images / max(self.seconds, 1e-9)


@dataclass
class Throughput:
    """Images/sec per worker over training steps only: the counted intervals' images over their time.

    Images over time, not a mean of interval rates: an epoch's short tail interval (one step whose batch the
    loader had already prefetched) then weighs by its seconds, not like a full interval, and a starved
    pipeline's stalls count for as long as they lasted.

    Every epoch's first interval is a warm-up and not counted: the first epoch's builds the graph, autotunes
    cuDNN and fills the pipeline; every later one's restarts the loader. Validation and checkpointing happen
    between epochs, after the last interval closed and before the next epoch's clock starts, so no counted
    interval contains them.
    """

    clock: Callable[[], float] = time.perf_counter
    intervals: list[Interval] = field(default_factory=list)
    started: float = field(init=False)
    last_mark: float = field(init=False)
    images_since_mark: int = 0
    steps_since_mark: int = 0
    all_images: int = 0
    warm: bool = False
    # Seconds from the clock's start to the end of the first step: start-up, cuDNN autotuning, compilation.
    first_step_seconds: float | None = None
    steps_done: int = 0  # steps this launch trained, all epochs

    @property
    def steps_per_sec(self) -> float | None:
        """This launch's pace for an ETA: steps after the first over the wall-clock time since it ended, so
        validation, checkpoints and loader restarts count as they will again, and start-up does not. None
        until a step after the first is done."""
        if self.first_step_seconds is None or self.steps_done < 2:
            return None
        elapsed = self.clock() - self.started - self.first_step_seconds
        return (self.steps_done - 1) / elapsed if elapsed > 0 else None

    def __post_init__(self) -> None:
        self.started = self.last_mark = self.clock()

    def new_epoch(self) -> None:
        """The epoch's first step is about to start: its interval starts now, and is a warm-up."""
        self.last_mark, self.images_since_mark, self.steps_since_mark, self.warm = self.clock(), 0, 0, False

    def add(self, images: int) -> None:
        """A step is done (its loss or a later collective has waited for the device)."""
        if self.first_step_seconds is None:
            self.first_step_seconds = self.clock() - self.started
        self.images_since_mark += images
        self.steps_since_mark += 1
        self.steps_done += 1
        self.all_images += images

    def mark(self) -> float:
        """Close an interval and return its images/sec per worker."""
        now = self.clock()
        interval = Interval(self.images_since_mark, now - self.last_mark, max(self.steps_since_mark, 1))
        if self.warm:
            self.intervals.append(interval)
        self.warm = True
        self.last_mark, self.images_since_mark, self.steps_since_mark = now, 0, 0
        return interval.rate

    def step_ms(self) -> dict[str, float] | None:
        """Percentiles (p50, p90, p99) of the counted intervals' mean step times, in milliseconds; None
        before any interval is counted. A log interval averages its steps: a spike shorter than an
        interval shows diluted."""
        per_step = sorted(1000 * i.seconds / i.steps for i in self.intervals)
        if not per_step:
            return None
        last = len(per_step) - 1
        return {f"p{round(q * 100)}": per_step[round(q * last)] for q in (0.5, 0.9, 0.99)}

    def per_worker(self) -> tuple[float, float]:
        """(images over time, 1.96 x the time-weighted standard deviation of the interval rates) of the
        counted intervals; a run too short to count any interval falls back to all images over the whole
        time, with no spread."""
        seconds = sum(i.seconds for i in self.intervals)
        if not self.intervals or seconds <= 0:
            return self.all_images / max(self.clock() - self.started, 1e-9), 0.0
        rate = sum(i.images for i in self.intervals) / seconds
        variance = sum(i.seconds * (i.rate - rate) ** 2 for i in self.intervals) / seconds
        return rate, CONFIDENCE_Z * math.sqrt(variance)


class Reporter:
    def __init__(
        self,
        *,
        enabled: bool,
        world_size: int,
        epochs: int,
        steps_per_epoch: int,
        progress_file: Path | None,
        output_dir: Path | None,
        batch_size: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.world_size = world_size
        self.batch_size = batch_size  # per worker: a step trains batch_size x world_size images
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.progress_file = progress_file
        self.output_dir = output_dir

    @classmethod
    def for_run(cls, cfg: TrainConfig, *, rank: int, world_size: int, steps_per_epoch: int) -> Reporter:
        """The run's reporter: rank 0 speaks and writes, every other rank stays silent."""
        return cls(
            enabled=rank == 0,
            world_size=world_size,
            epochs=cfg.epochs,
            steps_per_epoch=steps_per_epoch,
            progress_file=cfg.progress_file,
            output_dir=cfg.output_dir,
            batch_size=cfg.batch_size,
        )

    def say(self, message: str) -> None:
        if self.enabled:
            print(message, flush=True)

    def interval(
        self,
        *,
        epoch: int,
        step: int,
        loss: float,
        lr: float,
        per_worker: float,
        steps_per_sec: float | None = None,
    ) -> None:
        """epoch and step are 0-based counters of what has completed; printed 1-based. steps_per_sec: this
        launch's pace (Throughput.steps_per_sec), for the operator's ETA."""
        if not self.enabled:
            return
        print(
            f"epoch {epoch + 1}/{self.epochs} step {step}/{self.steps_per_epoch} loss {loss:.4f} "
            f"lr {lr:.5f} images/sec/worker {per_worker:.1f}",
            flush=True,
        )
        self.progress(epoch=epoch, step=step, loss=loss, per_worker=per_worker, steps_per_sec=steps_per_sec)

    def progress(
        self, *, epoch: int, step: int, loss: float, per_worker: float, steps_per_sec: float | None = None
    ) -> None:
        if not self.enabled:
            return
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "epochs": self.epochs,
            "step": step,
            "stepsPerEpoch": self.steps_per_epoch,
            "imagesPerSec": round(per_worker * self.world_size, 2),
            "loss": round(loss, 6),
            "updatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "worldSize": self.world_size,
        }
        if self.batch_size is not None:
            record["globalBatch"] = self.batch_size * self.world_size
        # Always present, null until measured: the operator then never times this trainer by imagesPerSec.
        record["stepsPerSec"] = None
        if steps_per_sec is not None and math.isfinite(steps_per_sec):
            record["stepsPerSec"] = round(steps_per_sec, 6)
        print(f"{PROGRESS_PREFIX} {json.dumps(record, separators=(',', ':'))}", flush=True)
        if self.progress_file is not None:
            write_json_atomic(self.progress_file, record)

    def finish(self, metrics: dict[str, Any]) -> None:
        """The closing line the reference benchmark parses, and metrics.json in the output dir."""
        if not self.enabled:
            return
        spread = metrics["imagesPerSecConfidence"]
        print(f"Img/sec per worker: {metrics['imagesPerSecPerWorker']:.1f} +-{spread:.1f}", flush=True)
        total, total_spread = metrics["totalImagesPerSec"], spread * self.world_size
        print(f"Total img/sec on {self.world_size} worker(s): {total:.1f} +-{total_spread:.1f}", flush=True)
        print(f"total images/sec: {total:.2f}", flush=True)
        if self.output_dir is not None:
            write_json_atomic(self.output_dir / "metrics.json", metrics)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
