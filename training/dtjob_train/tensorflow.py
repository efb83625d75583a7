"""Horovod + TensorFlow 2 ResNet-50 trainer with a GradientTape loop: ``python -m dtjob_train.tensorflow``."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

# isort: off
from .tf_env import configure_devices, keras, set_precision, tf  # selects Keras 2 before TF loads
import horovod
import horovod.tensorflow as hvd
# isort: on

from . import tf_checkpoint
from .cli import TrainConfig, parse_args
from .common import digest, metrics_record, scan_imagenet
from .models.resnet_keras import build, l2_penalty
from .progress import Reporter, Throughput
from .schedule import learning_rate


def synthetic_dataset(cfg: TrainConfig) -> Any:
    """One fixed random batch held on the device and fed again every step: measures compute only."""
    tf.random.set_seed(cfg.seed + hvd.rank())
    images = tf.random.normal((cfg.batch_size, cfg.image_size, cfg.image_size, 3))
    labels = tf.random.uniform((cfg.batch_size,), maxval=cfg.num_classes, dtype=tf.int32)
    return itertools.repeat((images, labels))


def evaluate(model: Any, dataset: Any, steps: int | None) -> float:
    counts = tf.zeros(2, tf.float64)
    for images, labels in dataset.take(steps if steps is not None else -1):
        logits = model(images, training=False)
        hit = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float64))
        counts += tf.stack([hit, tf.cast(tf.size(labels), tf.float64)])
    total = hvd.allreduce(counts, op=hvd.Sum, name="val_top1")
    return float(total[0] / tf.maximum(total[1], 1.0))


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.tensorflow", argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    set_precision(cfg.amp, on_gpu)
    tf.keras.utils.set_random_seed(cfg.seed)

    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
    val_ds = None
    if cfg.data == "synthetic":
        num_classes, batches = cfg.num_classes, synthetic_dataset(cfg)
        steps_per_epoch = cfg.steps_per_epoch or 100
    else:
        from .data.tf_data import make_dataset

        dataset, available = scan_imagenet(cfg, rank=rank, size=size)
        num_classes = len(dataset.train.classes)
        steps_per_epoch = min(available, cfg.steps_per_epoch or available)
        common = {"rank": rank, "size": size, "batch_size": cfg.batch_size, "image_size": cfg.image_size}
        common |= {"seed": cfg.seed, "num_classes": None, "skipped": skipped}
        batches = iter(make_dataset(dataset.train, train=True, **common))
        if dataset.val is not None and cfg.val_steps != 0:
            val_ds = make_dataset(dataset.val, train=False, **common)

    model = build(cfg.arch, num_classes, cfg.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=cfg.base_lr, momentum=cfg.momentum)
    if cfg.amp and on_gpu:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)  # slots exist now, so a restore fills them at once
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing)
    scaling = cfg.amp and on_gpu

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
    def train_step(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(tf.one_hot(labels, num_classes), logits) + l2_penalty(model, cfg.weight_decay)
            scaled = optimizer.get_scaled_loss(loss) if scaling else loss
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, model.trainable_variables)
        if scaling:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    start_epoch = 0
    found = tf_checkpoint.restore_latest(cfg.checkpoint_dir, model, optimizer) if rank == 0 else None
    if found is not None:
        start_epoch = found[0]
    start_epoch = int(hvd.broadcast_object(start_epoch, root_rank=0, name="start_epoch"))
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)

    reporter = Reporter.for_run(cfg, rank=rank, world_size=size, steps_per_epoch=steps_per_epoch)
    if found is not None:
        reporter.say(f"resuming from {found[1]}: {start_epoch} epochs done")
    reporter.say(
        f"tensorflow {tf.__version__} horovod {horovod.__version__}: {size} ranks, {cfg.arch}, {cfg.data}, "
        f"batch {cfg.batch_size}/worker, {steps_per_epoch} steps/epoch, {'GPU' if on_gpu else 'CPU'}"
    )
    meter = Throughput()
    loss_avg, val_top1 = math.nan, None
    step_total = start_epoch * steps_per_epoch
    for epoch in range(start_epoch, cfg.epochs):
        for step, (images, labels) in enumerate(itertools.islice(batches, steps_per_epoch), 1):
            lr = learning_rate(
                epoch + step / steps_per_epoch,
                base_lr=cfg.base_lr,
                world_size=size,
                warmup_epochs=cfg.warmup_epochs,
                epochs=cfg.epochs,
            )
            optimizer.learning_rate.assign(lr)
            loss = train_step(images, labels)
            meter.add(cfg.batch_size)
            step_total += 1
            if step % cfg.log_interval == 0 or step == steps_per_epoch:
                loss_avg = float(hvd.allreduce(loss, name="loss"))
                reporter.interval(epoch=epoch, step=step, loss=loss_avg, lr=lr, per_worker=meter.mark())
        if val_ds is not None:
            val_top1 = evaluate(model, val_ds, cfg.val_steps)
            reporter.say(f"epoch {epoch + 1}/{cfg.epochs} val top-1 {val_top1:.4f}")
        if rank == 0 and cfg.checkpoint_dir is not None:
            tf_checkpoint.save(cfg.checkpoint_dir, epoch + 1, model, optimizer)

    total_skipped = int(hvd.allreduce(skipped.read_value(), op=hvd.Sum, name="skipped"))
    if total_skipped:
        reporter.say(f"warning: skipped {total_skipped} unreadable images")
    local_digest = digest(v.numpy().tobytes() for v in model.trainable_variables)
    digests = [str(d) for d in hvd.allgather_object(local_digest, name="digests")]
    metrics = metrics_record(
        cfg,
        framework="tensorflow",
        world_size=size,
        per_worker=meter.overall_per_worker(),
        epochs_done=cfg.epochs,
        start_epoch=start_epoch,
        global_step=step_total,
        final_loss=loss_avg,
        val_top1=val_top1,
        skipped_images=total_skipped,
        weight_digests=digests,
    )
    if rank == 0 and cfg.output_dir is not None:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        model.save(str(cfg.output_dir / "model.keras"))
    reporter.finish(metrics)
    hvd.shutdown()


if __name__ == "__main__":
    main()
