"""--elastic for the DDP trainer (dtjob_train.ddp) under an elastic torchrun world: two torchrun agents, two
"nodes" of one process each, on loopback, the c10d rendezvous hosted by the first. The second node dies
mid-epoch (SIGKILL to its agent and its process); the first's agent re-forms the world at 1 and rank 0 resumes
from its newest step checkpoint; then a new node joins, the world re-forms at 2 and trains to the end. A lone
node without a checkpoint volume whose process dies resumes from rank 0's local disk. And the step
checkpoints' files on their own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from dtjob_train import checkpoints, step_checkpoint, torch_checkpoint
from dtjob_train.elastic import Position
from dtjob_train.schedule import learning_rate
from torch import nn

from testbed.operator_harness import free_port
from tests.training.training_helpers import REPO, make_tree, run_env, tiny_args

pytestmark = pytest.mark.training

COMMIT_EVERY = 3
EPOCHS, STEPS_PER_EPOCH = 2, 100
TREE_STEPS = STEPS_PER_EPOCH  # an epoch of the ImageNet tree's training images, 4 a step
# Fast rendezvous rounds for a test: a round completes 3 s after its minimum of nodes is in (30 s by default;
# long enough for both agents to make the first round), and a node whose heartbeat (every second) stopped is
# dropped after 4 s (15 s by default; a live node's heartbeat can be 2 s old when its timer fires early).
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=4"
# torch 2.13's agents share the rendezvous store with the processes by default, and then a node that joins a
# running world waits forever for the store's address (rank 0's agent publishes it in the first round only);
# with a store of the processes' own each round, rank 0's agent publishes it in every round.
NEW_STORE_EACH_ROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# What torchrun's agent logs as it stops its processes (a new node waits: the world re-forms).
STOPPING = "closing signal SIGTERM"


class Agent:
    """One torchrun agent (a node of the world) in a session of its own, its output in a file."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        *,
        addr: str,
        host: bool,
        endpoint: str,
        run_id: str,
        nodes: str = "1:2",
        data: Path | None = None,
    ) -> None:
        """nodes: torchrun's --nnodes; without a checkpoint volume when it is 1 (rank 0's local disk then).
        data: an ImageNet folder (validated each epoch), else synthetic data."""
        self.dir = tmp / name
        (self.dir / "tmp").mkdir(parents=True)
        self.log_file = self.dir / "log"
        args = tiny_args(data, "--arch", "resnet-tiny", "--epochs", str(EPOCHS), "--warmup-epochs", "0")
        args += [] if data is None else ["--val-steps", "1", "--workers", "0"]
        args += ["--steps-per-epoch", str(STEPS_PER_EPOCH), "--elastic", "--commit-every", str(COMMIT_EVERY)]
        args += ["--output-dir", str(self.dir / "out"), "--progress-file", str(self.dir / "progress.json")]
        args += [] if nodes == "1" else ["--checkpoint-dir", str(self.dir / "ckpt")]
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nodes, "--nproc-per-node", "1"]
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
        argv += ["--rdzv-conf", f"is_host={str(host).lower()},{RDZV_CONF}", "--local-addr", addr]
        argv += ["--max-restarts", "3", "--monitor-interval", "1", "-m", "dtjob_train.ddp", *args]
        # TMPDIR: the node's local disk, where rank 0 notes the last step it finished.
        env = run_env() | {"GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(self.dir / "tmp")}
        env |= {"PYTHONUNBUFFERED": "1", "DTJOB_THREADS_PER_RANK": "1", **NEW_STORE_EACH_ROUND}
        with self.log_file.open("w") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def steps(self) -> list[tuple[float, dict[str, Any]]]:
        """(learning rate, progress record) of every step rank 0 logged, in order."""
        found = re.findall(
            r"^epoch \d+/\d+ step \d+/\d+ loss \S+ lr ([\d.]+) .*\nDTJOB_PROGRESS (\{.*\})$", self.log(), re.M
        )
        return [(float(lr), json.loads(record)) for lr, record in found]

    def at(self) -> dict[str, Any]:
        """Rank 0's progress file now (empty before its first step): cheap enough to poll every few
        milliseconds, so the test acts within a step or two of what it waits for."""
        with contextlib.suppress(OSError, ValueError):
            found: dict[str, Any] = json.loads((self.dir / "progress.json").read_text())
            return found
        return {}

    def worker(self) -> int:
        """The pid of the trainer process this agent runs now."""
        [pid] = [pid for pid in descendants(self.proc.pid) if b"dtjob_train.ddp" in _cmdline(pid)]
        return pid

    def kill(self) -> None:
        """SIGKILL to the agent and every process it started (the node is gone): torchrun starts each of its
        processes in a session of its own, so each group goes. Nothing once the agent has ended: its pid
        may be another process's by then."""
        if self.proc.poll() is not None:
            return
        groups = {self.proc.pid} | {os.getpgid(pid) for pid in descendants(self.proc.pid)}
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self.proc.wait(30)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def past_a_commit(agent: Agent, size: int) -> Callable[[], bool]:
    """Whether rank 0's last step was one of a world of `size`, past a step checkpoint and not at one."""

    def check() -> bool:
        at = agent.at()
        step = at.get("step", 0) if at.get("worldSize") == size else 0
        return step > COMMIT_EVERY and step % COMMIT_EVERY != 0

    return check


def wait_for(what: str, done: Callable[[], bool], log: Callable[[], str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{log()[-20000:]}")
        time.sleep(0.02)


def exit_code(agent: Agent, timeout: float, agents: list[Agent]) -> int:
    """The agent's exit code; past `timeout`, a failure that shows the tail of every agent's log (one that
    waits in torchrun's exit barrier waits for another node's)."""
    try:
        return agent.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        tails = "\n".join(f"--- {each.dir.name}\n{each.log()[-6000:]}" for each in agents)
        pytest.fail(f"{agent.dir.name}'s agent still runs after {timeout:.0f} s:\n{tails}")


def resize_lines(log: str) -> list[tuple[int, int, int, int]]:
    """(world size, epoch, step resumed at, steps redone) of rank 0's 'world resized' lines."""
    found = re.findall(
        r"elastic: world resized to (\d+) ranks .* epoch (\d+) step (\d+), (\d+) steps redone", log
    )
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in found]


def shrink_and_grow(tmp_path: Path) -> Agent:
    """Nodes A (rank 0's, the rendezvous host: its address sorts first) and B train; B dies; A trains alone;
    B' joins; A's exit code is 0. Returns A."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"test-{os.getpid()}-{time.monotonic_ns()}"
    a = Agent(tmp_path, "a", addr="127.0.0.1", host=True, endpoint=endpoint, run_id=run_id)
    agents = [a, Agent(tmp_path, "b", addr="127.0.0.2", host=False, endpoint=endpoint, run_id=run_id)]
    try:
        # The node dies mid-epoch, steps after a step checkpoint (mostly: the test acts within a step or two).
        wait_for("2 nodes training", past_a_commit(a, 2), a.log)
        agents[1].kill()
        wait_for("1 node training", past_a_commit(a, 1), a.log)
        # Rank 0 pauses until the new node is in and A's agent stops it, so the world of 1 is still
        # training then, however fast this machine trains it.
        worker, stopping = a.worker(), a.log().count(STOPPING)
        os.kill(worker, signal.SIGSTOP)
        agents.append(Agent(tmp_path, "b2", addr="127.0.0.2", host=False, endpoint=endpoint, run_id=run_id))
        try:
            wait_for("A's agent to stop its process", lambda: a.log().count(STOPPING) > stopping, a.log)
        finally:
            os.kill(worker, signal.SIGCONT)
        assert exit_code(a, 90, agents) == 0, a.log()
        assert exit_code(agents[2], 30, agents) == 0, agents[2].log()
    finally:
        for agent in agents:
            agent.kill()
    return a


def test_a_node_dies_and_one_joins_and_rank_0_resumes_mid_epoch_from_its_step_checkpoints(
    tmp_path: Path,
) -> None:
    a = shrink_and_grow(tmp_path)
    log, steps = a.log(), a.steps()
    print(f"resized (size, epoch, step, redone): {resize_lines(log)}")
    sizes = [p["worldSize"] for _, p in steps]
    assert [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s] == [2, 1, 2], log
    # Each world resumed at a step checkpoint (every 3rd step, or an epoch's end), the first mid-epoch, and
    # redid the steps it lost: at most the steps since that checkpoint.
    [(one, epoch_1, step_1, redone_1), (two, epoch_2, step_2, redone_2)] = resize_lines(log)
    assert (one, two, epoch_1) == (1, 2, 1) and step_1 > 0, log
    assert step_1 % COMMIT_EVERY == step_2 % COMMIT_EVERY == 0, log
    assert 0 <= redone_1 <= COMMIT_EVERY and 0 <= redone_2 <= COMMIT_EVERY, log
    # Logged steps go on from where each world resumed, and end at the planned last.
    positions = [(p["epoch"], p["step"]) for _, p in steps]
    alone, again = sizes.index(1), sizes.index(2, sizes.index(1))
    assert positions[alone] == (epoch_1, step_1 + 1) and positions[again] == (epoch_2, step_2 + 1), log
    assert positions[-1] == (EPOCHS, STEPS_PER_EPOCH), log
    # The learning rate and the global batch follow the world's size.
    for lr, p in steps:
        at = p["epoch"] - 1 + p["step"] / STEPS_PER_EPOCH
        expected = learning_rate(
            at, base_lr=0.256, batch_size=4, world_size=p["worldSize"], warmup_epochs=0, epochs=EPOCHS
        )
        assert abs(lr - expected) < 1e-5 and p["globalBatch"] == 4 * p["worldSize"], (lr, p)
    metrics = json.loads((a.dir / "out" / "metrics.json").read_text())
    assert metrics["runner"] == "torchrun" and metrics["worldSizes"] == [2, 1, 2], metrics
    assert metrics["stepsRedone"] == redone_1 + redone_2, metrics
    # Steps redone are not counted twice.
    assert metrics["globalStep"] == EPOCHS * STEPS_PER_EPOCH and metrics["worldSize"] == 2, metrics
    assert len(metrics["weightDigests"]) == 2 and metrics["weightsConsistent"], metrics
    # Rank 0 keeps the epoch checkpoints every trainer reads and the newest two step checkpoints; its local
    # directory of the run goes when the run is done; the other nodes write nothing.
    files = sorted(p.name for p in (a.dir / "ckpt").iterdir())
    assert files[:2] == ["epoch-0001.pt", "epoch-0002.pt"] and files[-1] == "step-0002-0000000.pt", files
    assert len(files) == 4 and not list((a.dir / "tmp").glob("dtjob-elastic-*")), files
    assert not [p for p in tmp_path.glob("b*/**/*") if p.is_file() and p.name != "log"]


def test_without_a_checkpoint_volume_a_restarted_process_resumes_from_rank_0s_local_disk(
    tmp_path: Path,
) -> None:
    """One node, no --checkpoint-dir, ImageNet: its process dies (SIGKILL) mid-epoch; torchrun's agent starts
    it again and it resumes from the step checkpoint in the run's local directory (the loader's shard from
    the images the steps before it took), which goes when the run is done."""
    # 400 images: 100 steps of 4 an epoch, about a second on two idle cores, so the kill lands mid-epoch
    # (32 steps once took less than the test took to see a step and act on it, on a loaded machine).
    data = make_tree(tmp_path / "imagenet", per_class_train=TREE_STEPS * 2)
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"test-{os.getpid()}-{time.monotonic_ns()}"
    a = Agent(
        tmp_path, "a", addr="127.0.0.1", host=True, endpoint=endpoint, run_id=run_id, nodes="1", data=data
    )
    try:
        wait_for("training", past_a_commit(a, 1), a.log)
        run_dir = a.dir / "tmp" / f"dtjob-elastic-{run_id}"
        worker = a.worker()
        # Stopped first, so the last step the process finished, as rank 0 noted it, is the one it dies at.
        os.kill(worker, signal.SIGSTOP)
        reached = int((run_dir / "reached").read_text())
        os.kill(worker, signal.SIGKILL)
        assert exit_code(a, 90, [a]) == 0, a.log()
    finally:
        a.kill()
    log = a.log()
    [(size, epoch, step, redone)] = resize_lines(log)
    assert (size, epoch) == (1, 1) and step > 0 and step % COMMIT_EVERY == 0, log
    assert redone == reached - step and 0 <= redone <= COMMIT_EVERY, (reached, log)
    steps = [(p["epoch"], p["step"]) for _, p in a.steps()]
    assert steps[-1] == (EPOCHS, TREE_STEPS) and (1, step + 1) in steps[steps.index((1, step)) + 1 :], log
    metrics = json.loads((a.dir / "out" / "metrics.json").read_text())
    assert metrics["worldSizes"] == [1, 1] and metrics["stepsRedone"] == redone, metrics
    assert metrics["globalStep"] == EPOCHS * TREE_STEPS and metrics["valTop1"] is not None, metrics
    assert not run_dir.exists() and not (a.dir / "ckpt").exists()


def small_model() -> tuple[nn.Linear, torch.optim.Optimizer]:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # momentum buffers: optimizer state worth restoring
    return model, optimizer


def test_step_checkpoints_keep_the_newest_two_and_the_later_of_step_and_epoch_checkpoint_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(step_checkpoint.RUN_ID_ENV, "run-1")
    model, optimizer = small_model()
    at = Position(epoch=1, step=6, epoch_images=48, resumed_from=1, world_sizes=(2, 1), steps_redone=2)
    for position in (Position(epoch=1, step=3), at, Position(epoch=0, step=9)):
        step_checkpoint.save(tmp_path, position, 40, model, optimizer, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0001-0000003.pt", "step-0001-0000006.pt"]

    fresh, fresh_optimizer = small_model()
    with torch.no_grad():
        fresh.weight.zero_()
    cpu = torch.device("cpu")
    restored = step_checkpoint.restore_newest(tmp_path, tmp_path, fresh, fresh_optimizer, None, cpu)
    # The same torchrun run: its history and steps per epoch go on.
    assert restored == step_checkpoint.Restored(at, 40, tmp_path / "step-0001-0000006.pt")
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_optimizer.state_dict()["state"][0]["momentum_buffer"].abs().sum() > 0

    # Another run's (the job restarted whole): a place to resume from, with a history of its own.
    monkeypatch.setenv(step_checkpoint.RUN_ID_ENV, "run-2")
    restored = step_checkpoint.restore_newest(tmp_path, tmp_path, fresh, fresh_optimizer, None, cpu)
    assert restored.position == Position(epoch=1, step=6, epoch_images=48, resumed_from=1)
    assert restored.steps_per_epoch is None

    # A later epoch checkpoint (another trainer's) wins; the step files stay out of the epoch files' way.
    torch_checkpoint.save(tmp_path, 2, model, optimizer, None)
    restored = step_checkpoint.restore_newest(tmp_path, tmp_path, fresh, fresh_optimizer, None, cpu)
    assert restored == step_checkpoint.Restored(
        Position(epoch=2, resumed_from=2), None, tmp_path / "epoch-0002.pt"
    )
    assert checkpoints.latest(tmp_path) == (2, tmp_path / "epoch-0002.pt")
    assert step_checkpoint.restore_newest(None, tmp_path / "none", fresh, fresh_optimizer, None, cpu) == (
        step_checkpoint.Restored(Position())
    )


def test_rank_0s_note_of_the_last_step_is_rewritten_in_place(tmp_path: Path) -> None:
    reached = step_checkpoint.Reached(tmp_path / "run")
    assert reached.read() is None
    for global_step in (7, 12345, 8):
        reached.write(global_step)
    reached.close()
    assert step_checkpoint.Reached(tmp_path / "run").read() == 8
