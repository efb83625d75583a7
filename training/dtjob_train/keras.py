"""Horovod + Keras ResNet-50 trainer with ``model.fit``: ``python -m dtjob_train.keras``.

Keras here is tf_keras (Keras 2): horovod.tensorflow.keras 0.28.1 does not work with the Keras 3 that
TF >= 2.16 ships as tf.keras (see training/README.md). dtjob_train.tf_env selects it before TensorFlow loads.

Nothing reads a device value between steps: the learning rate is a schedule the optimizer evaluates inside
the step, and the callbacks take Keras's logs as tensors, reading the loss only on the steps they log. On a
GPU every such read waits for the step in flight to finish, so a read per step keeps the GPU's queue empty.
"""

from __future__ import annotations

import functools
import math
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
from .cli import TrainConfig, parse_args
from .data.tf_data import imagenet_datasets, synthetic_batch
from .models.resnet_keras import build, l2_penalty
from .run import TrainingRun
from .schedule import scaled_lr


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


class XlaStepModel(keras.Model):  # type: ignore[misc]
    """--xla: fit's step with the forward and backward pass XLA-compiled and Horovod's allreduce outside it
    (Horovod's collectives are not XLA operations). The optimizer is a plain one; this step averages the
    gradients, before the loss scale's overflow check, so every rank takes the same decision."""

    compression: Any = None

    @tf.function(jit_compile=True)  # type: ignore[untyped-decorator]
    def local_gradients(self, x: Any, y: Any) -> Any:
        scaling = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x, y, y_pred)
            scaled = self.optimizer.get_scaled_loss(loss) if scaling else loss
        return tape.gradient(scaled, self.trainable_variables), y_pred

    def train_step(self, data: Any) -> Any:
        x, y = data
        grads, y_pred = self.local_gradients(x, y)
        # Horovod: the gradients averaged over the ranks (fp16 with --fp16-allreduce).
        grads = [hvd_tf.allreduce(g, op=hvd_tf.Average, compression=self.compression) for g in grads]
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return self.compute_metrics(x, y, y_pred, None)


def broadcast_state(model: Any) -> None:
    """Horovod: every rank starts from rank 0's weights and loss scale (with --amp on GPU compile wraps the
    optimizer in a LossScaleOptimizer). The optimizer's own variables follow after the first step, when
    BroadcastGlobalVariablesCallback broadcasts them."""
    scale = tf_checkpoint.loss_scale_variables(model.optimizer)
    hvd_tf.broadcast_variables(model.variables + scale, root_rank=0)


def compiled_model(cfg: TrainConfig, run: TrainingRun) -> tuple[Any, Any]:
    """(the model fit trains, compiled with its optimizer; the network it trains, what is saved at the end).
    They are one model except with --xla, where the first wraps the second with its own step."""
    network = build(cfg.arch, run.num_classes, cfg.image_size)
    network.add_loss(lambda: l2_penalty(network, cfg.weight_decay))
    schedule = (ElasticStepSchedule if cfg.elastic else StepSchedule)(
        base_lr=cfg.base_lr,
        batch_size=cfg.batch_size,
        world_size=run.size,
        warmup_epochs=cfg.warmup_epochs,
        epochs=cfg.epochs,
        steps_per_epoch=run.steps_per_epoch,
    )
    sgd = keras.optimizers.legacy.SGD(learning_rate=schedule, momentum=cfg.momentum)
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    if cfg.xla:
        model = XlaStepModel(network.inputs, network.outputs, name=network.name)
        model.compression = compression
        optimizer = sgd
    else:
        model = network
        # Horovod: the optimizer averages the gradients over the ranks (allreduce; fp16 with
        # --fp16-allreduce).
        optimizer = hvd.DistributedOptimizer(sgd, compression=compression)
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing)
    model.compile(optimizer=optimizer, loss=loss_fn, metrics=["accuracy"])
    # Create the optimizer's slots now, on every rank alike: a restore on rank 0 would otherwise create them
    # in its own order, and the first broadcast would pair different variables across ranks and hang.
    model.optimizer._create_all_weights(model.trainable_variables)
    return model, network


def fit(run: TrainingRun, model: Any, train_ds: Any, val_ds: Any) -> None:
    """A fixed world's epochs: model.fit with the trainer's callbacks."""
    history = model.fit(
        train_ds,
        steps_per_epoch=run.steps_per_epoch,
        epochs=run.cfg.epochs,
        initial_epoch=run.start_epoch,
        validation_data=val_ds,
        validation_steps=run.cfg.val_steps,
        callbacks=callbacks(run),
        verbose=0,
    )
    val_top1 = history.history.get("val_accuracy", [None])[-1]
    if val_top1 is not None:
        run.validated(float(val_top1))


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.keras", argv, framework="keras")
    # Horovod: initialise, then pin this process to its GPU (its local rank) or to its share of the cores.
    hvd.init()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    set_precision(cfg.amp, cfg.amp_dtype, on_gpu)
    keras.utils.set_random_seed(cfg.seed)
    run = TrainingRun("keras", cfg, hvd_tf)
    model, network = compiled_model(cfg, run)

    # Horovod: rank 0 restores the newest checkpoint and broadcasts the epoch to start from.
    run.resume(lambda directory: tf_checkpoint.restore_latest(directory, model, model.optimizer))
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)  # files the input pipeline dropped
    versions = f"tf_keras {metadata.version('tf-keras')} (tf {tf.__version__})"
    if cfg.elastic:
        from .keras_elastic import KerasElasticTrainer

        run.begin(versions, "GPU" if on_gpu else "CPU")
        KerasElasticTrainer(run, model, skipped).train()
    else:
        broadcast_state(model)
        # The inputs start at the epoch the run resumes at, in that epoch's order.
        train_ds, val_ds = make_inputs(run, skipped)
        run.begin(versions, "GPU" if on_gpu else "CPU")
        fit(run, model, train_ds, val_ds)

    # Horovod: finish gathers every rank's skipped images and weight digest (equal: the ranks kept in step).
    weights = (v.numpy().tobytes() for v in model.trainable_variables)
    save = functools.partial(tf_checkpoint.save_model, network)
    run.finish(weights=weights, save=save, skipped=int(skipped.read_value()))


if __name__ == "__main__":
    main()
