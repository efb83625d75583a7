"""Synthetic ResNet-50 training throughput on this host: 1 Horovod rank vs 2, measured in one run.

    python -m bench.training_throughput [--framework pytorch] [--image-size 224] [--batch-size 16]
                                        [--steps 12] [--amp] [--xla]

Every rank gets one CPU core (DTJOB_THREADS_PER_RANK=1), the way each rank gets one GPU on a node, so the
2-rank figure against twice the 1-rank figure is the scaling efficiency of the allreduce path. A third run,
1 rank on 2 cores, is printed for reference: on CPU the cores are better spent inside one process.
The runs are fp32 with an fp32 allreduce unless --amp (bf16 autocast on CPU, fp16 allreduce), so the figures
stay comparable whatever the trainers' defaults; --xla compiles the TensorFlow/Keras step.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(framework: str, ranks: int, threads: int, args: list[str]) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "training"), env.get("PYTHONPATH", "")])
    env |= {"DTJOB_THREADS_PER_RANK": str(threads), "HOROVOD_HTTP_BIND_ADDR": "127.0.0.1"}
    env |= {"TF_CPP_MIN_LOG_LEVEL": "2"}
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [
        str(horovodrun),
        "-np",
        str(ranks),
        "-H",
        f"localhost:{ranks}",
        "--gloo",
        "--network-interface",
        "lo",
    ]
    cmd += [sys.executable, "-m", f"dtjob_train.{framework}", "--data", "synthetic", *args]
    print(f"[bench] {ranks} rank(s) x {threads} core(s) ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    # horovodrun tags rank output as "[0]<stdout>:".
    found = re.findall(r"^(?:\[\d+\]<stdout>:)?total images/sec: ([\d.]+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not found:
        sys.exit(f"run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return float(found[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=("pytorch", "tensorflow", "keras"), default="pytorch")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=12, help="steps per run; the first log interval is not timed")
    p.add_argument("--amp", action="store_true", help="mixed precision and fp16 allreduce")
    p.add_argument("--xla", action="store_true", help="XLA (TensorFlow and Keras)")
    a = p.parse_args()
    interval = max(a.steps // 4, 1)
    args = ["--arch", "resnet50", "--image-size", str(a.image_size), "--batch-size", str(a.batch_size)]
    args += ["--amp", "--fp16-allreduce"] if a.amp else ["--no-amp", "--no-fp16-allreduce"]
    args += ["--xla"] if a.xla else []
    args += ["--epochs", "1", "--steps-per-epoch", str(a.steps), "--log-interval", str(interval)]
    one = run(a.framework, 1, 1, args)
    two = run(a.framework, 2, 1, args)
    one_wide = run(a.framework, 1, 2, args)
    mode = ("AMP" if a.amp else "fp32") + (", XLA" if a.xla else "")
    shape = f"{a.framework}, {a.image_size}px, batch {a.batch_size}/rank, {mode}"
    print(f"\nResNet-50 synthetic, {shape}, CPU, Gloo")
    print(f"  1 rank  x 1 core : {one:8.2f} images/sec")
    print(f"  2 ranks x 1 core : {two:8.2f} images/sec")
    print(f"  1 rank  x 2 cores: {one_wide:8.2f} images/sec (reference)")
    print(f"scaling efficiency (2 ranks / (2 x 1 rank)): {two / (2 * one):.3f}")
    print(f"2 ranks vs 1 rank on the same 2 cores: {two / one_wide:.3f}x")


if __name__ == "__main__":
    main()
