"""bench.gpu_throughput, the trainer against a plain PyTorch loop: without a GPU it says so and measures
nothing; with --cpu both sides run end to end (the trainer through its command line, the baseline in its own
process), the JPEG runs included, and every figure the README's table quotes comes back. It runs as from a
checkout, with nothing of the repository on PYTHONPATH, as it is run on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dtjob_train.data import dali_data

from tests.training.training_helpers import REPO, run_env

pytestmark = pytest.mark.training


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench.gpu_throughput", *args]
    env = run_env() | {"PYTHONPATH": ""}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900, check=False)


def test_without_a_gpu_it_says_so_and_measures_nothing() -> None:
    done = bench()
    assert done.returncode == 0, done.stderr
    assert "no GPU here" in done.stdout and "img/s" not in done.stdout


def test_an_unknown_data_loader_is_refused_by_name() -> None:
    done = bench("--loaders", "pytorch,dalI")
    assert done.returncode == 2 and "unknown data loader dalI (choose pytorch, dali)" in done.stderr, done


def test_both_sides_run_and_report_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = bench(
        "--cpu",
        "--batch-size",
        "2",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--image-size",
        "64",
        "--no-amp",
        "--compile",
        "eager",
        "--jpegs",
        "64",
        "--cores",
        "1",
        "--dali-hw-decoder-load",
        "0.5,1",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [result] = json.loads(out.read_text())
    trainer, baseline = result["trainer"], result["baseline"]
    for side in (trainer, baseline):
        assert side["imagesPerSec"] > 0 and side["firstStepSeconds"] > 0, side
        assert set(side["stepTimeMs"]) == {"p50", "p90", "p99"}, side
        assert side["stepTimeMs"]["p50"] <= side["stepTimeMs"]["p99"], side
    assert trainer["compile"] is None and baseline["model"] in {"torchvision", "dtjob_train"}
    assert "plain PyTorch" in done.stdout and "dtjob trainer" in done.stdout and "1.00x" in done.stdout
    jpeg = {row["loader"]: row for row in result["jpeg"]}
    assert "pytorch" in jpeg, result["jpeg"]
    if dali_data.installed():
        # One run per hardware decoder share asked for, at the trainer's prefetch depth.
        assert {"dali (hw 0.5, prefetch 2)", "dali (hw 1, prefetch 2)"} < set(jpeg), result["jpeg"]
    for loader, row in jpeg.items():
        assert row["imagesPerSec"] > 0 and row["cores"] == 1, row
        assert row["dataLoader"] == loader.split()[0], row
        assert f"trainer, JPEGs, {loader}, 1 cores" in done.stdout, done.stdout


def test_an_unknown_variant_is_refused_by_name() -> None:
    done = bench("--variants", "foreach,fused")
    assert done.returncode == 2 and "unknown variant fused (choose foreach, async-completion)" in done.stderr


def test_without_the_baseline_the_trainer_is_the_reference_and_only_the_loaders_asked_for_run(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    loader = "dali" if dali_data.installed() else "pytorch"
    tiny = ["--batch-size", "2", "--steps", "4", "--warmup", "2", "--image-size", "64", "--no-amp"]
    done = bench(
        "--cpu", *tiny, "--compile", "eager", "--jpegs", "16", "--cores", "1", "--loaders", loader,
        "--no-baseline", "--variants", "foreach,async-completion", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [result] = json.loads(out.read_text())
    assert result["baseline"] is None and "plain PyTorch" not in done.stdout, done.stdout
    assert "dtjob trainer" in done.stdout and "1.00x" in done.stdout, done.stdout
    # Each variant once on synthetic data and once in the JPEG run, after the trainer as it ships.
    assert set(result["variants"]) == {"foreach", "async-completion"}, result
    assert all(r["imagesPerSec"] > 0 for r in result["variants"].values()), result["variants"]
    assert "dtjob trainer, foreach" in done.stdout and "dtjob trainer, async-completion" in done.stdout
    jpeg = [(row["dataLoader"], row["variant"]) for row in result["jpeg"]]
    assert jpeg == [(loader, None), (loader, "foreach"), (loader, "async-completion")], result["jpeg"]
    assert ", 1 cores, foreach" in done.stdout and ", 1 cores, async-completion" in done.stdout, done.stdout
