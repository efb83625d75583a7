"""The Kubernetes side of `dtjob fileserver`: the PersistentVolume and claim `create --apply` writes, the
jobs that mount a share (which `delete` refuses to pull it from under), and the objects `delete` removes
with the share. Raw dicts in and out, as dtjob.kube.client does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dtjob.azure.fileserver_spec import FileServerError
from dtjob.contract.transfer_report import ExitCode
from dtjob.datasets.fileserver_volume import (
    FILESERVER_LABEL,
    SHARE_LABEL,
    Share,
    ShareUse,
    persistent_volume,
    persistent_volume_claim,
    pv_conflict,
    pvc_conflict,
    share_users,
)

KUBE_TIMEOUT = (10, 30)  # seconds to connect, to answer


def apply_volume(api_client: Any, share: Share, namespace: str, claim: str) -> list[str]:
    """Create the PV and the claim, or find them as they should be: created, unchanged, or (the PV's
    capacity only, after a resize) updated. Anything else under those names is refused, never taken
    over."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    pv, pvc = persistent_volume(share, namespace, claim), persistent_volume_claim(share, namespace, claim)
    pv_name = pv["metadata"]["name"]
    lines = []
    existing = _read(
        lambda: core.read_persistent_volume(pv_name, _preload_content=False, _request_timeout=KUBE_TIMEOUT)
    )
    if existing is None:
        _kube_call(
            lambda: core.create_persistent_volume(pv, _preload_content=False, _request_timeout=KUBE_TIMEOUT)
        )
        lines.append(f"PersistentVolume {pv_name} created")
    elif (conflict := pv_conflict(existing, pv)) is not None:
        raise FileServerError(
            f"PersistentVolume {pv_name} exists, but {conflict}: delete it or use another share"
        )
    elif (existing["spec"].get("capacity") or {}).get("storage") != pv["spec"]["capacity"]["storage"]:
        body = {"spec": {"capacity": pv["spec"]["capacity"]}}
        _kube_call(
            lambda: core.patch_persistent_volume(
                pv_name, body, _preload_content=False, _request_timeout=KUBE_TIMEOUT
            )
        )
        lines.append(f"PersistentVolume {pv_name}: capacity {pv['spec']['capacity']['storage']}")
    else:
        lines.append(f"PersistentVolume {pv_name} unchanged")
    existing = _read(
        lambda: core.read_namespaced_persistent_volume_claim(
            claim, namespace, _preload_content=False, _request_timeout=KUBE_TIMEOUT
        )
    )
    if existing is None:
        _kube_call(
            lambda: core.create_namespaced_persistent_volume_claim(
                namespace, pvc, _preload_content=False, _request_timeout=KUBE_TIMEOUT
            )
        )
        lines.append(f"PersistentVolumeClaim {namespace}/{claim} created")
    elif (conflict := pvc_conflict(existing, pvc)) is not None:
        raise FileServerError(
            f"PersistentVolumeClaim {namespace}/{claim} exists, but {conflict}: pass another --claim-name"
        )
    else:
        lines.append(f"PersistentVolumeClaim {namespace}/{claim} unchanged")
    return lines


def _read(call: Callable[[], Any]) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        found: dict[str, Any] = json.loads(call().data)
    except ApiException as err:
        if err.status == 404:
            return None
        raise FileServerError(
            f"Kubernetes API: {err.status} {_api_message(err)}", kube_exit_code(err)
        ) from err
    return found


def _kube_call(call: Callable[[], Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as err:
        raise FileServerError(
            f"Kubernetes API: {err.status} {_api_message(err)}", kube_exit_code(err)
        ) from err


def kube_exit_code(err: Exception) -> int:
    """The exit status for a Kubernetes failure: an unusable kubeconfig, denied, not found, or the API
    server failed or could not be reached."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(err, ConfigException):
        return int(ExitCode.USAGE)
    status = err.status if isinstance(err, ApiException) else None
    if status in (401, 403):
        return int(ExitCode.DENIED)
    return int(ExitCode.NOT_FOUND if status == 404 else ExitCode.STORAGE)


def _api_message(err: Any) -> str:
    try:
        return str(json.loads(err.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(err.reason)


def jobs_using(api_client: Any, server: str, path: str) -> list[ShareUse]:
    """Every DistributedTrainingJob in the cluster that mounts the share (read: jobs, PVs, claims)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom: Any = client.CustomObjectsApi(api_client)
    core: Any = client.CoreV1Api(api_client)
    try:
        jobs = json.loads(
            custom.list_cluster_custom_object(
                "dtjob.io",
                "v1alpha1",
                "distributedtrainingjobs",
                _preload_content=False,
                _request_timeout=KUBE_TIMEOUT,
            ).data
        )["items"]
    except ApiException as err:
        if err.status != 404:  # 404: the CRD is not installed, so no job can use anything
            raise
        jobs = []
    pvs = json.loads(core.list_persistent_volume(_preload_content=False, _request_timeout=KUBE_TIMEOUT).data)[
        "items"
    ]
    pvcs = json.loads(
        core.list_persistent_volume_claim_for_all_namespaces(
            _preload_content=False, _request_timeout=KUBE_TIMEOUT
        ).data
    )["items"]
    return share_users(jobs, pvs, pvcs, server, path)


def delete_volume_objects(api_client: Any, account: str, share: str) -> list[str]:
    """The PV and claims create --apply wrote for the share (by label), now that the share is gone."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    selector = f"{FILESERVER_LABEL}={account},{SHARE_LABEL}={share}"
    lines = []
    claims = json.loads(
        core.list_persistent_volume_claim_for_all_namespaces(
            label_selector=selector, _preload_content=False, _request_timeout=KUBE_TIMEOUT
        ).data
    )["items"]
    for claim in claims:
        meta = claim["metadata"]
        core.delete_namespaced_persistent_volume_claim(
            meta["name"], meta["namespace"], _request_timeout=KUBE_TIMEOUT
        )
        lines.append(f"PersistentVolumeClaim {meta['namespace']}/{meta['name']} deleted")
    volumes = json.loads(
        core.list_persistent_volume(
            label_selector=selector, _preload_content=False, _request_timeout=KUBE_TIMEOUT
        ).data
    )["items"]
    for volume in volumes:
        core.delete_persistent_volume(volume["metadata"]["name"], _request_timeout=KUBE_TIMEOUT)
        lines.append(f"PersistentVolume {volume['metadata']['name']} deleted")
    return lines
