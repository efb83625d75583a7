"""Node lists are reused for a few seconds (a burst of new jobs reads the same pool), except for the decision
that fails a job for good: that one is made on a fresh list."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dtjob.kube.client import NODE_LIST_TTL_S, KubeClient
from dtjob.reconcile.preflight import preflight
from dtjob.runtime.ttl_cache import TtlCache
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
    versions: list[str | None] = field(default_factory=list)  # the resourceVersion each list asked for
    delay_s: float = 0.0

    def list_node(
        self, label_selector: str, _preload_content: bool, resource_version: str | None = None
    ) -> Response:
        self.selectors.append(label_selector)
        self.versions.append(resource_version)
        time.sleep(self.delay_s)
        return Response(json.dumps({"items": self.nodes}).encode())


def kept(gpus: int) -> dict[str, Any]:
    """node(gpus) as the client keeps it."""
    return {
        "metadata": {"name": f"n{gpus}", "labels": {}},
        "spec": {"unschedulable": None, "taints": []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "capacity": {}},
    }


def test_the_client_lists_each_pool_once_per_ttl() -> None:
    clock = ManualClock()
    kube = KubeClient(client.ApiClient(client.Configuration()))
    kube._node_lists = TtlCache(NODE_LIST_TTL_S, clock)  # a clock the test moves
    core = CountingCoreApi([node(4)])
    kube.core = core  # type: ignore[assignment]
    for _ in range(50):
        assert kube.list_nodes("pool=gpu") == [kept(4)]
    kube.list_nodes("pool=cpu")
    assert core.selectors == ["pool=gpu", "pool=cpu"]
    # A caller changing its copy changes nothing for the next one.
    kube.list_nodes("pool=gpu").clear()
    assert kube.list_nodes("pool=gpu") == [kept(4)]
    assert kube.list_nodes("pool=gpu", fresh=True) == [kept(4)]
    assert core.selectors == ["pool=gpu", "pool=cpu", "pool=gpu"]
    # Reused lists may come from the API server's watch cache; the one a job is failed on may not.
    assert core.versions == ["0", "0", None]
    clock.now += NODE_LIST_TTL_S
    kube.list_nodes("pool=gpu")
    assert core.selectors[-1] == "pool=gpu" and len(core.selectors) == 4


def test_reconciles_asking_at_once_share_one_list() -> None:
    kube = KubeClient(client.ApiClient(client.Configuration()))
    core = CountingCoreApi([node(4)], delay_s=0.2)
    kube.core = core  # type: ignore[assignment]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: kube.list_nodes("pool=gpu"), range(8)))
    assert answers == [[kept(4)]] * 8
    assert core.selectors == ["pool=gpu"]


def test_only_what_the_checks_read_is_kept_of_a_node() -> None:
    kube = KubeClient(client.ApiClient(client.Configuration()))
    full = {
        "metadata": {"name": "n1", "labels": {"pool": "gpu"}, "managedFields": [{"manager": "kubelet"}]},
        "spec": {
            "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
            "podCIDR": "10.0.0.0/24",
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "images": [{"names": ["a"] * 50}]},
    }
    kube.core = CountingCoreApi([full])  # type: ignore[assignment]
    assert kube.list_nodes("pool=gpu") == [{
        "metadata": {"name": "n1", "labels": {"pool": "gpu"}},
        "spec": {"unschedulable": None, "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {}},
    }]  # fmt: skip


def test_node_list_locks_stay_bounded_however_many_selectors() -> None:
    """Selectors come from jobs' specs: the locks serialising their lists must not grow with each new one."""
    kube = KubeClient(client.ApiClient())
    selectors = [f"pool=tenant-{n}" for n in range(5000)]
    for selector in selectors:
        kube._node_lists.put(selector, [node(8)])  # answered from the cache: no request
    for selector in selectors:
        assert kube.list_nodes(selector) == [node(8)]
    assert len(kube._node_list_locks) <= 64
