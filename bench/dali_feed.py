"""What taking a batch from DALI costs the training loop's own thread, against the way DALI's documentation
feeds an external source, on the same files in one run.

    python -m bench.dali_feed [--batch-size 256] [--batches 30] [--images 1024]

The trainer's pipeline reads the files its external source names (dali_data.PassSource). Fed a list of
per-sample arrays (paths and labels), DALI checks and converts each sample in Python on the thread that asks
for the batch: the training loop's, between two steps, while the GPU waits for the next step's kernels. Fed
one array per batch (the trainer's way: same_length_paths), it takes the batch whole. Each side builds the
same pipeline (the GPU's `mixed` decoder where there is a GPU, else DALI's CPU decoder) and times next() on
it once the pipeline has had time to prepare the batch, so what is timed is the asking thread's own work.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from dtjob_train.data import dali_data
from PIL import Image

# Long enough for the pipeline to have the next batch ready, so next() measures the asking thread alone.
SETTLE_SECONDS = 0.3


class PerSampleSource(dali_data.PassSource):
    """The baseline: each path and label its own array, as in DALI's external source examples."""

    def __call__(self, info: Any) -> tuple[list[npt.NDArray[np.uint8]], list[npt.NDArray[np.int32]]]:  # type: ignore[override]
        files, labels = self.batch(info)
        paths = [np.frombuffer(path.encode(), dtype=np.uint8) for path in files]
        return paths, [np.array([label], dtype=np.int32) for label in labels]


def make_files(root: Path, count: int) -> list[str]:
    """`count` small JPEGs under names of many lengths, as ImageNet's are not all alike."""
    files = []
    for i in range(count):
        path = root / f"n{i % 8:08d}" / f"{'x' * (i % 13)}img_{i}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((48, 64, 3), i % 251, dtype=np.uint8)).save(path)
        files.append(str(path))
    return files


def next_ms(pipeline: dali_data.KeptPipeline, files: list[str], batches: int) -> list[float]:
    """Milliseconds of each next() on a pipeline that has its batch ready."""
    reader = pipeline.read(files, [i % 8 for i in range(len(files))], seed=1)
    next(reader)
    times = []
    for _ in range(batches):
        time.sleep(SETTLE_SECONDS)
        started = time.perf_counter()
        next(reader)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=30, help="timed batches per side")
    p.add_argument("--images", type=int, default=1024, help="distinct files, read over and over")
    a = p.parse_args()
    if (missing := dali_missing()) is not None:
        print(f"bench.dali_feed: {missing}: nothing to measure")
        return
    gpu = torch.cuda.is_available()
    options = dali_data.PipelineOptions(
        batch_size=a.batch_size,
        image_size=32,
        threads=2,
        device_id=0 if gpu else None,
        fp16=False,
        channels_last=True,
        hw_decoder_load=1.0,
        prefetch=2,
    )
    with tempfile.TemporaryDirectory() as tmp:
        distinct = make_files(Path(tmp), a.images)
        files = (distinct * (-(-(a.batches + 2) * a.batch_size // len(distinct))))[
            : (a.batches + 2) * a.batch_size
        ]
        baseline = dali_data.KeptPipeline(options, train=True)
        baseline.source = PerSampleSource(a.batch_size)
        theirs = next_ms(baseline, files, a.batches)
        del baseline
        ours = next_ms(dali_data.KeptPipeline(options, train=True), files, a.batches)
    print(f"DALI {'mixed (GPU)' if gpu else 'CPU'} decoder, batch {a.batch_size}, {a.batches} batches a side")
    print(f"  {'external source fed':38s} {'next() ms p50':>14s} {'p90':>7s} {'vs per-sample':>14s}")
    base = statistics.median(theirs)
    for name, times in (("a list of per-sample arrays", theirs), ("one array a batch (the trainer)", ours)):
        p50, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
        print(f"  {name:38s} {p50:14.2f} {p90:7.2f} {p50 / base:13.2f}x")


def dali_missing() -> str | None:
    try:
        dali_data.require()
    except dali_data.DaliMissing as e:
        return str(e)
    return None


if __name__ == "__main__":
    main()
