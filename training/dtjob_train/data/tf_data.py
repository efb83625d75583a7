"""tf.data input pipeline for the ImageNet folder layout (shared by the TensorFlow and Keras trainers).

Training decodes only the random crop (decode_and_crop_jpeg), the standard TF ResNet recipe that skips most
of the decode work. Files that are not JPEGs are dropped and counted; a JPEG too corrupt to decode is dropped
by ignore_errors so a bad file never stops a run.

Batches are uint8 NHWC: the model's first layer (models.resnet_keras) casts and normalises on the device, so
the host copies a quarter of the bytes. Each rank's pipeline runs on its own thread pool, sized to its share
of the node's cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtjob_train.cli import TrainConfig
from dtjob_train.tf_env import tf

from .folder import Split, epoch_shard

AUTOTUNE = tf.data.AUTOTUNE


def _train_image(data: Any, size: int) -> Any:
    shape = tf.io.extract_jpeg_shape(data)
    begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
    image = tf.io.decode_and_crop_jpeg(data, window, channels=3)
    image = _to_uint8(tf.image.resize(image, (size, size), method="bilinear"))
    return tf.image.random_flip_left_right(image)


def _to_uint8(image: Any) -> Any:
    """Resizing yields float pixels in [0, 255] (bilinear never overshoots); back to one byte each."""
    return tf.saturate_cast(tf.round(image), tf.uint8)


def _val_image(data: Any, size: int) -> Any:
    image = tf.io.decode_jpeg(data, channels=3)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = (size / 0.875) / tf.reduce_min(shape)
    resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32), method="bilinear")
    return _to_uint8(tf.image.resize_with_crop_or_pad(resized, size, size))


def epoch_indices(total: int, *, rank: int, size: int, seed: int, epochs: range) -> Any:
    """One element per epoch of `epochs`: this rank's indices into the whole training set for that epoch
    (folder.epoch_shard, the order the PyTorch trainer uses too)."""

    def shard(epoch: Any) -> Any:
        return epoch_shard(total, epoch=int(epoch), rank=rank, size=size, seed=seed)

    def indices(epoch: Any) -> Any:
        found = tf.numpy_function(shard, [epoch], tf.int64, stateful=False)
        return tf.ensure_shape(found, [None])

    return tf.data.Dataset.range(epochs.start, epochs.stop).map(indices)


def make_dataset(
    split: Split,
    *,
    rank: int,
    size: int,
    batch_size: int,
    image_size: int,
    train: bool,
    seed: int,
    num_classes: int | None,
    skipped: Any,
    threads: int,
    epochs: range | None = None,
    steps_per_epoch: int = 0,
) -> Any:
    """Batches of (uint8 NHWC images, labels); one-hot labels when num_classes is given. `threads`: the
    size of the pipeline's private thread pool.

    Training: exactly steps_per_epoch batches for each epoch of `epochs`, each epoch in its own global order
    (epoch_indices). An epoch's shard wraps around when dropped files leave it short of full batches, so the
    next epoch still starts at its own beginning. Validation: this rank's fixed shard, once.
    `skipped` is an int64 tf.Variable counting files that were not JPEGs.
    """

    batches = _batcher(
        image_size=image_size, train=train, num_classes=num_classes, skipped=skipped, batch_size=batch_size
    )
    if train:
        if epochs is None or steps_per_epoch <= 0:
            raise ValueError("a training dataset needs its epochs and steps_per_epoch")
        paths = tf.constant([p for p, _ in split.samples])
        labels = tf.constant([label for _, label in split.samples])

        def epoch_batches(indices: Any) -> Any:
            files = tf.data.Dataset.from_tensor_slices(indices).repeat()
            files = files.map(lambda i: (tf.gather(paths, i), tf.gather(labels, i)))
            return batches(files).take(steps_per_epoch)

        total = len(split.samples)
        ds = epoch_indices(total, rank=rank, size=size, seed=seed, epochs=epochs).flat_map(epoch_batches)
    else:
        shard = split.shard(rank, size)
        ds = batches(
            tf.data.Dataset.from_tensor_slices(([p for p, _ in shard], [label for _, label in shard]))
        )
    return ds.with_options(_options(threads)).prefetch(AUTOTUNE)


def _batcher(
    *, image_size: int, train: bool, num_classes: int | None, skipped: Any, batch_size: int
) -> Callable[[Any], Any]:
    """(path, label) datasets -> batches: decoded (the training crop or the validation centre), files that
    are not JPEGs dropped and counted in `skipped`, labels one-hot when num_classes is given."""

    def load(path: Any, label: Any) -> Any:
        data = tf.io.read_file(path)
        ok = tf.io.is_jpeg(data)
        image = tf.cond(
            ok,
            lambda: _train_image(data, image_size) if train else _val_image(data, image_size),
            lambda: tf.zeros((image_size, image_size, 3), tf.uint8),
        )
        return image, label, ok

    def keep(image: Any, label: Any, ok: Any) -> Any:
        with tf.control_dependencies([skipped.assign_add(tf.cast(tf.logical_not(ok), tf.int64))]):
            return tf.identity(ok)

    def finish(image: Any, label: Any, ok: Any) -> Any:
        return image, (tf.one_hot(label, num_classes) if num_classes else label)

    def batches(files: Any) -> Any:
        ds = files.map(load, num_parallel_calls=AUTOTUNE, deterministic=False).ignore_errors()
        ds = ds.filter(keep).map(finish, num_parallel_calls=AUTOTUNE)
        return ds.batch(batch_size, drop_remainder=train, num_parallel_calls=AUTOTUNE)

    return batches


def _options(threads: int) -> Any:
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = True
    # Its own pool, its share of the cores: TensorFlow's default pool has a thread per core in every rank.
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return options


def synthetic_batch(cfg: TrainConfig, rank: int) -> tuple[Any, Any]:
    """One fixed random batch (uint8 NHWC images, int labels), fed again every step: measures compute only."""
    tf.random.set_seed(cfg.seed + rank)
    shape = (cfg.batch_size, cfg.image_size, cfg.image_size, 3)
    images = tf.cast(tf.random.uniform(shape, maxval=256, dtype=tf.int32), tf.uint8)
    labels = tf.random.uniform((cfg.batch_size,), maxval=cfg.num_classes, dtype=tf.int32)
    return images, labels
