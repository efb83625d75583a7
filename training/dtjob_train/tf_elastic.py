"""--elastic for the TensorFlow trainer: its epochs inside ``hvd.elastic.run`` with a state of the model's and
optimizer's variables (the loss scale's too) and the committed Position (elastic.py).

Horovod 0.28.1's own states do not fit: TensorFlowKerasState calls ``optimizer.variables()``, a list (not a
method) in the Keras 2 optimizer this trainer uses, and TensorFlowState broadcasts its variables when it is
built, a collective outside hvd.elastic.run that a rank joining a running world would wait in alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

# isort: off
from .tf_env import tf  # selects Keras 2 before TF loads
import horovod.tensorflow as hvd
from horovod.common.elastic import ObjectState
# isort: on

from . import tf_checkpoint
from .cli import TrainConfig
from .data.tf_data import synthetic_batch
from .elastic import LeaveRequest, commit_and_leave, commit_due, run_elastic, vote_due
from .run import TrainingRun
from .tf_inputs import imagenet_datasets


class VariablesState(ObjectState):  # type: ignore[misc]
    """TensorFlow variables committed to host memory (numpy copies), restored by assignment, and synced by a
    broadcast from rank 0 inside hvd.elastic.run; keyword arguments are plain objects, as ObjectState's."""

    def __init__(self, variables: list[Any], **kwargs: Any) -> None:
        self.tf_variables = variables
        self._values = [v.numpy() for v in variables]
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def save(self) -> None:
        self._values = [v.numpy() for v in self.tf_variables]
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.tf_variables, self._values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        # Horovod: rank 0's weights, optimizer slots and loss scale to every rank, the joining ones included.
        hvd.broadcast_variables(self.tf_variables, root_rank=0)
        self._values = [v.numpy() for v in self.tf_variables]
        super().sync()


def epoch_batches(run: TrainingRun, skipped: Any, epoch: int) -> Iterator[Any]:
    """This world's batches of one epoch. ImageNet: the epoch's order dealt to the ranks of this world from
    its start (the tf.data pipeline does not start an epoch at an offset, as the PyTorch DataLoader does)."""
    if run.train_split is None:
        return itertools.repeat(synthetic_batch(run.cfg, run.rank))
    epochs = range(epoch, epoch + 1)
    train, _ = imagenet_datasets(run, skipped, one_hot=False, local_size=hvd.local_size(), epochs=epochs)
    return iter(train)


def leave_vote(leave: LeaveRequest) -> bool:
    """Horovod: does any rank leave? A max over the ranks' flags (a blocking allreduce of one integer)."""
    flag = tf.constant([int(leave.requested)], tf.int32)
    return bool(hvd.allreduce(flag, op=hvd.Max, name="leaving").numpy()[0])


class TfElasticTrainer:
    def __init__(
        self,
        cfg: TrainConfig,
        run: TrainingRun,
        model: Any,
        optimizer: Any,
        train_step: Callable[[Any, Any], Any],
        validate: Callable[[], float] | None,
        skipped: Any,
    ) -> None:
        self.cfg, self.run, self.model, self.optimizer = cfg, run, model, optimizer
        self.train_step, self.validate, self.skipped = train_step, validate, skipped
        self.leave = LeaveRequest()
        self.leave.install(hvd.local_rank())
        variables = model.variables + optimizer.variables + tf_checkpoint.loss_scale_variables(optimizer)
        self.state = VariablesState(variables, position=run.start_position())

    def train(self) -> None:
        run_elastic(hvd.elastic.run, self._epochs, self.state, self.leave)

    def _epochs(self, state: Any) -> None:
        """The training function hvd.elastic.run restarts after every resize, from the last commit."""
        cfg, run = self.cfg, self.run
        state.position = run.rejoin(state.position)
        while state.position.epoch < cfg.epochs:
            epoch = state.position.epoch
            self._epoch(state, epoch_batches(run, self.skipped, epoch))
            if self.validate is not None:
                run.validated(self.validate(), epoch)
            if (directory := run.checkpoint_dir) is not None:  # whichever rank is rank 0 now
                tf_checkpoint.save(directory, epoch + 1, self.model, self.optimizer)
            state.position = state.position.next_epoch()
            state.commit()

    def _epoch(self, state: Any, batches: Iterator[Any]) -> None:
        run, at = self.run, state.position
        for step, lr, (images, labels) in run.steps(at.epoch, batches, done=at.step):
            self.optimizer.learning_rate.assign(lr)
            loss = self.train_step(images, labels)
            leaving = vote_due(step) and leave_vote(self.leave)
            state.position = state.position.advanced(run.global_batch)
            if run.step_done(step, images=self.cfg.batch_size):
                # Horovod: the logged loss is averaged over the ranks.
                run.log(epoch=at.epoch, step=step, lr=lr, loss=float(hvd.allreduce(loss, name="loss")))
            if leaving:
                commit_and_leave(state, self.leave, run.reporter, hvd.shutdown)
            if commit_due(step, self.cfg.commit_every, leaving):
                state.commit()
