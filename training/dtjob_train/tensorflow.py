"""Horovod + TensorFlow 2 ResNet-50 trainer with a GradientTape loop: ``python -m dtjob_train.tensorflow``."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

# isort: off
from .tf_env import configure_devices, keras, set_precision, tf  # selects Keras 2 before TF loads
import horovod.tensorflow as hvd
# isort: on

from . import tf_checkpoint
from .cli import TrainConfig, parse_args
from .data.tf_data import imagenet_datasets, synthetic_batch
from .models.resnet_keras import build, l2_penalty
from .run import TrainingRun


def make_inputs(run: TrainingRun, skipped: Any) -> tuple[Iterator[Any], Any]:
    """The training batches (one iterator for the whole run) and the validation dataset, or None."""
    if run.train_split is None:
        # One fixed random batch held on the device and fed again every step.
        return itertools.repeat(synthetic_batch(run.cfg, run.rank)), None
    train, val = imagenet_datasets(run, skipped, one_hot=False)
    return iter(train), val


def make_train_step(cfg: TrainConfig, model: Any, optimizer: Any, num_classes: int, scaling: bool) -> Any:
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing)

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
    def train_step(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(tf.one_hot(labels, num_classes), logits) + l2_penalty(model, cfg.weight_decay)
            scaled = optimizer.get_scaled_loss(loss) if scaling else loss
        # Horovod: the tape averages the gradients over the ranks (allreduce; fp16 with --fp16-allreduce).
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, model.trainable_variables)
        if scaling:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return train_step


def evaluate(model: Any, dataset: Any, steps: int | None) -> float:
    counts = tf.zeros(2, tf.float64)
    for images, labels in dataset.take(steps if steps is not None else -1):
        logits = model(images, training=False)
        hit = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float64))
        counts += tf.stack([hit, tf.cast(tf.size(labels), tf.float64)])
    # Horovod: the hits and the count summed over the ranks.
    total = hvd.allreduce(counts, op=hvd.Sum, name="val_top1")
    return float(total[0] / tf.maximum(total[1], 1.0))


def broadcast_state(model: Any, optimizer: Any) -> None:
    """Horovod: every rank starts from rank 0's weights and optimizer state, the loss scale included."""
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables + tf_checkpoint.loss_scale_variables(optimizer), root_rank=0)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.tensorflow", argv)
    # Horovod: initialise, then pin this process to its GPU (its local rank) or to its share of the cores.
    hvd.init()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    set_precision(cfg.amp, on_gpu)
    tf.keras.utils.set_random_seed(cfg.seed)
    run = TrainingRun("tensorflow", cfg, hvd)

    model = build(cfg.arch, run.num_classes, cfg.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=run.learning_rate(0), momentum=cfg.momentum)
    if cfg.amp and on_gpu:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)  # slots exist now, so a restore fills them at once
    train_step = make_train_step(cfg, model, optimizer, run.num_classes, scaling=cfg.amp and on_gpu)

    # Horovod: rank 0 restores the newest checkpoint and broadcasts the epoch to start from.
    run.resume(lambda directory: tf_checkpoint.restore_latest(directory, model, optimizer))
    broadcast_state(model, optimizer)
    # The inputs start at the epoch the run resumes at, in that epoch's order.
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)  # files the input pipeline dropped
    batches, val_ds = make_inputs(run, skipped)
    run.begin(f"tensorflow {tf.__version__}", "GPU" if on_gpu else "CPU")

    for epoch in run.epochs():
        for step, lr, (images, labels) in run.steps(epoch, batches):
            optimizer.learning_rate.assign(lr)
            loss = train_step(images, labels)
            if run.step_done(step, images=cfg.batch_size):
                # Horovod: the logged loss is averaged over the ranks.
                run.log(epoch=epoch, step=step, lr=lr, loss=float(hvd.allreduce(loss, name="loss")))
        if val_ds is not None:
            run.validated(evaluate(model, val_ds, cfg.val_steps), epoch)
        if run.checkpoint_dir is not None:
            tf_checkpoint.save(run.checkpoint_dir, epoch + 1, model, optimizer)

    # Horovod: finish gathers every rank's skipped images and weight digest (equal: the ranks kept in step).
    weights = (v.numpy().tobytes() for v in model.trainable_variables)
    save = functools.partial(tf_checkpoint.save_model, model)
    run.finish(weights=weights, save=save, skipped=int(skipped.read_value()))
    hvd.shutdown()


if __name__ == "__main__":
    main()
