"""--elastic under torchrun (dtjob_train.ddp_elastic): rank 0's step checkpoints, and its note of the last
step it finished.

torchrun's agents restart every process of the world when a node is lost or joins, so nothing in memory
survives a resize: rank 0 saves the whole training state to disk every --commit-every steps and at every
epoch's end, as step-<epochs done>-<steps done of the next epoch>.pt (a Position). Only this path reads that
name; the epoch checkpoints (checkpoints.py, epoch-NNNN) that every trainer reads are written as before,
beside them. Without --checkpoint-dir the step checkpoints go to run_dir: rank 0's local disk, which outlives
its processes (rank 0 stays on worker 0's pod) but belongs to one torchrun run.

A step checkpoint names the torchrun run that wrote it (TORCHELASTIC_RUN_ID, torchrun's --rdzv-id): within
the same run a restart continues its world's history (world sizes, steps redone); a checkpoint of an earlier
run (a job restarted whole) is only a place to resume from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoints, torch_checkpoint, torch_optim
from .elastic import Position

_NAME = re.compile(r"^step-(\d{4,})-(\d{7,})\.pt$")
KEEP = 2
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"


def run_id() -> str:
    """This torchrun run's id (its --rdzv-id; torchrun sets it in every process it starts)."""
    return os.environ.get(RUN_ID_ENV, "none")


def run_dir(run: str) -> Path:
    """Rank 0's local directory of one torchrun run: it survives the restarts of the processes, and another
    run (another --rdzv-id) never reads it."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run)
    return Path(tempfile.gettempdir()) / f"dtjob-elastic-{safe}"


def path_for(directory: Path, position: Position) -> Path:
    return directory / f"step-{position.epoch:04d}-{position.step:07d}.pt"


def latest(directory: Path | None) -> tuple[tuple[int, int], Path] | None:
    """((epoch, step), path) of the newest step checkpoint, or None."""
    if directory is None or not directory.is_dir():
        return None
    # A half-written file starts with '.' (temp + rename), so it never matches.
    found = [((int(m[1]), int(m[2])), e) for e in directory.iterdir() if (m := _NAME.match(e.name))]
    return max(found) if found else None


def prune(directory: Path, keep: int = KEEP) -> None:
    """Delete all but the newest `keep` step checkpoints (the epoch checkpoints are checkpoints.prune's)."""
    found = sorted(((int(m[1]), int(m[2])), e) for e in directory.iterdir() if (m := _NAME.match(e.name)))
    for _, old in found[:-keep]:
        old.unlink(missing_ok=True)


def save(
    directory: Path, position: Position, steps_per_epoch: int, model: Any, optimizer: Any, scaler: Any
) -> Path:
    """The state at `position` (model unwrapped, optimizer, grad scaler), written to a temp name then renamed;
    the older step checkpoints are pruned."""
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, position)
    tmp = directory / f".{final.name}.tmp"
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    state["scaler"] = scaler.state_dict() if scaler is not None else {}
    # Plain types only: torch.load(weights_only=True) reads them back.
    meta = dataclasses.asdict(position) | {"world_sizes": list(position.world_sizes)}
    torch.save(state | {"position": meta, "steps_per_epoch": steps_per_epoch, "run_id": run_id()}, tmp)
    tmp.replace(final)
    prune(directory)
    return final


@dataclass(frozen=True)
class Restored:
    """What rank 0 resumes from: the position, the steps per epoch it was counted in (None: the run's own),
    and the file (None: a fresh start)."""

    position: Position
    steps_per_epoch: int | None = None
    path: Path | None = None


def restore_newest(
    checkpoint_dir: Path | None, step_dir: Path, model: Any, optimizer: Any, scaler: Any, device: torch.device
) -> Restored:
    """Rank 0: the later (by position) of the newest step checkpoint and the newest epoch checkpoint, loaded
    into model, optimizer and scaler (None: no loss scaling). A tie goes to the step checkpoint, which
    carries the world's history."""
    step = latest(step_dir)
    epoch = checkpoints.latest(checkpoint_dir)
    if step is not None and (epoch is None or step[0] >= (epoch[0], 0)):
        return _load(step[1], model, optimizer, scaler, device)
    found = torch_checkpoint.restore_latest(checkpoint_dir, model, optimizer, scaler, device)
    if found is None:
        return Restored(Position())
    return Restored(Position(epoch=found[0], resumed_from=found[0]), path=found[1])


def _load(path: Path, model: Any, optimizer: Any, scaler: Any, device: torch.device) -> Restored:
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    torch_optim.load_state(optimizer, state["optimizer"])
    if scaler is not None and state["scaler"]:  # else a run of another precision: the scaler stays fresh
        scaler.load_state_dict(state["scaler"])
    meta = state["position"]
    position = Position(**(meta | {"world_sizes": tuple(meta["world_sizes"])}))
    if state["run_id"] == run_id():
        return Restored(position, int(state["steps_per_epoch"]), path)
    # An earlier run's: its step counts in this run's steps per epoch, with a history of its own.
    fresh = dataclasses.replace(position, resumed_from=position.epoch, world_sizes=(), steps_redone=0)
    return Restored(fresh, None, path)


class Reached:
    """The global step rank 0 last finished, in run_dir/reached: how far the processes a restart stopped got.
    Rewritten in place after every step, one pwrite of a fixed width (microseconds, no rename): the file is
    read only by the next processes, once this one is gone."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "reached"
        self.fd: int | None = None

    def read(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None

    def write(self, global_step: int) -> None:
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self.fd, f"{global_step:20d}\n".encode(), 0)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
