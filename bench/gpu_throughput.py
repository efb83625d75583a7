"""The PyTorch trainer against a plain PyTorch loop, on every GPU of this machine: images/sec, the ratio, peak
memory, step-time percentiles and the first step's seconds (start-up, cuDNN autotuning and compilation).

    python -m bench.gpu_throughput [--batch-size 256] [--no-amp | --amp-dtype fp16|bf16] [--no-channels-last]
        [--compile auto|eager|default|reduce-overhead|...] [--steps 110 --warmup 10] [--image-size 224]
        [--jpegs 8000 --cores 12 [--loaders pytorch,dali] [--dali-hw-decoder-load 0.65,0.9,1]
        [--dali-prefetch 2,3]] [--variants foreach,async-completion] [--no-baseline] [--json FILE]

Both sides train the same configuration on one fixed synthetic batch on the GPU: the batch per GPU, the
precision, the memory format and the compile mode (auto: the trainer's choice on a GPU). The baseline is the
loop anyone would write: torchvision's ResNet-50 where torchvision is installed (else the trainer's own),
SGD with momentum, autocast and, for fp16, a GradScaler; no Horovod, no input pipeline, no logging. Each side
runs in a process of its own on one GPU, one GPU after another. The first --warmup steps of each go untimed.

--jpegs N also trains the trainer on N generated JPEGs (500x375, ImageNet's typical photo) with each data
loader it has, pinned to --cores CPUs: the input pipeline's rate against the synthetic one, as on a node
with that many vCPUs per GPU (an Azure ND H100 v5 has 12). DALI runs once per hardware decoder share and
prefetch depth given (default: the trainer's). --loaders picks the loaders; --no-baseline leaves the plain
loop out (its compile is a minute of a GPU machine's time), and the trainer on synthetic data is then the
only reference.

--variants also runs the trainer, on synthetic data and in each JPEG run, with each of these changes to its
step, one at a time: foreach (--no-fused-optimizer: torch's default SGD step, whose loss scaling reads the
GPU's inf check back every step) and async-completion (HOROVOD_ENABLE_ASYNC_COMPLETION=1: Horovod reports an
allreduce done once it is queued on the GPU, so the loop does not wait for it; off in the trainer until
measured). What each buys is its rate against the trainer's own in the same run.

Without a GPU it says so and exits 0. On an AKS GPU node, run it in the PyTorch image (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dtjob_train.cli import DEFAULT_DALI_HW_DECODER_LOAD, DEFAULT_DALI_PREFETCH

from bench import gpu_baseline

REPO = Path(__file__).resolve().parents[1]
JPEG_EPOCHS = 3  # every epoch's first interval restarts the loader and is not counted
DISTINCT_JPEGS = 512
# --variants: each one's trainer flags and environment.
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "foreach": (["--no-fused-optimizer"], {}),
    "async-completion": ([], {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}),
}


def floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def loader_names(text: str) -> list[str]:
    names = text.split(",")
    if unknown := sorted(set(names) - {"pytorch", "dali"}):
        raise argparse.ArgumentTypeError(f"unknown data loader {', '.join(unknown)} (choose pytorch, dali)")
    return names


def variant_names(text: str) -> list[str]:
    names = text.split(",") if text else []
    if unknown := sorted(set(names) - set(VARIANTS)):
        raise argparse.ArgumentTypeError(
            f"unknown variant {', '.join(unknown)} (choose {', '.join(VARIANTS)})"
        )
    return names


def child_env(gpu: int, cores: list[int] | None = None) -> dict[str, str]:
    """One GPU per child (none with --cpu: gpu -1)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu) if gpu >= 0 else "", PYTHONUNBUFFERED="1")
    code = [str(REPO / "training"), str(REPO / "operator"), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([*code, env.get("PYTHONPATH", "")])
    if cores is not None:
        env["OMP_NUM_THREADS"] = str(len(cores))
    return env


def run_child(cmd: list[str], env: dict[str, str], cores: list[int] | None, log: Path) -> None:
    """One side, its output in `log`; pinned to `cores` (with its DataLoader workers) when given."""

    def pin() -> None:
        if cores is not None:
            os.sched_setaffinity(0, cores)

    with log.open("w") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}); its output:\n{log.read_text()}")


def trainer_flags(a: argparse.Namespace, epochs: int) -> list[str]:
    flags = ["--batch-size", str(a.batch_size), "--amp-dtype", a.amp_dtype, "--compile", a.compile]
    flags += ["--image-size", str(a.image_size)] + ([] if a.amp else ["--no-amp"])
    flags += ["--epochs", str(epochs), "--steps-per-epoch", str(a.steps), "--log-interval", str(a.warmup)]
    return flags + ([] if a.channels_last else ["--no-channels-last"])


def trainer(
    a: argparse.Namespace,
    gpu: int,
    work: Path,
    name: str,
    data: list[str],
    cores: list[int] | None = None,
    variant: str | None = None,
) -> dict[str, Any]:
    """The dtjob trainer on one GPU: its metrics.json (images over time after each epoch's first interval)."""
    out = work / name
    epochs = 1 if "synthetic" in data else JPEG_EPOCHS
    flags, env = VARIANTS[variant] if variant else ([], {})
    cmd = [sys.executable, "-m", "dtjob_train.pytorch", *trainer_flags(a, epochs), *data, *flags]
    cmd += ["--output-dir", str(out), "--val-steps", "0"]
    run_child(cmd, child_env(gpu, cores) | env, cores, work / f"{name}.log")
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    return {
        "imagesPerSec": metrics["imagesPerSecPerWorker"],
        "peakMemoryBytes": metrics.get("peakMemoryBytes"),
        "stepTimeMs": metrics.get("stepTimeMs"),
        "firstStepSeconds": metrics.get("firstStepSeconds"),
        "compile": metrics.get("compile"),
        "dataLoader": metrics.get("dataLoader"),
    }


def baseline(a: argparse.Namespace, gpu: int, work: Path, compile_mode: str | None) -> dict[str, Any]:
    out = work / "baseline.json"
    cmd = [sys.executable, "-m", "bench.gpu_baseline", "--batch-size", str(a.batch_size)]
    cmd += ["--amp-dtype", a.amp_dtype, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    cmd += [] if a.amp else ["--no-amp"]
    cmd += ["--compile", compile_mode or "eager", "--image-size", str(a.image_size), "--out", str(out)]
    cmd += [] if a.channels_last else ["--no-channels-last"]
    run_child(cmd, child_env(gpu), None, work / "baseline.log")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def jpeg_runs(a: argparse.Namespace, gpu: int, work: Path) -> list[dict[str, Any]]:
    """The trainer on generated JPEGs with each data loader it has, pinned to --cores CPUs."""
    from bench.input_pipeline import make_images

    root = work / "jpegs"
    if not root.exists():
        print(f"[bench] writing {a.jpegs} JPEGs of 500x375 ...", flush=True)
        make_images(work / "distinct", min(a.jpegs, DISTINCT_JPEGS), 500, 375)
        distinct = sorted((work / "distinct").rglob("*.JPEG"))
        # Copies of a few hundred photos: decoding costs the same per file, and writing them is quick.
        for i in range(a.jpegs):
            target = root / "train" / f"n{i % 8:08d}" / f"img_{i}.JPEG"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(distinct[i % len(distinct)], target)
    cores = sorted(os.sched_getaffinity(0))[: a.cores]
    from dtjob_train.data import dali_data

    runs: list[tuple[str, list[str]]] = [("pytorch", [])] if "pytorch" in a.loaders else []
    if "dali" in a.loaders and dali_data.installed():
        for load, prefetch in itertools.product(a.dali_hw_decoder_load, a.dali_prefetch):
            tuning = ["--dali-hw-decoder-load", str(load), "--dali-prefetch", str(prefetch)]
            runs.append((f"dali (hw {load:g}, prefetch {prefetch})", tuning))
    rows = []
    for i, ((loader, tuning), variant) in enumerate(itertools.product(runs, [None, *a.variants])):
        data = ["--data", "imagenet", "--data-dir", str(root), "--data-loader", loader.split()[0], *tuning]
        result = trainer(a, gpu, work, f"jpeg-{i}", data, cores, variant)
        rows.append(result | {"cores": len(cores), "loader": loader, "variant": variant})
    return rows


def fmt_row(name: str, r: dict[str, Any], base: float) -> str:
    ms = r.get("stepTimeMs") or {}
    steps = "/".join(f"{ms[k]:.1f}" for k in ("p50", "p90", "p99")) if ms else "-"
    mem = r.get("peakMemoryBytes")
    mem_text = f"{mem / 2**30:.1f}" if mem else "-"
    first = r.get("firstStepSeconds")
    first_text = f"{first:.1f}" if first is not None else "-"
    rate = r["imagesPerSec"]
    return f"  {name:70s} {rate:9.1f} {rate / base:6.2f}x {mem_text:>9s} {steps:>20s} {first_text:>9s}"


def bench_gpu(a: argparse.Namespace, gpu: int, work: Path) -> dict[str, Any]:
    ours = trainer(a, gpu, work, "synthetic", ["--data", "synthetic"])
    theirs = baseline(a, gpu, work, ours["compile"]) if a.baseline else None
    result: dict[str, Any] = {"gpu": gpu, **gpu_baseline.describe(gpu), "trainer": ours, "baseline": theirs}
    layout = "channels-last" if a.channels_last else "NCHW"
    print(
        f"\nGPU {gpu}: {result['name']} (driver {result['driver']}, CUDA {result['cuda']}, torch "
        f"{result['torch']}), batch {a.batch_size}, {a.amp_dtype if a.amp else 'fp32'}, {layout}, "
        f"compile {ours['compile'] or 'eager'}"
    )
    header = ("img/s", "ratio", "peak GiB", "step ms p50/p90/p99", "1st step s")
    print(f"  {'':70s} {header[0]:>9s} {header[1]:>7s} {header[2]:>9s} {header[3]:>20s} {header[4]:>9s}")
    # Without the plain loop, the trainer on synthetic data is the reference of every ratio.
    base = (theirs or ours)["imagesPerSec"]
    if theirs is not None:
        print(fmt_row(f"plain PyTorch ({theirs['model']})", theirs, base))
    print(fmt_row("dtjob trainer", ours, base))
    result["variants"] = {
        v: trainer(a, gpu, work, f"synthetic-{v}", ["--data", "synthetic"], None, v) for v in a.variants
    }
    for v, r in result["variants"].items():
        print(fmt_row(f"dtjob trainer, {v}", r, base))
    if a.jpegs:
        result["jpeg"] = jpeg_runs(a, gpu, work)
        for r in result["jpeg"]:
            label = f"trainer, JPEGs, {r['loader']}, {r['cores']} cores" + (
                f", {r['variant']}" if r["variant"] else ""
            )
            print(fmt_row(label, r, ours["imagesPerSec"]))
        print("  (JPEG rows: ratio against the trainer on synthetic data)")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True, help="16-bit autocast")
    p.add_argument("--amp-dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", default="auto", help="the trainer's --compile; the baseline compiles alike")
    p.add_argument(
        "--steps", type=int, default=110, help="steps per run, the first --warmup of them not timed"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="untimed steps: the trainer's first log interval, which its meter leaves out, and as many "
        "of the baseline's",
    )
    p.add_argument("--image-size", type=int, default=224, help="both sides' input side, in pixels")
    p.add_argument("--jpegs", type=int, default=0, help="also train on this many generated JPEGs")
    p.add_argument("--cores", type=int, default=12, help="CPUs the JPEG runs may use (vCPUs per GPU)")
    p.add_argument(
        "--dali-hw-decoder-load",
        type=floats,
        default=[DEFAULT_DALI_HW_DECODER_LOAD],
        help="DALI JPEG runs: the hardware decoder's shares to try, comma-separated (one run each)",
    )
    p.add_argument(
        "--dali-prefetch",
        type=ints,
        default=[DEFAULT_DALI_PREFETCH],
        help="DALI JPEG runs: the prefetch depths to try, comma-separated (one run per share and depth)",
    )
    p.add_argument(
        "--loaders",
        type=loader_names,
        default=["pytorch", "dali"],
        help="JPEG runs: the data loaders to run, comma-separated (pytorch, dali)",
    )
    p.add_argument(
        "--variants",
        type=variant_names,
        default=[],
        help=f"the trainer again with each of these changes to its step ({', '.join(VARIANTS)})",
    )
    p.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the plain PyTorch loop beside the trainer",
    )
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument(
        "--cpu", action="store_true", help="run on the CPU: checks the benchmark, measures nothing"
    )
    a = p.parse_args()
    gpus = 1 if a.cpu else gpu_baseline.gpu_count()
    if gpus == 0:
        print("bench.gpu_throughput: no GPU here (torch.cuda.is_available() is False): nothing to measure")
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpu in [-1] if a.cpu else range(gpus):
            work = Path(tmp) / f"gpu{gpu}"
            work.mkdir()
            started = time.perf_counter()
            results.append(bench_gpu(a, gpu, work) | {"seconds": time.perf_counter() - started})
            if a.json is not None:
                a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
