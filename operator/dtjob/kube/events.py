"""Events about an object, posted best effort: a failure is logged, never raised. A message may quote what a
tenant wrote: it is posted printable (dtjob.printable)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dtjob.kube.connect import ApiClient
from dtjob.kube.errors import ApiError
from dtjob.kube.rest import Json, api_call, discard
from dtjob.printable import printable
from dtjob.timefmt import format_micro_time, format_time

log = logging.getLogger(__name__)
COMPONENT = "dtjob-operator"
MESSAGE_CHARS = 1024


def reference(obj: Mapping[str, Any], api_version: str, kind: str) -> Json:
    """An object reference to `obj` (its own apiVersion and kind, else those given)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion") or api_version,
        "kind": obj.get("kind") or kind,
        **{key: meta.get(key) for key in ("name", "namespace", "uid", "resourceVersion")},
    }


def post_event(
    api_client: ApiClient,
    involved: Json,
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    instance: str = COMPONENT,
    timeout: tuple[float, float] | None = None,
) -> None:
    """An Event about `involved` (an object reference) of type `kind` (Normal, Warning); `timeout`: the
    call's (connect, read) deadlines, else the client's."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": printable(message)[:MESSAGE_CHARS],
        "firstTimestamp": format_time(now),
        "lastTimestamp": format_time(now),
        "eventTime": format_micro_time(now),
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "action": reason,
        "source": {"component": COMPONENT},
    }
    try:
        discard(api_call(api_client, "create", "Event", involved["namespace"], body=event, timeout=timeout))
    except ApiError as err:  # events are best effort: never fail a reconcile over one
        log.warning("could not post event %s on %s: %s", reason, involved["name"], err.reason)
