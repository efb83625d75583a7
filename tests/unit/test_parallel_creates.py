"""A new world's objects go out together, then its worker pods together: two round trips where there were
eight, one after another, for a job of four workers."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.desired.common import owner_reference
from dtjob.kube.client import Applied, KubeClient, Rejected
from dtjob.reconcile.act import act
from dtjob.state.decision import Action, CreateLauncher, CreateWorker, EnsureWorld
from kubernetes import client

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import RecordingKube

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class BatchingKube(RecordingKube):
    batches: list[list[str]] = field(default_factory=list)  # "Kind/name" of each ensure_all(), in order

    def ensure_all(self, objs: Sequence[dict[str, Any]]) -> list[Applied]:
        self.batches.append([f"{o['kind']}/{o['metadata']['name']}" for o in objs])
        return super().ensure_all(objs)


def test_the_world_then_its_workers_each_go_out_in_one_batch() -> None:
    kube = BatchingKube()
    spec = job_spec(workers=4)
    actions: list[Action] = [EnsureWorld(), *(CreateWorker(i, 0) for i in range(4)), CreateLauncher(0)]
    act(kube, CONFIG, spec, owner_reference("rn50", "uid-1"), actions, (), None, NOW)
    assert kube.batches == [
        ["Secret/rn50-ssh", "ConfigMap/rn50-hostfile", "Service/rn50-workers"],
        [f"Pod/rn50-worker-{i}" for i in range(4)],
        ["Job/rn50-launcher"],
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


def bare_client() -> KubeClient:
    return KubeClient(client.ApiClient(client.Configuration()))


def test_the_client_runs_a_batch_at_once() -> None:
    kube = bare_client()
    together = threading.Barrier(4, timeout=5)  # breaks unless all four calls are in flight together

    def ensure(obj: dict[str, Any]) -> Applied:
        together.wait()
        return Applied.CREATED

    kube.ensure = ensure  # type: ignore[method-assign]
    assert kube.ensure_all([{"n": i} for i in range(4)]) == [Applied.CREATED] * 4


def test_a_failed_create_is_raised_once_every_create_of_its_batch_has_ended() -> None:
    kube = bare_client()
    ended: list[int] = []
    release = threading.Event()

    def ensure(obj: dict[str, Any]) -> Applied:
        if obj["n"] in (1, 2):
            raise Rejected(f"pod {obj['n']}")
        release.wait(5)
        ended.append(obj["n"])
        return Applied.CREATED

    kube.ensure = ensure  # type: ignore[method-assign]
    threading.Timer(0.2, release.set).start()
    with pytest.raises(Rejected, match="pod 1"):
        kube.ensure_all([{"n": i} for i in range(4)])
    assert sorted(ended) == [0, 3]


def test_progress_polls_read_a_log_at_most_once_per_interval() -> None:
    kube = bare_client()
    clock = ManualClock()
    kube.clock = clock
    reads: list[str] = []

    def read_pod_log(namespace: str, pod: str, container: str, **_: Any) -> str:
        reads.append(pod)
        return f"log of {pod}"

    kube.read_pod_log = read_pod_log  # type: ignore[method-assign,assignment]
    assert kube.poll_pod_log("ml", "a", "c", 50, 1024, 15.0) == "log of a"
    for _ in range(10):  # pod events reconciling the job meanwhile
        assert kube.poll_pod_log("ml", "a", "c", 50, 1024, 15.0) is None
    assert kube.poll_pod_log("ml", "b", "c", 50, 1024, 15.0) == "log of b"
    clock.now += 15.0
    assert kube.poll_pod_log("ml", "a", "c", 50, 1024, 15.0) == "log of a"
    assert reads == ["a", "b", "a"]
