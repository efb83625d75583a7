"""The plain PyTorch loop bench.gpu_throughput measures the trainer against, run in a process of its own:

    python -m bench.gpu_baseline --batch-size 256 --amp-dtype fp16 --steps 110 --warmup 10 --compile eager \
        --out FILE

One fixed random batch on the GPU, ResNet-50 (torchvision's where installed, else dtjob_train's), SGD with
momentum, autocast, a GradScaler for fp16. Each step is timed with CUDA events, so the loop never waits for
the GPU before its end; images/sec is the timed steps' images over their wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def describe(gpu: int) -> dict[str, str]:
    """The GPU's name, the driver, CUDA and torch versions: what the README's table quotes (gpu -1: CPU)."""
    import torch

    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={gpu}"]
    try:
        driver = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        driver = "unknown"
    if gpu < 0:
        return {"name": "CPU", "driver": "-", "cuda": "-", "torch": torch.__version__, "cudnn": "-"}
    return {
        "name": torch.cuda.get_device_name(gpu),
        "driver": driver,
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "cudnn": str(torch.backends.cudnn.version()),  # type: ignore[no-untyped-call]
    }


def model(num_classes: int = 1000) -> tuple[Any, str]:
    if importlib.util.find_spec("torchvision") is not None:
        import torchvision  # type: ignore[import-not-found]  # on GPU machines, not in CI

        return torchvision.models.resnet50(num_classes=num_classes), "torchvision"
    from dtjob_train.models.resnet_torch import build

    return build("resnet50", num_classes), "dtjob_train"


def step_function(a: argparse.Namespace, device: Any) -> tuple[Callable[[], None], str]:
    """One training step of the plain loop on a fixed batch, and where the model came from."""
    import torch

    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    net, source = model()
    net = net.to(device).train()
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda and a.amp_dtype == "fp16" else torch.bfloat16
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    scaler = torch.amp.GradScaler("cuda") if a.amp and dtype == torch.float16 else None
    forward = net if a.compile == "eager" else torch.compile(net, mode=a.compile)
    images = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=device).contiguous(
        memory_format=fmt
    )
    labels = torch.randint(0, 1000, (a.batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype, enabled=a.amp):
            loss = loss_fn(forward(images), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    return step, source


def timed_steps(step: Callable[[], None], count: int, cuda: bool) -> tuple[list[float], float]:
    """(each step's milliseconds, sorted; the wall seconds of all): CUDA events on a GPU, so the loop never
    waits for the device before its end."""
    import torch

    if not cuda:
        ms, started = [], time.perf_counter()
        for _ in range(count):
            begun = time.perf_counter()
            step()
            ms.append(1000 * (time.perf_counter() - begun))
        return sorted(ms), time.perf_counter() - started
    new_event = torch.cuda.Event
    events = [(new_event(enable_timing=True), new_event(enable_timing=True)) for _ in range(count)]  # type: ignore[no-untyped-call]
    started = time.perf_counter()
    for begin, end in events:
        begin.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return sorted(b.elapsed_time(e) for b, e in events), time.perf_counter() - started


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    step, source = step_function(a, device)
    started = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - started
    for _ in range(a.warmup - 1):
        step()
    sync()
    ms, seconds = timed_steps(step, a.steps - a.warmup, cuda)
    last = len(ms) - 1
    return {
        "model": source,
        "imagesPerSec": len(ms) * a.batch_size / seconds,
        "peakMemoryBytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "stepTimeMs": {f"p{round(q * 100)}": ms[round(q * last)] for q in (0.5, 0.9, 0.99)},
        "firstStepSeconds": first,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True, help="16-bit autocast")
    p.add_argument("--amp-dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", default="eager", help="eager, or a torch.compile mode")
    p.add_argument("--steps", type=int, default=110)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.write_text(json.dumps(measure(a)))


if __name__ == "__main__":
    main()
