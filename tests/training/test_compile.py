"""--compile on CPU, on 2 real Horovod ranks: a torch.compile'd training step follows the eager run's losses
from the same seed, every rank ends with the same weights, and checkpoints stay those of the eager model (no
`_orig_mod.` prefixes), so a compiled run resumes an eager run's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.training.training_helpers import Run, launch, make_tree, tiny_args

pytestmark = pytest.mark.training

# Relative loss difference allowed between eager and compiled steps: the compiled kernels sum in another
# order (fp32), which moves a loss by about 1e-6 per step; a wrong gradient or a missed allreduce moves it
# by far more within the first steps.
LOSS_RTOL = 1e-3
STEPS, EPOCHS = 3, 2


def metrics(run_dir: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((run_dir / "rank-0" / "out" / "metrics.json").read_text())
    return loaded


def checkpoint_keys(run_dir: Path) -> set[str]:
    newest = max((run_dir / "rank-0" / "ckpt").glob("*.pt"))
    return set(torch.load(newest, map_location="cpu", weights_only=True)["model"])


def train(data: Path, run_dir: Path, compile_mode: str, *extra: str) -> Run:
    args = tiny_args(data, "--arch", "resnet-tiny", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS))
    # Inductor's compile cache in the test's own directory: nothing is left behind, nothing found.
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(run_dir.parent / "inductor-cache")}
    run = launch(
        "pytorch", [*args, "--compile", compile_mode, *extra], per_rank_dir=run_dir, timeout=900, env=cache
    )
    assert run.proc.returncode == 0, run.out
    return run


def test_a_compiled_run_follows_the_eager_run_and_resumes_its_checkpoints(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data", per_class_train=16, per_class_val=2)
    eager = train(data, tmp_path / "eager", "eager", "--val-steps", "0")
    compiled = train(data, tmp_path / "compiled", "default", "--val-steps", "0")

    assert "compile eager" in eager.stdout and "compile default" in compiled.stdout, compiled.out
    assert len(eager.losses()) == len(compiled.losses()) == STEPS * EPOCHS, compiled.out
    assert compiled.losses() == pytest.approx(eager.losses(), rel=LOSS_RTOL)
    assert eager.losses()[-1] != eager.losses()[0], "the weights moved"
    for run_dir, mode in ((tmp_path / "eager", None), (tmp_path / "compiled", "default")):
        m = metrics(run_dir)
        assert m["compile"] == mode and m["weightsConsistent"], m
    assert checkpoint_keys(tmp_path / "compiled") == checkpoint_keys(tmp_path / "eager")
    assert not any(k.startswith("_orig_mod.") for k in checkpoint_keys(tmp_path / "compiled"))

    # The eager run's directories, one epoch more, compiled: rank 0 loads the eager checkpoint into its model
    # (the compiled graph comes from the cache the compiled run above filled: one compile per test).
    resumed = train(data, tmp_path / "eager", "default", "--val-steps", "0", "--epochs", str(EPOCHS + 1))
    assert f"{EPOCHS} epochs done" in resumed.stdout, resumed.out
    assert len(resumed.losses()) == STEPS, resumed.out
    m = metrics(tmp_path / "eager")
    assert m["compile"] == "default" and m["weightsConsistent"] and m["resumedFromEpoch"] == EPOCHS, m
