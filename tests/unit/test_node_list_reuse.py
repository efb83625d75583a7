"""Node lists are reused for a few seconds (a burst of new jobs reads the same pool), except for the decision
that fails a job for good: that one is made on a fresh list."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dtjob.kube import NODE_LIST_TTL_S, KubeClient
from dtjob.preflight import preflight
from dtjob.ttl_cache import TtlCache
from kubernetes import client

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import job_spec
from tests.unit.recording_kube import RecordingKube


def test_entries_expire_after_their_ttl() -> None:
    clock = ManualClock()
    cache: TtlCache[str, int] = TtlCache(10.0, clock)
    cache.put("a", 1)
    clock.now += 9.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert cache.get("never") is None


def test_put_forgets_expired_entries() -> None:
    clock = ManualClock()
    cache: TtlCache[str, int] = TtlCache(10.0, clock)
    for key in "abc":
        cache.put(key, 1)
    clock.now += 11
    cache.put("d", 2)
    assert len(cache._entries) == 1  # what a long-running operator keeps


def node(gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": f"n{gpus}"}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


@dataclass
class StaleNodes(RecordingKube):
    """A reused list showing smaller nodes than the pool has now (it was just scaled up to bigger VMs)."""

    stale: list[dict[str, Any]] = field(default_factory=list)
    fresh_calls: list[bool] = field(default_factory=list)

    def list_nodes(self, label_selector: str, fresh: bool = False) -> list[dict[str, Any]]:
        self.fresh_calls.append(fresh)
        super().list_nodes(label_selector, fresh)
        return list(self.nodes if fresh else self.stale)


def test_a_job_is_failed_for_too_few_gpus_only_on_a_fresh_list() -> None:
    kube = StaleNodes(nodes=[node(8)], stale=[node(2)])
    assert preflight(kube, job_spec(gpusPerWorker=4)) is None
    assert kube.fresh_calls == [False, True]

    kube = StaleNodes(nodes=[node(2)], stale=[node(2)])
    blocker = preflight(kube, job_spec(gpusPerWorker=4))
    assert blocker is not None and blocker.fatal and blocker.reason == "InsufficientGPUsPerNode"
    assert kube.fresh_calls == [False, True]


def test_a_fitting_job_reads_the_reused_list_only() -> None:
    kube = StaleNodes(nodes=[node(8)], stale=[node(8)])
    assert preflight(kube, job_spec(gpusPerWorker=4)) is None
    assert kube.fresh_calls == [False]


@dataclass
class Response:
    data: bytes


@dataclass
class CountingCoreApi:
    nodes: list[dict[str, Any]]
    selectors: list[str] = field(default_factory=list)

    def list_node(self, label_selector: str, _preload_content: bool) -> Response:
        self.selectors.append(label_selector)
        return Response(json.dumps({"items": self.nodes}).encode())


def test_the_client_lists_each_pool_once_per_ttl() -> None:
    clock = ManualClock()
    kube = KubeClient(client.ApiClient(client.Configuration()))
    kube._node_lists = TtlCache(NODE_LIST_TTL_S, clock)  # a clock the test moves
    core = CountingCoreApi([node(4)])
    kube.core = core  # type: ignore[assignment]
    for _ in range(50):
        assert kube.list_nodes("pool=gpu") == [node(4)]
    kube.list_nodes("pool=cpu")
    assert core.selectors == ["pool=gpu", "pool=cpu"]
    # A caller changing its copy changes nothing for the next one.
    kube.list_nodes("pool=gpu").clear()
    assert kube.list_nodes("pool=gpu") == [node(4)]
    assert kube.list_nodes("pool=gpu", fresh=True) == [node(4)]
    assert core.selectors == ["pool=gpu", "pool=cpu", "pool=gpu"]
    clock.now += NODE_LIST_TTL_S
    kube.list_nodes("pool=gpu")
    assert core.selectors[-1] == "pool=gpu" and len(core.selectors) == 4
