"""--elastic on real Horovod worlds (horovodrun --min-np/--max-np/--host-discovery-script, Gloo, CPU ranks on
loopback): a host leaves mid-training with SIGTERM, the others carry on at the smaller size without a restart,
and a new host joins later."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.training.elastic_helpers import ElasticWorld, local_host_names, rank_pid, sigterm
from tests.training.training_helpers import make_tree, tiny_args

pytestmark = pytest.mark.training

# Enough steps for the survivors to be training still when a host joins: the driver polls the discovery
# script every second and the ranks hear of it at their next commit, which took up to 5 s on 2 busy cores.
# 2 ranks train some 35 steps a second in PyTorch and 63 in TensorFlow: 300 steps left TensorFlow's survivors
# under 5 s, and one cold CI run's finished before the join reached them. Once they hear of it they wait for
# the new rank to start.
STEPS = 1000
# The steps after the growth, at 3 ranks: about a minute alone, up to three beside the other test runs.
FINISH_TIMEOUT_S = 300


def sizes_in_order(progress: list[tuple[float, dict[str, Any]]]) -> list[int]:
    return [size for size, _ in itertools.groupby(p["worldSize"] for _, p in progress)]


def resize_lines(log: str) -> list[tuple[int, int, int]]:
    """(world size, step resumed at, steps redone) of rank 0's 'world resized' lines."""
    found = re.findall(r"elastic: world resized to (\d+) ranks .* step (\d+), (\d+) steps redone", log)
    return [(int(a), int(b), int(c)) for a, b, c in found]


def shrink_and_grow(
    framework: str, tmp_path: Path, *, grow: bool, timeout: float, arch: str = "resnet-tiny"
) -> tuple[ElasticWorld, dict[str, float]]:
    """3 ranks (2 on one host, 1 on another); the single one gets SIGTERM and leaves the discovery; with grow,
    a third host joins once the 2 have trained a few steps. The finished world, and seconds from the SIGTERM
    to the first step of 2 ranks (and from the join to the first step of 3)."""
    first, leaving, joining = local_host_names()
    world = ElasticWorld(tmp_path, {first: 2, leaving: 1}, min_np=2, max_np=3)
    args = tiny_args(None, "--arch", arch, "--epochs", "1", "--steps-per-epoch", str(STEPS))
    args += ["--elastic", "--commit-every", "10"]
    args += ["--output-dir", str(tmp_path / "out")]
    # One compute thread per rank: 3 ranks share the 2 cores a CI runner has.
    world.start([f"dtjob_train.{framework}", *args], tmp_path / "pids", {"DTJOB_THREADS_PER_RANK": "1"})
    seconds: dict[str, float] = {}
    try:
        world.wait_for("3 ranks training", lambda: _trained(world, size=3, steps=3), timeout)
        world.set_hosts({first: 2})
        pid = rank_pid(leaving, tmp_path / "pids")
        left = world.wait_for("the SIGTERM", lambda: True, timeout)
        sigterm(pid)
        at_2 = world.wait_for("2 ranks training", lambda: _trained(world, size=2, steps=1), timeout)
        seconds["sigterm_to_training"] = at_2 - left
        if grow:
            world.set_hosts({first: 2, joining: 1})
            joined = world.wait_for("the join", lambda: True, timeout)
            at_3 = world.wait_for("3 ranks again", lambda: _trained(world, size=3, steps=1, after=2), timeout)
            seconds["join_to_training"] = at_3 - joined
        assert world.finish(max(timeout, FINISH_TIMEOUT_S)) == 0, world.log()
    finally:
        world.stop()
    return world, seconds


def _trained(world: ElasticWorld, *, size: int, steps: int, after: int | None = None) -> bool:
    """At least `steps` progress lines of a world of `size` (after the first of a world of `after`)."""
    sizes = [p["worldSize"] for _, p in world.progress()]
    if after is not None:
        sizes = sizes[sizes.index(after) :] if after in sizes else []
    return sizes.count(size) >= steps


def test_pytorch_world_shrinks_on_sigterm_and_grows_back(tmp_path: Path) -> None:
    world, seconds = shrink_and_grow("pytorch", tmp_path, grow=True, timeout=120)
    # The figures training/README.md quotes (pytest -s shows them).
    print(f"elastic pytorch: {seconds}, resized (size, step, redone): {resize_lines(world.log())}")
    progress = world.progress()
    assert sizes_in_order(progress) == [3, 2, 3], world.log()
    assert [p["globalBatch"] for _, p in progress] == [4 * p["worldSize"] for _, p in progress]
    # The SIGTERM commit: the 2 survivors resume at the step the world committed when the rank left.
    resizes = resize_lines(world.log())
    assert [(size, redone) for size, _, redone in resizes] == [(2, 0), (3, 0)], world.log()
    steps = [p["step"] for _, p in progress]
    # Steps count on from the commit: each step is logged once, the last is the planned last.
    assert steps == list(range(1, STEPS + 1)), world.log()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["worldSizes"] == [3, 2, 3] and metrics["stepsRedone"] == 0, metrics
    assert metrics["worldSize"] == 3 and metrics["globalStep"] == STEPS
    assert len(metrics["weightDigests"]) == 3 and metrics["weightsConsistent"], metrics
    # The survivors do not wait out Gloo's 30 s timeout for the rank that left.
    assert seconds["sigterm_to_training"] < 15, world.log()


def test_tensorflow_world_shrinks_on_sigterm_and_grows_back(tmp_path: Path) -> None:
    world, seconds = shrink_and_grow("tensorflow", tmp_path, grow=True, timeout=120)
    print(f"elastic tensorflow: {seconds}, resized (size, step, redone): {resize_lines(world.log())}")
    progress = world.progress()
    assert sizes_in_order(progress) == [3, 2, 3], world.log()
    assert [(size, redone) for size, _, redone in resize_lines(world.log())] == [(2, 0), (3, 0)], world.log()
    assert [p["step"] for _, p in progress] == list(range(1, STEPS + 1)), world.log()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["worldSizes"] == [3, 2, 3] and metrics["stepsRedone"] == 0, metrics
    assert len(metrics["weightDigests"]) == 3 and metrics["weightsConsistent"], metrics
    assert seconds["sigterm_to_training"] < 15, world.log()


def test_keras_world_shrinks_on_sigterm_and_grows_back(tmp_path: Path) -> None:
    world, seconds = shrink_and_grow("keras", tmp_path, grow=True, timeout=120)
    print(f"elastic keras: {seconds}, resized (size, step, redone): {resize_lines(world.log())}")
    progress = world.progress()
    assert sizes_in_order(progress) == [3, 2, 3], world.log()
    assert [(size, redone) for size, _, redone in resize_lines(world.log())] == [(2, 0), (3, 0)], world.log()
    assert [p["step"] for _, p in progress] == list(range(1, STEPS + 1)), world.log()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["worldSizes"] == [3, 2, 3] and metrics["stepsRedone"] == 0, metrics
    assert len(metrics["weightDigests"]) == 3 and metrics["weightsConsistent"], metrics


def test_elastic_imagenet_run_checkpoints_and_a_restarted_world_resumes(tmp_path: Path) -> None:
    """--checkpoint-dir under --elastic: rank 0 of the world writes each epoch, and a whole new world (the
    job restarted) resumes from the newest with rank 0's weights reaching every rank through the state's
    sync; the ImageNet shards come from the DataLoader's elastic sampler."""
    data = make_tree(tmp_path / "imagenet")
    ckpt = tmp_path / "ckpt"

    def launch_world(epochs: int, name: str) -> ElasticWorld:
        world = ElasticWorld(tmp_path / name, {"localhost": 2}, min_np=2, max_np=2)
        args = tiny_args(data, "--arch", "resnet-tiny", "--epochs", str(epochs), "--val-steps", "1")
        args += ["--elastic", "--checkpoint-dir", str(ckpt), "--output-dir", str(tmp_path / name / "out")]
        world.start(["dtjob_train.pytorch", *args], tmp_path / "pids", {"DTJOB_THREADS_PER_RANK": "1"})
        try:
            assert world.finish(120) == 0, world.log()
        finally:
            world.stop()
        return world

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = launch_world(1, "first")
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-0001.pt"], first.log()
    second = launch_world(2, "second")
    assert "resuming from " in second.log() and "1 epochs done" in second.log(), second.log()
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-0001.pt", "epoch-0002.pt"]
    assert {p["epoch"] for _, p in second.progress()} == {2}, second.log()
    metrics = json.loads((tmp_path / "second" / "out" / "metrics.json").read_text())
    assert metrics["resumedFromEpoch"] == 1 and metrics["weightsConsistent"], metrics
    assert metrics["valTop1"] is not None


def test_pytorch_world_rolls_back_to_the_last_commit_when_a_rank_dies_without_warning(tmp_path: Path) -> None:
    """SIGKILL: no vote, no commit at the step it died. The survivors restore the last commit and redo the
    steps after it (at most --commit-every), which progress and metrics count as redone, not as new steps."""
    first, dying, _ = local_host_names()
    world = ElasticWorld(tmp_path, {first: 2, dying: 1}, min_np=2, max_np=3)
    args = tiny_args(None, "--arch", "resnet-tiny", "--epochs", "1", "--steps-per-epoch", "60")
    args += ["--elastic", "--commit-every", "10", "--output-dir", str(tmp_path / "out")]
    # A peer's death reaches a rank that is not talking to it at Gloo's timeout: 20 s here, not 30. Not less:
    # the same timeout bounds the survivors' own rendezvous after the reset, and beside other test runs on two
    # cores one survivor can come to it seconds after the other (at 5 s this test failed once in CI).
    env = {"DTJOB_THREADS_PER_RANK": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "20"}
    world.start(["dtjob_train.pytorch", *args], tmp_path / "pids", env)
    try:
        world.wait_for("3 ranks training", lambda: _trained(world, size=3, steps=13), 120)
        world.set_hosts({first: 2})
        os.kill(rank_pid(dying, tmp_path / "pids"), signal.SIGKILL)
        assert world.finish(240) == 0, world.log()
    finally:
        world.stop()
    progress = world.progress()
    assert sizes_in_order(progress) == [3, 2], world.log()
    [(size, resumed_at, redone)] = resize_lines(world.log())
    assert size == 2 and resumed_at % 10 == 0 and 0 <= redone <= 10, world.log()
    # The 3 ranks logged up to the step they last trained (its loss average may have failed); the 2 log
    # again from the commit on.
    at_3 = [p["step"] for _, p in progress if p["worldSize"] == 3]
    at_2 = [p["step"] for _, p in progress if p["worldSize"] == 2]
    assert at_3 == list(range(1, len(at_3) + 1)), world.log()
    assert resumed_at <= len(at_3) <= resumed_at + redone, world.log()
    assert at_2 == list(range(resumed_at + 1, 61)), world.log()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["stepsRedone"] == redone and metrics["globalStep"] == 60, metrics
    assert len(metrics["weightDigests"]) == 2 and metrics["weightsConsistent"], metrics
