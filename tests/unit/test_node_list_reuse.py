"""Node lists are reused for a few seconds (a burst of new jobs reads the same pool), except for the decision
that fails a job for good: that one is made on a fresh list."""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dtjob.kube.client import Keep
from dtjob.reconcile.preflight import preflight
from dtjob.reconcile.reads import list_nodes
from dtjob.runtime.cached_kube import NODE_LIST_TTL_S, CachedKube, ListAnswer
from dtjob.runtime.ttl_cache import TtlCache

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import job_spec
from tests.unit.recording_kube import RecordingKube, unused_api


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

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        assert kind == "Node"
        self.fresh_calls.append(not cached)
        super().list(kind, namespace, labels, fields, limit, cached)
        return [*(self.stale if cached else self.nodes)]


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


def tainted(gpus: int) -> dict[str, Any]:
    """A node of the job's label selector that its workers may not land on: a taint they do not tolerate."""
    body = node(gpus)
    body["metadata"]["name"] = f"tainted-{gpus}"
    body["spec"] = {"taints": [{"key": "team", "value": "other", "effect": "NoSchedule"}]}
    return body


def test_only_the_nodes_a_worker_may_land_on_count_for_its_gpus() -> None:
    kube = StaleNodes(nodes=[tainted(8), node(2)], stale=[tainted(8), node(2)])
    blocker = preflight(kube, job_spec(gpusPerWorker=4))
    assert blocker is not None and blocker.reason == "InsufficientGPUsPerNode"
    assert "at most 2 " in blocker.message, "the tainted 8-GPU node is not the pool's best"
    pool = [node(2), tainted(2), node(8)]
    assert preflight(StaleNodes(nodes=pool, stale=pool), job_spec(gpusPerWorker=4)) is None
    # No node it may land on at all: a pool scaled to zero, as far as the job can tell, gets the benefit.
    assert preflight(StaleNodes(nodes=[tainted(2)], stale=[tainted(2)]), job_spec(gpusPerWorker=4)) is None


@dataclass
class CountingNodes(RecordingKube):
    """The API server's node list, answered after `delay_s`; counts the lists and how each was asked."""

    selectors: list[str] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)  # the resourceVersion each list asked for
    delay_s: float = 0.0

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        assert (kind, namespace) == ("Node", None)
        self.selectors.append(labels)
        self.versions.append("0" if cached else None)
        time.sleep(self.delay_s)
        return copy.deepcopy(self.nodes)


def cached_over(api: CountingNodes, clock: ManualClock | None = None) -> CachedKube:
    lists: TtlCache[str, ListAnswer] = TtlCache(NODE_LIST_TTL_S, clock or ManualClock())
    return CachedKube(api, unused_api(), node_lists=lists)


def kept(gpus: int) -> dict[str, Any]:
    """node(gpus) as the client keeps it."""
    return {
        "metadata": {"name": f"n{gpus}", "labels": {}},
        "spec": {"unschedulable": None, "taints": []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "capacity": {}, "conditions": []},
    }


def test_the_client_lists_each_pool_once_per_ttl() -> None:
    clock = ManualClock()  # a clock the test moves
    core = CountingNodes(nodes=[node(4)])
    kube = cached_over(core, clock)
    for _ in range(50):
        assert list_nodes(kube, "pool=gpu") == [kept(4)]
    list_nodes(kube, "pool=cpu")
    assert core.selectors == ["pool=gpu", "pool=cpu"]
    # A caller changing its copy changes nothing for the next one.
    list_nodes(kube, "pool=gpu").clear()
    assert list_nodes(kube, "pool=gpu") == [kept(4)]
    assert list_nodes(kube, "pool=gpu", fresh=True) == [kept(4)]
    assert core.selectors == ["pool=gpu", "pool=cpu", "pool=gpu"]
    # Reused lists may come from the API server's watch cache; the one a job is failed on may not.
    assert core.versions == ["0", "0", None]
    clock.now += NODE_LIST_TTL_S
    list_nodes(kube, "pool=gpu")
    assert core.selectors[-1] == "pool=gpu" and len(core.selectors) == 4


def test_reconciles_asking_at_once_share_one_list() -> None:
    core = CountingNodes(nodes=[node(4)], delay_s=0.2)
    kube = cached_over(core)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: list_nodes(kube, "pool=gpu"), range(8)))
    assert answers == [[kept(4)]] * 8
    assert core.selectors == ["pool=gpu"]


def test_only_what_the_checks_read_is_kept_of_a_node() -> None:
    full = {
        "metadata": {"name": "n1", "labels": {"pool": "gpu"}, "managedFields": [{"manager": "kubelet"}]},
        "spec": {
            "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
            "podCIDR": "10.0.0.0/24",
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "images": [{"names": ["a"] * 50}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-11-29T06:00:00Z",
                    "lastTransitionTime": "2026-11-28T06:00:00Z",
                    "reason": "KubeletReady",
                    "message": "ready",
                },
                {"type": "XIDErrors", "status": "False", "lastHeartbeatTime": "2026-11-29T06:00:00Z"},
            ],
        },
    }
    kube = cached_over(CountingNodes(nodes=[full]))
    assert list_nodes(kube, "pool=gpu") == [{
        "metadata": {"name": "n1", "labels": {"pool": "gpu"}},
        "spec": {"unschedulable": None, "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "capacity": {},
            # Only the conditions set True, without the heartbeat that changes every few seconds.
            "conditions": [{"type": "Ready", "status": "True", "message": "ready",
                            "lastTransitionTime": "2026-11-28T06:00:00Z"}],
        },
    }]  # fmt: skip


def test_node_list_locks_stay_bounded_however_many_selectors() -> None:
    """Selectors come from jobs' specs: the locks serialising their lists must not grow with each new one."""
    kube = cached_over(CountingNodes())
    selectors = [f"pool=tenant-{n}" for n in range(5000)]
    for selector in selectors:
        kube.node_lists.put(selector, [node(8)])  # answered from the cache: no request
    for selector in selectors:
        assert list_nodes(kube, selector) == [node(8)]
    assert len(kube._node_list_locks) <= 64
