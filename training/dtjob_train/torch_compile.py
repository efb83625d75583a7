"""--compile: the model's forward and backward pass through torch.compile.

The compiled module shares its parameters with the eager one, which the trainer keeps for everything that
must not change: Horovod's DistributedOptimizer hooks the same Parameter objects (every gradient still passes
its allreduce), checkpoints and the saved model hold the eager state dict (no `_orig_mod.` prefixes, so a
compiled run resumes an eager one's checkpoint and the other way round), and validation runs eager (eval mode
would compile a second graph for a few percent of the job's time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from dtjob.contract import training as contract
from torch import Tensor, nn

Forward = Callable[[Tensor], Tensor]


def compile_mode(requested: str, device: torch.device) -> str | None:
    """The torch.compile mode to train in, or None for eager. auto compiles on a GPU only: on CPU the compile
    costs minutes and gains little (docs/benchmarks.md)."""
    if requested == contract.DEFAULT_COMPILE:
        return contract.GPU_COMPILE_MODE if device.type == "cuda" else None
    return None if requested == "eager" else requested


def compiled(model: nn.Module, mode: str | None) -> Forward:
    """The training forward: the model itself, or its compiled twin over the same parameters."""
    if mode is None:
        return cast(Forward, model)
    return cast(Forward, torch.compile(model, mode=mode))
