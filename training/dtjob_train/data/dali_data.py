"""NVIDIA DALI input pipeline for the PyTorch trainer (``--data-loader dali``), as NVIDIA's ResNet-50 recipes
(DeepLearningExamples, MLPerf) use it: JPEGs decoded on the GPU (DALI's ``mixed`` device: a share of them on
the GPU's hardware JPEG engines, the rest Huffman-decoded on the host and finished on the GPU), random-resized
crop and resize on the GPU, then one fused crop-mirror-normalize kernel that writes the batch in the trainer's
input type (fp16 under fp16 autocast) and memory format (NHWC for channels-last). The trainer gets batches it
can use as they are: no cast, normalisation or layout change of its own. On a host without a GPU the same
pipeline decodes and augments on the CPU (DALI's own threads), which is how the tests run it.

One pipeline serves every epoch, and another every validation: built on first use, rewound after each pass,
so no epoch pays for building one (decoder set-up, buffers, the first batches). The data order is the PIL
loader's (folder.epoch_shard): the pipeline's external source hands it each epoch's files of this rank, in
order, so a resumed run reads what an uninterrupted one would have. The random crops and flips come from the
pipeline's own generator, seeded by rank and the epoch the pipeline started at: a resumed run draws other
crops than an uninterrupted one would have.

DALI is optional (the training images do not carry it): `require` says how to install it. An image DALI
cannot decode stops the run (DALI has no way to skip a sample) with the file's name; the PIL loader would skip
it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from PIL import Image

from .folder import MEAN_RGB, STD_RGB, DataError, Split, epoch_shard

# The CUDA 13 build, matching the CUDA of the pinned torch wheel.
DALI_PACKAGE = "nvidia-dali-cuda130"
# Decoder buffers allocated up front (NVIDIA's values for ImageNet, one buffer per host thread), so the first
# large JPEGs of an epoch do not reallocate. Validation reads a few images an epoch and keeps DALI's defaults:
# both pipelines stay alive, and this is GPU memory the model does not get.
_DEVICE_PADDING, _HOST_PADDING = 211_025_920, 140_544_512

Batch = tuple[torch.Tensor, torch.Tensor, int]


class DaliMissing(RuntimeError):
    """--data-loader dali without DALI installed."""


class UndecodableImage(DataError):
    """A file of the data set that DALI's decoder refused."""


@dataclass(frozen=True)
class PipelineOptions:
    """What every pipeline of a rank shares: batch, output size, host threads and device (None: CPU), the
    output's type (fp16 for fp16 autocast, else fp32) and layout, and DALI's tuning (--dali-hw-decoder-load,
    --dali-prefetch)."""

    batch_size: int
    image_size: int
    threads: int
    device_id: int | None
    fp16: bool
    channels_last: bool
    hw_decoder_load: float
    prefetch: int


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


def same_length_paths(files: list[str]) -> npt.NDArray[np.uint8]:
    """The paths as one (N, longest) uint8 array, each row the UTF-8 bytes of a path that names the same file:
    shorter paths are lengthened by slashes after their first one ("/data/x" -> "/data///x"), which the
    system reads as one. DALI takes such a batch whole; a list of per-file arrays it checks and converts one
    by one in Python, which cost the training loop milliseconds a step (docs/benchmarks.md)."""
    encoded = [path.encode() if "/" in path else b"./" + path.encode() for path in files]
    width = max(map(len, encoded), default=0)
    rows = []
    for raw in encoded:
        cut = raw.index(b"/") + 1
        rows.append(raw[:cut] + b"/" * (width - len(raw)) + raw[cut:])
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)


class PassSource:
    """The pipeline's external source: batch `iteration` of the pass's files, as fn.io.file.read takes them
    (one uint8 array of the paths' bytes, same_length_paths) with their labels (one int32 array). Whole
    arrays, not lists of per-sample ones: DALI takes them without a Python step per image. StopIteration after
    the last batch ends the pass; a last batch may be short (validation keeps every image)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.files: list[str] = []
        self.labels: list[int] = []

    def set(self, files: list[str], labels: list[int]) -> None:
        self.files, self.labels = files, labels

    def batches(self) -> int:
        return -(-len(self.files) // self.batch_size)

    def batch(self, info: Any) -> tuple[list[str], list[int]]:
        """The files and labels of batch `info.iteration`; StopIteration past the last."""
        start = info.iteration * self.batch_size
        files = self.files[start : start + self.batch_size]
        if not files:
            raise StopIteration
        return files, self.labels[start : start + self.batch_size]

    def __call__(self, info: Any) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int32]]:
        files, labels = self.batch(info)
        return same_length_paths(files), np.array(labels, dtype=np.int32).reshape(-1, 1)


def build_pipeline(source: PassSource, options: PipelineOptions, *, train: bool, seed: int) -> Any:
    """A pipeline reading what `source` hands it: (normalised images, int32 labels)."""
    dali = require()
    fn, types = dali.fn, dali.types
    gpu = options.device_id is not None
    decoder: dict[str, Any] = {"device": "mixed" if gpu else "cpu", "output_type": types.RGB}
    if gpu:
        decoder["hw_decoder_load"] = options.hw_decoder_load
    if gpu and train:
        decoder |= {"device_memory_padding": _DEVICE_PADDING, "host_memory_padding": _HOST_PADDING}
    size = options.image_size
    pipe = dali.Pipeline(
        batch_size=options.batch_size,
        num_threads=options.threads,
        device_id=options.device_id,
        seed=seed,
        prefetch_queue_depth=options.prefetch,
    )
    with pipe:
        paths, labels = fn.external_source(source=source, num_outputs=2, batch=True, batch_info=True)
        jpegs = fn.io.file.read(paths)
        normalize: dict[str, Any] = {
            "dtype": types.FLOAT16 if options.fp16 else types.FLOAT,
            "output_layout": "HWC" if options.channels_last else "CHW",
            "mean": list(MEAN_RGB),
            "std": list(STD_RGB),
        }
        if train:
            # Inception-style crop, as the PIL loader's: 8%-100% of the area, aspect ratio 3/4-4/3.
            crop = {"random_area": [0.08, 1.0], "random_aspect_ratio": [3 / 4, 4 / 3], "num_attempts": 100}
            images = fn.decoders.image_random_crop(jpegs, **crop, **decoder)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
            mirror = fn.random.coin_flip(probability=0.5)
            images = fn.crop_mirror_normalize(images, mirror=mirror, **normalize)
        else:
            # The standard evaluation transform: the short side to size / 0.875, then the centre crop.
            images = fn.decoders.image(jpegs, **decoder)
            images = fn.resize(images, resize_shorter=size / 0.875, interp_type=types.INTERP_LINEAR)
            images = fn.crop_mirror_normalize(images, crop=(size, size), **normalize)
        pipe.set_outputs(images, labels)
    pipe.build()
    return pipe


class KeptPipeline:
    """One pipeline for every pass over a split: built on first use and rewound for the next pass once the
    last one was read to its end. A pass left part-read holds batches of that pass, so it is dropped and a new
    one built instead; so is one that failed."""

    def __init__(self, options: PipelineOptions, *, train: bool) -> None:
        self.options, self.train = options, train
        self.source = PassSource(options.batch_size)
        self.builds = 0
        self._iterator: Any = None
        self._pass = 0  # which pass the live iterator serves: a generator of an older one is stale
        self._handed = 0
        self._ended = False

    def read(self, files: list[str], labels: list[int], *, seed: int) -> Iterator[Batch]:
        """The pass over `files`; seed: the random augmentations' seed, should a pipeline be built."""
        rewind = self._iterator is not None and self._read_to_end()
        if not rewind:
            self._iterator = None  # before the next is built: a pipeline holds GPU memory
        self.source.set(files, labels)
        self._pass += 1
        self._handed, self._ended = 0, False
        try:
            # Both start the pass at once: its first batches are prepared, and a bad image can fail here.
            if rewind:
                self._iterator.reset()
            else:
                self._iterator = self._build(seed)
        except RuntimeError as e:
            self._iterator = None
            raise self._undecodable(files) from e
        return self._batches(self._pass, files)

    def _build(self, seed: int) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe = build_pipeline(self.source, self.options, train=self.train, seed=seed)
        self.builds += 1
        # The iterator starts the pipeline, which prepares its first batches at once.
        return DALIGenericIterator([pipe], ["images", "labels"])

    def _read_to_end(self) -> bool:
        """Whether the last pass was read to its end. The trainer takes an epoch's steps and no more, so it
        may have taken every batch without seeing the end: asking once more then ends the pass at once (the
        source said so while the pipeline prepared the last batches ahead)."""
        if self._ended:
            return True
        if self._handed < self.source.batches():
            return False
        try:
            next(self._iterator)
        except StopIteration:
            return True
        except RuntimeError:
            return False
        return False

    def _batches(self, serves: int, files: list[str]) -> Iterator[Batch]:
        iterator = self._iterator
        while serves == self._pass:  # a generator of an earlier pass reads nothing of this one
            try:
                (out,) = next(iterator)
            except StopIteration:
                self._ended = True
                return
            except RuntimeError as e:
                self._iterator = None
                raise self._undecodable(files) from e
            self._handed += 1
            images = out["images"]
            # HWC from DALI is NCHW with channels-last strides once permuted: what the model takes.
            images = images.permute(0, 3, 1, 2) if self.options.channels_last else images
            yield images, out["labels"].view(-1).long(), 0

    def _undecodable(self, files: list[str]) -> UndecodableImage:
        # DALI's error names no file. The failing batch is the next one or one the pipeline was preparing
        # ahead (the prefetch queue): look for the culprit there, with PIL.
        bs, ahead = self.options.batch_size, self.options.prefetch + 1
        suspects = files[self._handed * bs : (self._handed + ahead) * bs]
        bad = [path for path in suspects if not _decodable(path)] or ["one of " + ", ".join(suspects)]
        return UndecodableImage(
            f"--data-loader dali: cannot decode {', '.join(bad)} (DALI stops at an unreadable image; "
            "remove it, or use --data-loader pytorch, which skips unreadable images)"
        )


class DaliLoaders:
    """This rank's training batches of an epoch and its validation batches, from two kept pipelines."""

    def __init__(
        self,
        train_split: Split,
        val_split: Split | None,
        options: PipelineOptions,
        *,
        rank: int,
        size: int,
        steps_per_epoch: int,
        seed: int,
    ) -> None:
        require()
        self.train_split, self.val_split = train_split, val_split
        self.rank, self.size, self.seed = rank, size, seed
        self.steps_per_epoch, self.batch_size = steps_per_epoch, options.batch_size
        self.train_pipeline = KeptPipeline(options, train=True)
        self.val_pipeline = KeptPipeline(options, train=False)

    def train_files(self, epoch: int) -> tuple[list[str], list[int]]:
        """The epoch's files for this rank, in order: the PIL loader's, cut to the whole batches of the steps
        the epoch runs (every rank runs the same steps)."""
        order = epoch_shard(
            len(self.train_split.samples), epoch=epoch, rank=self.rank, size=self.size, seed=self.seed
        )
        steps = min(self.steps_per_epoch, len(order) // self.batch_size)
        chosen = [self.train_split.samples[i] for i in order[: steps * self.batch_size]]
        return [path for path, _ in chosen], [label for _, label in chosen]

    def train(self, epoch: int) -> Iterator[Batch]:
        files, labels = self.train_files(epoch)
        # Augmentations differ by rank and by the epoch the pipeline starts at.
        seed = (self.seed * 1_000_003 + epoch * 1_009 + self.rank) % 2**31
        return self.train_pipeline.read(files, labels, seed=seed)

    def val(self) -> Iterator[Batch]:
        assert self.val_split is not None
        shard = self.val_split.shard(self.rank, self.size)
        files, labels = [path for path, _ in shard], [label for _, label in shard]
        return self.val_pipeline.read(files, labels, seed=self.seed + self.rank)
