"""--elastic for the DDP trainer under an elastic torchrun world (``torchrun --nnodes MIN:MAX --rdzv-backend
c10d ... -m dtjob_train.ddp --elastic``).

When a node is lost or joins, torchrun's agents stop every process and start them again in a world of the new
size: nothing survives in memory. So rank 0 saves step checkpoints to disk (step_checkpoint.py), and every
start of the processes resumes from the newest state: rank 0 restores it and broadcasts it (the weights by
DDP's wrapper, the optimizer, the loss scale and the Position), the inputs are dealt to the new ranks from the
position's image offset in the epoch's order, and the learning rate follows the new global batch
(TrainingRun.rejoin). The steps trained past the restored checkpoint are redone: rank 0 counts them from its
note of the last step it finished (step_checkpoint.Reached).
"""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any

import torch
from torch import nn

from . import step_checkpoint, torch_checkpoint
from .cli import TrainConfig
from .ddp_world import TorchDistributed, sync_optimizer, wrapped
from .elastic import Position, commit_due
from .run import TrainingRun
from .torch_compile import Forward, compiled
from .torch_elastic import BatchesFrom, make_elastic_inputs
from .torch_train import Amp, begin, broadcast_scaler, evaluate, finish, train_step, unwrapped


class RankZeroFiles:
    """Rank 0's step checkpoints (in --checkpoint-dir, else in the run's local directory) and its note of the
    last step it finished (always local); every method does nothing on the other ranks."""

    def __init__(self, cfg: TrainConfig, rank: int) -> None:
        self.enabled = rank == 0
        self.local = step_checkpoint.run_dir(step_checkpoint.run_id())
        self.directory = cfg.checkpoint_dir or self.local
        self.reached = step_checkpoint.Reached(self.local)

    def restore(
        self, cfg: TrainConfig, model: nn.Module, optimizer: Any, amp: Amp, device: torch.device
    ) -> tuple[step_checkpoint.Restored, int | None]:
        """The newest state loaded into the model, optimizer and scaler, and the last step the stopped
        processes finished (None on the other ranks, and at a run's first start)."""
        if not self.enabled:
            return step_checkpoint.Restored(Position()), None
        found = step_checkpoint.restore_newest(
            cfg.checkpoint_dir, self.directory, model, optimizer, amp.scaler, device
        )
        return found, self.reached.read()

    def save(self, position: Position, run: TrainingRun, model: nn.Module, optimizer: Any, amp: Amp) -> None:
        if self.enabled:
            step_checkpoint.save(
                self.directory, position, run.steps_per_epoch, unwrapped(model), optimizer, amp.scaler
            )

    def step_done(self, global_step: int) -> None:
        if self.enabled:
            self.reached.write(global_step)

    def done(self) -> None:
        """The run is over: its local directory goes (the checkpoint directory's files stay)."""
        self.reached.close()
        if self.enabled:
            shutil.rmtree(self.local, ignore_errors=True)


def within_epoch(restored: step_checkpoint.Restored, steps_per_epoch: int) -> Position:
    """The restored position, or the next epoch's start when an earlier run with more steps per epoch had
    gone past this run's epoch length."""
    position = restored.position
    if restored.steps_per_epoch is None and position.step >= steps_per_epoch:
        return dataclasses.replace(position.next_epoch(), resumed_from=position.epoch + 1)
    return position


class ElasticDDP:
    """One start of the processes: resume from rank 0's newest state, then train to the end."""

    def __init__(
        self,
        cfg: TrainConfig,
        comm: TorchDistributed,
        run: TrainingRun,
        model: nn.Module,
        optimizer: Any,
        amp: Amp,
        device: torch.device,
    ) -> None:
        self.cfg, self.comm, self.run, self.optimizer, self.amp, self.device = (
            cfg, comm, run, optimizer, amp, device,
        )  # fmt: skip
        self.files = RankZeroFiles(cfg, comm.rank())
        self.model: nn.Module = model
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    def start(self) -> Position:
        """Rank 0 restores the newest state and every rank starts from it; the world's history grows by this
        start, which rank 0 saves at once (so no later restart loses it), with its note reset to here."""
        cfg, comm, run = self.cfg, self.comm, self.run
        found, reached = self.files.restore(cfg, self.model, self.optimizer, self.amp, self.device)
        if comm.rank() == 0:
            found = dataclasses.replace(found, position=within_epoch(found, run.steps_per_epoch))
        found = comm.broadcast_object(found, root_rank=0, name="elastic_position")
        run.steps_per_epoch = found.steps_per_epoch or run.steps_per_epoch
        sync_optimizer(comm, self.optimizer)
        broadcast_scaler(comm, self.amp.scaler)
        self.model = wrapped(self.model, self.device, comm, fp16_allreduce=cfg.fp16_allreduce)
        if not found.position.world_sizes:  # the run's first start: a resume line as every trainer's
            run.resumed_from, run.start_epoch = found.path, found.position.resumed_from
        begin(run, self.device)
        # Rank 0's processes that a restart stopped reached this step (rejoin counts the steps redone).
        run.global_step = reached or 0
        position = run.rejoin(found.position)
        if not found.position.world_sizes and found.position.step > 0:
            run.reporter.say(f"elastic: resuming at epoch {position.epoch + 1} step {position.step}")
        self.files.save(position, run, self.model, self.optimizer, self.amp)
        self.files.step_done(run.global_step)
        return position

    def train(self, position: Position) -> None:
        """The epochs from `position`; after each, validation and the checkpoints: the step checkpoint first
        (it carries the history), then the epoch checkpoint every trainer reads, with --checkpoint-dir."""
        cfg, run = self.cfg, self.run
        batches, val_batches = make_elastic_inputs(cfg, run, self.device, self.comm.local_size())
        forward = compiled(self.model, run.resolved["compile"])
        self.model.train()
        while position.epoch < cfg.epochs:
            epoch = position.epoch
            position = self._epoch(position, batches, forward).next_epoch()
            if val_batches is not None:
                run.validated(evaluate(self.model, val_batches(), cfg.val_steps, self.amp, self.comm), epoch)
            self.files.save(position, run, self.model, self.optimizer, self.amp)
            if (directory := run.checkpoint_dir) is not None:
                model = unwrapped(self.model)
                torch_checkpoint.save(directory, epoch + 1, model, self.optimizer, self.amp.scaler)

    def _epoch(self, at: Position, batches: BatchesFrom, forward: Forward) -> Position:
        """The rest of the epoch from `at`; rank 0 notes every step and saves every --commit-every-th (the
        epoch's last is saved after validation)."""
        cfg, run, comm, position = self.cfg, self.run, self.comm, at
        for step, lr, batch in run.steps(at.epoch, batches(at.epoch, at.epoch_images), done=at.step):
            loss = train_step(forward, self.optimizer, self.amp, self.loss_fn, batch, lr)
            position = position.advanced(run.global_batch)
            if run.step_done(step, images=batch[0].shape[0], skipped=batch[2]):
                loss_avg = comm.allreduce(loss.detach().float(), op=comm.Average, name="loss").item()
                run.log(epoch=at.epoch, step=step, lr=lr, loss=loss_avg)
            self.files.step_done(run.global_step)
            if step < run.steps_per_epoch and commit_due(step, cfg.commit_every, leaving=False):
                self.files.save(position, run, self.model, self.optimizer, self.amp)
        return position


def train_elastic(
    cfg: TrainConfig,
    comm: TorchDistributed,
    run: TrainingRun,
    model: nn.Module,
    optimizer: Any,
    amp: Amp,
    device: torch.device,
) -> None:
    """Resume, train, and finish (metrics, the model); then the run's local directory goes."""
    trainer = ElasticDDP(cfg, comm, run, model, optimizer, amp, device)
    trainer.train(trainer.start())
    finish(run, model, device)
    trainer.files.done()
