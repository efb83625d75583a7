"""Container logs for simulated pods: kwok serves a local file as a pod's log through the real API server.

A `Logs` object (kwok.x-k8s.io/v1alpha1, namespaced, named after the pod) points kwok at a file in the CRI log
format; with follow, lines appended later stream too. The operator then reads them with an ordinary pods/log
request, as it would from a kubelet.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException


def cri_line(text: str, stream: str = "stdout", at: datetime | None = None) -> str:
    """One line as a container runtime writes it: timestamp (`at`, default now), stream, full-line tag,
    text."""
    stamp = (at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} {stream} F {text}\n"


def append_log(path: Path, *lines: str, at: datetime | None = None) -> None:
    """Append lines written now (or at `at`: a log with a past)."""
    with path.open("a") as log:
        log.writelines(cri_line(line, at=at) for line in lines)


def serve_pod_log(api_client: client.ApiClient, namespace: str, pod: str, container: str, path: Path) -> None:
    """Make `path` the log of `container` in `pod` (the file may grow while the pod runs)."""
    serve_pod_logs(api_client, namespace, pod, {container: path})


def serve_pod_logs(api_client: client.ApiClient, namespace: str, pod: str, paths: dict[str, Path]) -> None:
    """Make each path the log of its container in `pod` (a sidecar's beside the main container's). A pod made
    again under the same name (the launcher of the next world) gets its own: the Logs object is replaced."""
    for path in paths.values():
        path.touch()
    logs = [{"containers": [c], "logsFile": str(p.resolve()), "follow": True} for c, p in paths.items()]
    body: dict[str, Any] = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": logs},
    }
    custom = client.CustomObjectsApi(api_client)
    kwok = ("kwok.x-k8s.io", "v1alpha1", namespace, "logs")
    try:
        custom.create_namespaced_custom_object(*kwok, body)
    except ApiException as err:
        if err.status != 409:
            raise
        old = cast(dict[str, Any], custom.get_namespaced_custom_object(*kwok, pod))
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        custom.replace_namespaced_custom_object(*kwok, pod, body)
