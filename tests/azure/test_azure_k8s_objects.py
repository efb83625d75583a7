"""The SAS Secret and the staging Job as a real API server sees them: accepted, readable back, replaceable in
place for rotation, and free of the account key."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import ContainerClient
from dtjob.azure.sas import (
    ContainerSas,
    mint_with_account_key,
    rotation_time,
    sas_secret,
    secret_rotation_due,
    validity_window,
)
from dtjob.desired.staging import staging_job
from dtjob.names import Access
from kubernetes import client

from testbed.azurite import Azurite
from tests.azure.helpers import service
from tests.unit.operator_fixtures import job_spec

pytestmark = [pytest.mark.azure, pytest.mark.integration]


def _owner(core_v1: client.CoreV1Api, namespace: str) -> dict[str, object]:
    # A real object to own the children, so the garbage collector leaves them alone during the test.
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}


def mint(azurite: Azurite, container: str, now: datetime) -> ContainerSas:
    start, expiry = validity_window(now, timedelta(minutes=10))
    return mint_with_account_key(
        azurite.endpoint, azurite.account_name, azurite.account_key, container, Access.INPUT, start, expiry
    )


def _decoded(secret: client.V1Secret) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def _as_dict(secret: client.V1Secret) -> dict[str, object]:
    serialized: dict[str, object] = client.ApiClient().sanitize_for_serialization(secret)
    return serialized


def test_sas_secret_round_trips_and_rotates_in_place(
    azurite: Azurite, container_name: str, core_v1: client.CoreV1Api, namespace: str
) -> None:
    container = service(azurite).create_container(container_name)
    try:
        container.upload_blob("a.bin", b"payload")
        owner = _owner(core_v1, namespace)
        issued = datetime.now(UTC)
        first = mint(azurite, container_name, issued)
        secret: Any = sas_secret("r50", namespace, Access.INPUT, first, issued, owner)
        core_v1.create_namespaced_secret(namespace, secret)

        stored = core_v1.read_namespaced_secret("r50-sas-in", namespace)
        files = _decoded(stored)
        assert files["sas-token"] == first.token
        assert stored.metadata.labels["dtjob.io/role"] == "sas-in"
        reader = ContainerClient.from_container_url(files["container-url"], files["sas-token"])
        assert reader.download_blob("a.bin").readall() == b"payload"
        assert not secret_rotation_due(_as_dict(stored), issued + timedelta(minutes=7))
        due_at = rotation_time(issued.replace(microsecond=0), first.expiry)
        assert secret_rotation_due(_as_dict(stored), due_at + timedelta(seconds=1))

        # Rotation: the same Secret gets a new token and times (a mounted Secret updates in place).
        reissued = due_at + timedelta(seconds=1)
        second = mint(azurite, container_name, reissued)
        assert second.token != first.token
        replacement: Any = sas_secret("r50", namespace, Access.INPUT, second, reissued, owner)
        replacement["metadata"]["resourceVersion"] = stored.metadata.resource_version
        core_v1.replace_namespaced_secret("r50-sas-in", namespace, replacement)
        rotated = core_v1.read_namespaced_secret("r50-sas-in", namespace)
        assert rotated.metadata.uid == stored.metadata.uid
        assert _decoded(rotated)["sas-token"] == second.token
        assert _decoded(rotated)["expires-at"] == second.expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert not secret_rotation_due(_as_dict(rotated), reissued)

        everything = str(_as_dict(rotated))
        assert azurite.account_key not in everything
        assert base64.b64encode(azurite.account_key.encode()).decode() not in everything
    finally:
        container.delete_container()


def test_staging_job_is_accepted_by_the_api_server(core_v1: client.CoreV1Api, namespace: str) -> None:
    owner = _owner(core_v1, namespace)
    volume = {"nfs": {"server": "10.0.0.4", "path": "/export", "readOnly": True}, "mountPath": "/data"}
    stage_from = {"account": "acct1", "prefix": "ilsvrc2012", "concurrency": 16, "container": "datasets"}
    dataset = {
        "source": "imagenet",
        "volume": volume,
        "dataDir": "/data/imagenet",
        "stageFrom": {**stage_from, "credentials": {"authMode": "workloadIdentity"}},
    }
    spec = job_spec(
        name="r50",
        namespace=namespace,
        dataset=dataset,
        placement={"launcher": {"nodePool": "system"}},
        runPolicy={"activeDeadlineSeconds": 3600},
    )
    job: Any = staging_job(spec, owner, "stager:1")
    batch = client.BatchV1Api(core_v1.api_client)
    created = batch.create_namespaced_job(namespace, job)
    pod = created.spec.template.spec
    assert pod.volumes[1].secret.secret_name == "r50-sas-in"
    assert pod.volumes[1].secret.default_mode == 0o440
    assert not pod.volumes[0].nfs.read_only  # false is omitted on the wire
    assert pod.containers[0].termination_message_policy == "FallbackToLogsOnError"
    assert pod.containers[0].env is None
