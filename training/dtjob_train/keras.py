"""Horovod + Keras ResNet-50 trainer with ``model.fit``: ``python -m dtjob_train.keras``.

Keras here is tf_keras (Keras 2): horovod.tensorflow.keras 0.28.1 does not work with the Keras 3 that
TF >= 2.16 ships as tf.keras (see training/README.md). dtjob_train.tf_env selects it before TensorFlow loads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

# isort: off
from .tf_env import configure_devices, keras, set_precision, tf  # selects Keras 2 before TF loads
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from . import tf_checkpoint
from .cli import parse_args
from .data.tf_data import imagenet_datasets, synthetic_batch
from .models.resnet_keras import build, l2_penalty
from .run import TrainingRun
from .schedule import cosine_multiplier


class Progress(keras.callbacks.Callback):  # type: ignore[misc]
    """Interval log lines and the progress file; runs on every rank because the loss average is collective."""

    def __init__(self, training_run: TrainingRun) -> None:
        super().__init__()
        self.training_run = training_run
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch
        self.training_run.epoch_started()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        run, step = self.training_run, batch + 1
        if not run.step_done(step, images=run.cfg.batch_size):
            return
        # Horovod: Keras reports the running mean of the epoch so far; logged averaged over the ranks.
        loss = float(hvd.allreduce(tf.constant(float((logs or {})["loss"])), name="loss"))
        lr = float(keras.backend.get_value(self.model.optimizer.lr))
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
    return imagenet_datasets(run, skipped, one_hot=True)


def callbacks(run: TrainingRun, scaled_lr: float) -> list[Any]:
    cfg = run.cfg
    schedule = functools.partial(cosine_multiplier, warmup_epochs=cfg.warmup_epochs, epochs=cfg.epochs)
    found: list[Any] = [
        # Horovod: rank 0's initial weights and optimizer state to every rank (after the first step creates
        # the slots).
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: epoch metrics (loss, accuracy, val_*) averaged over ranks before other callbacks read them.
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=cfg.warmup_epochs, steps_per_epoch=run.steps_per_epoch
        ),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=scaled_lr,
            multiplier=schedule,
            start_epoch=cfg.warmup_epochs,
            staircase=False,
            steps_per_epoch=run.steps_per_epoch,
        ),
        Progress(run),
    ]
    if run.checkpoint_dir is not None:
        found.append(Checkpoint(run.checkpoint_dir))
    return found


def broadcast_state(model: Any) -> None:
    """Horovod: every rank starts from rank 0's weights and loss scale (with --amp on GPU compile wraps the
    optimizer in a LossScaleOptimizer). The optimizer's own variables follow after the first step, when
    BroadcastGlobalVariablesCallback broadcasts them."""
    scale = tf_checkpoint.loss_scale_variables(model.optimizer)
    hvd_tf.broadcast_variables(model.variables + scale, root_rank=0)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.keras", argv)
    # Horovod: initialise, then pin this process to its GPU (its local rank) or to its share of the cores.
    hvd.init()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    set_precision(cfg.amp, on_gpu)
    keras.utils.set_random_seed(cfg.seed)
    run = TrainingRun("keras", cfg, hvd_tf)

    model = build(cfg.arch, run.num_classes, cfg.image_size)
    model.add_loss(lambda: l2_penalty(model, cfg.weight_decay))
    scaled_lr = run.scaled_lr
    # Horovod: the optimizer averages the gradients over the ranks (allreduce; fp16 with --fp16-allreduce).
    # The legacy optimizer: Horovod's LR callbacks apply momentum correction through its hyperparameters.
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.legacy.SGD(learning_rate=scaled_lr, momentum=cfg.momentum),
        compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
    )
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing)
    model.compile(optimizer=optimizer, loss=loss_fn, metrics=["accuracy"])
    # Create the optimizer's slots now, on every rank alike: a restore on rank 0 would otherwise create them
    # in its own order, and the first broadcast would pair different variables across ranks and hang.
    model.optimizer._create_all_weights(model.trainable_variables)

    # Horovod: rank 0 restores the newest checkpoint and broadcasts the epoch to start from.
    run.resume(lambda directory: tf_checkpoint.restore_latest(directory, model, model.optimizer))
    broadcast_state(model)
    # The inputs start at the epoch the run resumes at, in that epoch's order.
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)  # files the input pipeline dropped
    train_ds, val_ds = make_inputs(run, skipped)
    run.begin(f"tf_keras {metadata.version('tf-keras')} (tf {tf.__version__})", "GPU" if on_gpu else "CPU")

    history = model.fit(
        train_ds,
        steps_per_epoch=run.steps_per_epoch,
        epochs=cfg.epochs,
        initial_epoch=run.start_epoch,
        validation_data=val_ds,
        validation_steps=cfg.val_steps,
        callbacks=callbacks(run, scaled_lr),
        verbose=0,
    )
    val_top1 = history.history.get("val_accuracy", [None])[-1]
    if val_top1 is not None:
        run.validated(float(val_top1))

    # Horovod: finish gathers every rank's skipped images and weight digest (equal: the ranks kept in step).
    weights = (v.numpy().tobytes() for v in model.trainable_variables)
    save = functools.partial(tf_checkpoint.save_model, model)
    run.finish(weights=weights, save=save, skipped=int(skipped.read_value()))


if __name__ == "__main__":
    main()
