"""PyTorch DDP ResNet-50 trainer under torchrun, no MPI and no Horovod:
``torchrun --nnodes N --nproc-per-node P ... -m dtjob_train.ddp [flags]``.

The same model, data loaders, mixed precision, compile, checkpoints, progress lines and metrics as the Horovod
trainer (dtjob_train.torch_train); torch.distributed forms the world (dtjob_train.ddp_world). --elastic, under
``torchrun --nnodes MIN:MAX``, is dtjob_train.ddp_elastic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch import nn

from . import torch_checkpoint
from .cli import parse_args
from .ddp_elastic import train_elastic
from .ddp_world import TorchDistributed, end_world, exit_past_gloo, sync_optimizer, wrapped
from .torch_train import (
    Amp,
    bad_input_exits,
    begin,
    broadcast_scaler,
    finish,
    make_inputs,
    model_and_optimizer,
    plan_run,
    train,
)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("torchrun ... -m dtjob_train.ddp", argv, framework="pytorch")
    comm = TorchDistributed()
    device, pipeline, run = plan_run(cfg, comm)
    run.resolved["runner"] = "torchrun"
    if cfg.elastic:
        # Every start of the processes (torchrun restarts them all when the world resizes) resumes from rank
        # 0's newest state; the inputs are made for the world as it is then.
        model, optimizer = model_and_optimizer(cfg, run, device)
        with bad_input_exits(run.rank):
            train_elastic(cfg, comm, run, model, optimizer, Amp(cfg.amp, cfg.amp_dtype, device), device)
        end_world(comm)
        return
    train_batches, val_batches = make_inputs(cfg, run, device, pipeline, comm)
    model, optimizer = model_and_optimizer(cfg, run, device)
    amp = Amp(cfg.amp, cfg.amp_dtype, device)
    # Rank 0 restores the newest checkpoint and broadcasts the epoch to start from; its optimizer state and
    # loss scale go to every rank, and DDP's wrapper broadcasts its parameters and buffers.
    run.resume(
        lambda directory: torch_checkpoint.restore_latest(directory, model, optimizer, amp.scaler, device)
    )
    sync_optimizer(comm, optimizer)
    broadcast_scaler(comm, amp.scaler)
    ddp = wrapped(model, device, comm, fp16_allreduce=cfg.fp16_allreduce)
    begin(run, device)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    model.train()
    with bad_input_exits(run.rank):
        train(comm, cfg, run, ddp, optimizer, amp, loss_fn, train_batches, val_batches)
    finish(run, model, device)
    end_world(comm)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
    exit_past_gloo()
