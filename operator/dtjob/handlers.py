"""kopf registrations. Thin: they keep the watch cache (indices) and feed the controller's queue.

Pods and Jobs are watched once for the whole operator with a server-side label selector
(app.kubernetes.io/managed-by=dtjob-operator), so the API server streams only our children; each event is
one dict insert in an index plus one enqueue. No per-job watches, no polling, no list calls per reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from dtjob import API_GROUP, API_VERSION, PLURAL, names
from dtjob.azure.clients import Deadlines, set_default_deadlines
from dtjob.config import load_config
from dtjob.controller import Controller, children_from_indices
from dtjob.kube import KubeClient, connect
from dtjob.names import ROLE_STAGER as STAGER_ROLE

MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={names.MANAGED_BY}"
WATCH_SERVER_TIMEOUT = 300  # seconds; the API server ends each watch by then and kopf re-lists nothing
WATCH_CLIENT_TIMEOUT = 330


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{API_GROUP}/kopf-finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT
    settings.watching.connect_timeout = 30
    config = load_config()
    # kopf's own requests (the lists before each watch, its events): the same deadlines as ours.
    settings.networking.connect_timeout = config.kube_connect_timeout_seconds
    settings.networking.request_timeout = 2 * config.kube_timeout_seconds
    settings.watching.label_selectors["v1", "pods"] = MANAGED_SELECTOR
    settings.watching.label_selectors["batch", "v1", "jobs"] = MANAGED_SELECTOR
    # Our own events describe every transition; kopf's per-handler chatter would only add noise.
    settings.posting.level = logging.WARNING
    # Blob Storage: the operator's deadlines for every client built in this process.
    set_default_deadlines(
        Deadlines(config.azure_connect_timeout_seconds, config.azure_timeout_seconds, config.azure_retries, 2)
    )
    api = connect(config.kube_connect_timeout_seconds, config.kube_timeout_seconds, config.kube_retries)
    controller = Controller(KubeClient(api), config)
    controller.start()
    memo["controller"] = controller


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        await controller.stop()


def _projection(body: kopf.Body) -> dict[str, Any]:
    """The parts of a child the state machine reads; keeps the cache small."""
    meta = body.get("metadata", {})
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            # Only the owners' UIDs: a job re-created under the same name must not adopt what the old left.
            "ownerReferences": [{"uid": ref.get("uid")} for ref in meta.get("ownerReferences") or ()],
            "labels": dict(meta.get("labels") or {}),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "status": dict(body.get("status") or {}),
    }


def _job_key(namespace: str | None, labels: Mapping[str, str]) -> tuple[str, str] | None:
    job = labels.get(names.JOB_NAME_LABEL)
    return (namespace, job) if namespace and job else None


# The children the operator caches and reacts to: (index id, API group/version and plural, label filter).
# Each kind gets one index (the watch cache, keyed by job) and one event handler that enqueues its job.
CHILD_KINDS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    ("dtjob_pods", ("v1", "pods"), {names.JOB_NAME_LABEL: kopf.PRESENT}),
    ("dtjob_launchers", ("batch", "v1", "jobs"), {names.ROLE_LABEL: names.ROLE_LAUNCHER}),
    ("dtjob_stagers", ("batch", "v1", "jobs"), {names.ROLE_LABEL: STAGER_ROLE}),
)


async def index_child(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]] | None:
    key = _job_key(namespace, labels)
    return {key: _projection(body)} if key else None


async def child_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    key = _job_key(namespace, labels)
    if key:
        memo["controller"].enqueue(key)


for _index_id, _resource, _labels in CHILD_KINDS:
    kopf.index(*_resource, id=_index_id, labels=_labels)(index_child)
    kopf.on.event(*_resource, id=f"{_index_id}_event", labels=_labels)(child_event)


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
async def job_event(type: str, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    indices: list[kopf.Index[tuple[str, str], dict[str, Any]]] = [kwargs[kind[0]] for kind in CHILD_KINDS]
    controller: Controller = memo["controller"]
    if controller.children_of is None:
        # kopf fills every index before the first non-index handler runs, so the cache is complete here.
        controller.children_of = children_from_indices(*indices)
    if namespace and name:
        controller.observe_job((namespace, name), deleted=type == "DELETED")


@kopf.on.probe(id="queue")
async def queue_depth(memo: kopf.Memo, **_: Any) -> int:
    controller: Controller | None = memo.get("controller")
    return controller.depth if controller else 0


@kopf.on.probe(id="reconciles")
async def reconcile_count(memo: kopf.Memo, **_: Any) -> int:
    controller: Controller | None = memo.get("controller")
    return controller.reconciles if controller else 0
