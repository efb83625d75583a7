"""Horovod + Keras ResNet-50 trainer with ``model.fit``: ``python -m dtjob_train.keras``.

Keras here is tf_keras (Keras 2): horovod.tensorflow.keras 0.28.1 does not work with the Keras 3 that
TF >= 2.16 ships as tf.keras (see training/README.md). dtjob_train.tf_env selects it before TensorFlow loads.

Nothing reads a device value between steps: the learning rate is a schedule the optimizer evaluates inside
the step, and the callbacks take Keras's logs as tensors, reading the loss only on the steps they log. On a
GPU every such read waits for the step in flight to finish, so a read per step keeps the GPU's queue empty.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import metadata
from typing import Any

# isort: off
from .tf_env import configure_devices, keras, set_precision, tf  # selects Keras 2 before TF loads
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from . import tf_checkpoint
from .cli import TrainConfig, parse_args
from .keras_train import ElasticStepSchedule, StepSchedule, callbacks, make_inputs
from .models.resnet_keras import build, l2_penalty
from .run import TrainingRun


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
