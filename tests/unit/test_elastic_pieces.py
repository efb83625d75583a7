"""The framework-free pieces of --elastic: the flags, the data position, the re-dealt epoch shards and the
SIGTERM flag with its pid file. The worlds that shrink and grow are in tests/training/test_elastic.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from dtjob_train.cli import DEFAULT_COMMIT_EVERY, parse_args
from dtjob_train.data.folder import elastic_shard, epoch_shard
from dtjob_train.elastic import (
    RANK_PID_DIR_ENV,
    LeaveRequest,
    Position,
    commit_due,
)


def test_elastic_is_off_by_default_and_commits_on_the_default_cadence() -> None:
    cfg = parse_args("t", [])
    assert (cfg.elastic, cfg.commit_every) == (False, DEFAULT_COMMIT_EVERY)
    cfg = parse_args("t", ["--elastic", "--commit-every", "7"], framework="keras")
    assert (cfg.elastic, cfg.commit_every) == (True, 7)


def test_a_commit_cadence_below_one_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args("t", ["--elastic", "--commit-every", "0"])


def test_commits_fall_on_the_cadence_and_whenever_a_rank_leaves() -> None:
    assert [s for s in range(1, 31) if commit_due(s, 10, leaving=False)] == [10, 20, 30]
    assert commit_due(3, 10, leaving=True)


def test_a_position_changes_only_by_making_a_new_one() -> None:
    # Horovod's ObjectState commits by reference: a committed Position must never change under it.
    committed = Position(epoch=2)
    moved = committed.advanced(global_batch=12).advanced(global_batch=8)
    assert committed == Position(epoch=2)
    assert (moved.epoch, moved.step, moved.epoch_images) == (2, 2, 20)
    assert moved.next_epoch() == Position(epoch=3, step=0, epoch_images=0)
    with pytest.raises(AttributeError):
        moved.step = 5  # type: ignore[misc]


def test_a_resized_world_deals_the_rest_of_the_epoch_without_repeating_an_image() -> None:
    total, seed, batch = 103, 4, 3
    # 5 steps of 3 ranks, then the rest of the epoch on 2 ranks.
    before = [epoch_shard(total, epoch=1, rank=r, size=3, seed=seed)[: 5 * batch] for r in range(3)]
    offset = 5 * batch * 3
    after = [
        elastic_shard(total, epoch=1, rank=r, size=2, seed=seed, offset=offset, batch_size=batch)
        for r in range(2)
    ]
    seen = [int(i) for shard in before + after for i in shard]
    assert len(seen) == len(set(seen)), "an image twice in one epoch"
    # Every rank of the new world has the same number of whole batches, and at most one global batch
    # (less one image) of the epoch is left out.
    assert len(after[0]) == len(after[1]) and len(after[0]) % batch == 0
    assert total - len(seen) < 2 * batch
    # With no offset it is the ordinary shard, cut to whole global batches.
    whole = elastic_shard(total, epoch=1, rank=1, size=2, seed=seed, offset=0, batch_size=batch)
    assert whole.tolist() == epoch_shard(total, epoch=1, rank=1, size=2, seed=seed)[: len(whole)].tolist()


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("sigterm_restored")
def test_sigterm_only_raises_the_flag_and_the_pid_file_names_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RANK_PID_DIR_ENV, str(tmp_path / "ranks"))
    leave = LeaveRequest()
    leave.install(local_rank=3)
    pid_file = tmp_path / "ranks" / "3.pid"
    assert pid_file.read_text() == f"{os.getpid()}\n"
    assert not leave.requested
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before kill returns (a signal to itself)
    assert leave.requested
    leave.remove_pid_file()
    assert not pid_file.exists()


@pytest.mark.usefixtures("sigterm_restored")
def test_a_pid_file_another_process_took_over_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RANK_PID_DIR_ENV, str(tmp_path))
    leave = LeaveRequest()
    leave.install(local_rank=0)
    (tmp_path / "0.pid").write_text("1\n")  # the slot's next rank process wrote its own
    leave.remove_pid_file()
    assert (tmp_path / "0.pid").read_text() == "1\n"
