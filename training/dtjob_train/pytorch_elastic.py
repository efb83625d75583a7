"""--elastic for the PyTorch trainer: the epochs run inside ``hvd.elastic.run`` with a ``TorchState`` of the
model, the optimizer, the loss scaler's state and the committed Position (elastic.py).

Every (re)start of the training function (the first, and every one after the world resized) takes the world
as it is: rank 0's state arrives by the state's sync, the inputs are dealt afresh to the new ranks from the
committed position in the epoch's order (no image of the epoch skipped or seen twice), and the learning rate
follows the new global batch (TrainingRun.rejoin).
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from torch import nn

from . import torch_checkpoint
from .cli import TrainConfig
from .elastic import LeaveRequest, commit_and_leave, commit_due, run_elastic
from .run import TrainingRun
from .torch_compile import Forward, compiled
from .torch_elastic import BatchesFrom, make_elastic_inputs, scaler_state
from .torch_train import Amp, evaluate, train_step


class ElasticTrainer:
    """The pieces of the training loop, held together so the elastic function reaches them."""

    def __init__(
        self,
        cfg: TrainConfig,
        run: TrainingRun,
        model: nn.Module,
        optimizer: Any,
        amp: Amp,
        device: torch.device,
    ) -> None:
        self.cfg, self.run, self.model, self.optimizer, self.amp, self.device = (
            cfg, run, model, optimizer, amp, device,
        )  # fmt: skip
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.forward: Forward = compiled(model, run.resolved["compile"])
        self.leave = LeaveRequest()
        self.leave.install(hvd.local_rank())
        # Named so the optimizer comes before the model: TorchState syncs in this order, and the optimizer's
        # broadcast of an empty state takes a zero-gradient step (a weight-decay update) that the model's
        # broadcast must come after, as in the non-elastic start.
        self.state = hvd.elastic.TorchState(
            sgd=optimizer,
            network=model,
            position=run.start_position(),
            scaler=scaler_state(amp),
        )

    def train(self) -> None:
        run_elastic(hvd.elastic.run, self._epochs, self.state, self.leave)

    def _epochs(self, state: Any) -> None:
        """The training function hvd.elastic.run restarts after every resize, from the last commit."""
        cfg, run = self.cfg, self.run
        state.position = run.rejoin(state.position)
        if self.amp.scaler is not None and state.scaler is not None:
            self.amp.scaler.load_state_dict(state.scaler)
        batches, val_batches = make_elastic_inputs(cfg, run, self.device, hvd.local_size())
        while state.position.epoch < cfg.epochs:
            epoch = state.position.epoch
            self._epoch(state, batches)
            if val_batches is not None:
                run.validated(evaluate(self.model, val_batches(), cfg.val_steps, self.amp, hvd), epoch)
            if (directory := run.checkpoint_dir) is not None:  # whichever rank is rank 0 now
                torch_checkpoint.save(directory, epoch + 1, self.model, self.optimizer, self.amp.scaler)
            state.position = state.position.next_epoch()
            self._commit(state, leaving=False)

    def _epoch(self, state: Any, batches: BatchesFrom) -> None:
        run, at = self.run, state.position
        for step, lr, batch in run.steps(at.epoch, batches(at.epoch, at.epoch_images), done=at.step):
            # Horovod: does anyone leave? A max over the ranks' flags, overlapped with the step's compute.
            flag = torch.tensor([int(self.leave.requested)], dtype=torch.int32)
            vote = hvd.allreduce_async(flag, op=hvd.Max, name="leaving")
            loss = train_step(self.forward, self.optimizer, self.amp, self.loss_fn, batch, lr)
            leaving = bool(hvd.synchronize(vote).item())
            state.position = state.position.advanced(run.global_batch)
            if run.step_done(step, images=batch[0].shape[0], skipped=batch[2]):
                # Horovod: the logged loss is averaged over the ranks.
                loss_avg = hvd.allreduce(loss.detach().float(), name="loss").item()
                run.log(epoch=at.epoch, step=step, lr=lr, loss=loss_avg)
            if commit_due(step, self.cfg.commit_every, leaving):
                self._commit(state, leaving=leaving)

    def _commit(self, state: Any, *, leaving: bool) -> None:
        """Every rank commits at the same step; when a rank leaves, see elastic.commit_and_leave."""
        state.scaler = scaler_state(self.amp)
        if leaving:
            commit_and_leave(state, self.leave, self.run.reporter, hvd.shutdown)
        state.commit()  # and Horovod: raises HostsUpdatedInterrupt when hosts came or went
