"""What rank 0 tells the world: interval log lines, the progress file the operator reads, the final metrics.

Only rank 0 constructs a Reporter with ``enabled=True``; the other ranks get a silent one, so trainer code
calls it unconditionally after the collective (loss averaging) it needs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .cli import TrainConfig

PROGRESS_PREFIX = "DTJOB_PROGRESS"


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


@dataclass
class Throughput:
    """Images/sec per worker, excluding the first interval (graph build, cudnn autotune, pipeline fill)."""

    started: float = field(default_factory=time.perf_counter)
    last_mark: float = field(default_factory=time.perf_counter)
    images_since_mark: int = 0
    timed_images: int = 0
    timed_seconds: float = 0.0
    intervals: int = 0
    all_images: int = 0

    def add(self, images: int) -> None:
        self.images_since_mark += images
        self.all_images += images

    def mark(self) -> float:
        """Close an interval and return its images/sec per worker."""
        now = time.perf_counter()
        seconds = max(now - self.last_mark, 1e-9)
        rate = self.images_since_mark / seconds
        if self.intervals > 0:
            self.timed_images += self.images_since_mark
            self.timed_seconds += seconds
        self.intervals += 1
        self.last_mark, self.images_since_mark = now, 0
        return rate

    def overall_per_worker(self) -> float:
        if self.timed_seconds > 0:
            return self.timed_images / self.timed_seconds
        return self.all_images / max(time.perf_counter() - self.started, 1e-9)


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
    ) -> None:
        self.enabled = enabled
        self.world_size = world_size
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
        )

    def say(self, message: str) -> None:
        if self.enabled:
            print(message, flush=True)

    def interval(self, *, epoch: int, step: int, loss: float, lr: float, per_worker: float) -> None:
        """epoch and step are 0-based counters of what has completed; printed 1-based."""
        if not self.enabled:
            return
        print(
            f"epoch {epoch + 1}/{self.epochs} step {step}/{self.steps_per_epoch} loss {loss:.4f} "
            f"lr {lr:.5f} images/sec/worker {per_worker:.1f}",
            flush=True,
        )
        self.progress(epoch=epoch, step=step, loss=loss, per_worker=per_worker)

    def progress(self, *, epoch: int, step: int, loss: float, per_worker: float) -> None:
        if not self.enabled:
            return
        record = {
            "epoch": epoch + 1,
            "epochs": self.epochs,
            "step": step,
            "stepsPerEpoch": self.steps_per_epoch,
            "imagesPerSec": round(per_worker * self.world_size, 2),
            "loss": round(loss, 6),
            "updatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        print(f"{PROGRESS_PREFIX} {json.dumps(record, separators=(',', ':'))}", flush=True)
        if self.progress_file is not None:
            write_json_atomic(self.progress_file, record)

    def finish(self, metrics: dict[str, Any]) -> None:
        """The closing line the reference benchmark parses, and metrics.json in the output dir."""
        if not self.enabled:
            return
        print(f"Img/sec per worker: {metrics['imagesPerSecPerWorker']:.1f}", flush=True)
        print(f"total images/sec: {metrics['totalImagesPerSec']:.2f}", flush=True)
        if self.output_dir is not None:
            write_json_atomic(self.output_dir / "metrics.json", metrics)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
