"""--elastic for the Keras trainer: model.fit runs one epoch at a time (the rest of one after a resize)
inside ``hvd.elastic.run``, with tf_elastic's VariablesState of the model's and optimizer's variables and the
committed Position. A callback takes the leave vote (every 10th step) and commits on the cadence.

Horovod's Keras elastic callbacks (UpdateBatchStateCallback) resume mid-epoch by rewriting the callbacks'
view of the step count, which fit's own loop does not follow; a fit over the remaining steps does.
"""

from __future__ import annotations

from typing import Any

# isort: off
from . import tf_env  # noqa: F401  (selects Keras 2 before TF loads)
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from . import tf_checkpoint
from .elastic import LeaveRequest, commit_and_leave, commit_due, run_elastic, vote_due
from .keras_train import Checkpoint, Progress, make_inputs, without_log_sync
from .run import TrainingRun
from .tf_elastic import VariablesState, leave_vote
from .tf_inputs import imagenet_datasets


class ElasticProgress(Progress):
    """Progress's lines, on the committed step count; and every step the leave vote and the commit."""

    def __init__(self, training_run: TrainingRun, state: Any, leave: LeaveRequest) -> None:
        super().__init__(training_run)
        self.state, self.leave = state, leave

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        run, state = self.training_run, self.state
        step = state.position.step + 1  # a fit after a resize counts its batches from 0 again
        leaving = vote_due(step) and leave_vote(self.leave)
        state.position = state.position.advanced(run.global_batch)
        super().on_train_batch_end(step - 1, logs)
        if leaving:
            commit_and_leave(state, self.leave, run.reporter, hvd_tf.shutdown)
        if commit_due(step, run.cfg.commit_every, leaving):
            state.commit()


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The (legacy) optimizer's iterations and slots, and a dynamic loss scale's state."""
    return list(optimizer.variables()) + tf_checkpoint.loss_scale_variables(optimizer)


class KerasElasticTrainer:
    def __init__(self, run: TrainingRun, model: Any, skipped: Any) -> None:
        self.run, self.model, self.skipped = run, model, skipped
        self.leave = LeaveRequest()
        self.leave.install(hvd.local_rank())
        variables = model.variables + optimizer_variables(model.optimizer)
        self.state = VariablesState(variables, position=run.start_position())

    def train(self) -> None:
        run_elastic(hvd.elastic.run, self._epochs, self.state, self.leave)

    def _epochs(self, state: Any) -> None:
        """The training function hvd.elastic.run restarts after every resize, from the last commit."""
        run, cfg = self.run, self.run.cfg
        state.position = run.rejoin(state.position)
        self.model.optimizer.learning_rate.world.assign(float(run.size))  # ElasticStepSchedule
        callbacks = [hvd.callbacks.MetricAverageCallback(), ElasticProgress(run, state, self.leave)]
        if (directory := run.checkpoint_dir) is not None:  # whichever rank is rank 0 now
            callbacks.append(without_log_sync(Checkpoint(directory)))
        train_ds, val_ds = make_inputs(run, self.skipped)
        while state.position.epoch < cfg.epochs:
            at = state.position
            history = self.model.fit(
                self._epoch_data(at.epoch, train_ds),
                steps_per_epoch=run.steps_per_epoch - at.step,
                epochs=at.epoch + 1,
                initial_epoch=at.epoch,
                validation_data=val_ds,
                validation_steps=cfg.val_steps,
                callbacks=callbacks,
                verbose=0,
            )
            if (top1 := history.history.get("val_accuracy", [None])[-1]) is not None:
                run.validated(float(top1), at.epoch)
            state.position = state.position.next_epoch()
            state.commit()

    def _epoch_data(self, epoch: int, synthetic: Any) -> Any:
        """ImageNet: the epoch dealt to this world's ranks from its start (see tf_elastic.epoch_batches)."""
        if self.run.train_split is None:
            return synthetic
        epochs = range(epoch, epoch + 1)
        train, _ = imagenet_datasets(
            self.run, self.skipped, one_hot=True, local_size=hvd.local_size(), epochs=epochs
        )
        return train
