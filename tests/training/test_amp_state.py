"""Loss scaling state after a resume: only rank 0 restores the checkpoint, so the trainers must broadcast the
loss scale, which lives outside the optimizer's variables (PyTorch's GradScaler, tf_keras's
LossScaleOptimizer). Real Horovod ranks on CPU: the scaler's state and its broadcast do not depend on the
device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.amp_state_ranks import GOOD_STEPS, SCALE
from tests.training.training_helpers import FRAMEWORKS, launch

pytestmark = pytest.mark.training


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_rank_resumes_with_rank_0s_loss_scale(framework: str, tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    module = "tests.training.amp_state_ranks"
    saved = launch(framework, [framework, "save", str(ckpt), str(out)], launcher="single", module=module)
    assert saved.proc.returncode == 0, saved.out
    resumed = launch(framework, [framework, "resume", str(ckpt), str(out)], module=module)
    assert resumed.proc.returncode == 0, resumed.out
    states = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [(s["scale"], s["goodSteps"]) for s in states] == [(SCALE, GOOD_STEPS)] * 2, states
