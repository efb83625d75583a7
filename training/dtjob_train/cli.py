"""The one command line every framework's trainer shares (the operator's launcher passes these flags)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("resnet50", "resnet-tiny")
# numpy seeds (keras.utils.set_random_seed) are unsigned 32-bit; torch and TensorFlow accept more.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class TrainConfig:
    data: str
    data_dir: Path | None
    batch_size: int
    epochs: int
    steps_per_epoch: int | None
    val_steps: int | None
    base_lr: float
    warmup_epochs: float
    momentum: float
    weight_decay: float
    label_smoothing: float
    amp: bool
    fp16_allreduce: bool
    channels_last: bool
    checkpoint_dir: Path | None
    output_dir: Path | None
    log_interval: int
    seed: int
    progress_file: Path | None
    image_size: int
    num_classes: int
    arch: str
    workers: int


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Horovod ResNet-50 training (synthetic or ImageNet).")
    d = p.add_argument_group("data")
    d.add_argument("--data", choices=("synthetic", "imagenet"), default="synthetic")
    d.add_argument("--data-dir", type=Path, help="ImageNet folder with train/<class>/*.JPEG and val/<class>/")
    d.add_argument("--image-size", type=_positive_int, default=224)
    d.add_argument("--num-classes", type=_positive_int, default=1000, help="synthetic data only")
    d.add_argument("--workers", type=int, default=-1, help="input worker processes per rank (-1: auto)")
    t = p.add_argument_group("training")
    t.add_argument("--arch", choices=ARCHS, default="resnet50", help="resnet-tiny is for fast tests")
    t.add_argument("--batch-size", type=_positive_int, default=64, help="per worker")
    t.add_argument("--epochs", type=_positive_int, default=90)
    t.add_argument("--steps-per-epoch", type=_positive_int, help="cap on training steps per epoch")
    t.add_argument("--val-steps", type=int, help="cap on validation steps (0 skips validation)")
    t.add_argument(
        "--base-lr",
        type=_non_negative_float,
        default=0.256,
        help="per 256 images; the run trains at base-lr x global batch / 256",
    )
    t.add_argument("--warmup-epochs", type=_non_negative_float, default=5.0)
    t.add_argument("--momentum", type=_non_negative_float, default=0.9)
    t.add_argument("--weight-decay", type=_non_negative_float, default=5e-5)
    t.add_argument("--label-smoothing", type=_non_negative_float, default=0.1)
    t.add_argument("--seed", type=int, default=42)
    f = p.add_argument_group("performance")
    f.add_argument("--amp", action="store_true", help="mixed precision (fp16/bf16 compute, fp32 master)")
    f.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for allreduce")
    f.add_argument("--channels-last", action="store_true", help="NHWC memory format (PyTorch)")
    o = p.add_argument_group("output")
    o.add_argument("--checkpoint-dir", type=Path, help="rank 0 saves here each epoch; restarts resume")
    o.add_argument("--output-dir", type=Path, help="metrics.json and the final model go here")
    o.add_argument("--log-interval", type=_positive_int, default=10, help="steps between log lines")
    o.add_argument("--progress-file", type=Path, help="JSON progress for the operator, rewritten atomically")
    return p


def parse_args(prog: str, argv: Sequence[str] | None = None) -> TrainConfig:
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    if ns.data == "imagenet" and ns.data_dir is None:
        parser.error("--data-dir is required with --data imagenet")
    if ns.label_smoothing >= 1:
        parser.error(f"--label-smoothing must be in [0, 1), got {ns.label_smoothing}")
    if not 0 <= ns.seed <= MAX_SEED:
        parser.error(f"--seed must be in [0, {MAX_SEED}], got {ns.seed}")
    if ns.val_steps is not None and ns.val_steps < 0:
        parser.error(f"--val-steps must be >= 0, got {ns.val_steps}")
    return TrainConfig(**{k: v for k, v in vars(ns).items()})
