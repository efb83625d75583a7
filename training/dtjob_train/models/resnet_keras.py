"""Keras's own ResNet50 (random init) for the TensorFlow and Keras trainers, plus a tiny variant for tests."""

from __future__ import annotations

from typing import Any

from dtjob_train.data.folder import MEAN_RGB, STD_RGB
from dtjob_train.tf_env import keras, tf


def _tiny(inputs: Any) -> Any:
    """A stem and two strided residual blocks at 1/8 width: ResNet's layer kinds, cheap on 2 CPU cores."""
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for filters in (16, 32):
        shortcut = keras.layers.Conv2D(filters, 1, strides=2, use_bias=False)(x)
        y = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = keras.layers.BatchNormalization(gamma_initializer="zeros")(y)
        x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    return keras.layers.GlobalAveragePooling2D()(x)


def build(arch: str, num_classes: int, image_size: int) -> Any:
    """Logits model of uint8 NHWC images; the last layer is float32 so mixed precision keeps the
    softmax/loss in full precision.

    The first layer casts the bytes the input pipeline ships to the compute dtype and normalises them with
    ImageNet's channel statistics, on the device and inside the compiled step.
    """
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="images")
    x = keras.layers.Normalization(mean=MEAN_RGB, variance=[s * s for s in STD_RGB], name="normalize")(inputs)
    if arch == "resnet50":
        base = keras.applications.ResNet50(weights=None, include_top=False, input_tensor=x, pooling="avg")
        features = base.output
    elif arch == "resnet-tiny":
        features = _tiny(x)
    else:
        raise ValueError(f"--arch: unknown architecture {arch!r}")
    logits = keras.layers.Dense(num_classes, name="logits")(features)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits_fp32")(logits)
    return keras.Model(inputs, logits, name=arch)


def l2_penalty(model: Any, weight_decay: float) -> Any:
    """Weight decay on conv/dense kernels only (no BatchNorm or bias), added to the loss."""
    kernels = [v for v in model.trainable_variables if "kernel" in v.name]
    return weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(k, tf.float32)) for k in kernels])
