"""PyTorch input pipeline for the ImageNet folder layout, without torchvision.

Decoding and augmentation run in DataLoader worker processes on PIL, which hands uint8 tensors to the main
process; normalisation happens on the device in the trainer, so the host copies a quarter of the bytes.
JPEGs are decoded at reduced scale (libjpeg DCT scaling via Image.draft) whenever the crop allows it, which
is most of the decode cost saved for large photos.
"""

from __future__ import annotations

import math
import multiprocessing
import random
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from dtjob_train.host import cores_per_rank

from .folder import Split, elastic_shard, epoch_shard

# Attempts at neighbouring files before giving up on a sample; keeps every batch full so ranks stay in step.
_MAX_SUBSTITUTES = 16


def _random_resized_crop_box(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
    """Inception-style crop: 8%-100% of the area, aspect ratio 3/4-4/3; centre crop as the fallback."""
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            return x, y, x + cw, y + ch
    side = min(w, h)
    x, y = (w - side) // 2, (h - side) // 2
    return x, y, x + side, y + side


def _open_scaled(path: str, box_of: tuple[int, int]) -> tuple[Image.Image, float]:
    """Open an image asking libjpeg for the smallest DCT scale that still covers box_of pixels of output."""
    img = Image.open(path)
    w0, _ = img.size
    img.draft("RGB", box_of)
    return img.convert("RGB"), img.size[0] / w0


def load_train(path: str, size: int, rng: random.Random) -> npt.NDArray[np.uint8]:
    with Image.open(path) as probe:
        w, h = probe.size
    x0, y0, x1, y1 = _random_resized_crop_box(w, h, rng)
    # Request a decode where the crop is still >= size pixels on each side.
    need = (math.ceil(w * size / (x1 - x0)), math.ceil(h * size / (y1 - y0)))
    img, scale = _open_scaled(path, need)
    box = (x0 * scale, y0 * scale, x1 * scale, y1 * scale)
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out, dtype=np.uint8)


def load_val(path: str, size: int) -> npt.NDArray[np.uint8]:
    """Resize the short side to size/0.875, centre crop size x size (the standard evaluation transform)."""
    with Image.open(path) as probe:
        w, h = probe.size
    short = round(size / 0.875)
    rw, rh = (short, round(h * short / w)) if w <= h else (round(w * short / h), short)
    img, _ = _open_scaled(path, (rw, rh))
    img = img.resize((rw, rh), Image.Resampling.BILINEAR)
    left, top = (rw - size) // 2, (rh - size) // 2
    return np.asarray(img.crop((left, top, left + size, top + size)), dtype=np.uint8)


Sample = tuple[npt.NDArray[np.uint8], int, int]


class ImageFolder(Dataset[Sample]):
    """Items are (uint8 HWC image, label, number of unreadable files skipped to produce it)."""

    def __init__(self, samples: Sequence[tuple[str, int]], size: int, *, train: bool, seed: int) -> None:
        self.samples = samples
        self.size = size
        self.train = train
        self.seed = seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        # The DataLoader seeds `random` per worker and epoch: augmentations differ across both.
        rng = random.Random(random.getrandbits(64))
        for attempt in range(_MAX_SUBSTITUTES):
            path, label = self.samples[(index + attempt) % len(self.samples)]
            try:
                array = load_train(path, self.size, rng) if self.train else load_val(path, self.size)
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
                continue
            return array, label, attempt
        raise RuntimeError(f"{_MAX_SUBSTITUTES} unreadable images in a row from {self.samples[index][0]}")


def collate(batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One uint8 NHWC tensor per batch; the trainer views it as NCHW on the device (channels-last, free)."""
    images = torch.from_numpy(np.stack([b[0] for b in batch]))
    labels = torch.tensor([b[1] for b in batch], dtype=torch.long)
    return images, labels, sum(b[2] for b in batch)


class EpochShardSampler(Sampler[int]):
    """This rank's indices into the whole training set, reshuffled globally every epoch (folder.epoch_shard);
    set_epoch before each epoch's iterator, as with DistributedSampler."""

    def __init__(self, total: int, *, rank: int, size: int, seed: int) -> None:
        self.total, self.rank, self.size, self.seed = total, rank, size, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        shard = epoch_shard(self.total, epoch=self.epoch, rank=self.rank, size=self.size, seed=self.seed)
        return iter(shard.tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.total, self.size))


class ElasticShardSampler(EpochShardSampler):
    """--elastic: this rank's indices for the rest of an epoch from an offset (folder.elastic_shard), so a
    world of another size continues the epoch where the last one committed."""

    def __init__(self, total: int, *, rank: int, size: int, seed: int, batch_size: int) -> None:
        super().__init__(total, rank=rank, size=size, seed=seed)
        self.batch_size, self.offset = batch_size, 0

    def set_position(self, epoch: int, offset: int) -> None:
        self.epoch, self.offset = epoch, offset

    def _shard(self) -> npt.NDArray[np.int64]:
        return elastic_shard(
            self.total,
            epoch=self.epoch,
            rank=self.rank,
            size=self.size,
            seed=self.seed,
            offset=self.offset,
            batch_size=self.batch_size,
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self._shard().tolist())

    def __len__(self) -> int:
        return len(self._shard())


def set_epoch(loader: DataLoader[Sample], epoch: int) -> None:
    """The training loader's next iterator yields this epoch's order (a no-op for a validation loader)."""
    if isinstance(loader.sampler, EpochShardSampler):
        loader.sampler.set_epoch(epoch)


def default_workers(local_size: int, cpus: int | None = None) -> int:
    """Decode processes for one rank: its share of the cores (common.cores_per_rank) less one for the rank's
    own process, which drives the GPU. No fixed cap: PIL decoding is what bounds a rank's images/sec on a
    GPU node, and an 8-GPU node with 96 cores has 11 to spare per rank."""
    return max(1, cores_per_rank(local_size, cpus) - 1)


def worker_processes() -> multiprocessing.context.BaseContext:
    """How the decode workers start: from a fork server, not forked from the rank. A rank runs Horovod's and
    MPI's (or Gloo's) threads by the time its loaders start their workers, and a child forked from a
    threaded process can wait forever on a lock some thread held at the fork: the rank then waits on a batch
    that never comes while the others wait on it in the next allreduce. The server is a fresh interpreter
    with this module (so torch) imported once; each worker forks from it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def make_loader(
    split: Split,
    *,
    rank: int,
    size: int,
    batch_size: int,
    image_size: int,
    train: bool,
    workers: int,
    seed: int,
    pin_memory: bool,
    elastic: bool = False,
) -> DataLoader[Sample]:
    """Training: the whole set through an EpochShardSampler (call set_epoch before each epoch), or with
    elastic an ElasticShardSampler (call set_position). Validation: this rank's fixed shard, in order."""
    if train:
        dataset = ImageFolder(split.samples, image_size, train=True, seed=seed + rank)
        sampler: EpochShardSampler | None = (
            ElasticShardSampler(len(split.samples), rank=rank, size=size, seed=seed, batch_size=batch_size)
            if elastic
            else EpochShardSampler(len(split.samples), rank=rank, size=size, seed=seed)
        )
    else:
        dataset, sampler = (
            ImageFolder(split.shard(rank, size), image_size, train=False, seed=seed + rank),
            None,
        )
    # Seeds the workers' augmentation randomness, different on every rank.
    generator = torch.Generator()
    generator.manual_seed(seed + rank)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        multiprocessing_context=worker_processes() if workers > 0 else None,
        generator=generator,
    )
