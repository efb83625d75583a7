"""Import TensorFlow the way the TF/Keras trainers need it; import this module before tensorflow itself.

TF >= 2.16 ships Keras 3 as tf.keras, which horovod.tensorflow.keras (0.28.1) cannot drive;
TF_USE_LEGACY_KERAS makes tf.keras resolve to tf_keras (Keras 2), for which Horovod's callbacks and
optimizer wrapper work.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from tensorflow import keras

from .host import cpu_threads_per_rank, pick_gpu


def configure_devices(local_rank: int, local_size: int) -> bool:
    """Pin one GPU per local rank (see pick_gpu; memory grown on demand); on CPU split the cores. True when
    on GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    index = pick_gpu(local_rank, len(gpus))
    if index is not None:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[index], "GPU")
        return True
    threads = cpu_threads_per_rank(local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return False


def set_precision(amp: bool, amp_dtype: str, on_gpu: bool) -> bool:
    """--amp: the mixed_float16 policy on GPU (with loss scaling: True) or mixed_bfloat16 (--amp-dtype bf16,
    and always on CPU), which needs no loss scaling."""
    if not amp:
        return False
    scaled = on_gpu and amp_dtype == "fp16"
    keras.mixed_precision.set_global_policy("mixed_float16" if scaled else "mixed_bfloat16")
    return scaled


__all__ = ["configure_devices", "keras", "set_precision", "tf"]
