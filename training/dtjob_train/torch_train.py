"""What the PyTorch trainers share, whoever forms the world (Horovod under ``horovodrun``, or
torch.distributed under ``torchrun``): the device, mixed precision, the input pipelines, the training step,
validation and the epochs. The world's collectives come in as a Comm: the ``horovod.torch`` module, or
dtjob_train.ddp_world's TorchDistributed."""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from . import torch_checkpoint, torch_optim
from .cli import TrainConfig
from .common import EXIT_BAD_INPUT, fail
from .data import dali_data
from .data.folder import MEAN_RGB, STD_RGB
from .host import cores_per_rank, cpu_threads_per_rank, pick_gpu
from .models.resnet_torch import build
from .progress import write_json_atomic
from .run import TrainingRun
from .torch_compile import Forward, compile_mode, compiled


class Comm(Protocol):
    """The world's collectives, as horovod.torch names them (its module is one); ops Sum and Average."""

    Sum: Any
    Average: Any

    def rank(self) -> int: ...
    def size(self) -> int: ...
    def local_rank(self) -> int: ...
    def local_size(self) -> int: ...
    def allreduce(self, tensor: Tensor, op: Any = None, name: str | None = None) -> Tensor: ...
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any: ...
    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]: ...


Batch = tuple[Tensor, Tensor, int]
Batches = Callable[[], Iterator[Batch]]
EpochBatches = Callable[[int], Iterator[Batch]]  # the batches of the epoch it is given


def set_up_device(comm: Comm) -> torch.device:
    """This rank's GPU (cuDNN autotuned; see pick_gpu), or on CPU its share of the host's cores."""
    gpu = pick_gpu(comm.local_rank(), torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if gpu is not None:
        torch.cuda.set_device(gpu)
        torch.backends.cudnn.benchmark = True
        return torch.device("cuda", gpu)
    torch.set_num_threads(cpu_threads_per_rank(comm.local_size()))
    return torch.device("cpu")


def autocast_dtype(amp_dtype: str, device: torch.device) -> torch.dtype:
    """What --amp computes in: fp16 only on a GPU that was asked for it; bf16 otherwise."""
    return torch.float16 if device.type == "cuda" and amp_dtype == "fp16" else torch.bfloat16


class Amp:
    """--amp: autocast to fp16 with loss scaling on GPU, or to bf16 (--amp-dtype bf16), whose fp32 exponent
    range needs no scaling: then there is no GradScaler at all. CPUs autocast to bf16 either way."""

    def __init__(self, enabled: bool, dtype: str, device: torch.device) -> None:
        self.enabled, self.device_type = enabled, device.type
        self.dtype = autocast_dtype(dtype, device)
        scaled = enabled and self.dtype == torch.float16
        self.scaler: torch.amp.GradScaler | None = torch.amp.GradScaler("cuda") if scaled else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def bf16_unsupported(device: torch.device) -> str | None:
    """Why this GPU cannot train in bf16 (tensor cores for it arrived with Ampere), or None."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0):
        return None
    return f"--amp-dtype bf16: {torch.cuda.get_device_name(device)} has no bf16 tensor cores (use fp16)"


def broadcast_scaler(comm: Comm, scaler: torch.amp.GradScaler | None) -> None:
    """Rank 0's loss scale and growth tracker to every rank. The scaler is not optimizer state, and
    only rank 0 restored it; ranks with different scales would skip different steps on an overflow. Without
    loss scaling (fp32, bf16) there is nothing to send, and every rank agrees on that."""
    if scaler is not None:
        scaler.load_state_dict(comm.broadcast_object(scaler.state_dict(), root_rank=0, name="grad_scaler"))


def synthetic_batches(
    cfg: TrainConfig, device: torch.device, fmt: torch.memory_format, rank: int
) -> Iterator[Batch]:
    """One fixed random batch already on the device, as Horovod's synthetic benchmark: measures compute."""
    g = torch.Generator().manual_seed(cfg.seed + rank)
    images = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=g)
    labels = torch.randint(0, cfg.num_classes, (cfg.batch_size,), generator=g)
    batch = (images.to(device).contiguous(memory_format=fmt), labels.to(device), 0)
    return itertools.repeat(batch)


class Normalize:
    """uint8 NHWC from the loader -> normalised float NCHW on the device (the host ships 1 byte per value).
    Floating-point batches come normalised, in the model's type and memory format (DALI's): they pass."""

    def __init__(self, device: torch.device, fmt: torch.memory_format) -> None:
        self.mean = torch.tensor(MEAN_RGB, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD_RGB, device=device).view(1, 3, 1, 1)
        self.device, self.fmt = device, fmt

    def __call__(self, batch: Batch) -> Batch:
        images, labels, skipped = batch
        if images.is_floating_point():
            return images.to(self.device), labels.to(self.device, non_blocking=True), skipped
        x = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        x = x.contiguous(memory_format=self.fmt).float()
        return x.sub_(self.mean).div_(self.std), labels.to(self.device, non_blocking=True), skipped


class Prefetcher:
    """The next batch's host-to-device copy and normalisation run on a side CUDA stream while the current
    batch computes (NVIDIA's data_prefetcher), so the compute stream never waits for an input copy.

    On CPU there is no stream to overlap with: each batch is normalised as it is taken, by the same code.
    """

    def __init__(self, normalize: Normalize) -> None:
        self.normalize = normalize
        cuda = normalize.device.type == "cuda"
        self.stream = torch.cuda.Stream(normalize.device) if cuda else None  # type: ignore[no-untyped-call]

    def __call__(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        if self.stream is None:
            yield from map(self.normalize, batches)
            return
        ahead = self._load(batches)
        while ahead is not None:
            compute = torch.cuda.current_stream(self.normalize.device)
            compute.wait_stream(self.stream)
            batch = ahead
            # Made on the side stream, used on the compute stream: the caching allocator must not hand
            # their memory out again before the compute stream is done with them.
            batch[0].record_stream(compute)
            batch[1].record_stream(compute)
            ahead = self._load(batches)
            yield batch

    def _load(self, batches: Iterator[Batch]) -> Batch | None:
        # The loader's own device work (DALI copies its GPU output into torch tensors on the current
        # stream) lands on the side stream too, ahead of the normalisation that reads it.
        with torch.cuda.stream(self.stream):
            batch = next(batches, None)
            return None if batch is None else self.normalize(batch)


def data_loader(requested: str, device: torch.device, *, elastic: bool = False) -> str:
    """--data-loader auto: DALI's GPU decode on a GPU where DALI is installed (the GPU image ships it: the
    DataLoader's PIL decode cannot feed an H100 from 12 cores, docs/benchmarks.md), else the DataLoader.
    --elastic takes the DataLoader: only its sampler continues an epoch from an offset in a resized world."""
    if requested != "auto":
        return requested
    return "dali" if device.type == "cuda" and dali_data.installed() and not elastic else "pytorch"


def folder_loader(
    cfg: TrainConfig, run: TrainingRun, device: torch.device, local_size: int, elastic: bool = False
) -> Callable[..., Any]:
    """make_loader with this rank's place in the world and the run's settings; call it with a split and
    train=True/False. elastic: each epoch's shard can start at an offset (a resized world)."""
    from .data.torch_data import default_workers, make_loader

    workers = cfg.workers if cfg.workers >= 0 else default_workers(local_size)
    return functools.partial(
        make_loader,
        rank=run.rank,
        size=run.size,
        batch_size=cfg.batch_size,
        image_size=cfg.image_size,
        workers=workers,
        seed=cfg.seed,
        pin_memory=device.type == "cuda",
        elastic=elastic,
    )


def make_inputs(
    cfg: TrainConfig, run: TrainingRun, device: torch.device, pipeline: str, comm: Comm
) -> tuple[EpochBatches, Batches | None]:
    """An epoch's training batches on the device (a fresh iterator per call, in that epoch's order), and the
    validation batches (None without validation). `pipeline` is data_loader's choice: PyTorch's DataLoader
    hands over uint8 NHWC, which the prefetcher copies and normalises; DALI hands over batches normalised on
    the GPU, in fp16 under fp16 autocast. --channels-last makes the inputs, and so every activation, NHWC."""
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    if run.train_split is None:
        return (lambda epoch: synthetic_batches(cfg, device, fmt, comm.rank())), None
    prefetch = Prefetcher(Normalize(device, fmt))
    if pipeline == "dali":
        options = dali_data.PipelineOptions(
            batch_size=cfg.batch_size,
            image_size=cfg.image_size,
            threads=cores_per_rank(comm.local_size()),
            device_id=device.index if device.type == "cuda" else None,
            fp16=cfg.amp and autocast_dtype(cfg.amp_dtype, device) == torch.float16,
            channels_last=cfg.channels_last,
            hw_decoder_load=cfg.dali_hw_decoder_load,
            prefetch=cfg.dali_prefetch,
        )
        dali = dali_data.DaliLoaders(
            run.train_split,
            run.val_split,
            options,
            rank=run.rank,
            size=run.size,
            steps_per_epoch=run.steps_per_epoch,
            seed=cfg.seed,
        )
        val = None if run.val_split is None else (lambda: prefetch(dali.val()))
        return (lambda epoch: prefetch(dali.train(epoch))), val
    from .data.torch_data import set_epoch

    loader = folder_loader(cfg, run, device, comm.local_size())
    train_loader = loader(run.train_split, train=True)

    def train(epoch: int) -> Iterator[Batch]:
        set_epoch(train_loader, epoch)
        return prefetch(iter(train_loader))

    if run.val_split is None:
        return train, None
    val_loader = loader(run.val_split, train=False)
    return train, lambda: prefetch(iter(val_loader))


def train_step(
    forward: Forward, optimizer: Any, amp: Amp, loss_fn: nn.Module, batch: Batch, lr: float
) -> Any:
    """One optimizer step at learning rate lr; the batch's loss. forward: the model, or its compiled twin."""
    images, labels, _ = batch
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad()  # torch >= 2 sets grads to None
    with amp.autocast():
        loss = loss_fn(forward(images), labels)
    if amp.scaler is None:
        loss.backward()
        optimizer.step()  # Horovod: waits for the gradients' allreduce (started during backward) first
        return loss
    amp.scaler.scale(loss).backward()
    if not hasattr(optimizer, "synchronize"):  # DDP: the gradients were allreduced during backward
        amp.scaler.step(optimizer)
    else:
        # Horovod: wait for the gradients' allreduce (started during backward) before unscaling them, then
        # step without a second synchronize.
        optimizer.synchronize()
        amp.scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            amp.scaler.step(optimizer)
    amp.scaler.update()
    return loss


def evaluate(model: nn.Module, batches: Iterator[Batch], steps: int | None, amp: Amp, comm: Comm) -> float:
    """Top-1 accuracy over every rank's shard (sums allreduced, so all ranks agree)."""
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for images, labels, _ in itertools.islice(batches, steps):
            with amp.autocast():
                logits = model(images)
            correct[0] += (logits.argmax(1) == labels).sum().item()
            correct[1] += labels.numel()
    # The hits and the count summed over the ranks.
    total = comm.allreduce(correct, op=comm.Sum, name="val_top1")
    model.train()
    return float(total[0] / max(total[1].item(), 1))


def unwrapped(model: nn.Module) -> nn.Module:
    """The model itself, out of DDP's wrapper: checkpoints and saved weights have the same keys whichever
    trainer wrote them."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return inner if isinstance(inner, nn.Module) else model


def save_model(model: nn.Module, num_classes: int, out: Path) -> None:
    torch.save(model.state_dict(), out / "model.pt")
    write_json_atomic(out / "labels.json", {"numClasses": num_classes})


def train(
    comm: Comm,
    cfg: TrainConfig,
    run: TrainingRun,
    model: nn.Module,
    optimizer: Any,
    amp: Amp,
    loss_fn: nn.Module,
    train_batches: EpochBatches,
    val_batches: Batches | None,
) -> None:
    """The epochs: training steps (compiled with --compile), validation and a checkpoint after each."""
    forward = compiled(model, run.resolved["compile"])
    for epoch in run.epochs():
        for step, lr, batch in run.steps(epoch, train_batches(epoch)):
            loss = train_step(forward, optimizer, amp, loss_fn, batch, lr)
            if run.step_done(step, images=batch[0].shape[0], skipped=batch[2]):
                # The logged loss is averaged over the ranks.
                loss_avg = comm.allreduce(loss.detach().float(), op=comm.Average, name="loss").item()
                run.log(epoch=epoch, step=step, lr=lr, loss=loss_avg)
        if val_batches is not None:
            run.validated(evaluate(model, val_batches(), cfg.val_steps, amp, comm), epoch)
        if run.checkpoint_dir is not None:
            torch_checkpoint.save(run.checkpoint_dir, epoch + 1, unwrapped(model), optimizer, amp.scaler)


def begin(run: TrainingRun, device: torch.device) -> None:
    run.begin(
        f"pytorch {torch.__version__}", f"device {device}, compile {run.resolved['compile'] or 'eager'}"
    )


def refuse_what_the_device_lacks(cfg: TrainConfig, device: torch.device, pipeline: str, rank: int) -> None:
    """bf16 without bf16 tensor cores, and --data-loader dali without DALI, exit with a message."""
    if cfg.amp and cfg.amp_dtype == "bf16" and (problem := bf16_unsupported(device)) is not None:
        fail(problem, rank=rank)
    if cfg.data == "imagenet" and pipeline == "dali" and cfg.elastic:
        fail("--elastic reads ImageNet with --data-loader pytorch (auto picks it)", rank=rank)
    if cfg.data == "imagenet" and pipeline == "dali":
        try:
            dali_data.require()
        except dali_data.DaliMissing as e:
            fail(str(e), rank=rank)


def plan_run(cfg: TrainConfig, comm: Comm) -> tuple[torch.device, str, TrainingRun]:
    """This rank's device, its input pipeline (data_loader's choice) and the run's plan, each refused with a
    message where the device lacks what the flags ask for."""
    device = set_up_device(comm)
    pipeline = data_loader(cfg.data_loader, device, elastic=cfg.elastic)
    refuse_what_the_device_lacks(cfg, device, pipeline, comm.rank())
    torch.manual_seed(cfg.seed)
    run = TrainingRun("pytorch", cfg, comm)
    run.resolved["compile"] = compile_mode(cfg.compile, device)
    if cfg.data == "imagenet":
        run.resolved["dataLoader"] = pipeline
    return device, pipeline, run


def model_and_optimizer(cfg: TrainConfig, run: TrainingRun, device: torch.device) -> tuple[nn.Module, Any]:
    """ResNet on the device and its SGD with momentum (no weight decay on BatchNorm and biases; fused unless
    --no-fused-optimizer). The parameters stay NCHW with --channels-last: Horovod 0.28.1 allreduces and
    broadcasts only tensors contiguous in the default format."""
    model = build(cfg.arch, run.num_classes).to(device)
    lr = run.learning_rate(0)
    return model, torch_optim.sgd(model, lr, cfg.momentum, cfg.weight_decay, cfg.fused_optimizer)


@contextlib.contextmanager
def bad_input_exits(rank: int) -> Iterator[None]:
    """An image the input pipeline cannot decode ends this rank with EXIT_BAD_INPUT, saying so: the rank that
    met the file (it may not be rank 0); the world's runner stops the others."""
    try:
        yield
    except dali_data.UndecodableImage as e:
        print(f"error: rank {rank}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT) from None


def finish(run: TrainingRun, model: nn.Module, device: torch.device) -> None:
    """Peak memory, then TrainingRun.finish: every rank's skipped images and weight digest (equal: the ranks
    kept in step) and the model saved by rank 0."""
    if device.type == "cuda":
        run.resolved["peakMemoryBytes"] = torch.cuda.max_memory_allocated(device)
    weights = (p.detach().cpu().numpy().tobytes() for p in model.parameters())
    run.finish(weights=weights, save=lambda out: save_model(model, run.num_classes, out))
