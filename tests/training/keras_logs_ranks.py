"""Run by test_tf_throughput.py: the Keras trainer's model, optimizer and callbacks fit a few synthetic steps
with a probe callback that records what Keras hands every batch's logs as, and whether a batch's loss
was read. Tensors mean Keras did not copy the logs to the host (a sync with the device) on that batch.

    python -m tests.training.keras_logs_ranks OUT.json [trainer flags]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# isort: off
from dtjob_train.tf_env import keras, tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
# isort: on

from dtjob_train import keras as trainer
from dtjob_train import keras_train
from dtjob_train.cli import parse_args
from dtjob_train.run import TrainingRun


class Probe(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = True  # the probe itself must not ask for Python numbers
        self.kinds: list[str] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.kinds.append("tensor" if tf.is_tensor((logs or {})["loss"]) else "number")


def main() -> None:
    out, flags = Path(sys.argv[1]), sys.argv[2:]
    hvd.init()
    cfg = parse_args("keras_logs_ranks", flags, framework="keras")
    run = TrainingRun("keras", cfg, hvd_tf)
    model, _ = trainer.compiled_model(cfg, run)
    train, _ = keras_train.make_inputs(run, tf.Variable(0, dtype=tf.int64))
    probe = Probe()
    model.fit(
        train,
        steps_per_epoch=run.steps_per_epoch,
        epochs=cfg.epochs,
        callbacks=[*keras_train.callbacks(run), probe],
        verbose=0,
    )
    out.write_text(json.dumps({"kinds": probe.kinds}))


if __name__ == "__main__":
    main()
