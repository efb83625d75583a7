"""How fast a GPU decodes JPEGs, against the PIL decode one CPU core does: the question behind the data loader
a GPU node defaults to.

    python -m bench.gpu_decode [--images 2048] [--batch 256] [--cores 12]

The JPEGs are generated at ImageNet's typical size (500x375, as bench.input_pipeline). The GPU side is NVIDIA
nvImageCodec, the decoder DALI's `mixed` decoders run on (DALI installs it): the whole batch handed over at
once, per backend: the hardware JPEG engines (A100, H100), and nvJPEG's CUDA decoder with Huffman decoding on
`--cores` CPU threads. The process is pinned to `--cores` CPUs. The CPU side is PIL's full-size decode on one
core, the cost the DataLoader's workers pay per image before cropping.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

from bench.input_pipeline import make_images


def pil_decode_rate(blobs: list[bytes]) -> float:
    started = time.perf_counter()
    for blob in blobs:
        Image.open(io.BytesIO(blob)).convert("RGB")
    return len(blobs) / (time.perf_counter() - started)


def gpu_decode_rate(codec: Any, kind: Any, blobs: list[bytes], batch: int, threads: int) -> float | str:
    """Images/sec of one nvImageCodec backend over every batch after the first, or why it could not run."""
    import torch

    decoder = codec.Decoder(backends=[codec.Backend(kind)], max_num_cpu_threads=threads)
    batches = [blobs[i : i + batch] for i in range(0, len(blobs) - batch + 1, batch)]
    first = decoder.decode([codec.CodeStream(b) for b in batches[0]])
    if any(image is None for image in first):
        return "declined the images"
    torch.cuda.synchronize()
    started = time.perf_counter()
    for chunk in batches[1:]:
        images = decoder.decode([codec.CodeStream(b) for b in chunk])
        if any(image is None for image in images):
            return "declined the images"
        # The pixels as a tensor on the GPU, as a training step would take them.
        torch.as_tensor(images[-1], device="cuda")
    torch.cuda.synchronize()
    return len(batches[1:]) * batch / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--cores", type=int, default=12)
    a = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))[: a.cores]
    os.sched_setaffinity(0, cores)
    with tempfile.TemporaryDirectory() as tmp:
        make_images(Path(tmp), a.images, 500, 375)
        blobs = [f.read_bytes() for f in sorted(Path(tmp).rglob("*.JPEG"))]
    print(f"{len(blobs)} JPEGs of 500x375, {sum(map(len, blobs)) / len(blobs) / 1024:.0f} KiB each")
    pil = pil_decode_rate(blobs[: min(len(blobs), 512)])
    print(f"  {'PIL, 1 core':38s}: {pil:8.0f} images/sec  ({len(cores) * pil:.0f} on {len(cores)} cores)")
    try:
        import nvidia.nvimgcodec as codec
    except ImportError as e:
        print(f"  GPU decode: skipped: nvImageCodec is not installed ({e})")
        return
    for name, kind in (("hardware JPEG engines", codec.BackendKind.HW_GPU_ONLY),
                       (f"CUDA, Huffman on {len(cores)} threads", codec.BackendKind.HYBRID_CPU_GPU),
                       ("CUDA only", codec.BackendKind.GPU_ONLY)):  # fmt: skip
        try:
            rate = gpu_decode_rate(codec, kind, blobs, a.batch, len(cores))
        except Exception as e:  # a backend this GPU lacks says so, and the next one runs
            rate = f"failed: {e}"
        shown = (
            f"{rate:8.0f} images/sec  ({rate / pil:.1f} cores of PIL)" if isinstance(rate, float) else rate
        )
        print(f"  {'GPU, ' + name:38s}: {shown}")


if __name__ == "__main__":
    main()
