"""The world torchrun forms, as the PyTorch trainers' Comm: torch.distributed from what torchrun sets (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), NCCL on GPUs and Gloo on CPUs; rank 0's optimizer
state on every rank, and the model in DDP's wrapper. Shared by dtjob_train.ddp and its --elastic loop
(dtjob_train.ddp_elastic)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from . import torch_optim


class TorchDistributed:
    """torch.distributed as torch_train.Comm (the names horovod.torch gives its collectives)."""

    Sum = "sum"
    Average = "average"

    def __init__(self) -> None:
        gpus = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self.backend = "nccl" if gpus else "gloo"
        dist.init_process_group(self.backend)
        # NCCL reduces tensors on this rank's GPU (set_up_device picks it before any collective).
        self.on_gpu = gpus

    def rank(self) -> int:
        return dist.get_rank()

    def size(self) -> int:
        return dist.get_world_size()

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def local_size(self) -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def allreduce(self, tensor: Tensor, op: Any = None, name: str | None = None) -> Tensor:
        """A new tensor: the sum over the ranks, or (op Average, Horovod's default) the mean."""
        device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        reduced = tensor.detach().clone().to(device)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        if op != self.Sum:
            reduced /= self.size()
        return reduced.to(tensor.device)

    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank)
        return box[0]

    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        gathered: list[Any] = [None] * self.size()
        dist.all_gather_object(gathered, obj)
        return gathered


def sync_optimizer(comm: TorchDistributed, optimizer: torch.optim.Optimizer) -> None:
    """Rank 0's optimizer state (restored from a checkpoint, or empty) on every rank: DDP broadcasts only the
    parameters and buffers, and ranks with other momentum would drift apart. Sent from host memory; each
    rank's load_state_dict moves it to its parameters' device."""
    state = optimizer.state_dict() if comm.rank() == 0 else None
    if state is not None:
        state = {**state, "state": {k: _to_cpu(v) for k, v in state["state"].items()}}
    torch_optim.load_state(optimizer, comm.broadcast_object(state, root_rank=0, name="optimizer"))


def _to_cpu(per_param: dict[str, Any]) -> dict[str, Any]:
    return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in per_param.items()}


def wrapped(
    model: nn.Module, device: torch.device, comm: TorchDistributed, *, fp16_allreduce: bool
) -> nn.Module:
    """The model in DDP's wrapper (it broadcasts rank 0's parameters and buffers); with --fp16-allreduce on
    NCCL, DDP's fp16 compression hook halves the bytes each allreduce sends, as Horovod's Compression.fp16
    (Gloo's CPU allreduce keeps fp32)."""
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    if fp16_allreduce and comm.backend == "nccl":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return ddp


def end_world(comm: TorchDistributed) -> None:
    """Every rank past its last collective before any rank tears its world down. Gloo's threads drop a
    collective's tensors under the GIL after the caller returned, and torch 2.13's Gloo shutdown races with a
    peer's: one rank in about six aborted ("terminate called") as the other was still writing its results,
    and still one in twenty after a barrier. So Gloo's world ends with the process (exit_past_gloo); NCCL's
    is destroyed, which frees its communicators."""
    dist.barrier()
    if comm.backend == "nccl":
        dist.destroy_process_group()


def exit_past_gloo() -> None:
    """With a Gloo world still up, end the process at once, its work done and its output flushed. Left to the
    interpreter's exit, Gloo's process group is destroyed with the rest, and that too aborted a rank now and
    then ("terminate called", exit -6: one run in five of an elastic world on two busy cores). In an elastic
    world an aborted rank is a failed node: its agent re-rendezvouses alone and trains the run again, while
    the peer that finished waits for it in torchrun's exit barrier."""
    if dist.is_initialized() and dist.get_backend() == "gloo":
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
