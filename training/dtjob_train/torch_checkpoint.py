"""PyTorch checkpoints: one file per completed epoch (model, optimizer and grad scaler state), written to a
temp name then renamed. Runs without loss scaling (fp32, bf16) have no scaler and store an empty state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import checkpoints, torch_optim


def save(directory: Path, epochs_done: int, model: Any, optimizer: Any, scaler: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoints.path_for(directory, epochs_done, ".pt")
    tmp = directory / f".{final.name}.tmp"
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state | {"scaler": scaler.state_dict() if scaler is not None else {}}, tmp)
    tmp.replace(final)
    checkpoints.prune(directory)


def restore_latest(
    directory: Path | None, model: Any, optimizer: Any, scaler: Any, device: torch.device
) -> tuple[int, Path] | None:
    """Load the newest checkpoint into model, optimizer and scaler (None: no loss scaling); (epochs done,
    path) or None."""
    found = checkpoints.latest(directory)
    if found is not None:
        state = torch.load(found[1], map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        torch_optim.load_state(optimizer, state["optimizer"])
        # A checkpoint of a run with another precision: the scaler keeps its fresh state.
        if scaler is not None and state["scaler"]:
            scaler.load_state_dict(state["scaler"])
    return found
