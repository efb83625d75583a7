"""The PyTorch trainers' SGD, and how a saved state goes back into it.

Fused by default: one kernel updates every parameter of a group, and with loss scaling it takes the
GradScaler's scale and inf flag on the device. The unfused (foreach) step makes GradScaler read that flag on
the host with `.item()`, which waits for the GPU once a step, so the loop cannot take its next batch while
the GPU finishes the step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The settings of a param group that choose the step's kernels, not the training: a saved state must not
# change them (torch's load_state_dict takes them from the checkpoint with everything else).
KERNEL_OPTIONS = ("fused", "foreach")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on BatchNorm and bias parameters (1-D tensors), as in the large-batch recipes."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float, fused: bool) -> torch.optim.SGD:
    """SGD with momentum over the model's parameters; fused, or torch's default (foreach where it can)."""
    groups = param_groups(model, weight_decay)
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, fused=True if fused else None)


def load_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """A saved optimizer state into `optimizer`, which keeps its own kernels: a checkpoint written by a run
    that stepped otherwise (an earlier release, --no-fused-optimizer) would switch them, and a fused
    optimizer handed foreach groups fails at its first loss-scaled step."""
    kernels = [{k: group.get(k) for k in KERNEL_OPTIONS} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, kernels, strict=True):
        group.update(own)
