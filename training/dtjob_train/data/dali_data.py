"""NVIDIA DALI input pipeline for the PyTorch trainer (``--data-loader dali``), as NVIDIA's ResNet-50 recipe
(DeepLearningExamples) uses it: JPEGs decoded on the GPU (nvJPEG, DALI's ``mixed`` device: Huffman decoding on
the host, the rest on the GPU), random-resized crop, resize and flip on the GPU, so a rank's decode rate no
longer depends on its share of the node's cores. On a host without a GPU the same pipeline decodes and
augments on the CPU (DALI's own threads), which is how the tests run it.

The data order is the PIL loader's (folder.epoch_shard): every epoch a fresh pipeline reads this rank's files
of that epoch, in order, so a resumed run sees what an uninterrupted one would have. Batches leave as uint8
NHWC, as from the PIL loader; the trainer's prefetcher normalises them.

DALI is optional (the training images do not carry it): `require` says how to install it. An image DALI
cannot decode stops the run (DALI has no way to skip a sample) with the file's name; the PIL loader would skip
it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import torch
from PIL import Image

from .folder import DataError, Split, epoch_shard

# The CUDA 13 build, matching the CUDA of the pinned torch wheel.
DALI_PACKAGE = "nvidia-dali-cuda130"
_READER = "reader"
# Preallocated decoder buffers (NVIDIA's values for ImageNet), so the first large JPEGs do not reallocate.
_DEVICE_PADDING, _HOST_PADDING = 211_025_920, 140_544_512

Batch = tuple[torch.Tensor, torch.Tensor, int]


class DaliMissing(RuntimeError):
    """--data-loader dali without DALI installed."""


class UndecodableImage(DataError):
    """A file of the data set that DALI's decoder refused."""


def _decodable(path: str) -> bool:
    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False
    return True


def installed() -> bool:
    try:
        require()
    except DaliMissing:
        return False
    return True


def require() -> Any:
    """The nvidia.dali module, or DaliMissing saying how to get it."""
    try:
        return importlib.import_module("nvidia.dali")
    except ImportError as e:
        raise DaliMissing(
            f"--data-loader dali: NVIDIA DALI is not installed ({e}); install it into the image "
            f"(pip install {DALI_PACKAGE}) or use --data-loader pytorch"
        ) from None


def build_pipeline(
    files: list[str],
    labels: list[int],
    *,
    train: bool,
    batch_size: int,
    image_size: int,
    seed: int,
    threads: int,
    device_id: int | None,
) -> Any:
    """A pipeline reading `files` once, in order: (uint8 HWC images, int32 labels). device_id None: CPU."""
    dali = require()
    fn, types = dali.fn, dali.types
    gpu = device_id is not None
    decoder: dict[str, Any] = {"device": "mixed" if gpu else "cpu", "output_type": types.RGB}
    if gpu:
        decoder |= {"device_memory_padding": _DEVICE_PADDING, "host_memory_padding": _HOST_PADDING}
    pipe = dali.Pipeline(
        batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed, prefetch_queue_depth=2
    )
    with pipe:
        jpegs, label = fn.readers.file(
            files=files, labels=labels, random_shuffle=False, pad_last_batch=not train, name=_READER
        )
        if train:
            # Inception-style crop, as the PIL loader's: 8%-100% of the area, aspect ratio 3/4-4/3.
            images = fn.decoders.image_random_crop(
                jpegs,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
                num_attempts=100,
                **decoder,
            )
            images = fn.resize(
                images, resize_x=image_size, resize_y=image_size, interp_type=types.INTERP_LINEAR
            )
            images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
        else:
            # The standard evaluation transform: the short side to size / 0.875, then the centre crop.
            images = fn.decoders.image(jpegs, **decoder)
            images = fn.resize(images, resize_shorter=image_size / 0.875, interp_type=types.INTERP_LINEAR)
            images = fn.crop(images, crop=(image_size, image_size))
        pipe.set_outputs(images, label)
    pipe.build()
    return pipe


class DaliLoaders:
    """This rank's training batches of an epoch and its validation batches, each call a fresh pipeline."""

    def __init__(
        self,
        train_split: Split,
        val_split: Split | None,
        *,
        rank: int,
        size: int,
        batch_size: int,
        image_size: int,
        steps_per_epoch: int,
        seed: int,
        threads: int,
        device_id: int | None,
    ) -> None:
        require()
        self.train_split, self.val_split = train_split, val_split
        self.rank, self.size, self.seed = rank, size, seed
        self.steps_per_epoch, self.batch_size = steps_per_epoch, batch_size
        self.options = {"batch_size": batch_size, "image_size": image_size, "threads": threads}
        self.device_id = device_id
        self._live: Any = None  # the pipeline being read; dropped before the next is built (GPU memory)

    def train_files(self, epoch: int) -> tuple[list[str], list[int]]:
        """The epoch's files for this rank, in order: the PIL loader's, cut to the steps the epoch runs."""
        order = epoch_shard(
            len(self.train_split.samples), epoch=epoch, rank=self.rank, size=self.size, seed=self.seed
        )
        chosen = [self.train_split.samples[i] for i in order[: self.steps_per_epoch * self.batch_size]]
        return [path for path, _ in chosen], [label for _, label in chosen]

    def train(self, epoch: int) -> Iterator[Batch]:
        files, labels = self.train_files(epoch)
        # Augmentations differ by rank and epoch, and repeat on a resume.
        seed = (self.seed * 1_000_003 + epoch * 1_009 + self.rank) % 2**31
        return self._batches(files, labels, train=True, seed=seed)

    def val(self) -> Iterator[Batch]:
        assert self.val_split is not None
        shard = self.val_split.shard(self.rank, self.size)
        files, labels = [path for path, _ in shard], [label for _, label in shard]
        return self._batches(files, labels, train=False, seed=self.seed + self.rank)

    def _batches(self, files: list[str], labels: list[int], *, train: bool, seed: int) -> Iterator[Batch]:
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self._live = None
        pipe = build_pipeline(files, labels, train=train, seed=seed, device_id=self.device_id, **self.options)
        # Training drops a last partial batch (every rank runs the same steps); validation keeps it.
        policy = LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL
        done = 0
        try:
            # The iterator starts the pipeline, which decodes its first batches at once.
            self._live = DALIGenericIterator(
                [pipe], ["images", "labels"], reader_name=_READER, last_batch_policy=policy
            )
            for (out,) in self._live:
                yield out["images"], out["labels"].view(-1).long(), 0
                done += 1
        except RuntimeError as e:
            # DALI's error names no file. The failing batch is the next one or one the pipeline was
            # preparing ahead (prefetch_queue_depth): look for the culprit there, with PIL.
            bs = self.batch_size
            suspects = files[done * bs : (done + 3) * bs]
            bad = [path for path in suspects if not _decodable(path)] or ["one of " + ", ".join(suspects)]
            raise UndecodableImage(
                f"--data-loader dali: cannot decode {', '.join(bad)} (DALI stops at an unreadable image; "
                "remove it, or use --data-loader pytorch, which skips unreadable images)"
            ) from e
