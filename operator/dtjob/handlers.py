"""kopf registrations. Thin: they feed the controller's children cache and its queue.

Pods and Jobs are watched once for the whole operator with a server-side label selector
(app.kubernetes.io/managed-by=dtjob-operator), so the API server streams only our children; each event is
one dict update in the cache plus one enqueue. No per-job watches, no list calls per reconcile; the
controller lists each namespace's children once per resync to heal what the watches missed.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from dtjob import API_GROUP, API_VERSION, PLURAL, metrics, names
from dtjob.azure.clients import Deadlines, set_default_deadlines
from dtjob.config import load_config
from dtjob.controller import Controller
from dtjob.kube import KubeClient, connect

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
    metrics.bind(controller.metrics_snapshot)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        metrics.bind(None)
        await controller.stop()


# The children the operator caches and reacts to (API group/version and plural): its pods, and its batch Jobs
# (launchers and stagers). One event handler per kind feeds the children cache and enqueues the child's job.
CHILD_KINDS: tuple[tuple[str, ...], ...] = (("v1", "pods"), ("batch", "v1", "jobs"))


async def child_event(
    type: str | None, body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any
) -> None:
    memo["controller"].observe_child(resource.plural, body, deleted=type == "DELETED")


for _resource in CHILD_KINDS:
    kopf.on.event(*_resource, id=f"{_resource[-1]}_event", labels={names.JOB_NAME_LABEL: kopf.PRESENT})(
        child_event
    )


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
async def job_event(
    type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    if namespace and name:
        memo["controller"].observe_job(
            (namespace, name), deleted=type == "DELETED", status=body.get("status")
        )


@kopf.on.probe(id="queue")
async def queue_depth(memo: kopf.Memo, **_: Any) -> int:
    controller: Controller | None = memo.get("controller")
    return controller.depth if controller else 0


@kopf.on.probe(id="reconciles")
async def reconcile_count(memo: kopf.Memo, **_: Any) -> int:
    controller: Controller | None = memo.get("controller")
    return controller.reconciles if controller else 0
