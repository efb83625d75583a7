"""Run by test_optimizer.py on real Horovod ranks: the trainer's loss-scaled step (torch_train.train_step,
through Horovod's DistributedOptimizer) with SGD fused and unfused, from the same start on the same batches,
one of which overflows on rank 1 only. Each rank writes OUT/rank-<N>.json: per optimizer, its parameters
after every step and the loss scale at the end.

    python -m tests.training.optimizer_ranks OUT

`resume CHECKPOINT_DIR OUT` (one process): a checkpoint written by an unfused optimizer goes back into a
fused one as the trainers restore it, which then takes a loss-scaled step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STEPS = 5
OVERFLOW_STEP = 2  # on rank 1 only: the allreduced gradients overflow on every rank


def model_and_batches(rank: int) -> tuple[Any, list[Any]]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(1 + rank)
    batches = []
    for step in range(STEPS):
        images, labels = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        if step == OVERFLOW_STEP and rank == 1:
            images[0, 0] = float("inf")
        batches.append((images, labels, None))
    return model, batches


def scaled_amp() -> Any:
    import torch
    from dtjob_train.torch_train import Amp

    # The trainer scales the loss on CUDA only; the CPU scaler takes the same path through train_step.
    amp = Amp(False, "fp16", torch.device("cpu"))
    amp.scaler = torch.amp.GradScaler("cpu")
    return amp


def train(fused: bool) -> dict[str, Any]:
    import horovod.torch as hvd
    import torch
    from dtjob_train import torch_optim
    from dtjob_train.torch_train import train_step

    model, batches = model_and_batches(hvd.rank())
    sgd = torch_optim.sgd(model, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=fused)
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), op=hvd.Average)
    amp = scaled_amp()
    params = []
    for batch in batches:
        train_step(model, optimizer, amp, torch.nn.CrossEntropyLoss(), batch, 0.1)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
    return {"params": params, "scale": amp.scaler.get_scale()}


def ranks(out: Path) -> None:
    import horovod.torch as hvd

    hvd.init()
    result = {"rank": hvd.rank(), "fused": train(True), "foreach": train(False)}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{hvd.rank()}.json").write_text(json.dumps(result))


def resume(checkpoints: Path, out: Path) -> None:
    import torch
    from dtjob_train import torch_checkpoint, torch_optim
    from dtjob_train.torch_train import train_step

    model, batches = model_and_batches(0)
    amp = scaled_amp()
    unfused = torch_optim.sgd(model, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=False)
    train_step(model, unfused, amp, torch.nn.CrossEntropyLoss(), batches[0], 0.1)
    torch_checkpoint.save(checkpoints, 1, model, unfused, amp.scaler)
    fused = torch_optim.sgd(model, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)
    assert torch_checkpoint.restore_latest(checkpoints, model, fused, amp.scaler, torch.device("cpu"))
    train_step(model, fused, amp, torch.nn.CrossEntropyLoss(), batches[1], 0.1)
    out.mkdir(parents=True, exist_ok=True)
    kernels = [{k: group[k] for k in torch_optim.KERNEL_OPTIONS} for group in fused.param_groups]
    (out / "resumed.json").write_text(json.dumps({"kernels": kernels, "state": len(fused.state)}))


if __name__ == "__main__":
    if sys.argv[1] == "resume":
        resume(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        ranks(Path(sys.argv[1]))
