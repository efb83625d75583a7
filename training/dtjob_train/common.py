"""Small pieces every trainer uses: data-error exit, device choice, CPU thread budget, weight digests, the
metrics record."""

from __future__ import annotations

import hashlib
import pickle
import sys
import zlib
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from .cli import TrainConfig
from .data.folder import DataError, ImageFolderDataset, scan

EXIT_BAD_INPUT = 2


def fail(message: str, *, rank: int) -> NoReturn:
    """Every rank sees the same bad input and exits; only rank 0 says why, so the log reads once."""
    if rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def scan_imagenet(
    cfg: TrainConfig, *, rank: int, size: int, broadcast: Callable[[Any], Any]
) -> tuple[ImageFolderDataset, int]:
    """The ImageNet folders and how many full batches each rank's share of train/ holds; a bad data dir or a
    batch larger than a share exits with a message naming the flag.

    Rank 0 alone walks the tree and `broadcast` (rank 0's object to every rank) hands the listing to the
    others: ImageNet is 1.28 million files, and every rank listing them at once hammers a shared NFS server.
    """
    assert cfg.data_dir is not None
    found: ImageFolderDataset | str | None = None
    if rank == 0:
        try:
            found = scan(cfg.data_dir, need_val=cfg.val_steps != 0)
        except DataError as e:
            found = str(e)
    # Compressed: the paths share long prefixes, and the listing is some 100 MB of pickled strings.
    payload = zlib.compress(pickle.dumps(found), 1) if rank == 0 else None
    found = pickle.loads(zlib.decompress(broadcast(payload)))
    if isinstance(found, str):
        fail(found, rank=rank)
    assert isinstance(found, ImageFolderDataset)
    dataset = found
    batches = len(dataset.train.samples) // size // cfg.batch_size
    if batches == 0:
        fail(
            f"--batch-size {cfg.batch_size}: larger than this rank's share of train/ "
            f"({len(dataset.train.samples)} images over {size} ranks)",
            rank=rank,
        )
    return dataset, batches


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
    per_worker: tuple[float, float],
    timed_intervals: int,
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
        "ampDtype": cfg.amp_dtype if cfg.amp else None,
        "xla": cfg.xla,
        "dataLoader": cfg.data_loader if framework == "pytorch" else "tf.data",
        "compile": None,  # the PyTorch trainer sets the mode it compiled with
        "fp16Allreduce": cfg.fp16_allreduce,
        "epochs": cfg.epochs,
        "epochsDone": epochs_done,
        "resumedFromEpoch": start_epoch,
        "globalStep": global_step,
        "finalLoss": final_loss,
        "valTop1": val_top1,
        "skippedImages": skipped_images,
        # Training steps only: images over the time of timed_intervals log intervals, +- 1.96 time-weighted
        # standard deviations of their rates (see progress.Throughput).
        "imagesPerSecPerWorker": per_worker[0],
        "imagesPerSecConfidence": per_worker[1],
        "timedIntervals": timed_intervals,
        "totalImagesPerSec": per_worker[0] * world_size,
        "weightDigests": weight_digests,
        "weightsConsistent": len(set(weight_digests)) == 1,
    }
