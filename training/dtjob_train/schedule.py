"""Learning-rate schedule shared by the trainers: linear warmup to base_lr x world size, then cosine decay.

The warmup follows Goyal et al. (large-minibatch SGD): start at the single-worker rate and reach the scaled
rate after `warmup_epochs`, so a large global batch does not diverge in its first steps.
"""

from __future__ import annotations

import math


def learning_rate(
    epoch: float, *, base_lr: float, world_size: int, warmup_epochs: float, epochs: int
) -> float:
    """The rate at a fractional epoch (epoch + step / steps_per_epoch)."""
    scaled = base_lr * world_size
    if epoch < warmup_epochs:
        return base_lr + (scaled - base_lr) * epoch / warmup_epochs
    decay_span = max(epochs - warmup_epochs, 1e-9)
    progress = min((epoch - warmup_epochs) / decay_span, 1.0)
    return scaled * 0.5 * (1.0 + math.cos(math.pi * progress))


def cosine_multiplier(epoch: float, *, warmup_epochs: float, epochs: int) -> float:
    """The post-warmup factor on the scaled rate (for Horovod's Keras LearningRateScheduleCallback)."""
    decay_span = max(epochs - warmup_epochs, 1e-9)
    progress = min(max(epoch - warmup_epochs, 0.0) / decay_span, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
