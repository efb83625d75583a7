"""The ImageNet folder layout (train/<class>/*.JPEG, val/<class>/*.JPEG): scan, validate, shard by rank, and
the training order of every epoch.

Every problem a user can cause is a DataError whose message names the directory and what is wrong, raised
before any rank starts training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

IMAGE_SUFFIXES = frozenset({".jpeg", ".jpg", ".png"})

# Channel statistics of ImageNet (RGB, 0-255), used by every framework's normalisation.
MEAN_RGB = (123.675, 116.28, 103.53)
STD_RGB = (58.395, 57.12, 57.375)


class DataError(ValueError):
    """A data directory that cannot be trained on."""


@dataclass(frozen=True)
class Split:
    root: Path
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]

    def shard(self, rank: int, size: int) -> tuple[tuple[str, int], ...]:
        """Rank's fixed slice (validation), interleaved so every shard sees every class."""
        return self.samples[rank::size]


def epoch_shard(total: int, *, epoch: int, rank: int, size: int, seed: int) -> npt.NDArray[np.int64]:
    """This rank's sample indices for one training epoch, in order.

    As DistributedSampler with set_epoch: every rank draws the same permutation of the whole set (seeded by
    seed and epoch) and takes every size-th index from its rank on, so the ranks' shards split the set with no
    overlap, every epoch deals the images out afresh across ranks, and a restart that resumes at epoch k
    sees the order an uninterrupted run would have.
    """
    order = np.random.default_rng([seed, epoch]).permutation(total)
    return order[rank::size].astype(np.int64)


def elastic_shard(
    total: int, *, epoch: int, rank: int, size: int, seed: int, offset: int, batch_size: int
) -> npt.NDArray[np.int64]:
    """This rank's indices for the rest of an epoch under --elastic, from `offset` images into the epoch's
    order (the images that earlier worlds, of any size, trained on: every step of a world of W ranks takes the
    next W x batch_size images of the order). The rest is cut to whole global batches, so every rank of the
    new world has the same number of steps; the images cut are at most one global batch less one."""
    order = np.random.default_rng([seed, epoch]).permutation(total)[offset:]
    whole = len(order) // (size * batch_size) * size * batch_size
    return order[:whole][rank::size].astype(np.int64)


@dataclass(frozen=True)
class ImageFolderDataset:
    train: Split
    val: Split | None


def _scan_split(root: Path, name: str) -> Split:
    split_dir = root / name
    if not split_dir.is_dir():
        raise DataError(f"--data-dir {root}: missing '{name}/' directory (expected {name}/<class>/*.JPEG)")
    classes = tuple(sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not classes:
        raise DataError(f"--data-dir {root}: '{name}/' has no class directories")
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for label, cls in enumerate(classes):
        files = sorted(
            str(f) for f in (split_dir / cls).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file()
        )
        if not files:
            empty.append(cls)
        samples.extend((f, label) for f in files)
    if not samples:
        raise DataError(f"--data-dir {root}: '{name}/' has {len(classes)} class directories but no images")
    if empty:
        shown = ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise DataError(
            f"--data-dir {root}: {len(empty)} class directories in '{name}/' have no images: {shown}"
        )
    return Split(root=split_dir, classes=classes, samples=tuple(samples))


def scan(root: Path, *, need_val: bool = True) -> ImageFolderDataset:
    """Scan train/ (and val/ when present or required); train and val must list the same classes."""
    if not root.is_dir():
        raise DataError(f"--data-dir {root}: not a directory")
    if not any(root.iterdir()):
        raise DataError(f"--data-dir {root}: directory is empty")
    train = _scan_split(root, "train")
    val: Split | None = None
    if need_val or (root / "val").is_dir():
        val = _scan_split(root, "val")
        if val.classes != train.classes:
            only_train = sorted(set(train.classes) - set(val.classes))
            only_val = sorted(set(val.classes) - set(train.classes))
            raise DataError(
                f"--data-dir {root}: class mismatch between train/ ({len(train.classes)} classes) and "
                f"val/ ({len(val.classes)} classes): only in train: {only_train[:5]}, "
                f"only in val: {only_val[:5]}"
            )
    return ImageFolderDataset(train=train, val=val)
