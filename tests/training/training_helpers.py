"""Helpers for the training tests: a tiny ImageNet-format JPEG tree and real Horovod launches on loopback."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.operator_harness import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FRAMEWORKS = ("pytorch", "tensorflow", "keras")
# Small enough for 2 cores, big enough for Keras's ResNet50 (32 px minimum).
IMAGE_SIZE = 32


def make_tree(root: Path, *, per_class_train: int = 16, per_class_val: int = 4, corrupt: int = 0) -> Path:
    """Two classes a model can tell apart at a glance (reddish vs bluish noise), as 48 px JPEGs."""
    from PIL import Image

    rng = random.Random(0)
    for split, count in (("train", per_class_train), ("val", per_class_val)):
        for cls, channel in (("n01440764", 0), ("n01443537", 2)):
            d = root / split / cls
            d.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = bytearray(rng.randrange(0, 90) for _ in range(48 * 48 * 3))
                for p in range(channel, len(pixels), 3):
                    pixels[p] = rng.randrange(170, 256)
                Image.frombytes("RGB", (48, 48), bytes(pixels)).save(d / f"{cls}_{i}.JPEG", quality=90)
    for i in range(corrupt):
        (root / "train" / "n01440764" / f"broken_{i}.JPEG").write_bytes(b"this is not an image" * 10)
    return root


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "training"), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["HOROVOD_HTTP_BIND_ADDR"] = "127.0.0.1"  # horovodrun's rendezvous server listens on loopback only
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["OMP_NUM_THREADS"] = "1"
    return env


# horovodrun tags every line of a rank with "[rank]<stdout>:"; mpirun does not.
_RANK_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:", re.M)


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]

    @property
    def stdout(self) -> str:
        return _RANK_TAG.sub("", self.proc.stdout)

    @property
    def out(self) -> str:
        return self.stdout + _RANK_TAG.sub("", self.proc.stderr)

    def losses(self) -> list[float]:
        return [float(m) for m in re.findall(r"^epoch \d+/\d+ step \d+/\d+ loss ([\d.]+)", self.out, re.M)]

    def total_images_per_sec(self) -> float:
        found = re.findall(r"^total images/sec: ([\d.]+)$", self.stdout, re.M)
        assert len(found) == 1, self.out
        return float(found[0])

    def progress_lines(self) -> list[dict[str, Any]]:
        return [json.loads(m) for m in re.findall(r"^DTJOB_PROGRESS (\{.*\})$", self.stdout, re.M)]


def launch(
    framework: str,
    args: list[str],
    *,
    launcher: str = "gloo",
    np: int = 2,
    per_rank_dir: Path | None = None,
    timeout: int = 300,
    module: str | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run `python -m dtjob_train.<framework> args` (or `python -m <module> args`) on np real Horovod ranks on
    this host.

    With per_rank_dir, each rank gets --checkpoint-dir/--output-dir/--progress-file under
    per_rank_dir/rank-<N>, so a test can see which ranks wrote anything.
    """
    train = [sys.executable, "-m", module or f"dtjob_train.{framework}", *args]
    if per_rank_dir is not None:
        rank_dir = f"{per_rank_dir}/rank-$HOROVOD_RANK"
        if launcher == "mpi":
            rank_dir = f"{per_rank_dir}/rank-$OMPI_COMM_WORLD_RANK"
        if launcher == "torchrun":
            rank_dir = f"{per_rank_dir}/rank-$RANK"
        extra = f"--checkpoint-dir {rank_dir}/ckpt --output-dir {rank_dir}/out"
        extra += f" --progress-file {rank_dir}/progress.json"
        train = ["sh", "-c", " ".join(train) + " " + extra]
    if launcher == "gloo":
        cmd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo"]
        cmd += ["--network-interface", "lo", *train]
    elif launcher == "mpi":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            pytest.skip("OpenMPI is not installed (make deps)")
        cmd = [
            mpirun,
            "-np",
            str(np),
            "--oversubscribe",
            "-bind-to",
            "none",
            "-x",
            "PYTHONPATH",
            "-x",
            "PATH",
        ]
        cmd += [
            "--mca",
            "oob_tcp_if_include",
            "lo",
            "--mca",
            "btl_tcp_if_include",
            "lo",
            "--mca",
            "btl",
            "self,tcp",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "OMP_NUM_THREADS", *train]
    elif launcher == "torchrun":
        # One node: torchrun's c10d rendezvous on loopback, Gloo's sockets on lo. A per-rank directory needs
        # the shell to expand $RANK, so torchrun then starts `sh -c` instead of Python.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(np)]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
        cmd += ["--no-python", *train] if per_rank_dir is not None else train[1:]
        env = {"GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    elif launcher == "single":
        cmd = train
    else:
        raise ValueError(launcher)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=run_env() | (env or {}), cwd=REPO
    )
    return Run(proc)


def tiny_args(data_dir: Path | None = None, *extra: str) -> list[str]:
    """Flags of a tiny, fast run; fp32 compute and allreduce unless `extra` says --amp (on CPU, autocast is
    bf16, which older CPUs emulate slowly) or --fp16-allreduce (Keras's ResNet-50 at 32 px and batch 2
    takes gradients past fp16's range in its first steps)."""
    base = ["--image-size", str(IMAGE_SIZE), "--batch-size", "4", "--log-interval", "1", "--seed", "1"]
    base += ["--no-amp", "--no-fp16-allreduce"]
    if data_dir is None:
        return [*base, "--data", "synthetic", "--num-classes", "10", *extra]
    return [*base, "--data", "imagenet", "--data-dir", str(data_dir), *extra]
