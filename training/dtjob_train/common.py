"""Small pieces every trainer uses: data-error exit, device choice, CPU thread budget, weight digests, the
metrics record."""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from dtjob.contract.training import EXPECT_GPU_ENV

from .cli import TrainConfig
from .data.folder import DataError, ImageFolderDataset, scan

EXIT_BAD_INPUT = 2
EXIT_NO_GPU = 3


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


class NoGpuError(RuntimeError):
    """GPUs were asked for, and this rank sees none."""


def expect_gpu(environ: Mapping[str, str]) -> bool:
    return environ.get(EXPECT_GPU_ENV, "").strip().lower() not in ("", "0", "false", "no")


def gpu_for_rank(local_rank: int, gpus: int, *, expect: bool) -> int | None:
    """The GPU this rank uses (None: train on CPU).

    Ranks on one host share its GPUs round-robin (local rank modulo the count), so more ranks than GPUs still
    start. With no GPU visible, a job that asked for GPUs fails instead of training on CPU, 100 times slower,
    without a word: the node's driver or device plugin is broken, or the image is a CPU build.
    """
    if gpus > 0:
        return local_rank % gpus
    if expect:
        raise NoGpuError(
            f"{EXPECT_GPU_ENV} is set (the job asks for GPUs) but no GPU is visible to this rank: "
            "check the node's NVIDIA driver and device plugin and that the image is a GPU build; "
            f"set {EXPECT_GPU_ENV}=0 in the job's env to train on CPU"
        )
    return None


def pick_gpu(local_rank: int, gpus: int) -> int | None:
    """gpu_for_rank with the expectation from the environment; a missing GPU exits this rank with a message
    naming its host (unlike bad input, it may be one node's problem)."""
    try:
        return gpu_for_rank(local_rank, gpus, expect=expect_gpu(os.environ))
    except NoGpuError as e:
        print(f"error: {socket.gethostname()} local rank {local_rank}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_NO_GPU) from None


def cores_per_rank(local_size: int, cpus: int | None = None) -> int:
    """This rank's share of the cores it may run on (its affinity mask, which a container's CPU set narrows),
    split evenly among the ranks on its host; at least 1."""
    available = len(os.sched_getaffinity(0)) if cpus is None else cpus
    return max(1, available // max(local_size, 1))


def cpu_threads_per_rank(local_size: int) -> int:
    """Compute threads of a rank training on CPU: its share of the cores, so two ranks on one node do not
    oversubscribe it.

    DTJOB_THREADS_PER_RANK overrides it (the scaling benchmark gives every rank one core).
    """
    override = os.environ.get("DTJOB_THREADS_PER_RANK")
    if override:
        return max(1, int(override))
    return cores_per_rank(local_size)


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
