"""--data-loader dali: a clear error where DALI is not installed; where it is, the pipeline on CPU (DALI's
CPU decoder stands in for nvJPEG) reads the PIL loader's epoch order, decodes the right images, and trains
on real Horovod ranks."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from dtjob_train.data.folder import epoch_shard, scan

from tests.training.training_helpers import launch, make_tree, run_env, tiny_args

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


def _loaders(root: Path, *, rank: int = 0, size: int = 1, steps: int = 3) -> object:
    from dtjob_train.data.dali_data import DaliLoaders

    dataset = scan(root)
    return DaliLoaders(
        dataset.train,
        dataset.val,
        rank=rank,
        size=size,
        batch_size=4,
        image_size=32,
        steps_per_epoch=steps,
        seed=3,
        threads=1,
        device_id=None,
    )


@needs_dali
def test_the_dali_pipeline_reads_the_epoch_order_and_decodes_on_cpu(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", per_class_train=8, per_class_val=3)
    split = scan(root).train
    loaders = _loaders(root, rank=1, size=2, steps=2)
    for epoch in (0, 1):
        files, labels = loaders.train_files(epoch)  # type: ignore[attr-defined]
        order = epoch_shard(16, epoch=epoch, rank=1, size=2, seed=3)[:8]
        assert files == [split.samples[i][0] for i in order]
        batches = list(loaders.train(epoch))  # type: ignore[attr-defined]
        assert len(batches) == 2
        seen = []
        for images, batch_labels, skipped in batches:
            assert images.dtype == torch.uint8
            assert tuple(images.shape) == (4, 32, 32, 3) and skipped == 0
            seen += batch_labels.tolist()
            # Reddish noise is class 0, bluish class 1: the decoded pixels belong to the labelled file.
            for image, label in zip(images.numpy().astype(float), batch_labels.tolist(), strict=True):
                assert (image[..., 0].mean() > image[..., 2].mean()) == (label == 0)
        assert seen == labels
    # Validation: this rank's fixed shard, every image once, the last batch partial.
    val = list(loaders.val())  # type: ignore[attr-defined]
    assert [len(labels) for _, labels, _ in val] == [3]
    assert all(tuple(images.shape[1:]) == (32, 32, 3) for images, _, _ in val)


@needs_dali
def test_an_image_dali_cannot_decode_is_named(tmp_path: Path) -> None:
    from dtjob_train.data.dali_data import UndecodableImage

    root = make_tree(tmp_path / "data", per_class_train=4, per_class_val=1, corrupt=1)
    loaders = _loaders(root, steps=3)
    with pytest.raises(UndecodableImage, match=r"cannot decode \S*/broken_0\.JPEG \(DALI stops"):
        list(loaders.train(0))  # type: ignore[attr-defined]


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
