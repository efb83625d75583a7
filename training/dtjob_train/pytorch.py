"""Horovod + PyTorch ResNet-50 trainer: ``horovodrun -np N python -m dtjob_train.pytorch [flags]``. What it
shares with the torchrun trainer (dtjob_train.ddp) is in dtjob_train.torch_train; --elastic is
dtjob_train.pytorch_elastic."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import horovod.torch as hvd
import torch
from torch import nn

from . import torch_checkpoint
from .cli import TrainConfig, parse_args
from .run import TrainingRun
from .torch_train import (
    Amp,
    Batches,
    EpochBatches,
    bad_input_exits,
    begin,
    broadcast_scaler,
    finish,
    make_inputs,
    model_and_optimizer,
    plan_run,
    train,
)


def start_and_train(
    cfg: TrainConfig,
    run: TrainingRun,
    model: nn.Module,
    optimizer: Any,
    amp: Amp,
    train_batches: EpochBatches,
    val_batches: Batches | None,
) -> None:
    """A fixed world: every rank starts from rank 0's state, then trains."""
    # Horovod: rank 0's optimizer state first. Horovod initialises an empty state (every rank but 0 on a
    # resume) with a zero-gradient step, which weight decay turns into a real update of those ranks' weights;
    # broadcasting the parameters afterwards leaves every rank with rank 0's weights.
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast_scaler(hvd, amp.scaler)
    begin(run, next(p.device for p in model.parameters()))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    model.train()
    train(hvd, cfg, run, model, optimizer, amp, loss_fn, train_batches, val_batches)


def train_elastic(
    cfg: TrainConfig, run: TrainingRun, model: nn.Module, optimizer: Any, amp: Amp, device: torch.device
) -> None:
    """--elastic: hvd.elastic.run's state sync starts every rank from rank 0's state (pytorch_elastic)."""
    from .pytorch_elastic import ElasticTrainer

    begin(run, device)
    model.train()
    ElasticTrainer(cfg, run, model, optimizer, amp, device).train()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.pytorch", argv, framework="pytorch")
    # Horovod: initialise, then pin this process to its GPU (its local rank) or to its share of the cores.
    hvd.init()
    device, pipeline, run = plan_run(cfg, hvd)
    # --elastic builds its inputs anew for every world (pytorch_elastic).
    inputs = None if cfg.elastic else make_inputs(cfg, run, device, pipeline, hvd)
    model, optimizer = model_and_optimizer(cfg, run, device)
    # Horovod: the optimizer averages the gradients over the ranks (allreduce; in fp16 with --fp16-allreduce).
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
    )
    amp = Amp(cfg.amp, cfg.amp_dtype, device)

    # Horovod: rank 0 restores the newest checkpoint and broadcasts the epoch to start from.
    run.resume(
        lambda directory: torch_checkpoint.restore_latest(directory, model, optimizer, amp.scaler, device)
    )
    with bad_input_exits(run.rank):  # Horovod stops the other ranks
        if inputs is None:
            train_elastic(cfg, run, model, optimizer, amp, device)
        else:
            start_and_train(cfg, run, model, optimizer, amp, *inputs)
    finish(run, model, device)
    hvd.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
