"""Input pipeline images/sec against a naive single-process PIL loader, on the same JPEGs in one run.

    python -m bench.input_pipeline [--images 1024] [--width 500 --height 375] [--workers N] [--no-tf]
    python -m bench.input_pipeline --stages [--images 512]

The files are generated at ImageNet's typical size (500x375 JPEG, quality 90). The naive loader is what a
first version would do: open, convert, resize the short side, random-crop 224, flip, in the main process.
The pipelines are dtjob_train's: the PyTorch DataLoader (worker processes, reduced-scale JPEG decode, uint8
batches), NVIDIA DALI (`--data-loader dali`: nvJPEG on a GPU, its CPU decoder without one; skipped, with the
reason, where DALI is not installed) and the tf.data pipeline of the TensorFlow/Keras trainers.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from dtjob_train.data.folder import scan
from PIL import Image


def make_images(root: Path, count: int, width: int, height: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        d = root / "train" / f"n{i % 8:08d}"
        d.mkdir(parents=True, exist_ok=True)
        # Smooth noise compresses like a photo (pure noise would make unrealistically large JPEGs).
        small = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
        img.save(d / f"img_{i}.JPEG", quality=90)


def naive(paths: list[str], size: int) -> float:
    rng = random.Random(0)
    start = time.perf_counter()
    for path in paths:
        img = Image.open(path).convert("RGB")
        w, h = img.size
        short = 256
        img = img.resize(
            (round(w * short / min(w, h)), round(h * short / min(w, h))), Image.Resampling.BILINEAR
        )
        x, y = rng.randint(0, img.size[0] - size), rng.randint(0, img.size[1] - size)
        img = img.crop((x, y, x + size, y + size))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        np.asarray(img, dtype=np.uint8)
    return len(paths) / (time.perf_counter() - start)


def torch_pipeline(root: Path, size: int, workers: int, batch: int) -> float:
    from dtjob_train.data.torch_data import make_loader

    split = scan(root, need_val=False).train
    loader = make_loader(
        split,
        rank=0,
        size=1,
        batch_size=batch,
        image_size=size,
        train=True,
        workers=workers,
        seed=0,
        pin_memory=False,
    )
    batches = iter(loader)
    next(batches)  # worker start-up and the first batch are not timed (as for tf.data below)
    start, seen = time.perf_counter(), 0
    for images, _, _ in batches:
        seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def dali_pipeline(root: Path, size: int, threads: int, batch: int) -> tuple[float, str]:
    """(images/sec, where it decoded) of the DALI pipeline, timed after its first batch."""
    import torch
    from dtjob_train.cli import DEFAULT_DALI_HW_DECODER_LOAD, DEFAULT_DALI_PREFETCH
    from dtjob_train.data.dali_data import DaliLoaders, PipelineOptions

    split = scan(root, need_val=False).train
    gpu = torch.cuda.is_available()
    # As the trainer asks on a GPU by default: fp16, channels-last.
    options = PipelineOptions(
        batch_size=batch,
        image_size=size,
        threads=threads,
        device_id=0 if gpu else None,
        fp16=gpu,
        channels_last=True,
        hw_decoder_load=DEFAULT_DALI_HW_DECODER_LOAD,
        prefetch=DEFAULT_DALI_PREFETCH,
    )
    steps = len(split.samples) // batch
    loaders = DaliLoaders(split, None, options, rank=0, size=1, steps_per_epoch=steps, seed=0)
    batches = loaders.train(0)
    next(batches)
    start, seen = time.perf_counter(), 0
    for images, _, _ in batches:
        seen += images.shape[0]
    if gpu:
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start), "GPU, nvJPEG" if gpu else "CPU decoder"


def dali_missing() -> str | None:
    from dtjob_train.data.dali_data import DaliMissing, require

    try:
        require()
    except DaliMissing as e:
        return str(e)
    return None


def tf_pipeline(root: Path, size: int, threads: int, batch: int) -> float:
    from dtjob_train.data.tf_data import make_dataset
    from dtjob_train.tf_env import tf

    split = scan(root, need_val=False).train
    skipped = tf.Variable(0, dtype=tf.int64)
    ds = make_dataset(
        split,
        rank=0,
        size=1,
        batch_size=batch,
        image_size=size,
        train=True,
        seed=0,
        num_classes=None,
        skipped=skipped,
        threads=threads,
        # Two epochs: the first batch below is not timed, the next `steps` are.
        epochs=range(2),
        steps_per_epoch=len(split.samples) // batch,
    )
    steps = len(split.samples) // batch
    it = iter(ds)
    next(it)
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch / (time.perf_counter() - start)


def stage_costs(paths: list[str], size: int) -> dict[str, float]:
    """Milliseconds per image of each step of the DataLoader's training transform (torch_data.load_train), on
    one core: the header probe, the JPEG decode (at reduced DCT scale where the crop allows), the random
    resized crop (one bilinear resize of the crop box), the flip of half the images, and the copy to a numpy
    array. Each stage is timed over every image in turn, on the outputs of the stage before."""
    from dtjob_train.data.torch_data import _open_scaled, _random_resized_crop_box

    rng = random.Random(0)
    ms: dict[str, float] = {}

    def timed(name: str, items: list[Any], work: Callable[[Any], Any]) -> list[Any]:
        started = time.perf_counter()
        out = [work(item) for item in items]
        ms[name] = 1000 * (time.perf_counter() - started) / len(items)
        return out

    def probe(path: str) -> tuple[str, tuple[int, int, int, int], tuple[int, int]]:
        with Image.open(path) as img:
            w, h = img.size
        x0, y0, x1, y1 = _random_resized_crop_box(w, h, rng)
        return path, (x0, y0, x1, y1), (math.ceil(w * size / (x1 - x0)), math.ceil(h * size / (y1 - y0)))

    def decode(item: tuple[str, tuple[int, int, int, int], tuple[int, int]]) -> tuple[Any, tuple[float, ...]]:
        path, box, need = item
        img, scale = _open_scaled(path, need)
        img.load()
        return img, tuple(v * scale for v in box)

    def crop(item: tuple[Any, tuple[float, ...]]) -> Any:
        img, box = item
        return img.resize((size, size), Image.Resampling.BILINEAR, box=box)

    probed = timed("header and crop box", paths, probe)
    decoded = timed("decode (reduced scale where possible)", probed, decode)
    cropped = timed("random resized crop (bilinear)", decoded, crop)
    flipped = timed(
        "flip (half the images)",
        cropped,
        lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else im,
    )
    timed("to a uint8 array", flipped, lambda im: np.asarray(im, dtype=np.uint8))
    return ms


def print_stages(ms: dict[str, float], shape: str) -> None:
    total = sum(ms.values())
    print(f"\nThe DataLoader's training transform on one core, {shape}")
    for name, cost in ms.items():
        print(f"  {name:40s}: {cost:6.2f} ms/image  {100 * cost / total:5.1f}%")
    per_core = 1000 / total
    print(f"  {'all':40s}: {total:6.2f} ms/image  = {per_core:.0f} images/sec per core")
    for cores in (12, 6):
        # The rank's own process drives the GPU: cores - 1 decode workers (torch_data.default_workers).
        print(
            f"  {cores} vCPUs per GPU ({cores - 1} workers): at most {per_core * (cores - 1):,.0f} images/sec"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--tf", action=argparse.BooleanOptionalAction, default=True, help="the tf.data pipeline")
    p.add_argument("--stages", action="store_true", help="only the cost of each step of the transform")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"[bench] writing {a.images} JPEGs of {a.width}x{a.height} ...", flush=True)
        make_images(root, a.images, a.width, a.height)
        paths = [p for p, _ in scan(root, need_val=False).train.samples]
        if a.stages:
            print_stages(stage_costs(paths, a.image_size), f"{a.width}x{a.height} JPEGs -> {a.image_size}px")
            return
        base = naive(paths, a.image_size)
        rows = [("dtjob_train (PyTorch)", torch_pipeline(root, a.image_size, a.workers, a.batch_size), "")]
        missing = dali_missing()
        if missing is None:
            rate, where = dali_pipeline(root, a.image_size, a.workers, a.batch_size)
            rows.append(("DALI", rate, where))
        if a.tf:
            rows.append(
                ("dtjob_train (tf.data)", tf_pipeline(root, a.image_size, a.workers, a.batch_size), "")
            )
        shape = f"{a.images} JPEGs {a.width}x{a.height} -> {a.image_size}px"
        print(f"\nInput pipeline, {shape}, {a.workers} workers/threads")
        print(f"  {'naive PIL, 1 process':24s}: {base:8.1f} images/sec")
        for name, rate, note in rows:
            suffix = f"   ({note})" if note else ""
            print(f"  {name:24s}: {rate:8.1f} images/sec   ratio {rate / base:.2f}x{suffix}")
        if missing is not None:
            print(f"  {'DALI':24s}: skipped: {missing}")


if __name__ == "__main__":
    main()
