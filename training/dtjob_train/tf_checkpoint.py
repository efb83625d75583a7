"""TensorFlow/Keras checkpoints: one directory per completed epoch, written to a temp name then renamed; and
the final model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from . import checkpoints
from .tf_env import tf


def save(directory: Path, epochs_done: int, model: Any, optimizer: Any) -> None:
    final = checkpoints.path_for(directory, epochs_done, "")
    tmp = directory / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp / "ckpt"))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    checkpoints.prune(directory)


def restore_latest(directory: Path | None, model: Any, optimizer: Any) -> tuple[int, Path] | None:
    """Load the newest checkpoint into model and optimizer; (epochs done, path) or None."""
    found = checkpoints.latest(directory)
    if found is not None:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(str(found[1] / "ckpt")).expect_partial()
    return found


def loss_scale_variables(optimizer: Any) -> list[Any]:
    """A dynamic loss scale's state (the scale and its count of good steps), or [] without one.

    tf_keras's LossScaleOptimizer (both the legacy and the current one) checkpoints it, but keeps it out of
    optimizer.variables, all that Horovod's broadcasts cover: after a resume only rank 0 would have it.
    """
    state = getattr(optimizer, "_loss_scale", None)
    if not getattr(optimizer, "dynamic", False) or state is None:
        return []
    return [state.current_loss_scale, state.counter]


def save_model(model: Any, output_dir: Path) -> None:
    """The trained network as output_dir/model.keras, for inference: the training state (optimizer, its
    learning-rate schedule) lives in the checkpoints, and loading the file needs no dtjob_train code."""
    # An uncompiled view of the same layers: the .keras format saves a compiled model's optimizer.
    network = tf.keras.Model(model.inputs, model.outputs, name=model.name)
    network.save(str(output_dir / "model.keras"))
