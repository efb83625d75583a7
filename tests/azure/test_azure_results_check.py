"""The operator's look for a run's results (a record of `dtjob results upload`) against Azurite, when whoever
holds the run's write token (rank 0) has filled the prefix: the look reads the manifest no further than its
bound, lists no more blobs than its own bound, and keeps only the sizes of the files the manifest names, so
that the reconcile it runs in costs the operator the same whatever lies there."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import ContainerClient
from dtjob.azure.clients import container_client
from dtjob.contract.results_upload import MANIFEST_MAX_BYTES, MANIFEST_NAME, ResultsRecord, manifest_text
from dtjob.names import Access, run_prefix
from dtjob.reconcile.results_check import look_for_results

from testbed.azurite import Azurite
from tests.azure.helpers import mint, service

pytestmark = pytest.mark.azure

PREFIX = run_prefix("runs", "team-a", "r50", "0b1c-uid")
URL = f"http://results/{PREFIX}"
RESULTS = {"zz/model.pt": b"w" * 300, "zz/metrics.json": b'{"top1": 0.76}'}


def record(files: Mapping[str, bytes | int]) -> ResultsRecord:
    sizes = [v if isinstance(v, int) else len(v) for v in files.values()]
    return ResultsRecord(job_uid="0b1c-uid", attempt=0, pod="r50-worker-0", pod_uid="p-uid",
                         files=len(files), bytes=sum(sizes), at="2026-12-07T09:00:00Z")  # fmt: skip


def as_rank_zero(azurite: Azurite, container: ContainerClient) -> ContainerClient:
    """A client with the run's write token, what rank 0 holds: it creates and writes, it cannot list."""
    sas = mint(azurite, container.container_name, Access.OUTPUT)
    return container_client(sas.container_url, sas.token, 4)


def as_operator(azurite: Azurite, container: ContainerClient) -> ContainerClient:
    """A client with the read token the operator mints for its look."""
    sas = mint(azurite, container.container_name, Access.INPUT)
    return container_client(sas.container_url, sas.token, 1)


def upload(client: ContainerClient, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        client.upload_blob(PREFIX + rel, data, overwrite=True)


def manifest_of(files: Mapping[str, bytes]) -> dict[str, bytes]:
    return {MANIFEST_NAME: manifest_text({rel: len(data) for rel, data in files.items()}).encode()}


def test_a_prefix_filled_with_blobs_is_listed_no_further_than_the_bound(
    azurite: Azurite, container: ContainerClient
) -> None:
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {**RESULTS, **manifest_of(RESULTS)})
        # Blobs that sort before the results, so that a listing must pass them all to reach the results.
        upload(writer, {f"junk/{i:03}": b"j" for i in range(60)})
    with as_operator(azurite, container) as reader:
        bounded = look_for_results(reader, PREFIX, URL, record(RESULTS), listing_max=50)
        assert not bounded.complete
        assert "2 file(s) the manifest lists are not under" in bounded.message, bounded.message
        assert "within the first 50 blobs there" in bounded.message, bounded.message
        # Within the bound, the same prefix holds the results.
        found = look_for_results(reader, PREFIX, URL, record(RESULTS), listing_max=100)
        assert found.complete, found.message
        assert found.message == f"2 files, 314 bytes under {URL}"


def test_a_manifest_past_its_bound_is_not_read_whole(azurite: Azurite, container: ContainerClient) -> None:
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {**RESULTS, MANIFEST_NAME: b" " * (MANIFEST_MAX_BYTES + 4096)})
    with as_operator(azurite, container) as reader:
        looked = look_for_results(reader, PREFIX, URL, record(RESULTS))
    assert not looked.complete
    bound = f"more than a manifest may be ({MANIFEST_MAX_BYTES} bytes)"
    assert looked.message == f"{URL}{MANIFEST_NAME} is {bound}"


def test_a_manifest_listing_more_files_than_the_bound_is_not_looked_for(
    azurite: Azurite, container: ContainerClient
) -> None:
    many = {f"shard-{i}": b"s" for i in range(5)}
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {**many, **manifest_of(many)})
    with as_operator(azurite, container) as reader:
        capped = look_for_results(reader, PREFIX, URL, record(many), listing_max=5)
        assert not capped.complete
        said = "lists 5 files, more than the operator looks for (4)"
        assert capped.message == f"the manifest under {URL} {said}"
        assert look_for_results(reader, PREFIX, URL, record(many), listing_max=7).complete


def test_an_empty_manifest_blob_is_no_manifest_and_an_empty_run_needs_no_listing(
    azurite: Azurite, container: ContainerClient
) -> None:
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {MANIFEST_NAME: b""})  # a ranged read of an empty blob is answered 416
    with as_operator(azurite, container) as reader:
        empty = look_for_results(reader, PREFIX, URL, record({}))
        assert not empty.complete and empty.message == f"{URL}{MANIFEST_NAME} is not a manifest"
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {**manifest_of({}), **{f"junk/{i}": b"j" for i in range(5)}})
    with as_operator(azurite, container) as reader:
        nothing = look_for_results(reader, PREFIX, URL, record({}), listing_max=1)
    assert nothing.complete and nothing.message == f"0 files, 0 bytes under {URL}"


def test_a_missing_container_is_storage_that_could_not_be_asked(
    azurite: Azurite, container: ContainerClient
) -> None:
    with as_operator(azurite, container) as reader:
        container.delete_container()
        with pytest.raises(ResourceNotFoundError):  # stored_results: retried, not a verdict
            look_for_results(reader, PREFIX, URL, record(RESULTS))
        service(azurite).create_container(container.container_name)  # for the fixture's cleanup


def test_no_manifest_and_a_record_that_is_not_the_manifests_are_said(
    azurite: Azurite, container: ContainerClient
) -> None:
    with as_operator(azurite, container) as reader:
        missing = look_for_results(reader, PREFIX, URL, record(RESULTS))
        assert not missing.complete and missing.message.startswith(f"no {MANIFEST_NAME} under {URL}")
    with as_rank_zero(azurite, container) as writer:
        upload(writer, {**RESULTS, **manifest_of(RESULTS)})
    with as_operator(azurite, container) as reader:
        forged = look_for_results(reader, PREFIX, URL, record({**RESULTS, "extra": b"x"}))
    assert not forged.complete
    assert "lists 2 files, 314 bytes, not the 3 files, 315 bytes" in forged.message, forged.message
