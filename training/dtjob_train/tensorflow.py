"""Horovod + TensorFlow 2 ResNet-50 trainer with a GradientTape loop: ``python -m dtjob_train.tensorflow``.

The step is two functions: the forward and backward pass (XLA-compiled with --xla) yields this rank's
gradients, and the step around it allreduces them with Horovod and applies them. Horovod's collectives are
not XLA operations (the patched build leaves its XLA ops out), so the allreduce stays outside the compiled
part, as in NVIDIA's ResNet-50 recipe.
"""

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
from .data.tf_data import synthetic_batch
from .models.resnet_keras import build, l2_penalty
from .run import TrainingRun
from .tf_inputs import imagenet_datasets


def make_inputs(run: TrainingRun, skipped: Any) -> tuple[Iterator[Any], Any]:
    """The training batches (one iterator for the whole run) and the validation dataset, or None."""
    if run.train_split is None:
        # One fixed random batch held on the device and fed again every step.
        return itertools.repeat(synthetic_batch(run.cfg, run.rank)), None
    train, val = imagenet_datasets(run, skipped, one_hot=False, local_size=hvd.local_size())
    return iter(train), val


def make_gradients(cfg: TrainConfig, model: Any, optimizer: Any, num_classes: int, scaling: bool) -> Any:
    """This rank's forward and backward pass: (loss, gradients, of the scaled loss when scaling). XLA-compiled
    with --xla; no collective inside."""
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=cfg.label_smoothing)

    @tf.function(jit_compile=cfg.xla, reduce_retracing=True)  # type: ignore[untyped-decorator]
    def gradients(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(tf.one_hot(labels, num_classes), logits) + l2_penalty(model, cfg.weight_decay)
            scaled = optimizer.get_scaled_loss(loss) if scaling else loss
        return loss, tape.gradient(scaled, model.trainable_variables)

    return gradients


def make_train_step(cfg: TrainConfig, model: Any, optimizer: Any, num_classes: int, scaling: bool) -> Any:
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    gradients = make_gradients(cfg, model, optimizer, num_classes, scaling)

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
    def train_step(images: Any, labels: Any) -> Any:
        loss, grads = gradients(images, labels)
        # Horovod: the gradients averaged over the ranks (fp16 with --fp16-allreduce), outside the XLA
        # cluster; one allreduce per tensor, as DistributedGradientTape does, which Horovod fuses.
        grads = [hvd.allreduce(g, op=hvd.Average, compression=compression) for g in grads]
        if scaling:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return train_step


def make_eval_step(cfg: TrainConfig, model: Any) -> Any:
    """(hits, images) of one validation batch, compiled as the training step is (XLA with --xla)."""

    @tf.function(jit_compile=cfg.xla, reduce_retracing=True)  # type: ignore[untyped-decorator]
    def eval_step(images: Any, labels: Any) -> Any:
        logits = model(images, training=False)
        predicted = tf.argmax(logits, 1, output_type=tf.int32)
        hits = tf.reduce_sum(tf.cast(tf.equal(predicted, tf.cast(labels, tf.int32)), tf.float64))
        return tf.stack([hits, tf.cast(tf.size(labels), tf.float64)])

    return eval_step


def evaluate(eval_step: Any, dataset: Any, steps: int | None) -> float:
    """Top-1 accuracy over every rank's shard (sums allreduced, so all ranks agree)."""
    counts = tf.zeros(2, tf.float64)
    for images, labels in dataset.take(steps if steps is not None else -1):
        counts += eval_step(images, labels)
    # Horovod: the hits and the count summed over the ranks.
    total = hvd.allreduce(counts, op=hvd.Sum, name="val_top1")
    return float(total[0] / tf.maximum(total[1], 1.0))


def broadcast_state(model: Any, optimizer: Any) -> None:
    """Horovod: every rank starts from rank 0's weights and optimizer state, the loss scale included."""
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables + tf_checkpoint.loss_scale_variables(optimizer), root_rank=0)


def train(
    run: TrainingRun, model: Any, optimizer: Any, train_step: Any, eval_step: Any, batches: Any, val_ds: Any
) -> None:
    """A fixed world's epochs: training steps, validation and a checkpoint after each."""
    cfg = run.cfg
    for epoch in run.epochs():
        for step, lr, (images, labels) in run.steps(epoch, batches):
            optimizer.learning_rate.assign(lr)
            loss = train_step(images, labels)
            if run.step_done(step, images=cfg.batch_size):
                # Horovod: the logged loss is averaged over the ranks.
                run.log(epoch=epoch, step=step, lr=lr, loss=float(hvd.allreduce(loss, name="loss")))
        if val_ds is not None:
            run.validated(evaluate(eval_step, val_ds, cfg.val_steps), epoch)
        if run.checkpoint_dir is not None:
            tf_checkpoint.save(run.checkpoint_dir, epoch + 1, model, optimizer)


def train_elastic(
    run: TrainingRun, model: Any, optimizer: Any, train_step: Any, eval_step: Any, skipped: Any, on_gpu: bool
) -> None:
    """--elastic: hvd.elastic.run's state sync starts every rank from rank 0's state (tf_elastic)."""
    from .tf_elastic import TfElasticTrainer

    def validate() -> float:
        # This world's shards of val/, built anew: the ranks may have changed since the last epoch.
        _, val_ds = make_inputs(run, skipped)
        return evaluate(eval_step, val_ds, run.cfg.val_steps)

    run.begin(f"tensorflow {tf.__version__}", "GPU" if on_gpu else "CPU")
    validation = validate if run.val_split is not None else None
    TfElasticTrainer(run.cfg, run, model, optimizer, train_step, validation, skipped).train()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args("python -m dtjob_train.tensorflow", argv, framework="tensorflow")
    # Horovod: initialise, then pin this process to its GPU (its local rank) or to its share of the cores.
    hvd.init()
    on_gpu = configure_devices(hvd.local_rank(), hvd.local_size())
    scaling = set_precision(cfg.amp, cfg.amp_dtype, on_gpu)
    tf.keras.utils.set_random_seed(cfg.seed)
    run = TrainingRun("tensorflow", cfg, hvd)

    model = build(cfg.arch, run.num_classes, cfg.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=run.learning_rate(0), momentum=cfg.momentum)
    if scaling:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)  # slots exist now, so a restore fills them at once
    train_step = make_train_step(cfg, model, optimizer, run.num_classes, scaling=scaling)
    eval_step = make_eval_step(cfg, model)

    # Horovod: rank 0 restores the newest checkpoint and broadcasts the epoch to start from.
    run.resume(lambda directory: tf_checkpoint.restore_latest(directory, model, optimizer))
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)  # files the input pipeline dropped
    if cfg.elastic:
        train_elastic(run, model, optimizer, train_step, eval_step, skipped, on_gpu)
    else:
        broadcast_state(model, optimizer)
        # The inputs start at the epoch the run resumes at, in that epoch's order.
        batches, val_ds = make_inputs(run, skipped)
        run.begin(f"tensorflow {tf.__version__}", "GPU" if on_gpu else "CPU")
        train(run, model, optimizer, train_step, eval_step, batches, val_ds)

    # Horovod: finish gathers every rank's skipped images and weight digest (equal: the ranks kept in step).
    weights = (v.numpy().tobytes() for v in model.trainable_variables)
    save = functools.partial(tf_checkpoint.save_model, model)
    run.finish(weights=weights, save=save, skipped=int(skipped.read_value()))
    hvd.shutdown()


if __name__ == "__main__":
    main()
