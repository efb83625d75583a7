"""Horovod + PyTorch ResNet-50 trainer: ``horovodrun -np N python -m dtjob_train.pytorch [flags]``."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import horovod
import horovod.torch as hvd
import torch
from torch import Tensor, nn

from . import checkpoints
from .cli import TrainConfig, parse_args
from .common import cpu_threads_per_rank, digest, metrics_record, scan_imagenet
from .data.folder import MEAN_RGB, STD_RGB
from .models.resnet_torch import build
from .progress import Reporter, Throughput, write_json_atomic
from .schedule import learning_rate

Batch = tuple[Tensor, Tensor, int]


def synthetic_batches(cfg: TrainConfig, device: torch.device, fmt: torch.memory_format) -> Iterator[Batch]:
    """One fixed random batch already on the device, as Horovod's synthetic benchmark: measures compute."""
    g = torch.Generator().manual_seed(cfg.seed + hvd.rank())
    images = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=g)
    labels = torch.randint(0, cfg.num_classes, (cfg.batch_size,), generator=g)
    batch = (images.to(device).contiguous(memory_format=fmt), labels.to(device), 0)
    return itertools.repeat(batch)


class Normalize:
    """uint8 NHWC from the loader -> normalised float NCHW on the device (the host ships 1 byte per value)."""

    def __init__(self, device: torch.device, fmt: torch.memory_format) -> None:
        self.mean = torch.tensor(MEAN_RGB, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD_RGB, device=device).view(1, 3, 1, 1)
        self.device, self.fmt = device, fmt

    def __call__(self, batch: Batch) -> Batch:
        images, labels, skipped = batch
        x = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        x = x.contiguous(memory_format=self.fmt).float()
        return x.sub_(self.mean).div_(self.std), labels.to(self.device, non_blocking=True), skipped


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on BatchNorm and bias parameters (1-D tensors), as in the large-batch recipes."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def save_checkpoint(directory: Path, epochs_done: int, state: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoints.path_for(directory, epochs_done, ".pt")
    tmp = directory / f".{final.name}.tmp"
    torch.save(state, tmp)
    tmp.replace(final)
    checkpoints.prune(directory)


def evaluate(model: nn.Module, batches: Iterator[Batch], steps: int | None, amp_ctx: Any) -> float:
    """Top-1 accuracy over every rank's shard (sums allreduced, so all ranks agree)."""
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for images, labels, _ in itertools.islice(batches, steps):
            with amp_ctx():
                logits = model(images)
            correct[0] += (logits.argmax(1) == labels).sum().item()
            correct[1] += labels.numel()
    total = hvd.allreduce(correct, op=hvd.Sum, name="val_top1")
    model.train()
    return float(total[0] / max(total[1].item(), 1))


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.pytorch", argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(cpu_threads_per_rank(hvd.local_size()))
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    torch.manual_seed(cfg.seed)

    val_loader = None
    if cfg.data == "synthetic":
        num_classes, train_iter_factory = cfg.num_classes, None
    else:
        from .data.torch_data import default_workers, make_loader

        dataset, _ = scan_imagenet(cfg, rank=rank, size=size)
        num_classes = len(dataset.train.classes)
        workers = cfg.workers if cfg.workers >= 0 else default_workers(hvd.local_size())
        common = {"rank": rank, "size": size, "batch_size": cfg.batch_size, "image_size": cfg.image_size}
        common |= {"workers": workers, "seed": cfg.seed, "pin_memory": cuda}
        train_loader = make_loader(dataset.train, train=True, **common)
        if dataset.val is not None and cfg.val_steps != 0:
            val_loader = make_loader(dataset.val, train=False, **common)
        train_iter_factory = train_loader

    # Every rank must run the same number of steps (each one is an allreduce): size by the smallest shard.
    available = cfg.steps_per_epoch or 100
    if cfg.data == "imagenet":
        available = len(dataset.train.samples) // size // cfg.batch_size
    steps_per_epoch = min(available, cfg.steps_per_epoch or available)

    # --channels-last makes the inputs, and so every activation, NHWC. The parameters stay NCHW: Horovod
    # 0.28.1 allreduces and broadcasts only tensors contiguous in the default format.
    model = build(cfg.arch, num_classes).to(device)
    optimizer = torch.optim.SGD(param_groups(model, cfg.weight_decay), lr=cfg.base_lr, momentum=cfg.momentum)
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
    )
    # fp16 autocast with loss scaling on GPU; on CPU autocast means bfloat16, which needs no scaler.
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.amp and cuda)

    def amp_ctx() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device.type, dtype=amp_dtype, enabled=cfg.amp)

    start_epoch = 0
    found = checkpoints.latest(cfg.checkpoint_dir) if rank == 0 else None
    if found is not None:
        state = torch.load(found[1], map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start_epoch = found[0]
    start_epoch = int(hvd.broadcast_object(start_epoch, root_rank=0, name="start_epoch"))
    # Optimizer state first: Horovod initialises an empty state (every rank but 0 on a resume) with a
    # zero-gradient step, which weight decay turns into a real update of those ranks' weights. Broadcasting
    # the parameters afterwards leaves every rank with rank 0's weights.
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    reporter = Reporter.for_run(cfg, rank=rank, world_size=size, steps_per_epoch=steps_per_epoch)
    if start_epoch:
        reporter.say(f"resuming from {found[1] if found else 'checkpoint'}: {start_epoch} epochs done")
    reporter.say(
        f"pytorch {torch.__version__} horovod {horovod.__version__}: {size} ranks, {cfg.arch}, {cfg.data}, "
        f"batch {cfg.batch_size}/worker, {steps_per_epoch} steps/epoch, device {device}"
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    normalize = Normalize(device, fmt)
    meter = Throughput()
    loss_avg, val_top1, skipped = math.nan, None, 0
    step_total = start_epoch * steps_per_epoch
    model.train()
    for epoch in range(start_epoch, cfg.epochs):
        if train_iter_factory is None:
            batches = synthetic_batches(cfg, device, fmt)
        else:
            batches = map(normalize, iter(train_iter_factory))
        for step, (images, labels, n_skipped) in enumerate(itertools.islice(batches, steps_per_epoch), 1):
            lr = learning_rate(
                epoch + step / steps_per_epoch,
                base_lr=cfg.base_lr,
                world_size=size,
                warmup_epochs=cfg.warmup_epochs,
                epochs=cfg.epochs,
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad()  # torch >= 2 sets grads to None
            with amp_ctx():
                loss = loss_fn(model(images), labels)
            scaler.scale(loss).backward()
            # Wait for the allreduce before unscaling, then step without a second synchronize.
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
            meter.add(images.shape[0])
            skipped += n_skipped
            step_total += 1
            if step % cfg.log_interval == 0 or step == steps_per_epoch:
                loss_avg = hvd.allreduce(loss.detach().float(), name="loss").item()
                reporter.interval(epoch=epoch, step=step, loss=loss_avg, lr=lr, per_worker=meter.mark())
        if val_loader is not None:
            val_top1 = evaluate(model, map(normalize, iter(val_loader)), cfg.val_steps, amp_ctx)
            reporter.say(f"epoch {epoch + 1}/{cfg.epochs} val top-1 {val_top1:.4f}")
        if rank == 0 and cfg.checkpoint_dir is not None:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            save_checkpoint(cfg.checkpoint_dir, epoch + 1, state | {"scaler": scaler.state_dict()})

    skipped = int(hvd.allreduce(torch.tensor(skipped), op=hvd.Sum, name="skipped").item())
    local_digest = digest(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    digests = [str(d) for d in hvd.allgather_object(local_digest, name="digests")]
    if skipped:
        reporter.say(f"warning: skipped {skipped} unreadable images")
    metrics = metrics_record(
        cfg,
        framework="pytorch",
        world_size=size,
        per_worker=meter.overall_per_worker(),
        epochs_done=cfg.epochs,
        start_epoch=start_epoch,
        global_step=step_total,
        final_loss=loss_avg,
        val_top1=val_top1,
        skipped_images=skipped,
        weight_digests=digests,
    )
    if rank == 0 and cfg.output_dir is not None:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cfg.output_dir / "model.pt")
        write_json_atomic(cfg.output_dir / "labels.json", {"numClasses": num_classes})
    reporter.finish(metrics)
    hvd.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
