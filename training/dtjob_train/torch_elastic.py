"""What both PyTorch --elastic trainers share (Horovod Elastic's dtjob_train.pytorch_elastic and torchrun's
dtjob_train.ddp_elastic): a world's inputs that continue an epoch from an image offset, whatever the size of
the worlds that trained its earlier steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from .cli import TrainConfig
from .run import TrainingRun
from .torch_train import Amp, Batch, Normalize, Prefetcher, folder_loader, synthetic_batches

# An epoch's batches from an offset into it: the images (all ranks together) earlier worlds trained on.
BatchesFrom = Callable[[int, int], Iterator[Batch]]


def make_elastic_inputs(
    cfg: TrainConfig, run: TrainingRun, device: torch.device, local_size: int
) -> tuple[BatchesFrom, Callable[[], Iterator[Batch]] | None]:
    """This world's training batches (from an epoch offset) and validation batches (None without), for the
    ranks as they are now (run.rank and run.size; local_size: the ranks on this host, for the loader's
    workers). The PyTorch DataLoader only: it can start an epoch's shard at an offset."""
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    if run.train_split is None:
        return (lambda epoch, offset: synthetic_batches(cfg, device, fmt, run.rank)), None
    loader = folder_loader(cfg, run, device, local_size, elastic=True)
    prefetch = Prefetcher(Normalize(device, fmt))
    train_loader = loader(run.train_split, train=True)

    def train(epoch: int, offset: int) -> Iterator[Batch]:
        train_loader.sampler.set_position(epoch, offset)
        return prefetch(iter(train_loader))

    if run.val_split is None:
        return train, None
    val_loader = loader(run.val_split, train=False)
    return train, lambda: prefetch(iter(val_loader))


def scaler_state(amp: Amp) -> dict[str, Any] | None:
    return None if amp.scaler is None else amp.scaler.state_dict()
