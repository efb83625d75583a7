"""Small pieces every trainer uses: data-error exit, CPU thread budget, weight digests, the metrics record."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from .cli import TrainConfig
from .data.folder import DataError, ImageFolderDataset, scan

EXIT_BAD_INPUT = 2


def fail(message: str, *, rank: int) -> NoReturn:
    """Every rank sees the same bad input and exits; only rank 0 says why, so the log reads once."""
    if rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def scan_imagenet(cfg: TrainConfig, *, rank: int, size: int) -> tuple[ImageFolderDataset, int]:
    """The ImageNet folders and how many full batches this rank's shard of train/ holds; a bad data dir or a
    batch larger than a shard exits with a message naming the flag."""
    assert cfg.data_dir is not None
    try:
        dataset = scan(cfg.data_dir, need_val=cfg.val_steps != 0)
    except DataError as e:
        fail(str(e), rank=rank)
    batches = len(dataset.train.samples) // size // cfg.batch_size
    if batches == 0:
        fail(
            f"--batch-size {cfg.batch_size}: larger than this rank's share of train/ "
            f"({len(dataset.train.samples)} images over {size} ranks)",
            rank=rank,
        )
    return dataset, batches


def cpu_threads_per_rank(local_size: int) -> int:
    """Split the cores among the ranks on this host, so two ranks on one node do not oversubscribe it.

    DTJOB_THREADS_PER_RANK overrides it (the scaling benchmark gives every rank one core).
    """
    override = os.environ.get("DTJOB_THREADS_PER_RANK")
    if override:
        return max(1, int(override))
    return max(1, len(os.sched_getaffinity(0)) // max(local_size, 1))


def digest(chunks: Iterable[bytes]) -> str:
    """sha256 over the trained parameters; equal on every rank when the allreduce kept them in step."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def metrics_record(
    cfg: TrainConfig,
    *,
    framework: str,
    world_size: int,
    per_worker: float,
    epochs_done: int,
    start_epoch: int,
    global_step: int,
    final_loss: float,
    val_top1: float | None,
    skipped_images: int,
    weight_digests: list[str],
) -> dict[str, Any]:
    return {
        "framework": framework,
        "arch": cfg.arch,
        "data": cfg.data,
        "worldSize": world_size,
        "batchSizePerWorker": cfg.batch_size,
        "imageSize": cfg.image_size,
        "amp": cfg.amp,
        "fp16Allreduce": cfg.fp16_allreduce,
        "epochs": cfg.epochs,
        "epochsDone": epochs_done,
        "resumedFromEpoch": start_epoch,
        "globalStep": global_step,
        "finalLoss": final_loss,
        "valTop1": val_top1,
        "skippedImages": skipped_images,
        "imagesPerSecPerWorker": per_worker,
        "totalImagesPerSec": per_worker * world_size,
        "weightDigests": weight_digests,
        "weightsConsistent": len(set(weight_digests)) == 1,
    }
