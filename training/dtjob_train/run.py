"""The steps every trainer takes in the same way, whatever the framework: plan the steps, resume from rank 0's
checkpoint, say the banner, count steps and log them, and finish (metrics, weight digests, the saved model).

A trainer makes one TrainingRun after ``hvd.init()`` and passes it its Horovod module (``horovod.torch`` or
``horovod.tensorflow``: both have the object collectives used here). What differs between the frameworks
(restoring a checkpoint, averaging a loss tensor, saving the model) comes in as small functions.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .cli import TrainConfig
from .common import digest, metrics_record, scan_imagenet
from .data.folder import ImageFolderDataset, Split
from .elastic import Position
from .progress import Reporter, Throughput
from .schedule import learning_rate, scaled_lr

T = TypeVar("T")
# Rank 0's restore: the checkpoint directory (None: no checkpoints) -> (epochs done, path) of the checkpoint
# it loaded into the model and optimizer, or None.
Restore = Callable[[Path | None], tuple[int, Path] | None]


def _own_listing(listing: Any) -> Any:
    return listing


class Horovod(Protocol):
    """What a TrainingRun needs of horovod.torch or horovod.tensorflow."""

    def rank(self) -> int: ...
    def size(self) -> int: ...
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any: ...
    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]: ...


class TrainingRun:
    def __init__(self, framework: str, cfg: TrainConfig, hvd: Horovod) -> None:
        """Plans the run: the data (an ImageNet folder is scanned here, and a bad one exits with a message),
        the number of classes and the steps per epoch."""
        self.framework, self.cfg, self.hvd = framework, cfg, hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.dataset: ImageFolderDataset | None = None
        if cfg.data == "synthetic":
            self.num_classes, available = cfg.num_classes, cfg.steps_per_epoch or 100
        else:
            broadcast: Callable[[Any], Any] = functools.partial(
                hvd.broadcast_object, root_rank=0, name="imagenet_listing"
            )
            scan_rank = self.rank
            if cfg.elastic:
                # Every rank lists the folder itself: one that joins a running world would wait alone in a
                # broadcast the others are not in.
                broadcast, scan_rank = _own_listing, 0
            self.dataset, available = scan_imagenet(cfg, rank=scan_rank, size=self.size, broadcast=broadcast)
            self.num_classes = len(self.dataset.train.classes)
        # Every rank must run the same number of steps (each is an allreduce): sized by the smallest shard.
        self.steps_per_epoch = min(available, cfg.steps_per_epoch or available)
        self.reporter = Reporter.for_run(
            cfg, rank=self.rank, world_size=self.size, steps_per_epoch=self.steps_per_epoch
        )
        self.start_epoch, self.global_step, self.skipped = 0, 0, 0
        self.resumed_from: Path | None = None
        self.final_loss = math.nan  # the last logged loss, averaged over the ranks
        self.val_top1: float | None = None
        self.meter = Throughput()
        # Into the metrics: what the trainer made of its "auto" flags (compile, data loader), peak memory.
        self.resolved: dict[str, Any] = {}

    @property
    def train_split(self) -> Split | None:
        """The ImageNet train/ folder, or None on synthetic data."""
        return None if self.dataset is None else self.dataset.train

    @property
    def val_split(self) -> Split | None:
        """The val/ folder when there is one and validation is not switched off (--val-steps 0)."""
        return None if self.dataset is None or self.cfg.val_steps == 0 else self.dataset.val

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where this rank saves checkpoints: rank 0 only, when --checkpoint-dir is given."""
        return self.cfg.checkpoint_dir if self.rank == 0 else None

    def resume(self, restore: Restore) -> int:
        """Rank 0 restores the newest checkpoint, and every rank learns the epoch to start from (a broadcast).

        The caller then broadcasts rank 0's weights and optimizer state, the framework's own collective.
        """
        found = restore(self.cfg.checkpoint_dir) if self.rank == 0 else None
        self.resumed_from = None if found is None else found[1]
        epochs_done = 0 if found is None else found[0]
        if self.cfg.elastic:
            # No collective before hvd.elastic.run (a joining rank would wait in it alone): the state's sync
            # hands rank 0's epoch, weights and optimizer state to every rank.
            self.start_epoch = epochs_done
        else:
            self.start_epoch = int(self.hvd.broadcast_object(epochs_done, root_rank=0, name="start_epoch"))
        self.global_step = self.start_epoch * self.steps_per_epoch
        return self.start_epoch

    def begin(self, versions: str, device: str) -> None:
        """The resume line and the banner (rank 0), and the throughput clock starts."""
        cfg = self.cfg
        if self.resumed_from is not None:
            self.reporter.say(f"resuming from {self.resumed_from}: {self.start_epoch} epochs done")
        self.reporter.say(
            f"{versions} {self._runner()}: {self.size} ranks, {cfg.arch}, {cfg.data}, "
            f"batch {cfg.batch_size}/worker, {self.steps_per_epoch} steps/epoch, {device}"
        )
        self.meter = Throughput()

    def _runner(self) -> str:
        """What formed the world: torchrun (the DDP trainers, which run without Horovod), or Horovod."""
        if self.resolved.get("runner") == "torchrun":
            return "torchrun"
        import horovod

        return f"horovod {horovod.__version__}"

    def epochs(self) -> range:
        return range(self.start_epoch, self.cfg.epochs)

    @property
    def scaled_lr(self) -> float:
        """The peak rate: --base-lr (per 256 images) x the global batch / 256."""
        return scaled_lr(self.cfg.base_lr, batch_size=self.cfg.batch_size, world_size=self.size)

    def learning_rate(self, epoch: float) -> float:
        """Warmup to the scaled rate, then cosine decay, at a fractional epoch."""
        cfg = self.cfg
        return learning_rate(
            epoch,
            base_lr=cfg.base_lr,
            batch_size=cfg.batch_size,
            world_size=self.size,
            warmup_epochs=cfg.warmup_epochs,
            epochs=cfg.epochs,
        )

    def steps(self, epoch: int, batches: Iterable[T], done: int = 0) -> Iterator[tuple[int, float, T]]:
        """(step from done + 1, learning rate, batch) for the rest of the epoch's steps_per_epoch batches
        (done: steps of this epoch already trained, when an elastic world resumes mid-epoch)."""
        self.epoch_started()
        for step, batch in enumerate(itertools.islice(batches, self.steps_per_epoch - done), done + 1):
            yield step, self.learning_rate(epoch + step / self.steps_per_epoch), batch

    @property
    def global_batch(self) -> int:
        return self.cfg.batch_size * self.size

    def start_position(self) -> Position:
        """--elastic: where the job starts, before any commit (rank 0's, after resume, is the one synced)."""
        return Position(epoch=self.start_epoch, resumed_from=self.start_epoch)

    def rejoin(self, committed: Position) -> Position:
        """--elastic: the world as it is after a (re)start of the training function, and where it resumes.

        Rank, size and the rank-0 reporter follow the new world (the learning rate, scaled by the world size,
        follows with them). The throughput clock restarts: the time of the resize is not training, and a rate
        of the old world is not mixed with one of the new. Steps this rank trained past the commit are redone
        (one collective: every rank agrees on the count). Returns the position with the world recorded."""
        reached, first = self.global_step, not committed.world_sizes
        self.rank, self.size = self.hvd.rank(), self.hvd.size()
        self.reporter = Reporter.for_run(
            self.cfg, rank=self.rank, world_size=self.size, steps_per_epoch=self.steps_per_epoch
        )
        self.meter = Throughput()
        self.global_step = committed.epoch * self.steps_per_epoch + committed.step
        self.start_epoch = committed.resumed_from  # for metrics.json, also on a rank 0 that joined later
        local_redone = 0 if first else max(0, reached - self.global_step)
        redone = max(int(n) for n in self.hvd.allgather_object(local_redone, name="steps_redone"))
        position = dataclasses.replace(
            committed,
            world_sizes=(*committed.world_sizes, self.size),
            steps_redone=committed.steps_redone + redone,
        )
        if not first:
            self.reporter.say(
                f"elastic: world resized to {self.size} ranks (global batch {self.global_batch}), "
                f"resuming at epoch {committed.epoch + 1} step {committed.step}, {redone} steps redone"
            )
        self.resolved |= {"worldSizes": list(position.world_sizes), "stepsRedone": position.steps_redone}
        return position

    def epoch_started(self) -> None:
        """The throughput clock's epoch boundary: what ran since the last step (validation, checkpointing) is
        not training, and the next interval (the loader's restart) is a warm-up."""
        self.meter.new_epoch()

    def step_done(self, step: int, images: int, skipped: int = 0) -> bool:
        """Counts a finished step; True when it is one to log (every rank alike, so the loss average that
        follows is a collective every rank joins)."""
        self.meter.add(images)
        self.skipped += skipped
        self.global_step += 1
        return step % self.cfg.log_interval == 0 or step == self.steps_per_epoch

    def log(self, *, epoch: int, step: int, lr: float, loss: float) -> None:
        """The interval line and progress record (rank 0) with the loss already averaged over the ranks."""
        self.final_loss = loss
        per_worker, pace = self.meter.mark(), self.meter.steps_per_sec
        self.reporter.interval(
            epoch=epoch, step=step, loss=loss, lr=lr, per_worker=per_worker, steps_per_sec=pace
        )

    def validated(self, top1: float, epoch: int | None = None) -> None:
        self.val_top1 = top1
        when = "" if epoch is None else f"epoch {epoch + 1}/{self.cfg.epochs} "
        self.reporter.say(f"{when}val top-1 {top1:.4f}")

    def finish(self, *, weights: Iterable[bytes], save: Callable[[Path], None], skipped: int = 0) -> None:
        """Totals over the ranks, metrics.json and the closing lines; rank 0 saves the model into the output
        directory with `save`. `skipped` adds images this rank skipped that step_done did not count."""
        # One collective for both: every rank's skipped images and the digest of its trained weights.
        gathered = self.hvd.allgather_object((self.skipped + skipped, digest(weights)), name="finish")
        total_skipped = sum(int(n) for n, _ in gathered)
        if total_skipped:
            self.reporter.say(f"warning: skipped {total_skipped} unreadable images")
        metrics = (
            metrics_record(
                self.cfg,
                framework=self.framework,
                world_size=self.size,
                per_worker=self.meter.per_worker(),
                timed_intervals=len(self.meter.intervals),
                epochs_done=self.cfg.epochs,
                start_epoch=self.start_epoch,
                global_step=self.global_step,
                final_loss=self.final_loss,
                val_top1=self.val_top1,
                skipped_images=total_skipped,
                weight_digests=[str(d) for _, d in gathered],
            )
            | {"firstStepSeconds": self.meter.first_step_seconds, "stepTimeMs": self.meter.step_ms()}
            | self.resolved
        )
        if self.rank == 0 and self.cfg.output_dir is not None:
            self.cfg.output_dir.mkdir(parents=True, exist_ok=True)
            save(self.cfg.output_dir)
        self.reporter.finish(metrics)
