"""Real Horovod ranks (Gloo and OpenMPI, 2 ranks on CPU) running each framework's trainer end to end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from dtjob.contract.training_progress import latest_progress

from tests.training.training_helpers import FRAMEWORKS, launch, make_tree, tiny_args

pytestmark = pytest.mark.training

PROGRESS_KEYS = {"epoch", "epochs", "step", "stepsPerEpoch", "imagesPerSec", "loss", "updatedAt", "worldSize",
                 "globalBatch", "stepsPerSec"}  # fmt: skip


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_synthetic_training_on_two_ranks(framework: str, tmp_path: Path) -> None:
    # ResNet-50 itself trains on two ranks in every framework's image on the real node
    # (tests/e2e/test_real_training.py); here the tiny network keeps the ranks' CPU for the other runs. Mixed
    # precision with an fp16 allreduce and channels-last in the same run (the ImageNet test below trains in
    # fp32): each launch of two ranks costs both cores some seconds of framework imports.
    args = tiny_args(
        None, "--arch", "resnet-tiny", "--batch-size", "2", "--epochs", "1", "--steps-per-epoch", "2"
    )
    run = launch(framework, [*args, "--amp", "--fp16-allreduce", "--channels-last"], per_rank_dir=tmp_path)
    assert run.proc.returncode == 0, run.out
    assert len(run.losses()) == 2 and all(loss == loss for loss in run.losses()), run.out  # finite
    assert run.total_images_per_sec() > 0
    assert re.search(r"^Img/sec per worker: [\d.]+ \+-[\d.]+$", run.stdout, re.M), run.out
    progress = run.progress_lines()
    assert [p["step"] for p in progress] == [1, 2]
    assert all(set(p) == PROGRESS_KEYS for p in progress)
    assert [(p["worldSize"], p["globalBatch"]) for p in progress] == [(2, 4), (2, 4)]
    # No pace after the first step (start-up is in it); one after the second.
    assert progress[0]["stepsPerSec"] is None and progress[1]["stepsPerSec"] > 0
    on_disk = json.loads((tmp_path / "rank-0" / "progress.json").read_text())
    assert on_disk == progress[-1]
    # The operator reads the launcher's log as it is (rank tags and all) into status.progress.
    status = latest_progress(run.proc.stdout)
    assert status is not None, run.proc.stdout
    assert {k: status[k] for k in ("epoch", "epochs", "step", "stepsPerEpoch", "updatedAt")} == {
        k: progress[-1][k] for k in ("epoch", "epochs", "step", "stepsPerEpoch", "updatedAt")
    }
    assert status["imagesPerSec"] == round(progress[-1]["imagesPerSec"], 1)
    assert status["loss"] == round(progress[-1]["loss"], 4)
    assert status["summary"].startswith("epoch 1/1 step 2/2 ")
    assert (status["percent"], status["etaSeconds"]) == (100.0, 0), status
    metrics = json.loads((tmp_path / "rank-0" / "out" / "metrics.json").read_text())
    assert metrics["worldSize"] == 2 and metrics["arch"] == "resnet-tiny"
    assert metrics["amp"] and metrics["fp16Allreduce"], metrics
    # Step 1 is the warm-up; step 2 is the one timed interval.
    assert metrics["timedIntervals"] == 1 and metrics["imagesPerSecConfidence"] == 0.0
    assert len(metrics["weightDigests"]) == 2 and metrics["weightsConsistent"], metrics
    assert files_under(tmp_path / "rank-1") == [], "only rank 0 writes outputs"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_imagenet_training_learns_checkpoints_and_resumes(framework: str, tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data", corrupt=1)
    # 3.2 per 256 images is a rate of 0.1 at this global batch of 8 (4 per rank x 2).
    args = tiny_args(data, "--arch", "resnet-tiny", "--base-lr", "3.2", "--warmup-epochs", "0")
    # Default weight decay: a resume must leave the ranks identical with it too.
    args += ["--label-smoothing", "0", "--workers", "1"]
    runs = tmp_path / "runs"

    first = launch(framework, [*args, "--epochs", "3"], per_rank_dir=runs)
    assert first.proc.returncode == 0, first.out
    losses = first.losses()
    steps = first.progress_lines()[0]["stepsPerEpoch"]
    assert steps == 4 and len(losses) == 3 * steps, first.out  # 32 images / 2 ranks / batch 4
    assert all(loss == loss and loss < 10 for loss in losses)  # finite
    assert sum(losses[-2:]) < sum(losses[:2]), f"loss did not fall: {losses}"
    metrics = json.loads((runs / "rank-0" / "out" / "metrics.json").read_text())
    assert metrics["weightsConsistent"] and len(set(metrics["weightDigests"])) == 1, metrics
    assert metrics["skippedImages"] >= 1, "the broken JPEG is skipped and counted"
    assert metrics["valTop1"] is not None
    ckpts = sorted(p.name for p in (runs / "rank-0" / "ckpt").iterdir())
    assert ckpts == ["epoch-0002" + (".pt" if framework == "pytorch" else ""), ckpts[-1]]
    assert ckpts[-1].startswith("epoch-0003"), ckpts
    assert files_under(runs / "rank-1") == [], "only rank 0 writes checkpoints and outputs"

    # A restarted job (here under mpirun) resumes after epoch 3 instead of starting over.
    again = launch(framework, [*args, "--epochs", "4"], launcher="mpi", per_rank_dir=runs)
    assert again.proc.returncode == 0, again.out
    assert "resuming from" in again.out and "3 epochs done" in again.out
    assert len(again.losses()) == steps, again.out  # only epoch 4 ran
    assert {p["epoch"] for p in again.progress_lines()} == {4}
    # Its pace starts over (none after its first step), and percent done counts from the checkpoint.
    records = again.progress_lines()
    assert records[0]["stepsPerSec"] is None and records[1]["stepsPerSec"] > 0
    second = latest_progress(f"DTJOB_PROGRESS {json.dumps(records[1])}")
    assert second is not None and second["percent"] == 87.5  # (3 x 4 + 2) of 4 x 4 steps
    assert second["etaSeconds"] == math.ceil(2 / records[1]["stepsPerSec"])
    resumed = json.loads((runs / "rank-0" / "out" / "metrics.json").read_text())
    assert resumed["resumedFromEpoch"] == 3 and resumed["globalStep"] == 4 * steps
    assert resumed["weightsConsistent"], resumed
    assert any(p.name.startswith("epoch-0004") for p in (runs / "rank-0" / "ckpt").iterdir())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_data_dir_gives_a_clear_error(framework: str, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    run = launch(framework, tiny_args(tmp_path / "empty"), launcher="single")
    assert run.proc.returncode == 2, run.out
    assert f"error: --data-dir {tmp_path / 'empty'}: directory is empty" in run.out
    assert "Traceback" not in run.out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_job_that_asked_for_gpus_does_not_train_on_cpu(framework: str) -> None:
    # This host has no GPU: as a node whose driver or device plugin broke under a GPU job.
    run = launch(framework, tiny_args(None), launcher="single", env={"DTJOB_EXPECT_GPU": "1"})
    assert run.proc.returncode == 3, run.out
    assert "DTJOB_EXPECT_GPU is set (the job asks for GPUs) but no GPU is visible" in run.out
    assert "local rank 0" in run.out and "Traceback" not in run.out and run.losses() == []


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_xla_training_learns_with_the_allreduce_outside_the_compiled_step(
    framework: str, tmp_path: Path
) -> None:
    # Horovod's allreduce inside an XLA cluster would not compile: this run proves it stays outside.
    data = make_tree(tmp_path / "data")
    args = tiny_args(data, "--arch", "resnet-tiny", "--base-lr", "3.2", "--warmup-epochs", "0")
    args += ["--label-smoothing", "0", "--workers", "1", "--epochs", "3", "--xla"]
    run = launch(framework, args, per_rank_dir=tmp_path / "runs")
    assert run.proc.returncode == 0, run.out
    losses = run.losses()
    assert len(losses) == 12 and all(loss == loss for loss in losses), run.out
    assert sum(losses[-2:]) < sum(losses[:2]), f"loss did not fall: {losses}"
    metrics = json.loads((tmp_path / "runs" / "rank-0" / "out" / "metrics.json").read_text())
    assert metrics["xla"] and metrics["weightsConsistent"] and metrics["valTop1"] is not None, metrics
