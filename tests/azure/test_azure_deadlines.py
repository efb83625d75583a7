"""Every Blob Storage client the operator builds gives up on an endpoint that never answers: each try ends
at its read timeout and the tries are bounded (a loopback port that accepts and stays silent)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from azure.core.exceptions import ServiceResponseError
from dtjob.azure.clients import (
    Deadlines,
    blob_service_client,
    container_client,
    default_deadlines,
    set_default_deadlines,
)
from dtjob.azure.logs import LogCap, upload_log

from testbed.azurite import DEV_ACCOUNT_KEY, DEV_ACCOUNT_NAME
from testbed.blackhole import Blackhole

pytestmark = pytest.mark.azure
QUICK = Deadlines(connect_s=1, read_s=1, retries=1, backoff_s=1)
# QUICK's two tries end in about 3 s; one try at the default deadlines would wait 60 s for an answer. The
# bound tells the two apart with room for a busy machine.
GIVES_UP_WITHIN_S = 30


@pytest.fixture
def quick_deadlines() -> Iterator[Deadlines]:
    before = default_deadlines()
    set_default_deadlines(QUICK)
    try:
        yield QUICK
    finally:
        set_default_deadlines(before)


def gives_up(call: Callable[[], object], blackhole: Blackhole) -> float:
    started = time.monotonic()
    with pytest.raises(ServiceResponseError, match="timed out"):
        call()
    assert blackhole.accepted == 1 + QUICK.retries, "one connection per try, and no more tries"
    return time.monotonic() - started


def test_a_log_upload_to_a_silent_endpoint_gives_up_at_its_deadline(quick_deadlines: Deadlines) -> None:
    with Blackhole() as blackhole:
        client = container_client(f"{blackhole.url}/{DEV_ACCOUNT_NAME}/results", "sv=x&sig=y")
        cap = LogCap(64 * 1024)
        took = gives_up(lambda: upload_log(client, "runs/logs/pod.log", [b"log text\n"], cap), blackhole)
    assert took < GIVES_UP_WITHIN_S, f"{took:.1f}s"


def test_a_service_client_call_to_a_silent_endpoint_gives_up_at_its_deadline(
    quick_deadlines: Deadlines,
) -> None:
    with Blackhole() as blackhole:
        credential = {"account_name": DEV_ACCOUNT_NAME, "account_key": DEV_ACCOUNT_KEY}
        service = blob_service_client(f"{blackhole.url}/{DEV_ACCOUNT_NAME}", credential)
        took = gives_up(service.get_service_properties, blackhole)
    assert took < GIVES_UP_WITHIN_S, f"{took:.1f}s"
