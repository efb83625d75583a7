"""The test bed's fault proxy against the real API server: it forwards faithfully, and each fault does what
the fault tests rely on."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.faultproxy import Fault, FaultProxy, Rule
from testbed.kube_wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def via_proxy(proxy: FaultProxy) -> client.CoreV1Api:
    settings = client.Configuration()
    config.load_kube_config(config_file=str(proxy.kubeconfig), client_configuration=settings)
    settings.retries = 0  # each request once: the test counts them
    return client.CoreV1Api(client.ApiClient(settings))


def config_map(name: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"k": "v"})


def test_forwards_reads_writes_and_watches(
    proxy: FaultProxy, via_proxy: client.CoreV1Api, core_v1: client.CoreV1Api, namespace: str
) -> None:
    via_proxy.create_namespaced_config_map(namespace, config_map("a"))
    assert core_v1.read_namespaced_config_map("a", namespace).data == {"k": "v"}
    assert [c.metadata.name for c in via_proxy.list_namespaced_config_map(namespace).items
            if c.metadata.name == "a"] == ["a"]  # fmt: skip
    via_proxy.delete_namespaced_config_map("a", namespace)
    verbs = [(r.request.verb, r.request.resource, r.status) for r in proxy.records]
    assert verbs == [
        ("create", "configmaps", 201), ("list", "configmaps", 200), ("delete", "configmaps", 200)
    ]  # fmt: skip


def test_error_rules_pick_by_verb_and_subresource_and_retire(
    proxy: FaultProxy, via_proxy: client.CoreV1Api, core_v1: client.CoreV1Api, namespace: str
) -> None:
    proxy.add(Rule(Fault.ERROR, status=409, verbs={"create"}, resources={"configmaps"}, times=2))
    for _ in range(2):
        with pytest.raises(ApiException) as refused:
            via_proxy.create_namespaced_config_map(namespace, config_map("b"))
        assert refused.value.status == 409 and "AlreadyExists" in str(refused.value.body)
    with pytest.raises(ApiException):
        core_v1.read_namespaced_config_map("b", namespace)  # refused before it reached the API server
    via_proxy.create_namespaced_config_map(namespace, config_map("b"))  # the rule has retired

    # after=True: the write happens, the client hears 500.
    proxy.add(Rule(Fault.ERROR, status=500, verbs={"create"}, after=True, times=1))
    with pytest.raises(ApiException) as failed:
        via_proxy.create_namespaced_config_map(namespace, config_map("c"))
    assert failed.value.status == 500
    assert core_v1.read_namespaced_config_map("c", namespace).metadata.name == "c"

    # subresource="" matches the main resource only.
    proxy.add(Rule(Fault.ERROR, status=500, verbs={"get"}, resources={"namespaces"}, subresource="status"))
    assert via_proxy.read_namespace(namespace).metadata.name == namespace
    with pytest.raises(ApiException) as status_failed:
        via_proxy.read_namespace_status(namespace)
    assert status_failed.value.status == 500


def test_hang_holds_until_the_client_gives_up_and_drop_cuts(
    proxy: FaultProxy, via_proxy: client.CoreV1Api, namespace: str
) -> None:
    proxy.add(Rule(Fault.HANG, verbs={"get"}, resources={"namespaces"}))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        via_proxy.read_namespace(namespace, _request_timeout=1.5)
    # Held until the client's 1.5 s deadline: a hang ignoring it would last until released (below), so the
    # upper bound only has to be finite, with room for a busy machine.
    assert 1.4 < time.monotonic() - started < 30
    assert proxy.release_hung() == 1
    proxy.clear()
    proxy.add(Rule(Fault.DROP, verbs={"get"}, times=1))
    with pytest.raises(urllib3.exceptions.HTTPError):
        via_proxy.read_namespace(namespace)
    assert via_proxy.read_namespace(namespace).metadata.name == namespace


def watch_events(api: client.CoreV1Api, namespace: str, **kwargs: Any) -> tuple[list[str], threading.Thread]:
    """Watch the ConfigMap `w` in a thread; returns what it saw, line by line, and how the stream ended."""
    seen: list[str] = []

    def run() -> None:
        try:
            response: Any = api.list_namespaced_config_map(
                namespace, field_selector="metadata.name=w", watch=True, _preload_content=False, **kwargs
            )
            for line in response.stream(amt=None):
                for text in line.decode().splitlines():
                    event = json.loads(text)
                    what = event["object"].get("metadata", {}).get("name") or event["object"].get("code")
                    seen.append(f"{event['type']} {what}")
        except Exception as err:  # what a cut stream raises is the point of the test
            seen.append(f"raised {type(err).__name__}")
        seen.append("ended")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return seen, thread


def test_watches_end_cleanly_or_are_cut_or_expire(
    proxy: FaultProxy, via_proxy: client.CoreV1Api, core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_config_map(namespace, config_map("w"))
    seen, thread = watch_events(via_proxy, namespace, timeout_seconds=60)
    wait_for(lambda: "ADDED w" in seen, timeout=10, what="the watch's first event")
    assert proxy.end_watches(["configmaps"]) == 1
    thread.join(10)
    assert seen == ["ADDED w", "ended"], "a cleanly ended watch ends without an error"

    seen, thread = watch_events(via_proxy, namespace, timeout_seconds=60)
    wait_for(lambda: "ADDED w" in seen, timeout=10, what="the watch's first event")
    assert proxy.end_watches(cut=True) == 1
    thread.join(10)
    assert seen[-2:] == ["raised ProtocolError", "ended"], seen

    proxy.add(Rule(Fault.GONE, verbs={"watch"}, times=1))
    seen, thread = watch_events(via_proxy, namespace, resource_version="1", timeout_seconds=60)
    thread.join(10)
    assert seen == ["ERROR 410", "ended"], seen
    assert [r.fault for r in proxy.injected()] == [Fault.GONE]
