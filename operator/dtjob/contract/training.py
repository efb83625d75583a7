"""The training contract, written once: the frameworks, the hyperparameters' defaults and bounds, and which
options each framework's trainer takes. The operator's parser (dtjob.spec.run) and command line
(dtjob.desired.command) import it, and so do the trainers (dtjob_train.cli): the training images install the
dtjob package beside dtjob_train (images/common/install-uploader.sh). The CRD is written by hand; its copies
of these facts are held to this module by tests/unit/test_training_contract.py.

Pure and dependency-free: a trainer imports it without the operator's dependencies.
"""

from __future__ import annotations

# Each has a trainer, `python -m dtjob_train.<framework>`, and a default image.
FRAMEWORKS = ("pytorch", "tensorflow", "keras")
# synthetic: one random batch fed again every step; imagenet: the train/ and val/ folders of a data dir.
DATA_SOURCES = ("synthetic", "imagenet")
DEFAULT_DATA_SOURCE = "synthetic"
AMP_DTYPES = ("fp16", "bf16")
# auto: DALI (GPU JPEG decode) on a GPU where DALI is installed, as in the GPU PyTorch image; else pytorch.
DATA_LOADERS = ("auto", "pytorch", "dali")
# torch.compile's modes, plus auto (GPU_COMPILE_MODE on a GPU, eager on CPU) and eager (no compile; not
# "off", which YAML reads as false).
COMPILE_MODES = ("auto", "eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")

# Which trainers take an option; the others refuse it rather than ignore it.
XLA_FRAMEWORKS = ("tensorflow", "keras")  # XLA compiles TensorFlow graphs
DALI_FRAMEWORKS = ("pytorch",)  # the TensorFlow trainers read tf.data
# Loaders every trainer takes: auto, and pytorch (the default before auto), which the TensorFlow trainers
# read as their tf.data pipeline.
ANY_FRAMEWORK_DATA_LOADERS = ("auto", "pytorch")
COMPILE_FRAMEWORKS = ("pytorch",)  # TensorFlow and Keras compile with --xla

# The per-GPU (per-rank) batch when none is given: NVIDIA DeepLearningExamples' ResNet-50 batch with mixed
# precision, which fits a 16 GB GPU (V100, T4); fp32 activations take twice the memory.
DEFAULT_BATCH_AMP = 256
DEFAULT_BATCH_FP32 = 128

# The learning rate is given per LR_REFERENCE_BATCH images: a run trains at base rate x global batch / 256.
# NVIDIA's ResNet-50 v1.5 recipe uses 0.256 per 256 with warmup and cosine decay.
LR_REFERENCE_BATCH = 256
DEFAULT_BASE_LR = 0.256
DEFAULT_WARMUP_EPOCHS = 5.0
DEFAULT_MOMENTUM = 0.9
DEFAULT_WEIGHT_DECAY = 5e-5
DEFAULT_LABEL_SMOOTHING = 0.1
LABEL_SMOOTHING_BELOW = 1.0  # smoothing 1 would leave no signal of the true class

DEFAULT_AMP = True
DEFAULT_AMP_DTYPE = "fp16"  # bf16: no loss scaling (Ampere and newer GPUs)
DEFAULT_FP16_ALLREDUCE = True
DEFAULT_CHANNELS_LAST = True
DEFAULT_XLA = False
DEFAULT_DATA_LOADER = "auto"
DEFAULT_COMPILE = "auto"
# What --compile auto means on a GPU: the mode measured to pay for its compile time within a job's first
# minutes (docs/benchmarks.md, "Compiled training steps").
GPU_COMPILE_MODE = "default"
DEFAULT_IMAGE_SIZE = 224
DEFAULT_LOG_INTERVAL = 10  # steps between progress lines
DEFAULT_SEED = 42
# numpy seeds (keras.utils.set_random_seed) are unsigned 32-bit; torch and TensorFlow accept more.
MAX_SEED = 2**32 - 1

# Set by the operator on every pod of a job that asks for GPUs (gpusPerWorker): the trainers then refuse to
# train on CPU, so a node whose GPUs vanished fails the job instead of running it 100 times slower. "0" lets
# a job train on CPU.
EXPECT_GPU_ENV = "DTJOB_EXPECT_GPU"


def default_batch(amp: bool) -> int:
    """The per-GPU batch without one given: what fits the precision."""
    return DEFAULT_BATCH_AMP if amp else DEFAULT_BATCH_FP32


def takes_xla(framework: str) -> bool:
    return framework in XLA_FRAMEWORKS


def takes_data_loader(framework: str, data_loader: str) -> bool:
    """auto and pytorch go with every trainer; dali only with the trainers that have it."""
    return data_loader in ANY_FRAMEWORK_DATA_LOADERS or framework in DALI_FRAMEWORKS


def takes_compile(framework: str, mode: str) -> bool:
    """auto goes with every trainer (TensorFlow's is eager unless --xla); a mode only with PyTorch's."""
    return mode == DEFAULT_COMPILE or framework in COMPILE_FRAMEWORKS


# Elastic training (--elastic): each rank writes its pid to <dir>/<local rank>.pid while it runs, so the
# worker's entrypoint can hand it the pod's SIGTERM (the ranks are children of ssh sessions, not of the
# container's PID 1). A rank that leaves on SIGTERM exits with RANK_LEFT_EXIT: not 0, which Horovod's elastic
# driver would take as the whole job done.
RANK_PID_DIR_ENV = "DTJOB_RANK_PID_DIR"
RANK_PID_DIR = "/tmp/dtjob-ranks"
RANK_LEFT_EXIT = 75
