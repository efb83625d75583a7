"""In-process checks of the TensorFlow/Keras trainers' throughput features on CPU: XLA compilation of the
forward and backward pass, compiled evaluation, uint8 inputs normalised inside the model, the tf.data thread
pool's share of the cores, and the Keras learning rate computed inside the step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dtjob_train.cli import TrainConfig, parse_args
from dtjob_train.data.folder import MEAN_RGB, STD_RGB
from dtjob_train.host import cores_per_rank
from dtjob_train.run import TrainingRun
from dtjob_train.schedule import learning_rate
from dtjob_train.tf_env import keras, tf

from tests.training.training_helpers import launch, make_tree, tiny_args

pytestmark = pytest.mark.training


class OneRank:
    """A world of one rank, for the parts of a TrainingRun that call Horovod's object collectives."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
        return obj

    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        return [obj]


def config(*flags: str) -> TrainConfig:
    return parse_args("t", ["--arch", "resnet-tiny", "--image-size", "32", "--batch-size", "4", *flags])


def tiny_batch() -> tuple[Any, Any]:
    images = tf.cast(
        tf.random.stateless_uniform((4, 32, 32, 3), (1, 2), maxval=256, dtype=tf.int32), tf.uint8
    )
    return images, tf.constant([0, 1, 0, 1], tf.int32)


def must_compile(function: Any, *args: Any) -> bool:
    """Whether the traced function carries XLA's must-compile attribute (what jit_compile=True sets)."""
    attrs = function.get_concrete_function(*args).function_def.attr
    return "_XlaMustCompile" in attrs and bool(attrs["_XlaMustCompile"].b)


@pytest.mark.parametrize("xla", [True, False])
def test_the_xla_flag_compiles_the_forward_and_backward_pass(xla: bool) -> None:
    from dtjob_train.models.resnet_keras import build
    from dtjob_train.tensorflow import make_gradients

    cfg = config(*(["--xla"] if xla else []))
    assert cfg.xla is xla
    model = build(cfg.arch, 2, cfg.image_size)
    optimizer = keras.optimizers.SGD(0.1)
    gradients = make_gradients(cfg, model, optimizer, 2, scaling=False)
    batch = tiny_batch()
    assert must_compile(gradients, *batch) is xla
    loss, grads = gradients(*batch)
    assert np.isfinite(float(loss)) and len(grads) == len(model.trainable_variables)
    if xla:
        # XLA's own program for it: the pass really goes through the compiler on this CPU.
        assert gradients.experimental_get_compiler_ir(*batch)(stage="hlo").startswith("HloModule")


def test_evaluation_is_a_compiled_function_that_counts_hits() -> None:
    from dtjob_train.models.resnet_keras import build
    from dtjob_train.tensorflow import make_eval_step

    cfg = config("--xla")
    model = build(cfg.arch, 2, cfg.image_size)
    eval_step = make_eval_step(cfg, model)
    assert isinstance(eval_step, tf.types.experimental.PolymorphicFunction)
    images, labels = tiny_batch()
    assert must_compile(eval_step, images, labels)
    expected = int(
        tf.reduce_sum(tf.cast(tf.argmax(model(images), 1, output_type=tf.int32) == labels, tf.int32))
    )
    assert eval_step(images, labels).numpy().tolist() == [expected, 4]


def test_the_model_takes_uint8_images_and_normalises_them() -> None:
    from dtjob_train.models.resnet_keras import build

    model = build("resnet-tiny", 2, 32)
    assert model.inputs[0].dtype == tf.uint8
    images, _ = tiny_batch()
    normalised = model.get_layer("normalize")(images)
    reference = (tf.cast(images, tf.float32) - tf.constant(MEAN_RGB)) / tf.constant(STD_RGB)
    np.testing.assert_allclose(normalised.numpy(), reference.numpy(), rtol=1e-5, atol=1e-5)


def test_tf_data_ships_uint8_on_this_ranks_share_of_the_cores(tmp_path: Path) -> None:
    from dtjob_train.tf_inputs import imagenet_datasets

    cfg = parse_args("t", ["--data", "imagenet", "--data-dir", str(make_tree(tmp_path, per_class_train=4)),
                           "--image-size", "32", "--batch-size", "4", "--epochs", "1"])  # fmt: skip
    run = TrainingRun("tensorflow", cfg, OneRank())
    skipped = tf.Variable(0, dtype=tf.int64)
    train, val = imagenet_datasets(run, skipped, one_hot=False, local_size=2)
    for dataset in (train, val):
        assert dataset.element_spec[0].dtype == tf.uint8
        assert dataset.options().threading.private_threadpool_size == cores_per_rank(2)
    images, labels = next(iter(train))
    assert images.shape == (4, 32, 32, 3) and images.dtype == tf.uint8
    # The two classes are reddish and bluish noise: the bytes survived decoding and resizing.
    for image, label in zip(images.numpy().astype(float), labels.numpy(), strict=True):
        red, blue = image[..., 0].mean(), image[..., 2].mean()
        assert (red > blue) == (label == 0), (red, blue, label)


@pytest.mark.parametrize("world_size", [1, 8])
def test_the_keras_learning_rate_is_the_shared_schedule_inside_the_step(world_size: int) -> None:
    from dtjob_train.keras_train import StepSchedule

    steps_per_epoch = 10
    schedule = StepSchedule(
        base_lr=0.256, batch_size=64, world_size=world_size, warmup_epochs=2.0, epochs=5, steps_per_epoch=10
    )
    for step in range(5 * steps_per_epoch):
        # Optimizer step i (0-based) runs at the rate the other trainers give step i + 1 of the run.
        expected = learning_rate(
            (step + 1) / steps_per_epoch, base_lr=0.256, batch_size=64, world_size=world_size,
            warmup_epochs=2.0, epochs=5,
        )  # fmt: skip
        assert float(schedule(tf.constant(step, tf.int64))) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert StepSchedule.from_config(schedule.get_config()).get_config() == schedule.get_config()


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
def test_keras_copies_no_logs_to_the_host_between_logged_steps(xla: bool, tmp_path: Path) -> None:
    """Every batch's logs reach the callbacks as tensors: Keras converts them to numbers (a copy that waits
    for the step in flight) only if some callback needs numbers. The loss is read on logged steps alone."""
    out = tmp_path / "kinds.json"
    args = tiny_args(None, "--arch", "resnet-tiny", "--epochs", "1", "--steps-per-epoch", "6")
    args += ["--log-interval", "3", *(["--xla"] if xla else [])]
    run = launch("keras", [str(out), *args], launcher="single", module="tests.training.keras_logs_ranks")
    assert run.proc.returncode == 0, run.out
    assert json.loads(out.read_text())["kinds"] == ["tensor"] * 6
    assert [p["step"] for p in run.progress_lines()] == [3, 6]
