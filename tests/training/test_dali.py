"""--data-loader dali: a clear error where DALI is not installed; where it is, the pipeline on CPU (DALI's
CPU decoder stands in for nvJPEG) reads the PIL loader's epoch order, decodes the right images, and trains
on real Horovod ranks."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dtjob_train.data.dali_data import PipelineOptions
from dtjob_train.data.folder import MEAN_RGB, STD_RGB, epoch_shard, scan

from tests.training.training_helpers import REPO, launch, make_tree, run_env, tiny_args

pytestmark = pytest.mark.training

HAVE_DALI = (
    importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
)
needs_dali = pytest.mark.skipif(
    not HAVE_DALI, reason="NVIDIA DALI is not installed (pip install nvidia-dali-cuda130)"
)


def without_dali(tmp_path: Path) -> dict[str, str]:
    """An environment where `import nvidia.dali` fails as in an image without DALI, whether or not it is
    installed here: a package of that name ahead on the path that refuses to import."""
    hidden = tmp_path / "no-dali" / "nvidia" / "dali"
    hidden.mkdir(parents=True)
    # nvidia is a regular package in site-packages: this one extends its path, so its other modules import.
    (hidden.parent / "__init__.py").write_text(
        "__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"
    )
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'nvidia.dali'\")\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "no-dali"), run_env()["PYTHONPATH"]])}


def test_without_dali_the_trainer_says_how_to_get_it(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data", per_class_train=4, per_class_val=2)
    run = launch(
        "pytorch", tiny_args(data, "--data-loader", "dali"), launcher="single", env=without_dali(tmp_path)
    )
    assert run.proc.returncode == 2, run.out
    assert "error: --data-loader dali: NVIDIA DALI is not installed" in run.out
    assert "pip install nvidia-dali-cuda130" in run.out and "Traceback" not in run.out


def test_auto_takes_dali_on_a_gpu_where_it_is_installed_and_the_dataloader_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dtjob_train import torch_train as pytorch
    from dtjob_train.data import dali_data

    for installed in (True, False):
        monkeypatch.setattr(dali_data, "installed", lambda installed=installed: installed)
        assert pytorch.data_loader("auto", torch.device("cpu")) == "pytorch"
        assert pytorch.data_loader("auto", torch.device("cuda", 0)) == ("dali" if installed else "pytorch")
        assert pytorch.data_loader("pytorch", torch.device("cuda", 0)) == "pytorch"
        assert pytorch.data_loader("dali", torch.device("cpu")) == "dali"


def test_auto_on_cpu_trains_with_the_dataloader(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data", per_class_train=4, per_class_val=2)
    args = tiny_args(data, "--epochs", "1", "--output-dir", str(tmp_path / "out"))
    run = launch("pytorch", args, launcher="single")
    assert run.proc.returncode == 0, run.out
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["dataLoader"] == "pytorch" and metrics["compile"] is None, metrics


def _options(**changes: object) -> PipelineOptions:
    settings: dict[str, object] = {"batch_size": 4, "image_size": 32, "threads": 1, "device_id": None}
    settings |= {"fp16": False, "channels_last": True, "hw_decoder_load": 0.9, "prefetch": 2}
    return PipelineOptions(**(settings | changes))  # type: ignore[arg-type]


def _loaders(root: Path, *, rank: int = 0, size: int = 1, steps: int = 3, **options: object) -> Any:
    from dtjob_train.data.dali_data import DaliLoaders

    dataset = scan(root)
    return DaliLoaders(
        dataset.train, dataset.val, _options(**options), rank=rank, size=size, steps_per_epoch=steps, seed=3
    )


def _denormalised(images: torch.Tensor) -> torch.Tensor:
    """NCHW normalised images back to 0-255 RGB."""
    mean = torch.tensor(MEAN_RGB).view(1, 3, 1, 1)
    return images.float() * torch.tensor(STD_RGB).view(1, 3, 1, 1) + mean


@needs_dali
def test_one_pipeline_reads_each_epochs_order_normalised_in_the_models_layout(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", per_class_train=8, per_class_val=3)
    split = scan(root).train
    loaders = _loaders(root, rank=1, size=2, steps=2)
    for epoch in (0, 1, 2):
        files, labels = loaders.train_files(epoch)
        order = epoch_shard(16, epoch=epoch, rank=1, size=2, seed=3)[:8]
        assert files == [split.samples[i][0] for i in order]
        # As the trainer takes an epoch: its steps and no more, never asking for the end of the pass.
        batches = list(itertools.islice(loaders.train(epoch), 2))
        seen = []
        for images, batch_labels, skipped in batches:
            assert images.dtype == torch.float32 and skipped == 0
            assert tuple(images.shape) == (4, 3, 32, 32)
            assert images.is_contiguous(memory_format=torch.channels_last)
            seen += batch_labels.tolist()
            # Reddish noise is class 0, bluish class 1: the decoded pixels belong to the labelled file.
            rgb = _denormalised(images)
            for image, label in zip(rgb, batch_labels.tolist(), strict=True):
                assert (image[0].mean() > image[2].mean()) == (label == 0)
        assert seen == labels
    assert loaders.train_pipeline.builds == 1
    # Validation: this rank's fixed shard, every image once, the last batch partial; twice, one pipeline.
    for _ in range(2):
        val = list(loaders.val())
        assert [len(labels) for _, labels, _ in val] == [3]
        assert all(tuple(images.shape[1:]) == (3, 32, 32) for images, _, _ in val)
    assert loaders.val_pipeline.builds == 1


def test_paths_of_different_lengths_become_one_array_of_rows_naming_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtjob_train.data.dali_data import same_length_paths

    monkeypatch.chdir(tmp_path)
    names = [tmp_path / "a" / "x.JPEG", tmp_path / "a" / "a-longer-name-\u00e9.JPEG", Path("plain.JPEG")]
    for name in names:
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_bytes(name.name.encode())
    rows = same_length_paths([str(name) for name in names])
    assert rows.dtype == np.uint8 and rows.shape == (3, max(len(str(n).encode()) for n in names[:2]))
    for row, name in zip(rows, names, strict=True):
        read_back = bytes(row).decode()
        assert Path(read_back).samefile(name) and Path(read_back).read_bytes() == name.name.encode()
    assert same_length_paths([]).shape == (0, 0)


@needs_dali
def test_files_named_by_paths_of_different_lengths_are_read_with_their_labels(tmp_path: Path) -> None:
    from PIL import Image

    # Class 0 red, class 1 blue, under names of many lengths (one not ASCII): every batch mixes them.
    for split, count in (("train", 6), ("val", 1)):
        for cls, colour in (("n01440764", (220, 20, 20)), ("n01443537", (20, 20, 220))):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for i in range(count):
                name = ("\u00e9" if i == 3 else "") + "x" * (i * 7) + f"{i}.JPEG"
                Image.new("RGB", (40, 40), colour).save(tmp_path / "data" / split / cls / name)
    loaders = _loaders(tmp_path / "data", steps=3)
    files, labels = loaders.train_files(0)
    assert len({len(path.encode()) for path in files}) > 3
    seen = []
    for images, batch_labels, _ in loaders.train(0):
        rgb = _denormalised(images)
        for image, label in zip(rgb, batch_labels.tolist(), strict=True):
            assert (image[0].mean() > image[2].mean()) == (label == 0)
        seen += batch_labels.tolist()
    assert seen == labels


@needs_dali
def test_a_pass_left_part_read_is_not_continued_by_the_next(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", per_class_train=8, per_class_val=3)
    loaders = _loaders(root, steps=3)
    next(loaders.train(0))  # one batch of three, as a run stopped mid-epoch
    _, labels = loaders.train_files(1)
    seen = [label for _, batch, _ in loaders.train(1) for label in batch.tolist()]
    assert seen == labels and loaders.train_pipeline.builds == 2


@needs_dali
@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("channels_last", [True, False])
def test_the_pipeline_normalises_as_the_trainer_does(tmp_path: Path, fp16: bool, channels_last: bool) -> None:
    from PIL import Image

    # One flat colour: every pixel of every crop, resize and flip normalises to the same three values.
    colour = (200, 100, 40)
    for split in ("train", "val"):
        for cls in ("n01440764", "n01443537"):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (48, 40), colour).save(tmp_path / "data" / split / cls / f"{i}.JPEG")
    loaders = _loaders(tmp_path / "data", steps=2, fp16=fp16, channels_last=channels_last)
    want = (torch.tensor(colour, dtype=torch.float32) - torch.tensor(MEAN_RGB)) / torch.tensor(STD_RGB)
    for images, _, _ in [*loaders.train(0), *loaders.val()]:
        assert images.dtype == (torch.float16 if fp16 else torch.float32)
        assert tuple(images.shape[1:]) == (3, 32, 32)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        assert images.is_contiguous(memory_format=layout)
        per_channel = images.float().permute(1, 0, 2, 3).reshape(3, -1)
        # JPEG's chroma rounding moves a flat colour by a level or two: 3 levels of 255 at most.
        assert (per_channel - want.view(3, 1)).abs().max() < 3 / 57, per_channel.mean(1)


@needs_dali
def test_an_image_dali_cannot_decode_is_named(tmp_path: Path) -> None:
    from dtjob_train.data.dali_data import UndecodableImage

    root = make_tree(tmp_path / "data", per_class_train=4, per_class_val=1, corrupt=1)
    loaders = _loaders(root, steps=3)
    with pytest.raises(UndecodableImage, match=r"cannot decode \S*/broken_0\.JPEG \(DALI stops"):
        list(loaders.train(0))
    # The failed pipeline is not read again: the next epoch builds another, and fails alike.
    with pytest.raises(UndecodableImage, match=r"broken_0\.JPEG"):
        list(loaders.train(1))
    assert loaders.train_pipeline.builds == 2


@needs_dali
def test_dali_training_on_two_ranks(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    args = tiny_args(data, "--arch", "resnet-tiny", "--base-lr", "3.2", "--warmup-epochs", "0")
    args += ["--label-smoothing", "0", "--epochs", "2", "--data-loader", "dali"]
    run = launch("pytorch", args, per_rank_dir=tmp_path / "runs")
    assert run.proc.returncode == 0, run.out
    losses = run.losses()
    assert len(losses) == 8 and all(loss == loss for loss in losses), run.out
    metrics = json.loads((tmp_path / "runs" / "rank-0" / "out" / "metrics.json").read_text())
    assert metrics["dataLoader"] == "dali" and metrics["weightsConsistent"], metrics
    assert metrics["valTop1"] is not None


@needs_dali
def test_the_feed_benchmark_times_both_ways_of_feeding_dali() -> None:
    cmd = [sys.executable, "-m", "bench.dali_feed", "--batches", "3", "--batch-size", "8", "--images", "16"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=run_env(), cwd=REPO, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("  ")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert "1.00x" in rows["a list of per-sample arrays"], done.stdout
    assert rows["one array a batch (the trainer)"].endswith("x"), done.stdout
