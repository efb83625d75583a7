"""The TensorFlow and Keras trainers' ImageNet inputs for a run: dtjob_train.data.tf_data's tf.data
pipeline with the run's place in the world, its splits and the epochs it has left."""

from __future__ import annotations

import functools
from typing import Any

from .data.tf_data import make_dataset
from .host import cores_per_rank
from .run import TrainingRun


def imagenet_datasets(
    run: TrainingRun, skipped: Any, *, one_hot: bool, local_size: int, epochs: range | None = None
) -> tuple[Any, Any]:
    """This rank's training dataset of an ImageNet run and its validation dataset (None without one);
    one-hot labels for Keras's fit, class indices otherwise. `local_size`: the ranks on this host, which
    share its cores. `epochs`: the epochs the training dataset covers (default: the rest of the run)."""
    cfg = run.cfg
    assert run.train_split is not None
    num_classes = run.num_classes if one_hot else None
    dataset = functools.partial(
        make_dataset,
        rank=run.rank,
        size=run.size,
        batch_size=cfg.batch_size,
        image_size=cfg.image_size,
        seed=cfg.seed,
        num_classes=num_classes,
        skipped=skipped,
        threads=cores_per_rank(local_size),
    )
    # From the epoch the run resumes at: call after TrainingRun.resume.
    epochs = run.epochs() if epochs is None else epochs
    train = dataset(run.train_split, train=True, epochs=epochs, steps_per_epoch=run.steps_per_epoch)
    val = None if run.val_split is None else dataset(run.val_split, train=False)
    return train, val
