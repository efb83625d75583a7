"""Learning-rate schedule shared by the trainers: the linear scaling rule, a linear warmup, then cosine decay.

The rate scales with the global batch (Goyal et al., "Accurate, Large Minibatch SGD"): `--base-lr` is the
rate for 256 images, and a run with global batch B = per-worker batch x world size trains at
base_lr x B / 256. NVIDIA's ResNet-50 v1.5 recipe (DeepLearningExamples) uses 0.256 per 256 with warmup and
cosine decay, the default here; Goyal et al. use 0.1 per 256 with step decay. The warmup starts from one
worker's share (base_lr x per-worker batch / 256, what Horovod's Keras warmup callback starts from too) and
reaches the scaled rate after `warmup_epochs`, so a large global batch does not diverge in its first steps.
"""

from __future__ import annotations

import math

from dtjob.contract.training import LR_REFERENCE_BATCH as REFERENCE_BATCH


def scaled_lr(base_lr: float, *, batch_size: int, world_size: int) -> float:
    """The peak rate: base_lr (per 256 images) x global batch / 256."""
    return base_lr * batch_size * world_size / REFERENCE_BATCH


def learning_rate(
    epoch: float, *, base_lr: float, batch_size: int, world_size: int, warmup_epochs: float, epochs: int
) -> float:
    """The rate at a fractional epoch (epoch + step / steps_per_epoch); batch_size is per worker."""
    peak = scaled_lr(base_lr, batch_size=batch_size, world_size=world_size)
    if epoch < warmup_epochs:
        start = peak / world_size
        return start + (peak - start) * epoch / warmup_epochs
    return peak * cosine_multiplier(epoch, warmup_epochs=warmup_epochs, epochs=epochs)


def cosine_multiplier(epoch: float, *, warmup_epochs: float, epochs: int) -> float:
    """The post-warmup factor on the scaled rate (for Horovod's Keras LearningRateScheduleCallback)."""
    decay_span = max(epochs - warmup_epochs, 1e-9)
    progress = min(max(epoch - warmup_epochs, 0.0) / decay_span, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
