"""What the Keras trainers share (dtjob_train.keras, and its --elastic variant dtjob_train.keras_elastic): the
learning-rate schedule, the progress and checkpoint callbacks, and the inputs. Keras 2 (tf_keras), selected by
dtjob_train.tf_env before TensorFlow loads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

# isort: off
from .tf_env import keras, tf  # selects Keras 2 before TF loads
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from . import tf_checkpoint
from .data.tf_data import synthetic_batch
from .run import TrainingRun
from .schedule import scaled_lr
from .tf_inputs import imagenet_datasets


# Registered: Horovod's DistributedOptimizer rebuilds the optimizer from its config, schedule included.
@keras.utils.register_keras_serializable(package="dtjob_train")
class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """The trainers' schedule (schedule.learning_rate: warmup, then cosine decay) at the optimizer's step,
    computed inside the training step. The rate of step i (0-based, within the whole run) is the one at
    epoch (i + 1) / steps_per_epoch, as TrainingRun.steps gives the other trainers."""

    def __init__(
        self,
        *,
        base_lr: float,
        batch_size: int,
        world_size: int,
        warmup_epochs: float,
        epochs: int,
        steps_per_epoch: int,
    ) -> None:
        super().__init__()
        self.base_lr, self.batch_size, self.world_size = base_lr, batch_size, world_size
        self.warmup_epochs, self.epochs, self.steps_per_epoch = warmup_epochs, epochs, steps_per_epoch

    def __call__(self, step: Any) -> Any:
        epoch = (tf.cast(step, tf.float32) + 1.0) / self.steps_per_epoch
        peak, start = self.peak_and_start()
        warmup = self.warmup_epochs
        warming = start + (peak - start) * epoch / max(warmup, 1e-9)
        progress = tf.clip_by_value((epoch - warmup) / max(self.epochs - warmup, 1e-9), 0.0, 1.0)
        decaying = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        return tf.where(epoch < warmup, warming, decaying)

    def peak_and_start(self) -> tuple[Any, Any]:
        """The scaled rate and the warmup's first rate (one worker's share)."""
        peak = scaled_lr(self.base_lr, batch_size=self.batch_size, world_size=self.world_size)
        return peak, peak / self.world_size

    def get_config(self) -> dict[str, Any]:
        return {
            "base_lr": self.base_lr,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "warmup_epochs": self.warmup_epochs,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
        }


@keras.utils.register_keras_serializable(package="dtjob_train")
class ElasticStepSchedule(StepSchedule):
    """--elastic: StepSchedule with the world size a variable the trainer sets after every resize, so the
    rate follows the global batch without a new optimizer (the compiled step reads the variable)."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.world = tf.Variable(float(self.world_size), trainable=False, dtype=tf.float32, name="world_size")

    def peak_and_start(self) -> tuple[Any, Any]:
        start = scaled_lr(self.base_lr, batch_size=self.batch_size, world_size=1)
        return start * self.world, start


def without_log_sync(callback: Any) -> Any:
    """Marks a callback that reads no batch logs, or reads them as tensors: Keras then stops converting
    every batch's logs to Python numbers, a device-to-host copy that waits for the step in flight."""
    callback._supports_tf_logs = True
    return callback


class Progress(keras.callbacks.Callback):  # type: ignore[misc]
    """Interval log lines and the progress file; runs on every rank because the loss average is collective.
    The loss tensor is read on the logged steps only."""

    def __init__(self, training_run: TrainingRun) -> None:
        super().__init__()
        self.training_run = training_run
        self.epoch = 0
        without_log_sync(self)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch
        self.training_run.epoch_started()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        run, step = self.training_run, batch + 1
        if not run.step_done(step, images=run.cfg.batch_size):
            return
        # Horovod: Keras reports the running mean of the epoch so far; logged averaged over the ranks.
        loss = tf.cast((logs or {})["loss"], tf.float32)
        loss = float(hvd_tf.allreduce(loss, op=hvd_tf.Average, name="loss"))
        lr = run.learning_rate(self.epoch + step / run.steps_per_epoch)
        run.log(epoch=self.epoch, step=step, lr=lr, loss=loss)


class Checkpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Rank 0 only: model + optimizer state after every epoch."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        tf_checkpoint.save(self.directory, epoch + 1, self.model, self.model.optimizer)


def make_inputs(run: TrainingRun, skipped: Any) -> tuple[Any, Any]:
    """The training dataset (one-hot labels) and the validation dataset, or None."""
    if run.train_split is None:
        images, labels = synthetic_batch(run.cfg, run.rank)
        return tf.data.Dataset.from_tensors((images, tf.one_hot(labels, run.cfg.num_classes))).repeat(), None
    return imagenet_datasets(run, skipped, one_hot=True, local_size=hvd.local_size())


def callbacks(run: TrainingRun) -> list[Any]:
    found: list[Any] = [
        # Horovod: rank 0's initial weights and optimizer state to every rank (after the first step creates
        # the slots).
        without_log_sync(hvd.callbacks.BroadcastGlobalVariablesCallback(0)),
        # Horovod: epoch metrics (loss, accuracy, val_*) averaged over ranks before other callbacks read them.
        hvd.callbacks.MetricAverageCallback(),
        Progress(run),
    ]
    if run.checkpoint_dir is not None:
        found.append(Checkpoint(run.checkpoint_dir))
    return found
