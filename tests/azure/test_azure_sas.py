"""SAS tokens minted by dtjob.azure.sas, against Azurite, which enforces permissions, times and signatures."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobServiceClient, ContainerClient
from dtjob.azure.sas import ContainerSas, mint_with_account_key, validity_window
from dtjob.names import Access

from testbed.azurite import Azurite

pytestmark = pytest.mark.azure


@pytest.fixture
def seeded(azurite: Azurite, container_name: str) -> Iterator[ContainerClient]:
    service = BlobServiceClient(azurite.endpoint, credential=azurite.account_key)
    container = service.create_container(container_name)
    container.upload_blob("data/a.bin", b"alpha")
    yield container
    container.delete_container()


def _mint(
    azurite: Azurite, container: str, access: Access, now: datetime, lifetime: timedelta
) -> ContainerSas:
    start, expiry = validity_window(now, lifetime)
    return mint_with_account_key(
        azurite.endpoint, azurite.account_name, azurite.account_key, container, access, start, expiry
    )


def _client(sas: ContainerSas, token: str | None = None) -> ContainerClient:
    return ContainerClient.from_container_url(sas.container_url, credential=token or sas.token)


def _status(err: pytest.ExceptionInfo[HttpResponseError]) -> int | None:
    return err.value.status_code


def test_read_sas_lists_and_reads_but_cannot_write_or_delete(
    azurite: Azurite, seeded: ContainerClient
) -> None:
    sas = _mint(azurite, seeded.container_name, Access.INPUT, datetime.now(UTC), timedelta(hours=1))
    reader = _client(sas)
    assert [b.name for b in reader.list_blobs()] == ["data/a.bin"]
    assert reader.download_blob("data/a.bin").readall() == b"alpha"
    with pytest.raises(HttpResponseError) as denied_write:
        reader.upload_blob("data/new.bin", b"x")
    assert _status(denied_write) == 403
    with pytest.raises(HttpResponseError) as denied_delete:
        reader.delete_blob("data/a.bin")
    assert _status(denied_delete) == 403
    assert seeded.download_blob("data/a.bin").readall() == b"alpha"


def test_write_sas_creates_and_rewrites_but_cannot_list_read_or_delete(
    azurite: Azurite, seeded: ContainerClient
) -> None:
    sas = _mint(azurite, seeded.container_name, Access.OUTPUT, datetime.now(UTC), timedelta(hours=1))
    writer = _client(sas)
    writer.upload_blob("results/model.pt", b"weights")
    # A retried upload rewrites its own blob; a large file goes in blocks (Put Block + Put Block List).
    writer.upload_blob("results/model.pt", b"weights, again", overwrite=True)
    big = bytes(range(256)) * 4096
    writer.upload_blob("results/big.bin", big, max_concurrency=2, overwrite=True)
    # Nothing else: other runs' results can be neither found nor read, nor removed.
    with pytest.raises(HttpResponseError) as denied_list:
        list(writer.list_blobs())
    assert _status(denied_list) == 403
    with pytest.raises(HttpResponseError) as denied_read:
        writer.download_blob("data/a.bin").readall()
    assert _status(denied_read) == 403
    with pytest.raises(HttpResponseError) as denied_props:
        writer.get_blob_client("data/a.bin").get_blob_properties()
    assert _status(denied_props) == 403
    with pytest.raises(HttpResponseError) as denied_delete:
        writer.delete_blob("data/a.bin")
    assert _status(denied_delete) == 403
    assert seeded.download_blob("results/model.pt").readall() == b"weights, again"
    assert seeded.download_blob("results/big.bin").readall() == big


def test_expired_sas_is_denied(azurite: Azurite, seeded: ContainerClient) -> None:
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    sas = _mint(azurite, seeded.container_name, Access.INPUT, two_hours_ago, timedelta(hours=1))
    assert sas.expiry < datetime.now(UTC)
    with pytest.raises(HttpResponseError) as denied:
        list(_client(sas).list_blobs())
    assert _status(denied) == 403


def test_tampered_sas_is_denied(azurite: Azurite, seeded: ContainerClient) -> None:
    sas = _mint(azurite, seeded.container_name, Access.INPUT, datetime.now(UTC), timedelta(hours=1))
    # Widen the permissions without re-signing: the signature no longer matches.
    tampered = sas.token.replace("sp=rl", "sp=rwdl")
    assert tampered != sas.token
    with pytest.raises(HttpResponseError) as denied:
        _client(sas, tampered).upload_blob("data/evil.bin", b"x")
    assert _status(denied) == 403
    with pytest.raises(HttpResponseError) as denied_list:
        list(_client(sas, tampered).list_blobs())
    assert _status(denied_list) == 403


def test_sas_for_one_container_does_not_open_another(azurite: Azurite, seeded: ContainerClient) -> None:
    service = BlobServiceClient(azurite.endpoint, credential=azurite.account_key)
    other = service.create_container(seeded.container_name + "x")
    try:
        sas = _mint(azurite, seeded.container_name, Access.INPUT, datetime.now(UTC), timedelta(hours=1))
        foreign = ContainerClient.from_container_url(other.url, credential=sas.token)
        with pytest.raises(HttpResponseError) as denied:
            list(foreign.list_blobs())
        assert _status(denied) == 403
    finally:
        other.delete_container()
