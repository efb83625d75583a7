"""Whether storage holds a run's results, asked with the operator's own credentials before a record of `dtjob
results upload` makes the job Succeeded (dtjob.machine.results_later).

The record on the job is anyone's to write who may edit the job; the results are taken as uploaded only when
the run's manifest (dtjob.contract.results_upload.MANIFEST_NAME, which the uploader writes once every file
is up) is under the run's prefix, lists as many files and bytes as the record says, and every file it lists
is there with its size. Someone who cannot write to the run's prefix cannot make that true. Read at the
run's location in status (the one the storage policy allowed), never at a spec.output edited since.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from dtjob.azure.clients import Deadlines
from dtjob.config import OperatorConfig
from dtjob.contract.results_upload import MANIFEST_MAX_BYTES, MANIFEST_NAME, ResultsRecord, parse_manifest
from dtjob.kube.client import Kube
from dtjob.names import output_url, run_prefix
from dtjob.reconcile.storage_act import results_check_sas
from dtjob.reconcile.storage_observe import StorageRefused
from dtjob.redaction import redact
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import StoredResults
from dtjob.state.status import JobStatus

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = logging.getLogger(__name__)

# One look within a reconcile: short tries, no retries (a failed look is retried by the state machine).
CHECK_DEADLINES = Deadlines(connect_s=5.0, read_s=15.0, retries=0, backoff_s=1)
# Whoever may write under the run's prefix (rank 0's token) decides what lies there, and the check runs at
# every reconcile of the job: it reads the manifest up to its bound, keeps only the sizes of the files the
# manifest lists, and lists at most this many blobs (20 pages), so that no prefix filled with millions of
# blobs or a huge manifest costs the operator more than that.
LISTING_MAX_BLOBS = 100_000
LISTING_PAGE = 5_000


def stored_results(
    kube: Kube,
    spec: JobSpec,
    status: JobStatus,
    uid: str,
    record: ResultsRecord,
    now: datetime,
    config: OperatorConfig,
) -> StoredResults:
    """What storage holds of the results `record` says were uploaded to the run `uid`."""
    from azure.core.exceptions import AzureError

    from dtjob.azure.clients import container_client

    if spec.output is None:
        return StoredResults(False, "the job has no spec.output")
    target = spec.output.target
    url = output_url(target.container_url, target.prefix, spec.namespace, spec.name, uid)
    if url != status.output_url:
        return StoredResults(False, f"spec.output names {url}, not the run's location {status.output_url}")
    prefix = run_prefix(target.prefix, spec.namespace, spec.name, uid)
    try:
        sas = results_check_sas(kube, spec, uid, now, config)
        with container_client(sas.container_url, sas.token, 1, CHECK_DEADLINES) as client:
            return look_for_results(client, prefix, url, record)
    except StorageRefused as refused:
        return StoredResults(False, f"could not look at {url}: {refused.blocker.message}", retry=True)
    except AzureError as err:
        reason = redact(f"{type(err).__name__}: {err}").splitlines()[0][:300]
        log.warning("%s/%s: could not look for the results at %s: %s", spec.namespace, spec.name, url, reason)
        return StoredResults(False, f"could not look for the results at {url}: {reason}", retry=True)


def look_for_results(
    client: ContainerClient,
    prefix: str,
    url: str,
    record: ResultsRecord,
    listing_max: int = LISTING_MAX_BLOBS,
) -> StoredResults:
    """Whether the manifest under `prefix` lists what `record` says, and every file it lists is there with
    its size, read within the bounds above."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

    try:
        stream = client.download_blob(prefix + MANIFEST_NAME, offset=0, length=MANIFEST_MAX_BYTES + 1)
        data = stream.readall()
    except ResourceNotFoundError as err:
        if getattr(err, "error_code", None) != "BlobNotFound":
            raise  # the container is gone: storage could not be asked, looked at again
        return StoredResults(False, _no_manifest(url, None))
    except HttpResponseError as err:
        if err.status_code != 416:  # a range of an empty blob
            raise
        data = b""
    if len(data) > MANIFEST_MAX_BYTES:
        return StoredResults(False, _no_manifest(url, len(data)))
    manifest = parse_manifest(data.decode("utf-8", "replace"))
    if manifest is None:
        return StoredResults(False, f"{url}{MANIFEST_NAME} is not a manifest")
    files, size = len(manifest), sum(manifest.values())
    if (files, size) != (record.files, record.bytes):
        return StoredResults(
            False,
            f"the manifest under {url} lists {files} files, {size} bytes, not the {record.files} files, "
            f"{record.bytes} bytes the record says were uploaded",
        )
    if not manifest:
        return StoredResults(True, f"0 files, 0 bytes under {url}")
    if files >= listing_max:
        return StoredResults(False, f"the manifest under {url} lists {files} files, more than the operator "
                                    f"looks for ({listing_max - 1})")  # fmt: skip
    listed, looked = _sizes_listed(client, prefix, manifest, listing_max)
    absent = sorted(name for name, length in manifest.items() if listed.get(name) != length)
    if absent:
        shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
        within = f" within the first {looked} blobs there" if looked >= listing_max else ""
        return StoredResults(False, f"{len(absent)} file(s) the manifest lists are not under {url} "
                                    f"with their size{within}: {shown}")  # fmt: skip
    return StoredResults(True, f"{files} files, {size} bytes under {url}")


def _sizes_listed(
    client: ContainerClient, prefix: str, manifest: Mapping[str, int], listing_max: int
) -> tuple[dict[str, int], int]:
    """The listed sizes of the files `manifest` names (no other name is kept), and how many blobs were
    listed: until all of them are found, or `listing_max`."""
    found: dict[str, int] = {}
    looked = 0
    for blob in client.list_blobs(name_starts_with=prefix, results_per_page=LISTING_PAGE):
        looked += 1
        name = blob.name.removeprefix(prefix)
        if name in manifest:
            found[name] = int(blob.size)
            if len(found) == len(manifest):
                break
        if looked >= listing_max:
            break
    return found, looked


def _no_manifest(url: str, size: int | None) -> str:
    if size is None:
        return f"no {MANIFEST_NAME} under {url}: the upload that writes it last has not completed there"
    return f"{url}{MANIFEST_NAME} is more than a manifest may be ({MANIFEST_MAX_BYTES} bytes)"
