"""A new world's objects go out together, then its worker pods together: two round trips where there were
eight, one after another, for a job of four workers."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.desired.common import owner_reference
from dtjob.kube.client import Kube, KubeClient, Rejected
from dtjob.kube.connect import ApiClient
from dtjob.kube.credentials import Credentials
from dtjob.reconcile import act as act_module
from dtjob.reconcile import ensure
from dtjob.reconcile.act import act
from dtjob.reconcile.ensure import Applied
from dtjob.reconcile.reads import poll_pod_log, progress_poll_seconds
from dtjob.runtime.cached_kube import CachedKube
from dtjob.runtime.log_polls import LogPolls
from dtjob.state.decision import Action, CreateLauncher, CreateWorker, EnsureWorld

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import RecordingKube

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class BatchingKube(RecordingKube):
    batches: list[list[str]] = field(default_factory=list)  # "Kind/name" of each ensure_all(), in order


@pytest.fixture(autouse=True)
def _batches_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ensure_all() of act() notes its batch on the BatchingKube it was given."""

    def recorded(kube: Kube, objs: Sequence[dict[str, Any]]) -> list[Applied]:
        if isinstance(kube, BatchingKube):
            kube.batches.append([f"{o['kind']}/{o['metadata']['name']}" for o in objs])
        return ensure.ensure_all(kube, objs)

    monkeypatch.setattr(act_module, "ensure_all", recorded)


def test_the_world_then_its_workers_each_go_out_in_one_batch() -> None:
    kube = BatchingKube()
    spec = job_spec(workers=4)
    actions: list[Action] = [EnsureWorld(), *(CreateWorker(i, 0) for i in range(4)), CreateLauncher(0)]
    act(kube, CONFIG, spec, owner_reference("rn50", "uid-1"), actions, (), None, NOW)
    assert kube.batches == [
        ["Secret/rn50-ssh", "ConfigMap/rn50-hostfile", "Service/rn50-workers"],
        [f"Pod/rn50-worker-{i}" for i in range(4)],
        ["Pod/rn50-launcher"],
    ]
    assert not [c for c in kube.calls if c[0] == "get"], "the SSH Secret is created, not read first"


def test_an_existing_ssh_secret_keeps_its_keys() -> None:
    kube = BatchingKube()
    spec = job_spec(workers=1)
    owner = owner_reference("rn50", "uid-1")
    act(kube, CONFIG, spec, owner, [EnsureWorld()], (), None, NOW)
    keys = kube.objects[("Secret", "ml", "rn50-ssh")]["stringData"]
    act(kube, CONFIG, spec, owner, [EnsureWorld()], (), None, NOW)
    assert kube.objects[("Secret", "ml", "rn50-ssh")]["stringData"] == keys


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ensure_all()'s own pool of PARALLEL_CREATES threads (unit tests otherwise run creates in order)."""
    with ThreadPoolExecutor(ensure.PARALLEL_CREATES) as executor:
        monkeypatch.setattr(ensure, "CREATES", executor)
        yield


def test_ensure_all_runs_a_batch_at_once(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Breaks unless all four calls are in flight together: calls made one after another never get past it, so
    # the timeout only ends such a run; generous, so that a busy machine's slow thread start cannot break it.
    together = threading.Barrier(4, timeout=30)

    def ensure_one(kube: Kube, obj: dict[str, Any]) -> Applied:
        together.wait()
        return Applied.CREATED

    monkeypatch.setattr(ensure, "ensure", ensure_one)
    assert ensure.ensure_all(RecordingKube(), [{"n": i} for i in range(4)]) == [Applied.CREATED] * 4


def test_a_failed_create_is_raised_once_every_create_of_its_batch_has_ended(
    pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[int] = []
    release = threading.Event()

    def ensure_one(kube: Kube, obj: dict[str, Any]) -> Applied:
        if obj["n"] in (1, 2):
            raise Rejected(f"pod {obj['n']}")
        release.wait(5)
        ended.append(obj["n"])
        return Applied.CREATED

    monkeypatch.setattr(ensure, "ensure", ensure_one)
    threading.Timer(0.2, release.set).start()
    with pytest.raises(Rejected, match="pod 1"):
        ensure.ensure_all(RecordingKube(), [{"n": i} for i in range(4)])
    assert sorted(ended) == [0, 3]


def test_progress_polls_read_a_log_at_most_once_per_interval() -> None:
    clock = ManualClock()
    api = ApiClient(Credentials(server="http://127.0.0.1:9"), (1.0, 1.0), retries=False)
    kube = CachedKube(KubeClient(api), api, polls=LogPolls(clock))
    reads: list[str] = []

    def read_log(namespace: str, pod: str, container: str, *_: Any) -> str:
        reads.append(pod)
        return f"log of {pod}"

    kube.kube.read_log = read_log  # type: ignore[method-assign,assignment]
    assert poll_pod_log(kube, "ml", "a", "c", 50, 1024, 15.0) == "log of a"
    for _ in range(10):  # pod events reconciling the job meanwhile
        assert poll_pod_log(kube, "ml", "a", "c", 50, 1024, 15.0) is None
    assert poll_pod_log(kube, "ml", "b", "c", 50, 1024, 15.0) == "log of b"
    clock.now += 15.0
    assert poll_pod_log(kube, "ml", "a", "c", 50, 1024, 15.0) == "log of a"
    assert reads == ["a", "b", "a"]


def test_a_running_jobs_next_progress_pass_follows_the_budgets_spacing() -> None:
    clock = ManualClock()
    api = ApiClient(Credentials(server="http://127.0.0.1:9"), (1.0, 1.0), retries=False)
    kube = CachedKube(KubeClient(api), api, polls=LogPolls(clock, reads_per_second=1.0))
    kube.kube.read_log = lambda *_: "step 1\n"  # type: ignore[method-assign]
    assert progress_poll_seconds(kube, 30.0) == 30.0  # nothing polled yet
    for i in range(100):  # 100 running launchers at one read a second: each read every 100 s
        poll_pod_log(kube, "ml", f"job-{i}", "c", 50, 1024, 15.0)
    clock.now += 1.0  # the polled logs are counted again
    assert progress_poll_seconds(kube, 30.0) == 100.0
    assert progress_poll_seconds(RecordingKube(), 30.0) == 30.0  # a client without a budget


def test_a_pass_that_read_nothing_keeps_the_next_read_when_it_is_due() -> None:
    clock = ManualClock()
    api = ApiClient(Credentials(server="http://127.0.0.1:9"), (1.0, 1.0), retries=False)
    kube = CachedKube(KubeClient(api), api, polls=LogPolls(clock, reads_per_second=1.0))
    kube.kube.read_log = lambda *_: "step 1\n"  # type: ignore[method-assign]
    launcher = ("ml", "job-0", "c")
    assert progress_poll_seconds(kube, 30.0, launcher) == 30.0  # never read: a whole period
    for i in range(100):  # 100 running launchers at one read a second: each read every 100 s
        poll_pod_log(kube, "ml", f"job-{i}", "c", 50, 1024, 15.0)
    clock.now += 1.0  # the polled logs are counted again
    # 100 s after its read, and a moment more (a timer may fire a hair early)
    assert progress_poll_seconds(kube, 30.0, launcher) == pytest.approx(99.05)
    clock.now += 59.0  # a resync's pass, which finds the log not due
    assert poll_pod_log(kube, *launcher, 50, 1024, 15.0) is None
    assert progress_poll_seconds(kube, 30.0, launcher) == pytest.approx(40.05)  # not 100 s from now
    clock.now += 40.0  # the timer's pass, were it to find the log not due: a second on, no sooner
    assert progress_poll_seconds(kube, 30.0, launcher) == 1.0
    assert poll_pod_log(kube, *launcher, 50, 1024, 15.0) == "step 1\n"
    assert progress_poll_seconds(kube, 30.0, launcher) == pytest.approx(100.05)


def test_a_client_without_a_poll_memory_reads_each_time() -> None:
    kube = RecordingKube(logs={"a": "step 1\n"})
    for _ in range(3):
        assert poll_pod_log(kube, "ml", "a", "c", 50, 1024, 15.0) == "step 1\n"
    assert kube.calls.count(("read-log", "Pod", "a")) == 3
