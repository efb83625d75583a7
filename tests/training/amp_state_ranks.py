"""Run by test_amp_state.py: `save` (one process) writes a checkpoint whose loss scale differs from a fresh
one's; `resume` (real Horovod ranks) restores it on rank 0 as the trainers do, runs the trainer's broadcast,
and every rank writes the loss-scale state it ends up with to OUT/rank-<N>.json.

    python -m tests.training.amp_state_ranks {pytorch,tensorflow,keras} {save,resume} CHECKPOINT_DIR OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# What `save` puts in the checkpoint; a fresh scaler starts at 2**16 with no good steps.
SCALE, GOOD_STEPS = 1024.0, 7


def pytorch(save: bool, checkpoints: Path) -> dict[str, Any]:
    import horovod.torch as hvd
    import torch
    from dtjob_train import torch_checkpoint
    from dtjob_train import torch_train as trainer

    hvd.init()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # The trainer's scaler runs on CUDA only; the CPU one has the same state and goes through the same
    # checkpoint and broadcast.
    scaler = torch.amp.GradScaler("cpu")
    if save:
        scaler.load_state_dict(scaler.state_dict() | {"scale": SCALE, "_growth_tracker": GOOD_STEPS})
        torch_checkpoint.save(checkpoints, 1, model, optimizer, scaler)
        return {}
    if hvd.rank() == 0:
        assert torch_checkpoint.restore_latest(checkpoints, model, optimizer, scaler, torch.device("cpu"))
    trainer.broadcast_scaler(hvd, scaler)
    state = scaler.state_dict()
    return {"rank": hvd.rank(), "scale": state["scale"], "goodSteps": state["_growth_tracker"]}


def tensorflow(framework: str, save: bool, checkpoints: Path) -> dict[str, Any]:
    # isort: off
    from dtjob_train.tf_env import keras  # selects Keras 2 before TF loads
    import horovod.tensorflow as hvd

    # isort: on
    from dtjob_train import tf_checkpoint

    hvd.init()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    if framework == "tensorflow":
        # As dtjob_train.tensorflow builds it with --amp on GPU.
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
        optimizer.build(model.trainable_variables)
    else:
        # As Keras's compile wraps dtjob_train.keras's optimizer under the mixed_float16 policy.
        import horovod.tensorflow.keras as hvd_keras

        inner = hvd_keras.DistributedOptimizer(keras.optimizers.legacy.SGD())
        model.compile(optimizer=keras.mixed_precision.LossScaleOptimizer(inner), loss="mse")
        optimizer = model.optimizer
    scale = tf_checkpoint.loss_scale_variables(optimizer)
    assert len(scale) == 2, "a dynamic loss scale has a scale and a counter"
    if save:
        scale[0].assign(SCALE)
        scale[1].assign(GOOD_STEPS)
        tf_checkpoint.save(checkpoints, 1, model, optimizer)
        return {}
    if hvd.rank() == 0:
        assert tf_checkpoint.restore_latest(checkpoints, model, optimizer)
    if framework == "tensorflow":
        from dtjob_train import tensorflow as trainer

        trainer.broadcast_state(model, optimizer)
    else:
        from dtjob_train import keras as keras_trainer

        keras_trainer.broadcast_state(model)
    return {"rank": hvd.rank(), "scale": float(scale[0].numpy()), "goodSteps": int(scale[1].numpy())}


def main() -> None:
    framework, mode, checkpoints, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    save = mode == "save"
    result = (
        pytorch(save, checkpoints) if framework == "pytorch" else tensorflow(framework, save, checkpoints)
    )
    if result:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank-{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
