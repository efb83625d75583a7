"""The one command line every framework's trainer shares (the operator's launcher passes these flags)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dtjob.contract import training as contract

# --elastic: steps between commits (dtjob_train.elastic). A commit copies the model and optimizer state and
# broadcasts a small object (the check for host changes): 57 ms for ResNet-50 measured on CPU (2 ranks), an
# upper bound on a GPU, where TorchState copies on the device. Against a ~50 ms ResNet-50 step at batch 256 on
# an H100, a commit every 50 steps costs at most 2.3%, and a rank that dies without SIGTERM costs at most 50
# steps (2.5 s). See training/README.md.
DEFAULT_COMMIT_EVERY = 50
ARCHS = ("resnet50", "resnet-tiny")
# The recipe's length when run by hand; a job passes its own (one epoch without spec.hyperparameters.epochs).
DEFAULT_EPOCHS = 90
# --data-loader dali: the share of JPEGs given to the GPU's hardware JPEG engines (Ampere and newer); DALI
# sends the rest to nvJPEG's hybrid decoder, Huffman decoding on the host's cores and the rest on the GPU's
# SMs, both of which training contends for. DALI's default, 0.65, is about the split at which both decoders
# finish a batch together (0.64 with the rates measured on an H100, docs/benchmarks.md): the fastest decode.
# Training needs less: the engines alone decode 17,799 images/sec there, about three times what it trains on,
# so they take every JPEG they can decode (DALI falls back for the rest, e.g. progressive JPEGs).
DEFAULT_DALI_HW_DECODER_LOAD = 1.0
# Batches DALI prepares ahead of the one the trainer takes (DALI's default; MLPerf's ResNet runs use 3).
DEFAULT_DALI_PREFETCH = 2


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
    amp_dtype: str
    fp16_allreduce: bool
    channels_last: bool
    xla: bool
    compile: str
    data_loader: str
    checkpoint_dir: Path | None
    output_dir: Path | None
    log_interval: int
    seed: int
    progress_file: Path | None
    image_size: int
    num_classes: int
    arch: str
    workers: int
    elastic: bool = False
    commit_every: int = DEFAULT_COMMIT_EVERY
    dali_hw_decoder_load: float = DEFAULT_DALI_HW_DECODER_LOAD
    dali_prefetch: int = DEFAULT_DALI_PREFETCH
    fused_optimizer: bool = True


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


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Horovod ResNet-50 training (synthetic or ImageNet).")
    _data_flags(p.add_argument_group("data"))
    _training_flags(p.add_argument_group("training"))
    _performance_flags(p.add_argument_group("performance"))
    _elastic_flags(p.add_argument_group("elastic (horovodrun --min-np/--max-np/--host-discovery-script)"))
    o = p.add_argument_group("output")
    o.add_argument("--checkpoint-dir", type=Path, help="rank 0 saves here each epoch; restarts resume")
    o.add_argument("--output-dir", type=Path, help="metrics.json and the final model go here")
    o.add_argument(
        "--log-interval",
        type=_positive_int,
        default=contract.DEFAULT_LOG_INTERVAL,
        help="steps between log lines",
    )
    o.add_argument("--progress-file", type=Path, help="JSON progress for the operator, rewritten atomically")
    return p


def _data_flags(d: argparse._ArgumentGroup) -> None:
    d.add_argument("--data", choices=contract.DATA_SOURCES, default=contract.DEFAULT_DATA_SOURCE)
    d.add_argument("--data-dir", type=Path, help="ImageNet folder with train/<class>/*.JPEG and val/<class>/")
    d.add_argument("--image-size", type=_positive_int, default=contract.DEFAULT_IMAGE_SIZE)
    d.add_argument("--num-classes", type=_positive_int, default=1000, help="synthetic data only")
    d.add_argument("--workers", type=int, default=-1, help="input worker processes per rank (-1: auto)")


def _training_flags(t: argparse._ArgumentGroup) -> None:
    t.add_argument("--arch", choices=ARCHS, default="resnet50", help="resnet-tiny is for fast tests")
    t.add_argument(
        "--batch-size",
        type=_positive_int,
        help=f"per worker (default {contract.DEFAULT_BATCH_AMP} with --amp, {contract.DEFAULT_BATCH_FP32} "
        "without)",
    )
    t.add_argument("--epochs", type=_positive_int, default=DEFAULT_EPOCHS)
    t.add_argument("--steps-per-epoch", type=_positive_int, help="cap on training steps per epoch")
    t.add_argument("--val-steps", type=int, help="cap on validation steps (0 skips validation)")
    t.add_argument(
        "--base-lr",
        type=_non_negative_float,
        default=contract.DEFAULT_BASE_LR,
        help=f"per {contract.LR_REFERENCE_BATCH} images; the run trains at base-lr x global batch / "
        f"{contract.LR_REFERENCE_BATCH}",
    )
    t.add_argument("--warmup-epochs", type=_non_negative_float, default=contract.DEFAULT_WARMUP_EPOCHS)
    t.add_argument("--momentum", type=_non_negative_float, default=contract.DEFAULT_MOMENTUM)
    t.add_argument("--weight-decay", type=_non_negative_float, default=contract.DEFAULT_WEIGHT_DECAY)
    t.add_argument("--label-smoothing", type=_non_negative_float, default=contract.DEFAULT_LABEL_SMOOTHING)
    t.add_argument("--seed", type=int, default=contract.DEFAULT_SEED)


def _elastic_flags(e: argparse._ArgumentGroup) -> None:
    e.add_argument(
        "--elastic",
        action="store_true",
        help="train inside hvd.elastic.run: the world may shrink and grow; a rank that gets SIGTERM leaves "
        "after every rank commits at the same step",
    )
    e.add_argument(
        "--commit-every",
        type=_positive_int,
        default=DEFAULT_COMMIT_EVERY,
        help="steps between in-memory commits of the training state under --elastic (at most this many "
        "steps are redone when a rank dies without SIGTERM)",
    )


def _performance_flags(f: argparse._ArgumentGroup) -> None:
    on_off = argparse.BooleanOptionalAction
    f.add_argument(
        "--amp",
        action=on_off,
        default=contract.DEFAULT_AMP,
        help="mixed precision (16-bit compute, fp32 master)",
    )
    f.add_argument(
        "--amp-dtype",
        choices=contract.AMP_DTYPES,
        default=contract.DEFAULT_AMP_DTYPE,
        help="16-bit type of --amp: fp16 (loss scaling on GPU) or bf16 (no loss scaling; Ampere or newer); "
        "CPUs compute in bf16 either way",
    )
    f.add_argument(
        "--fp16-allreduce",
        action=on_off,
        default=contract.DEFAULT_FP16_ALLREDUCE,
        help="compress gradients to fp16 for allreduce",
    )
    f.add_argument(
        "--channels-last",
        action=on_off,
        default=contract.DEFAULT_CHANNELS_LAST,
        help="NHWC memory format (PyTorch)",
    )
    f.add_argument(
        "--xla",
        action=on_off,
        default=contract.DEFAULT_XLA,
        help="XLA-compile the forward and backward pass (TensorFlow/Keras; the allreduce stays outside)",
    )
    f.add_argument(
        "--compile",
        choices=contract.COMPILE_MODES,
        default=contract.DEFAULT_COMPILE,
        help=f"torch.compile the model in this mode (PyTorch); auto: {contract.GPU_COMPILE_MODE} on a GPU, "
        "eager on CPU",
    )
    _pytorch_input_and_step_flags(f)


def _pytorch_input_and_step_flags(f: argparse._ArgumentGroup) -> None:
    f.add_argument(
        "--data-loader",
        choices=contract.DATA_LOADERS,
        default=contract.DEFAULT_DATA_LOADER,
        help="PyTorch's ImageNet input: DataLoader workers (PIL), NVIDIA DALI (GPU JPEG decode), or auto: "
        "DALI on a GPU where it is installed, else the DataLoader",
    )
    f.add_argument(
        "--dali-hw-decoder-load",
        type=_fraction,
        default=DEFAULT_DALI_HW_DECODER_LOAD,
        help="DALI: share of the JPEGs decoded by the GPU's hardware JPEG engines, where it has them; the "
        "rest are Huffman-decoded on the host",
    )
    f.add_argument(
        "--dali-prefetch",
        type=_positive_int,
        default=DEFAULT_DALI_PREFETCH,
        help="DALI: batches prepared ahead of the one training",
    )
    f.add_argument(
        "--fused-optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PyTorch: SGD's fused step, which takes the loss scale on the GPU; --no-fused-optimizer: "
        "torch's default step, whose loss scaling reads the GPU's inf check back once a step",
    )


def parse_args(prog: str, argv: Sequence[str] | None = None, *, framework: str | None = None) -> TrainConfig:
    """The flags; with `framework`, a flag that has no meaning for that trainer is refused, not ignored."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    if framework is not None and ns.xla and not contract.takes_xla(framework):
        parser.error("--xla applies to the TensorFlow and Keras trainers")
    if framework is not None and not contract.takes_compile(framework, ns.compile):
        parser.error(
            f"--compile {ns.compile} applies to the PyTorch trainer (TensorFlow compiles with --xla)"
        )
    if framework is not None and not contract.takes_data_loader(framework, ns.data_loader):
        parser.error(
            f"--data-loader {ns.data_loader} applies to the PyTorch trainer (TensorFlow reads tf.data)"
        )
    if framework not in (None, "pytorch") and not ns.fused_optimizer:
        parser.error("--no-fused-optimizer applies to the PyTorch trainer")
    if ns.data == "imagenet" and ns.data_dir is None:
        parser.error("--data-dir is required with --data imagenet")
    if ns.label_smoothing >= contract.LABEL_SMOOTHING_BELOW:
        parser.error(
            f"--label-smoothing must be in [0, {contract.LABEL_SMOOTHING_BELOW:g}), got {ns.label_smoothing}"
        )
    if not 0 <= ns.seed <= contract.MAX_SEED:
        parser.error(f"--seed must be in [0, {contract.MAX_SEED}], got {ns.seed}")
    if ns.val_steps is not None and ns.val_steps < 0:
        parser.error(f"--val-steps must be >= 0, got {ns.val_steps}")
    if ns.batch_size is None:
        ns.batch_size = contract.default_batch(ns.amp)
    return TrainConfig(**{k: v for k, v in vars(ns).items()})
