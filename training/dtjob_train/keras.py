"""Horovod + Keras ResNet-50 trainer with ``model.fit``: ``python -m dtjob_train.keras``.

Keras here is tf_keras (Keras 2): horovod.tensorflow.keras 0.28.1 does not work with the Keras 3 that
TF >= 2.16 ships as tf.keras (see training/README.md). dtjob_train.tf_env selects it before TensorFlow loads.
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
import horovod
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from . import tf_checkpoint
from .cli import TrainConfig, parse_args
from .common import digest, metrics_record, scan_imagenet
from .models.resnet_keras import build, l2_penalty
from .progress import Reporter, Throughput
from .schedule import cosine_multiplier


class Progress(keras.callbacks.Callback):  # type: ignore[misc]
    """Interval log lines and the progress file; runs on every rank because the loss average is collective."""

    def __init__(self, reporter: Reporter, meter: Throughput, batch_size: int, log_interval: int) -> None:
        super().__init__()
        self.reporter, self.meter = reporter, meter
        self.batch_size, self.log_interval = batch_size, log_interval
        self.epoch = 0
        self.last_loss = math.nan

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.meter.add(self.batch_size)
        step = batch + 1
        if step % self.log_interval and step != self.reporter.steps_per_epoch:
            return
        # Keras reports the running mean of the epoch so far; averaged over ranks here.
        self.last_loss = float(hvd.allreduce(tf.constant(float((logs or {})["loss"])), name="loss"))
        lr = float(keras.backend.get_value(self.model.optimizer.lr))
        rate = self.meter.mark()
        self.reporter.interval(epoch=self.epoch, step=step, loss=self.last_loss, lr=lr, per_worker=rate)


class Checkpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Rank 0 only: model + optimizer state after every epoch."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        tf_checkpoint.save(self.directory, epoch + 1, self.model, self.model.optimizer)


def synthetic_dataset(cfg: TrainConfig) -> Any:
    tf.random.set_seed(cfg.seed + hvd.rank())
    images = tf.random.normal((cfg.batch_size, cfg.image_size, cfg.image_size, 3))
    labels = tf.random.uniform((cfg.batch_size,), maxval=cfg.num_classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((images, tf.one_hot(labels, cfg.num_classes))).repeat()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.keras", argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    set_precision(cfg.amp, on_gpu)
    keras.utils.set_random_seed(cfg.seed)

    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
    val_ds = None
    if cfg.data == "synthetic":
        num_classes, train_ds = cfg.num_classes, synthetic_dataset(cfg)
        steps_per_epoch = cfg.steps_per_epoch or 100
    else:
        from .data.tf_data import make_dataset

        dataset, available = scan_imagenet(cfg, rank=rank, size=size)
        num_classes = len(dataset.train.classes)
        steps_per_epoch = min(available, cfg.steps_per_epoch or available)
        common = {"rank": rank, "size": size, "batch_size": cfg.batch_size, "image_size": cfg.image_size}
        common |= {"seed": cfg.seed, "num_classes": num_classes, "skipped": skipped}
        train_ds = make_dataset(dataset.train, train=True, **common)
        if dataset.val is not None and cfg.val_steps != 0:
            val_ds = make_dataset(dataset.val, train=False, **common)

    model = build(cfg.arch, num_classes, cfg.image_size)
    model.add_loss(lambda: l2_penalty(model, cfg.weight_decay))
    scaled_lr = cfg.base_lr * size
    # The legacy optimizer: Horovod's LR callbacks apply momentum correction through its hyperparameters.
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.legacy.SGD(learning_rate=scaled_lr, momentum=cfg.momentum),
        compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing),
        metrics=["accuracy"],
    )

    # Create the optimizer's slots now, on every rank alike: a restore on rank 0 would otherwise create them
    # in its own order, and the first broadcast would pair different variables across ranks and hang.
    model.optimizer._create_all_weights(model.trainable_variables)
    start_epoch = 0
    found = tf_checkpoint.restore_latest(cfg.checkpoint_dir, model, model.optimizer) if rank == 0 else None
    if found is not None:
        start_epoch = found[0]
    start_epoch = int(hvd_tf.broadcast_object(start_epoch, root_rank=0, name="start_epoch"))
    hvd_tf.broadcast_variables(model.variables, root_rank=0)

    reporter = Reporter.for_run(cfg, rank=rank, world_size=size, steps_per_epoch=steps_per_epoch)
    if found is not None:
        reporter.say(f"resuming from {found[1]}: {start_epoch} epochs done")
    reporter.say(
        f"tf_keras {metadata.version('tf-keras')} (tf {tf.__version__}) horovod {horovod.__version__}: "
        f"{size} ranks, {cfg.arch}, {cfg.data}, batch {cfg.batch_size}/worker, "
        f"{steps_per_epoch} steps/epoch, {'GPU' if on_gpu else 'CPU'}"
    )
    meter = Throughput()
    progress = Progress(reporter, meter, cfg.batch_size, cfg.log_interval)
    callbacks: list[Any] = [
        # Rank 0's initial weights and optimizer state to every rank (after the first step creates the slots).
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Epoch metrics (loss, accuracy, val_*) averaged over ranks before any other callback reads them.
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=cfg.warmup_epochs, steps_per_epoch=steps_per_epoch
        ),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=scaled_lr,
            multiplier=functools.partial(
                cosine_multiplier, warmup_epochs=cfg.warmup_epochs, epochs=cfg.epochs
            ),
            start_epoch=cfg.warmup_epochs,
            staircase=False,
            steps_per_epoch=steps_per_epoch,
        ),
        progress,
    ]
    if rank == 0 and cfg.checkpoint_dir is not None:
        callbacks.append(Checkpoint(cfg.checkpoint_dir))
    history = model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=cfg.epochs,
        initial_epoch=start_epoch,
        validation_data=val_ds,
        validation_steps=cfg.val_steps,
        callbacks=callbacks,
        verbose=0,
    )
    val_top1 = history.history.get("val_accuracy", [None])[-1]
    if val_top1 is not None:
        reporter.say(f"val top-1 {val_top1:.4f}")

    total_skipped = int(hvd.allreduce(skipped.read_value(), op=hvd.Sum, name="skipped"))
    if total_skipped:
        reporter.say(f"warning: skipped {total_skipped} unreadable images")
    local_digest = digest(v.numpy().tobytes() for v in model.trainable_variables)
    digests = [str(d) for d in hvd_tf.allgather_object(local_digest, name="digests")]
    metrics = metrics_record(
        cfg,
        framework="keras",
        world_size=size,
        per_worker=meter.overall_per_worker(),
        epochs_done=cfg.epochs,
        start_epoch=start_epoch,
        global_step=cfg.epochs * steps_per_epoch,
        final_loss=progress.last_loss,
        val_top1=None if val_top1 is None else float(val_top1),
        skipped_images=total_skipped,
        weight_digests=digests,
    )
    if rank == 0 and cfg.output_dir is not None:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        model.save(str(cfg.output_dir / "model.keras"))
    reporter.finish(metrics)


if __name__ == "__main__":
    main()
