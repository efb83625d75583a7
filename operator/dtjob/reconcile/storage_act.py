"""Blob Storage actions of one reconcile: the per-job SAS Secrets minted, rotated and revoked, and the pod
logs uploaded before cleanup.

Kubernetes I/O goes through dtjob.kube.client and Azure I/O through dtjob.azure; this module only sequences
them. No token, key or signed URL is ever logged, put into an event or into status: errors pass through
redact(). What the actions need to know is read by dtjob.reconcile.storage_observe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from dtjob import metrics, names
from dtjob.azure.sas import (
    ContainerSas,
    mint_with_account_key,
    mint_with_user_delegation,
    sas_secret,
    validity_window,
    workload_identity_credential,
)
from dtjob.config import OperatorConfig
from dtjob.desired.owned import is_ours
from dtjob.fence import NotLeader
from dtjob.kube.client import Kube, LogUnavailable, NotOurs
from dtjob.names import Access, log_blob_name, sas_secret_name
from dtjob.reconcile import deletes
from dtjob.reconcile.ensure import Applied, ensure
from dtjob.reconcile.storage_observe import (
    StorageRefused,
    account_key,
    output_directory,
    sas_locations,
    storage_allowed,
    token_sha256,
)
from dtjob.redaction import redact
from dtjob.spec.parse import JobSpec
from dtjob.spec.storage import AuthMode, BlobLocation
from dtjob.state.decision import SasMinted
from dtjob.state.observed import Blocker, PodState
from dtjob.state.status import JobStatus

if TYPE_CHECKING:
    from dtjob.azure.logs import LogCap

log = logging.getLogger(__name__)
Json = dict[str, Any]

# The life of the operator's own log-upload token: the upload's retries fit in it many times over.
LOG_UPLOAD_TOKEN_LIFETIME = timedelta(minutes=30)
# The life of the operator's own token for reading a run's manifest and listing its files: one look.
RESULTS_CHECK_TOKEN_LIFETIME = timedelta(minutes=10)


@dataclass(frozen=True)
class LogUpload:
    uploaded: bool
    missing: tuple[str, ...] = ()
    error: str | None = None
    truncated: tuple[str, ...] = ()  # pods whose log was longer than the cap: head and tail kept
    cap_bytes: int = 0  # the cap they were cut to


def mint_sas(
    kube: Kube,
    spec: JobSpec,
    access: Access,
    not_after: datetime | None,
    owner: Json,
    now: datetime,
    config: OperatorConfig,
) -> SasMinted | None:
    """Create `<job>-sas-<access>` with a fresh token, or replace the token of the one there (rotation).
    Returns the new token's digest once it is in the Secret, for the status; None when nothing was written.
    StorageRefused when the credentials do not allow it; NotLeader, before anything is signed, on a replica
    that does not hold the leader Lease."""
    kube.check_leader()
    wanted = {a: (location, path) for a, location, path in sas_locations(spec, JobStatus())}
    location, path = wanted[access]
    try:
        start, expiry = validity_window(now, location.sas_lifetime, not_after, config.sas_lifetime_cap)
    except ValueError:
        return None  # the deadline has passed: the state machine fails the job
    directory = output_directory(spec, location, str(owner.get("uid", "")), config, access)
    sas = _mint(kube, spec, config, location, path, access, start, expiry, directory)
    secret = sas_secret(spec.name, spec.namespace, access, sas, issued_at=now, owner_reference=owner)
    existing = kube.get("Secret", spec.namespace, sas_secret_name(spec.name, access))
    if existing is None:
        applied = ensure(kube, secret)
        if applied is Applied.NOT_OURS:
            raise NotOurs(f"Secret {sas_secret_name(spec.name, access)}")
        if applied is not Applied.CREATED:
            return None  # created a moment ago by another reconcile: its token is not this one
        metrics.sas_minted(access.value, rotation=False)
        return SasMinted(access.value, token_sha256(sas.token))
    if not is_ours(existing, secret):
        raise NotOurs(f"Secret {sas_secret_name(spec.name, access)}")
    kube.replace(secret, existing["metadata"]["resourceVersion"])
    metrics.sas_minted(access.value, rotation=True)
    log.info("rotated the SAS in %s/%s; it now expires at %s", spec.namespace,
             sas_secret_name(spec.name, access), sas.expiry.isoformat())  # fmt: skip
    return SasMinted(access.value, token_sha256(sas.token))


def _mint(
    kube: Kube,
    spec: JobSpec,
    config: OperatorConfig,
    location: BlobLocation,
    path: str,
    access: Access,
    start: datetime,
    expiry: datetime,
    directory: str | None = None,
) -> ContainerSas:
    """Every token the operator signs is signed here: only while the namespace's storage policy allows the
    spec's locations as they are now (a spec edited mid-run to another team's container gets nothing signed
    for it, not even the operator's own log upload). StorageRefused naming what refuses."""
    refused = storage_allowed(kube, spec, config)
    if refused is not None:
        raise StorageRefused(refused)
    creds = location.credentials
    if creds.auth_mode is AuthMode.ACCOUNT_KEY:
        key = account_key(kube, spec.namespace, location, path)
        return mint_with_account_key(
            location.endpoint, location.account_name, key, location.container, access, start, expiry,
            directory,
        )  # fmt: skip
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    try:
        credential = workload_identity_credential(creds.client_id)
        return mint_with_user_delegation(
            location.endpoint,
            location.account_name,
            credential,
            location.container,
            access,
            start,
            expiry,
            directory,
        )
    except (ClientAuthenticationError, HttpResponseError) as err:
        if isinstance(err, HttpResponseError) and err.status_code not in (401, 403):
            raise
        first_line = redact(str(err)).splitlines()[0] if str(err) else type(err).__name__
        raise StorageRefused(Blocker(
            "StorageCredentialsDenied",
            f"{path}: the operator's workload identity could not get a user delegation key: {first_line}",
            fatal=True,
        )) from None  # fmt: skip


def log_upload_sas(
    kube: Kube, spec: JobSpec, uid: str, now: datetime, config: OperatorConfig
) -> ContainerSas:
    """A token for the operator's own upload of pod logs, minted now from the spec's output location and kept
    in memory only. Not the pods' `<job>-sas-out` token: that one expires at activeDeadlineSeconds (the logs
    of a job that hit its deadline would be refused), and a namespace editor can rewrite its URL. Scoped like
    the pods' token (the run's directory on hierarchical-namespace accounts). StorageRefused when the
    credentials do not allow it."""
    assert spec.output is not None
    location = spec.output.target
    start, expiry = validity_window(now, LOG_UPLOAD_TOKEN_LIFETIME)
    directory = output_directory(spec, location, uid, config, Access.OUTPUT)
    return _mint(kube, spec, config, location, "spec.output.credentials", Access.OUTPUT, start, expiry,
                 directory)  # fmt: skip


def results_check_sas(
    kube: Kube, spec: JobSpec, uid: str, now: datetime, config: OperatorConfig
) -> ContainerSas:
    """A read+list token for the operator's own look at a run's results (dtjob.reconcile.results_check),
    minted now from the spec's output location and kept in memory only; scoped to the run's directory on
    hierarchical-namespace accounts. StorageRefused when the credentials do not allow it."""
    assert spec.output is not None
    location = spec.output.target
    start, expiry = validity_window(now, RESULTS_CHECK_TOKEN_LIFETIME)
    directory = output_directory(spec, location, uid, config, Access.OUTPUT)
    return _mint(kube, spec, config, location, "spec.output.credentials", Access.INPUT, start, expiry,
                 directory)  # fmt: skip


def delete_sas_secrets(kube: Kube, namespace: str, job: str, uid: str) -> None:
    """Revoke the job's SAS Secrets: those the job `uid` owns, never another owner's of the same name."""
    for access in Access:
        deletes.delete_owned(kube, "Secret", namespace, sas_secret_name(job, access), uid)


def upload_pod_logs(
    kube: Kube,
    spec: JobSpec,
    uid: str,
    pods: Iterable[PodState],
    attempt: int | None = None,
    *,
    cap_bytes: int,
    config: OperatorConfig,
    now: datetime | None = None,
) -> LogUpload:
    """Stream every pod's log from the API server into `<run prefix>/logs/<pod>.log`, a few pods at a time and
    never a whole log in memory; a log longer than `cap_bytes` keeps its head and tail (dtjob.azure.logs).
    With a token of its own (log_upload_sas), so the logs reach storage after the job's deadline too.
    Pods whose log cannot be read are listed, not waited for. NotLeader, before any blob is written or the
    next pod's started, once this replica does not hold the leader Lease."""
    from dtjob.azure.clients import container_client
    from dtjob.azure.logs import LOG_UPLOAD_CONCURRENCY, LogCap
    from dtjob.azure.parallel import run_bounded

    assert spec.output is not None
    sources = [
        (pod.name, names.CONTAINER_OF_ROLE[pod.role])
        for pod in pods
        if pod.name and pod.role in names.CONTAINER_OF_ROLE
    ]
    kube.check_leader()
    try:
        sas = log_upload_sas(kube, spec, uid, now or datetime.now(UTC), config)
    except StorageRefused as refused:
        return LogUpload(False, error=refused.blocker.message[:300])
    client = container_client(sas.container_url, sas.token, LOG_UPLOAD_CONCURRENCY)
    upload = _LogUploader(kube, spec, uid, attempt, spec.output.target.prefix, client, LogCap(cap_bytes))
    try:
        with client:  # closes its connections after
            run_bounded(sources, upload.one, LOG_UPLOAD_CONCURRENCY, "log-upload")
    except NotLeader:
        raise  # not a failed upload: the new leader uploads them all
    except Exception as err:  # any Azure or network failure: retried until the grace period ends
        text = redact(f"{type(err).__name__}: {err}").splitlines()[0]
        log.warning("uploading logs of %s/%s failed: %s", spec.namespace, spec.name, text)
        # No missing pods with a failure: the retry reads every log again and says which are missing then.
        return LogUpload(False, error=text[:300])
    log.info("uploaded %d pod logs of %s/%s", len(sources) - len(upload.missing), spec.namespace, spec.name)
    return LogUpload(
        True, tuple(sorted(upload.missing)), truncated=tuple(sorted(upload.truncated)), cap_bytes=cap_bytes
    )


@dataclass
class _LogUploader:
    """Uploads one pod's log at a time (from several threads), noting the logs missing and those cut."""

    kube: Kube
    spec: JobSpec
    uid: str
    attempt: int | None
    prefix: str  # spec.output's
    client: Any  # azure.storage.blob.ContainerClient
    cap: LogCap
    missing: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def one(self, source: tuple[str, str], cancel: threading.Event) -> None:
        from dtjob.azure.logs import stop_when, upload_log

        name, container = source
        spec, kube = self.spec, self.kube
        blob = log_blob_name(self.prefix, spec.namespace, spec.name, self.uid, name, self.attempt)
        kube.check_leader()
        with closing(kube.stream_log(spec.namespace, name, container)) as chunks:
            try:
                chunks_led = stop_when(cancel, _while_leading(kube, chunks))
                summary = upload_log(self.client, blob, chunks_led, self.cap)
            except LogUnavailable as err:
                log.info("log unavailable: %s", err)
                self.missing.append(name)
                return
        if summary.truncated:
            log.info("the log of %s/%s is %d bytes, over the %d-byte cap: kept the first %d and last %d",
                     spec.namespace, name, summary.total_bytes, self.cap.cap_bytes, summary.head_bytes,
                     summary.tail_bytes)  # fmt: skip
            self.truncated.append(name)


def _while_leading(kube: Kube, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks`, until this replica loses the leader Lease: then NotLeader, and the half-read log is never
    committed (the new leader uploads it whole)."""
    for chunk in chunks:
        kube.check_leader()
        yield chunk
