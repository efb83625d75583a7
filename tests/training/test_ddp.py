"""The PyTorch trainer under torchrun with DDP (dtjob_train.ddp): real ranks on this host, Gloo on CPU, the
c10d rendezvous on loopback. The same flags, progress lines, metrics and checkpoints as the Horovod trainer,
whose checkpoints it resumes from and which resumes from its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dtjob.desired.torchrun import TORCHRUN

from testbed.operator_harness import free_port
from tests.training.training_helpers import launch, make_tree, run_env, tiny_args

pytestmark = pytest.mark.training
DDP = "dtjob_train.ddp"


def metrics(runs: Path) -> dict[str, object]:
    found: dict[str, object] = json.loads((runs / "rank-0" / "out" / "metrics.json").read_text())
    return found


def without_horovod(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import horovod` fails, as in an image built without Horovod."""
    shim = tmp_path / "no-horovod" / "horovod"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('this image has no Horovod')\n")
    return {"PYTHONPATH": os.pathsep.join([str(shim.parent), run_env()["PYTHONPATH"]])}


def test_two_ddp_ranks_train_in_step_and_report_as_the_horovod_trainer(tmp_path: Path) -> None:
    """Without Horovod, too: the DDP trainer needs none of it."""
    args = tiny_args(None, "--arch", "resnet-tiny", "--epochs", "1", "--steps-per-epoch", "3")
    env = without_horovod(tmp_path)
    run = launch("pytorch", args, launcher="torchrun", module=DDP, per_rank_dir=tmp_path, env=env)
    assert run.proc.returncode == 0, run.out
    assert "torchrun: 2 ranks" in run.out and "has no Horovod" not in run.out, run.out
    progress = run.progress_lines()
    assert [p["step"] for p in progress] == [1, 2, 3], run.out
    assert {(p["worldSize"], p["globalBatch"]) for p in progress} == {(2, 8)}
    assert all(loss == loss for loss in run.losses()), run.out  # finite
    found = metrics(tmp_path)
    assert found["worldSize"] == 2 and found["runner"] == "torchrun", found
    # DDP averaged the same gradients on both ranks: their trained weights are identical.
    digests = found["weightDigests"]
    assert isinstance(digests, list) and len(digests) == 2 and found["weightsConsistent"], found
    assert not any((tmp_path / "rank-1").rglob("*.*")), "only rank 0 writes outputs"


def test_ddp_learns_and_resumes_from_its_own_and_the_horovod_trainers_checkpoints(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    args = tiny_args(data, "--arch", "resnet-tiny", "--base-lr", "3.2", "--warmup-epochs", "0")
    args += ["--label-smoothing", "0", "--workers", "1"]  # default weight decay: momentum must be in sync
    runs = tmp_path / "runs"

    first = launch("pytorch", [*args, "--epochs", "2"], launcher="torchrun", module=DDP, per_rank_dir=runs)
    assert first.proc.returncode == 0, first.out
    losses = first.losses()
    assert len(losses) == 8 and sum(losses[-2:]) < sum(losses[:2]), f"loss did not fall: {losses}"
    assert metrics(runs)["weightsConsistent"] and metrics(runs)["valTop1"] is not None

    # Horovod's trainer takes the DDP checkpoint (the model's own keys, not DDP's wrapper's) and goes on.
    horovod = launch("pytorch", [*args, "--epochs", "3"], per_rank_dir=runs)
    assert horovod.proc.returncode == 0, horovod.out
    assert "resuming from" in horovod.out and "2 epochs done" in horovod.out, horovod.out
    assert len(horovod.losses()) == 4 and metrics(runs)["weightsConsistent"]

    # And back: DDP resumes Horovod's checkpoint, rank 0's optimizer state on every rank.
    again = launch("pytorch", [*args, "--epochs", "4"], launcher="torchrun", module=DDP, per_rank_dir=runs)
    assert again.proc.returncode == 0, again.out
    assert "3 epochs done" in again.out and {p["epoch"] for p in again.progress_lines()} == {4}, again.out
    resumed = metrics(runs)
    assert resumed["resumedFromEpoch"] == 3 and resumed["weightsConsistent"], resumed


# Rank 1 ends first (a code of the user's, or a signal); rank 0 waits, then ends as its peer's loss would.
ENDINGS = {
    "an exit code of the rank's own": ("raise SystemExit(3)", 3),
    "a signal": ("os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_operators_torchrun_launch_exits_with_the_first_failed_ranks_code(ending: str) -> None:
    """torchrun itself exits 1 whatever ended a rank; the launch the operator gives each torchrun worker
    (dtjob.desired.torchrun.TORCHRUN) exits with the code of the rank that failed first, so that
    runPolicy.restartPolicy ExitCode tells the user's error from a killed process."""
    how, code = ENDINGS[ending]
    program = (
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        f"    {how}\n"
        "time.sleep(3)\n"
        "raise SystemExit(1)\n"
    )
    argv = [sys.executable, "-c", TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2",
            "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "--max-restarts", "0", "--no-python", sys.executable, "-c", program]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=run_env())
    assert proc.returncode == code, proc.stdout + proc.stderr
