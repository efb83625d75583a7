"""A child a reconcile creates is in the controller's children cache before its watch event arrives: the
next reconcile of its job neither creates it again nor reports it missing (the cache would otherwise lag
behind the operator's own creates by the watch's delay)."""

from __future__ import annotations

import asyncio
from typing import Any

from dtjob import names
from dtjob.config import OperatorConfig
from dtjob.runtime.cached_kube import CachedKube
from dtjob.runtime.controller import Controller

from tests.unit.recording_kube import RecordingKube, unused_api


def _pod(name: str, job: str, role: str = names.ROLE_WORKER) -> dict[str, Any]:
    labels = {names.JOB_NAME_LABEL: job, names.ROLE_LABEL: role}
    meta = {"name": name, "namespace": "ml", "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def _launcher(job: str) -> dict[str, Any]:
    labels = {names.JOB_NAME_LABEL: job, names.ROLE_LABEL: names.ROLE_LAUNCHER}
    meta = {"name": names.launcher_name(job), "namespace": "ml", "labels": labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta}


def test_children_a_reconcile_creates_are_cached_at_once_and_nothing_else_is() -> None:
    kube = CachedKube(RecordingKube(), unused_api())

    async def scenario() -> Controller:
        controller = Controller(kube, OperatorConfig())
        controller.start()
        try:
            loop = asyncio.get_running_loop()
            # From a reconcile thread, as act() creates them; the second create finds the pod there.
            for obj in (_pod("rn-worker-0", "rn"), _launcher("rn"), _pod("rn-worker-0", "rn")):
                await loop.run_in_executor(None, kube.create, obj)
            hostfile = {"name": "rn-hostfile", "namespace": "ml"}
            kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": hostfile})
            await asyncio.sleep(0)  # the loop runs what the threads handed it
            return controller
        finally:
            await controller.stop()

    controller = asyncio.run(scenario())
    children = controller.cache.children(("ml", "rn"))
    assert [p["metadata"]["name"] for p in children.pods] == ["rn-worker-0"]
    assert children.launcher is not None and children.launcher["metadata"]["name"] == "rn-launcher"
    assert children.launcher["metadata"]["uid"], "as the API server answered the create, uid included"
    assert len(controller.cache) == 2  # the ConfigMap is no child the cache keeps
    assert controller.cache.namespaces() == {"ml"}


def test_an_endpoint_slice_a_reconcile_creates_or_patches_is_cached_as_answered() -> None:
    """The next reconcile compares the hosts with what it wrote, not with a watch event still on its way."""
    kube = CachedKube(RecordingKube(), unused_api())
    labels = {names.JOB_NAME_LABEL: "rn"}
    endpoint = {"addresses": ["10.0.0.1"], "hostname": "rn-worker-0"}
    hosts = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "rn-workers", "namespace": "ml", "labels": labels}, "endpoints": [endpoint],
    }  # fmt: skip

    async def scenario() -> Controller:
        controller = Controller(kube, OperatorConfig())
        controller.start()
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, kube.create, hosts)
            moved = {"endpoints": [{**endpoint, "addresses": ["10.0.0.2"]}]}
            await loop.run_in_executor(None, kube.patch, "EndpointSlice", "ml", "rn-workers", moved)
            await asyncio.sleep(0)
            return controller
        finally:
            await controller.stop()

    controller = asyncio.run(scenario())
    (cached,) = controller.cache.children(("ml", "rn")).endpoint_slices
    assert cached["endpoints"] == [{**endpoint, "addresses": ["10.0.0.2"]}]
