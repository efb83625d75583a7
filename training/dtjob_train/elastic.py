"""What every trainer does the same way under ``--elastic`` (``horovodrun --min-np/--max-np
--host-discovery-script``): the commit cadence, the leave protocol of a rank that got SIGTERM, the pid file
the worker pod signals it through, and the data position that survives a resize.

The leave protocol. A rank whose pod is being deleted gets SIGTERM and has the pod's grace period to go. Its
handler only raises a flag; every step the ranks allreduce the flags (a max of one integer), so all of them
learn at the same step that someone is leaving, commit their in-memory state there, and the leaving rank
exits with LEAVE_EXIT_CODE. The survivors' next collective then fails (HorovodInternalError), they restore the
commit they just made (no step is lost) and re-form the world without it.

The exit code must not be 0. Horovod's elastic driver (horovod/runner/elastic/registration.py) reads a worker
that exits 0 as the job having succeeded and stops every rank; a non-zero exit is a failure, which blacklists
the worker's host (its pod, which is going away anyway) and lets the others carry on. A replacement pod must
therefore come back under a new host name, or horovodrun must be given ``--blacklist-cooldown-range``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from dtjob.contract import training as contract

if TYPE_CHECKING:
    from .progress import Reporter

# TensorFlow and Keras take the leave vote as a blocking allreduce (horovod.tensorflow has no asynchronous
# one): 1.2-1.6 ms with 2 ranks on CPU loopback, up to 3% of a 50 ms step, so they vote every 10th step
# (0.3%). A leaving rank then waits at most 10 steps (0.5 s of its grace period); the world still commits at
# the vote's step, so the survivors lose no step. PyTorch overlaps its vote with the step and votes on each.
BLOCKING_VOTE_EVERY = 10
# EX_TEMPFAIL: "try again later"; any non-zero code makes the driver drop this host and keep the others.
LEAVE_EXIT_CODE = contract.RANK_LEFT_EXIT
# The worker pod signals the rank processes it hosts through these files: <dir>/<local rank>.pid.
RANK_PID_DIR_ENV = contract.RANK_PID_DIR_ENV
DEFAULT_RANK_PID_DIR = Path(contract.RANK_PID_DIR)


class LeaveRequest:
    """SIGTERM sets `requested`; the training loop decides (with every rank) when to act on it."""

    def __init__(self) -> None:
        self.requested = False
        self.pid_file: Path | None = None

    def install(self, local_rank: int) -> None:
        """Catches SIGTERM and writes this process's pid where the worker pod's entrypoint finds it."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        directory = Path(os.environ.get(RANK_PID_DIR_ENV) or DEFAULT_RANK_PID_DIR)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.pid_file = directory / f"{local_rank}.pid"
            self.pid_file.write_text(f"{os.getpid()}\n")
        except OSError as e:  # a read-only /tmp: the rank still trains, it just cannot be told to leave early
            print(f"warning: no pid file in {directory}: {e}", file=sys.stderr, flush=True)
            self.pid_file = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def remove_pid_file(self) -> None:
        """Removes the pid file if it is still this process's (a later rank of the same slot may own it)."""
        if self.pid_file is not None:
            try:
                if self.pid_file.read_text().strip() == str(os.getpid()):
                    self.pid_file.unlink()
            except OSError:
                pass
            self.pid_file = None

    def leave(self, shutdown: Callable[[], None]) -> NoReturn:
        """Shut Horovod down together with the others (they do so as they recover), then exit at once: the
        interpreter's own exit would wait on Horovod's threads."""
        shutdown()
        self.remove_pid_file()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(LEAVE_EXIT_CODE)


def run_elastic(
    elastic_run: Callable[[Callable[[Any], None]], Callable[[Any], None]],
    training: Callable[[Any], None],
    state: Any,
    leave: LeaveRequest,
) -> None:
    """The framework's hvd.elastic.run of `training` over `state`; the rank's pid file goes when it ends,
    however it ends (the worker pod must not signal a pid that is no longer this rank)."""
    try:
        elastic_run(training)(state)
    finally:
        leave.remove_pid_file()


@dataclass(frozen=True)
class Position:
    """Where training is, as committed: the epoch, the steps done in it, and the images (all ranks together)
    those steps consumed, which is where the next world's shards of the epoch start; and the world's history.

    Frozen: Horovod's ObjectState commits an attribute by keeping a reference to its value, so a value changed
    in place would change the commit too; every change here makes a new Position.
    """

    epoch: int = 0
    step: int = 0
    epoch_images: int = 0
    resumed_from: int = 0  # the epochs done in the checkpoint the job started from
    world_sizes: tuple[int, ...] = ()  # the world's size at every (re)start of the training function
    steps_redone: int = 0  # steps trained past a commit and lost when a rank failed, all resets together

    def advanced(self, global_batch: int) -> Position:
        return dataclasses.replace(self, step=self.step + 1, epoch_images=self.epoch_images + global_batch)

    def next_epoch(self) -> Position:
        return dataclasses.replace(self, epoch=self.epoch + 1, step=0, epoch_images=0)


def vote_due(step: int) -> bool:
    """Whether a trainer whose vote blocks (TensorFlow, Keras) takes it after this step of the epoch."""
    return step % BLOCKING_VOTE_EVERY == 0


def commit_due(step: int, commit_every: int, leaving: bool) -> bool:
    """Commit on every commit_every-th step of the epoch, and at once when a rank is leaving."""
    return leaving or step % commit_every == 0


def commit_and_leave(
    state: Any, leave: LeaveRequest, reporter: Reporter, shutdown: Callable[[], None]
) -> NoReturn:
    """A rank is leaving, and every rank knows it at this step: all save the state here (without the commit's
    check for host changes, a collective the leaving rank would not join). The leaving rank shuts Horovod
    down and exits; the others go straight to hvd.elastic.run's recovery (restore this commit, shut down,
    re-form the world), whose shutdown meets the leaving rank's. Waiting instead for a collective to fail
    costs Gloo's timeout (30 s) on every rank not directly connected to the one that left."""
    # Imported here: the DDP trainers share this module's Position and commit_due, and run without Horovod.
    from horovod.common.exceptions import HorovodInternalError

    state.save()
    reporter.say(f"elastic: a rank is leaving; every rank committed at step {state.position.step}")
    if leave.requested:
        leave.leave(shutdown)
    raise HorovodInternalError("a rank left the world (SIGTERM)")
