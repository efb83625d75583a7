"""Pod logs streamed into block blobs with the operator's write SAS, cut to the cap, against Azurite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import ContainerClient
from dtjob.azure.clients import container_client
from dtjob.azure.logs import (
    LOG_CONTENT_TYPE,
    NOTE_PREFIX,
    LogCap,
    omission_marker,
    truncation_note,
    upload_log,
)
from dtjob.azure.sas import redact
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.helpers import mint

pytestmark = pytest.mark.azure

CAP = LogCap(2**20)  # 256 KiB head, 64 KiB blocks
CHUNK = 64 * 1024


def numbered_log(lines: int, width: int = 120) -> bytes:
    return b"".join(f"{i:08d} ".encode().ljust(width - 1, b".") + b"\n" for i in range(lines))


def chunks(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]


def writer(azurite: Azurite, container: ContainerClient) -> ContainerClient:
    """A client with the output SAS the operator mints (create + write, no read)."""
    sas = mint(azurite, container.container_name, Access.OUTPUT)
    return container_client(sas.container_url, sas.token)


def test_a_log_within_the_cap_is_stored_as_it_is(azurite: Azurite, container: ContainerClient) -> None:
    data = numbered_log(8000)  # 960 KB
    summary = upload_log(writer(azurite, container), "logs/w-0.log", chunks(data), CAP)
    assert not summary.truncated and summary.total_bytes == len(data)
    blob = container.get_blob_client("logs/w-0.log")
    assert blob.download_blob().readall() == data
    assert blob.get_blob_properties().content_settings.content_type == LOG_CONTENT_TYPE


def test_a_longer_log_keeps_head_and_tail_and_the_staged_middle_is_discarded(
    azurite: Azurite, container: ContainerClient
) -> None:
    data = numbered_log(60_000)  # 7.2 MB, seven times the cap
    summary = upload_log(writer(azurite, container), "logs/w-1.log", chunks(data), CAP)
    assert summary.truncated and summary.total_bytes == len(data)
    blob = container.get_blob_client("logs/w-1.log")
    stored = blob.download_blob().readall()
    note = truncation_note(summary, CAP.cap_bytes).encode()
    marker = omission_marker(summary.omitted_bytes, head_ends_line=True).encode()
    assert stored == note + data[: summary.head_bytes] + marker + data[-summary.tail_bytes :]
    assert stored.startswith(f"{NOTE_PREFIX} This log was {len(data)} bytes".encode())
    assert stored.splitlines()[1].startswith(b"00000000 ")
    assert stored.endswith(b"00059999 " + b"." * 110 + b"\n")
    assert len(stored) <= CAP.cap_bytes + len(note) + len(marker)
    committed, uncommitted = blob.get_block_list("all")
    assert not uncommitted  # the commit dropped the blocks of the middle
    assert len(committed) <= 2 * CAP.cap_bytes // CAP.block_bytes + 2


def test_a_retried_upload_replaces_the_blob_and_an_empty_log_is_an_empty_blob(
    azurite: Azurite, container: ContainerClient
) -> None:
    client = writer(azurite, container)
    upload_log(client, "logs/w-2.log", chunks(numbered_log(30_000)), CAP)
    fuller = numbered_log(40_000)
    summary = upload_log(client, "logs/w-2.log", chunks(fuller), CAP)
    stored = container.download_blob("logs/w-2.log").readall()
    assert stored.endswith(fuller[-summary.tail_bytes :]) and b"00039999 " in stored
    assert f"This log was {len(fuller)} bytes".encode() in stored
    upload_log(client, "logs/w-3.log", iter(()), CAP)
    assert container.download_blob("logs/w-3.log").readall() == b""


def test_a_stream_that_breaks_leaves_the_blob_as_it_was(azurite: Azurite, container: ContainerClient) -> None:
    client = writer(azurite, container)
    upload_log(client, "logs/w-4.log", [b"first run\n"], CAP)

    def broken() -> Iterator[bytes]:
        yield from chunks(numbered_log(20_000))
        raise ConnectionResetError("the log stream broke")

    with pytest.raises(ConnectionResetError):
        upload_log(client, "logs/w-4.log", broken(), CAP)
    assert container.download_blob("logs/w-4.log").readall() == b"first run\n"


def test_a_read_only_sas_is_refused_and_the_error_carries_no_signature(
    azurite: Azurite, container: ContainerClient
) -> None:
    sas = mint(azurite, container.container_name, Access.INPUT)
    with pytest.raises(HttpResponseError) as refused:
        upload_log(container_client(sas.container_url, sas.token), "logs/w-5.log", [b"x\n"], CAP)
    assert refused.value.status_code == 403
    # What the operator puts into status.output.logsError and its log.
    text = redact(f"{type(refused.value).__name__}: {refused.value}").splitlines()[0]
    assert "sig=" not in text and sas.token not in text
