"""The PyTorch trainers' fused SGD (dtjob_train.torch_optim): on real Horovod ranks on CPU, the loss-scaled
step through Horovod's DistributedOptimizer trains to the same weights as torch's default step, skips the
same overflowing step on every rank, and ends at the same loss scale; a checkpoint of an unfused optimizer
resumes into a fused one, which keeps its kernel. Speed is measured on a GPU (bench.gpu_throughput
--variants foreach), not here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.optimizer_ranks import OVERFLOW_STEP, STEPS
from tests.training.training_helpers import launch

pytestmark = pytest.mark.training

MODULE = "tests.training.optimizer_ranks"


def test_the_fused_step_trains_as_the_default_one_and_skips_the_same_overflow_on_every_rank(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    done = launch("pytorch", [str(out)], module=MODULE)
    assert done.proc.returncode == 0, done.out
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for rank in ranks:
        fused, foreach = rank["fused"]["params"], rank["foreach"]["params"]
        assert len(fused) == len(foreach) == STEPS
        for step, (a, b) in enumerate(zip(fused, foreach, strict=True)):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5, f"step {step} differs"
        # The overflow left every parameter as the step before it, and halved the scale once.
        assert fused[OVERFLOW_STEP] == fused[OVERFLOW_STEP - 1]
        assert fused[OVERFLOW_STEP + 1] != fused[OVERFLOW_STEP]
        assert rank["fused"]["scale"] == rank["foreach"]["scale"] == 2.0**15
    assert ranks[0]["fused"] == ranks[1]["fused"], "the ranks' weights drifted apart"


def test_an_unfused_checkpoint_resumes_into_a_fused_optimizer_which_keeps_its_kernel(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    done = launch("pytorch", ["resume", str(ckpt), str(out)], launcher="single", module=MODULE)
    assert done.proc.returncode == 0, done.out
    resumed = json.loads((out / "resumed.json").read_text())
    assert resumed["kernels"] == [{"fused": True, "foreach": None}] * 2, resumed
    assert resumed["state"] > 0, "the checkpoint's momentum was not restored"
