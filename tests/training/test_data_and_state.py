"""In-process checks of the framework-independent parts: folder checks, LR schedule, checkpoints, progress."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from dtjob_train import checkpoints
from dtjob_train.cli import parse_args
from dtjob_train.data.folder import DataError, epoch_shard, scan
from dtjob_train.host import NoGpuError, expect_gpu, gpu_for_rank
from dtjob_train.progress import Reporter, Throughput
from dtjob_train.schedule import learning_rate, scaled_lr

from tests.training.training_helpers import make_tree

pytestmark = pytest.mark.training


def test_scan_shards_every_class_to_every_rank(tmp_path: Path) -> None:
    ds = scan(make_tree(tmp_path, per_class_train=5, per_class_val=2))
    assert ds.train.classes == ("n01440764", "n01443537") and len(ds.train.samples) == 10
    shards = [ds.train.shard(r, 2) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(ds.train.samples)
    assert all({label for _, label in s} == {0, 1} for s in shards)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing", "not a directory"),
        ("no-train", "missing 'train/' directory"),
        ("no-classes", "'train/' has no class directories"),
        ("empty-class", "1 class directories in 'train/' have no images: n02"),
        ("mismatch", "class mismatch between train/ (2 classes) and val/ (1 classes)"),
    ],
)
def test_scan_names_what_is_wrong(tmp_path: Path, breakage: str, message: str) -> None:
    root = tmp_path / "data"
    if breakage != "missing":
        make_tree(root, per_class_train=1, per_class_val=1)
    if breakage == "no-train":
        (root / "train").rename(root / "training")
    elif breakage == "no-classes":
        for d in (root / "train").iterdir():
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    elif breakage == "empty-class":
        (root / "train" / "n02").mkdir()
        (root / "val" / "n02").mkdir()
    elif breakage == "mismatch":
        next((root / "val").iterdir()).rename(tmp_path / "moved")
        for f in (tmp_path / "moved").iterdir():
            f.unlink()
    with pytest.raises(DataError) as err:
        scan(root)
    assert message in str(err.value) and str(root) in str(err.value)


def test_imagenet_without_data_dir_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args("train", ["--data", "imagenet"])
    assert "--data-dir is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("batch_size", "world_size", "peak"),
    [(256, 1, 0.256), (32, 8, 0.256), (64, 8, 0.512), (128, 8, 1.024), (256, 32, 8.192), (4, 2, 0.008)],
)
def test_scaled_rate_follows_the_global_batch_not_the_rank_count(
    batch_size: int, world_size: int, peak: float
) -> None:
    # Goyal et al.: base_lr is the rate for 256 images; the run trains at base_lr x global batch / 256.
    assert scaled_lr(0.256, batch_size=batch_size, world_size=world_size) == pytest.approx(peak)


def test_learning_rate_warms_up_to_the_scaled_rate_then_decays() -> None:
    def lr(epoch: float) -> float:
        return learning_rate(epoch, base_lr=0.256, batch_size=64, world_size=8, warmup_epochs=5, epochs=90)

    # Global batch 512: peak 0.512, the warmup starting from one worker's share (0.064).
    assert lr(0) == pytest.approx(0.064)
    assert lr(2.5) == pytest.approx(0.064 + (0.512 - 0.064) / 2)
    assert lr(5) == pytest.approx(0.512)
    assert lr(47.5) == pytest.approx(0.256)
    assert lr(90) == pytest.approx(0.0, abs=1e-12)


def test_the_default_base_rate_is_the_reference_recipes_per_256() -> None:
    assert parse_args("train", []).base_lr == 0.256


def test_latest_checkpoint_ignores_half_written_ones_and_prune_keeps_two(tmp_path: Path) -> None:
    assert checkpoints.latest(tmp_path / "none") is None
    for epoch in (1, 2, 3):
        checkpoints.path_for(tmp_path, epoch, ".pt").write_bytes(b"x")
    (tmp_path / ".epoch-0004.pt.tmp").write_bytes(b"partial")
    assert checkpoints.latest(tmp_path) == (3, tmp_path / "epoch-0003.pt")
    checkpoints.prune(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("epoch-*")) == ["epoch-0002.pt", "epoch-0003.pt"]


def test_progress_file_and_line_carry_the_same_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reporter = Reporter(
        enabled=True,
        world_size=4,
        epochs=90,
        steps_per_epoch=100,
        progress_file=tmp_path / "p.json",
        output_dir=None,
    )
    reporter.interval(epoch=2, step=40, loss=2.5, lr=0.1, per_worker=250.0)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("DTJOB_PROGRESS "))
    record = json.loads(line.split(" ", 1)[1])
    assert record == json.loads((tmp_path / "p.json").read_text())
    assert record["epoch"] == 3 and record["step"] == 40 and record["imagesPerSec"] == 1000.0
    assert record["updatedAt"].endswith("Z") and not math.isnan(record["loss"])
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(
    ("local_rank", "gpus", "expect", "chosen"),
    [
        (0, 4, True, 0),
        (3, 4, True, 3),
        (1, 1, True, 0),  # two ranks on a one-GPU host share it instead of asking for a GPU that is not there
        (5, 2, False, 1),
        (0, 0, False, None),  # no GPU asked for: CPU
    ],
)
def test_each_rank_takes_a_gpu_round_robin(
    local_rank: int, gpus: int, expect: bool, chosen: int | None
) -> None:
    assert gpu_for_rank(local_rank, gpus, expect=expect) == chosen


def test_a_job_that_asked_for_gpus_never_trains_on_cpu() -> None:
    with pytest.raises(NoGpuError, match=r"DTJOB_EXPECT_GPU is set .* no GPU is visible"):
        gpu_for_rank(0, 0, expect=True)


@pytest.mark.parametrize(
    ("value", "expected"), [(None, False), ("", False), ("0", False), ("false", False), ("1", True)]
)
def test_the_gpu_expectation_comes_from_the_environment(value: str | None, expected: bool) -> None:
    assert expect_gpu({} if value is None else {"DTJOB_EXPECT_GPU": value}) is expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throughput_counts_training_steps_only_and_gives_a_spread() -> None:
    clock = FakeClock()
    meter = Throughput(clock=clock)

    for epoch_rates in ((100, 20, 20), (1, 10, 30)):
        meter.new_epoch()
        clock.now += 3.0  # the loader's restart, inside the epoch's first (warm-up) interval
        for rate in epoch_rates:
            meter.add(2 * rate)
            clock.now += 2.0
            meter.mark()
        clock.now += 500.0  # validation and checkpointing, between epochs
    # Counted: the non-warm-up intervals of both epochs, 20, 20, 10 and 30 images/sec.
    assert [i.rate for i in meter.intervals] == pytest.approx([20, 20, 10, 30])
    mean, spread = meter.per_worker()
    assert mean == pytest.approx(20.0)
    assert spread == pytest.approx(1.96 * math.sqrt(50))


def test_a_starved_pipeline_is_reported_at_its_images_over_time_not_at_its_prefetched_bursts() -> None:
    """A loader that keeps up with a third of the GPU: every full interval of 10 steps waits 30 s for its
    data, and each epoch ends with one step whose batch was prefetched long before, at the GPU's own speed.
    A mean of interval rates would weigh that 0.1-s tail like a 30-s interval, and read 8 times too high."""
    clock = FakeClock()
    meter = Throughput(clock=clock)
    batch = 256
    for _ in range(3):
        meter.new_epoch()
        for _ in range(4):  # the warm-up interval, then three starved ones
            meter.add(10 * batch)
            clock.now += 30.0
            meter.mark()
        meter.add(batch)  # the tail: one step, its batch already there
        clock.now += 0.1
        tail_rate = meter.mark()
        clock.now += 60.0  # validation
    assert tail_rate == pytest.approx(2560.0)
    mean, spread = meter.per_worker()
    starved, tail = 10 * batch / 30.0, batch / 0.1
    # Three epochs of three starved intervals and a tail each, over their seconds.
    assert mean == pytest.approx((9 * 10 * batch + 3 * batch) / (9 * 30.0 + 3 * 0.1))
    assert mean < 1.05 * starved
    unweighted = (9 * starved + 3 * tail) / 12
    assert unweighted > 7 * mean  # what the mean of interval rates said
    assert 0 < spread < tail - mean


def test_a_run_too_short_for_a_timed_interval_reports_its_overall_rate() -> None:
    clock = FakeClock()
    meter = Throughput(clock=clock)
    meter.new_epoch()
    meter.add(40)
    clock.now = 4.0
    meter.mark()
    assert meter.per_worker() == (10.0, 0.0)


def test_every_epoch_deals_the_whole_set_out_afresh_and_a_resume_sees_the_same_order() -> None:
    total, size, seed = 103, 4, 7

    def epoch(k: int) -> list[list[int]]:
        return [epoch_shard(total, epoch=k, rank=r, size=size, seed=seed).tolist() for r in range(size)]

    uninterrupted = [epoch(k) for k in range(3)]
    for shards in uninterrupted:
        dealt = [i for shard in shards for i in shard]
        assert sorted(dealt) == list(range(total)), "the ranks' shards split the set with no overlap"
        assert {len(s) for s in shards} == {25, 26}
    # The order changes every epoch, for every rank, and across ranks (a global shuffle, not per shard).
    assert all(uninterrupted[0][r] != uninterrupted[1][r] for r in range(size))
    assert set(uninterrupted[0][0]) != set(uninterrupted[1][0])
    # A restart computes epoch 2 from nothing but its number: the order an uninterrupted run had.
    assert epoch(2) == uninterrupted[2]


def test_the_pytorch_loader_follows_the_epoch_order(tmp_path: Path) -> None:
    from dtjob_train.data.torch_data import EpochShardSampler, make_loader, set_epoch

    split = scan(make_tree(tmp_path, per_class_train=5, per_class_val=1)).train

    def loader(rank: int) -> Any:
        return make_loader(
            split,
            rank=rank,
            size=2,
            batch_size=2,
            image_size=8,
            train=True,
            workers=0,
            seed=3,
            pin_memory=False,
        )

    uninterrupted = loader(0)
    orders = []
    for k in range(3):
        set_epoch(uninterrupted, k)
        assert isinstance(uninterrupted.sampler, EpochShardSampler)
        orders.append(list(uninterrupted.sampler))
        labels = [int(label) for _, labels_, _ in uninterrupted for label in labels_]
        assert labels == [split.samples[i][1] for i in orders[-1][: len(labels)]]
    assert orders[0] != orders[1]
    resumed = loader(0)
    set_epoch(resumed, 2)
    assert list(resumed.sampler) == orders[2] == epoch_shard(10, epoch=2, rank=0, size=2, seed=3).tolist()
    set_epoch(other := loader(1), 2)
    assert sorted(orders[2] + list(other.sampler)) == list(range(10))


def test_the_pytorch_loaders_workers_start_from_a_fork_server_not_from_the_rank(tmp_path: Path) -> None:
    """A rank has Horovod's and MPI's threads running when its validation loader starts its workers; a child
    forked from it can wait forever on a lock one of them held (a rank hung so in CI, the others waiting for
    it in the next allreduce). The workers fork from a clean server instead, and decode what the rank
    would."""
    import numpy as np
    from dtjob_train.data.torch_data import make_loader

    split = scan(make_tree(tmp_path, per_class_train=2, per_class_val=2)).val
    assert split is not None

    def loader(workers: int) -> Any:
        return make_loader(
            split, rank=0, size=1, batch_size=2, image_size=8, train=False, workers=workers, seed=3,
            pin_memory=False,
        )  # fmt: skip

    batches = iter(loader(1))
    workers = [w.pid for w in batches._workers]
    parents = [int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in workers]
    assert workers and all(parent != os.getpid() for parent in parents), (os.getpid(), parents)
    in_workers = list(batches)
    in_rank = list(loader(0))
    assert len(in_workers) == len(in_rank) == 2
    for (images, labels, _), (images_0, labels_0, _) in zip(in_workers, in_rank, strict=True):
        assert np.array_equal(images.numpy(), images_0.numpy()) and labels.tolist() == labels_0.tolist()


def test_the_tf_pipeline_follows_the_epoch_order() -> None:
    from dtjob_train.data.tf_data import epoch_indices

    def orders(epochs: range) -> list[list[int]]:
        dataset = epoch_indices(50, rank=1, size=3, seed=5, epochs=epochs)
        return [list(map(int, shard)) for shard in dataset.as_numpy_iterator()]

    uninterrupted, resumed = orders(range(0, 4)), orders(range(2, 4))
    assert uninterrupted[2:] == resumed
    assert uninterrupted[0] == epoch_shard(50, epoch=0, rank=1, size=3, seed=5).tolist()
    assert uninterrupted[0] != uninterrupted[1]


def test_step_time_percentiles_are_per_step_over_the_counted_intervals() -> None:
    clock = FakeClock()
    meter = Throughput(clock=clock)
    assert meter.step_ms() is None
    meter.new_epoch()
    clock.now += 5.0  # start-up and compilation, inside the first step
    meter.add(8)
    assert meter.first_step_seconds == 5.0
    meter.mark()  # the warm-up interval: not counted
    for seconds_per_step in [0.1] * 98 + [0.2, 1.0]:
        for _ in range(10):
            meter.add(8)
            clock.now += seconds_per_step
        meter.mark()
    ms = meter.step_ms()
    assert ms is not None
    assert (ms["p50"], ms["p90"], ms["p99"]) == pytest.approx((100.0, 100.0, 200.0))
