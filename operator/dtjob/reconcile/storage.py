"""Blob Storage I/O of one reconcile: the per-job SAS Secrets (mint, rotate, delete), the staging Job's
progress, and the upload of pod logs before cleanup.

Kubernetes I/O goes through dtjob.kube.client and Azure I/O through dtjob.azure; this module only sequences
them. No token, key or signed URL is ever logged, put into an event or into status: errors pass through
redact().
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob import metrics, names
from dtjob.azure.clients import Deadlines
from dtjob.azure.sas import (
    ANNOTATION_EXPIRES,
    ANNOTATION_ISSUED,
    ContainerSas,
    mint_with_account_key,
    mint_with_user_delegation,
    redact,
    rotation_time,
    sas_secret,
    secret_rotation_due,
    validity_window,
    workload_identity_credential,
)
from dtjob.config import OperatorConfig
from dtjob.desired.owned import is_ours, owner_uids
from dtjob.fence import NotLeader
from dtjob.kube.client import Applied, Kube, LogUnavailable, NotOurs
from dtjob.names import SECRET_TOKEN_KEY, SECRET_URL_KEY, Access, log_blob_name, run_prefix, sas_secret_name
from dtjob.spec.parse import JobSpec
from dtjob.spec.storage import AuthMode, BlobLocation
from dtjob.spec.tenancy import Use, check_locations, namespace_policy
from dtjob.state.observed import Blocker, SasObservation, pod_state
from dtjob.state.staging import StagingOutcome, staging_outcome
from dtjob.state.status import JobStatus
from dtjob.timefmt import parse_time

log = logging.getLogger(__name__)
Json = dict[str, Any]

STAGING_LOG_TAIL_LINES = 20
# The life of the operator's own log-upload token: the upload's retries fit in it many times over.
LOG_UPLOAD_TOKEN_LIFETIME = timedelta(minutes=30)
# The output container's check before the first output token: one quick try, never a reconcile held long.
CONTAINER_CHECK_DEADLINES = Deadlines(connect_s=5.0, read_s=5.0, retries=0, backoff_s=1)
# accountKey mode: the operator reads only Secrets that carry this label, so a job cannot point it at another
# system's key in its namespace that its author may not read.
STORAGE_KEY_LABEL = "dtjob.io/storage-key"


@dataclass(frozen=True)
class LogUpload:
    uploaded: bool
    missing: tuple[str, ...] = ()
    error: str | None = None
    truncated: tuple[str, ...] = ()  # pods whose log was longer than the cap: head and tail kept
    cap_bytes: int = 0  # the cap they were cut to


class StorageRefused(Exception):
    """Minting a SAS was refused for a reason the job's author must fix (credentials, identity)."""

    def __init__(self, blocker: Blocker) -> None:
        super().__init__(blocker.message)
        self.blocker = blocker


def sas_locations(spec: JobSpec, status: JobStatus) -> list[tuple[Access, BlobLocation, str]]:
    """(access, location, credentials field path) of every SAS the job needs now: the input one only until
    the data is staged, the output one until the job ends."""
    wanted: list[tuple[Access, BlobLocation, str]] = []
    staging = spec.dataset.staging
    if staging is not None and not status.is_true("Staged"):
        wanted.append((Access.INPUT, staging.source.source, "spec.dataset.stageFrom.credentials"))
    if spec.output is not None:
        wanted.append((Access.OUTPUT, spec.output.target, "spec.output.credentials"))
    return wanted


def spec_locations(spec: JobSpec) -> list[tuple[BlobLocation, str, Use]]:
    """(location, field path, read or write) of every storage location the spec names."""
    found: list[tuple[BlobLocation, str, Use]] = []
    if spec.dataset.staging is not None:
        found.append((spec.dataset.staging.source.source, "spec.dataset.stageFrom", Use.READ))
    if spec.output is not None:
        found.append((spec.output.target, "spec.output", Use.WRITE))
    return found


def storage_allowed(kube: Kube, spec: JobSpec, config: OperatorConfig) -> Blocker | None:
    """A fatal blocker when the job names an account, container or client ID its namespace may not use, or
    may not use that way (read for stageFrom, write for output)."""
    locations = spec_locations(spec)
    if not locations:
        return None
    namespace = kube.get_namespace(spec.namespace) or {}
    annotations = (namespace.get("metadata") or {}).get("annotations") or {}
    policy = namespace_policy(config.storage_policy, spec.namespace, annotations)
    violation = check_locations(policy, spec.namespace, locations)
    if violation is None:
        return None
    return Blocker("StorageNotAllowed", f"{violation.path}: {violation.message}", fatal=True)


def observe_sas(
    kube: Kube, spec: JobSpec, status: JobStatus, uid: str, now: datetime, config: OperatorConfig
) -> dict[str, SasObservation]:
    """Each SAS Secret the job needs now: present and fresh (seconds to its rotation), or in need of a mint,
    and then whether the namespace's storage policy and the credentials allow one. The policy and the
    credentials are read only when a token is due, so a running job costs one Secret read per location; before
    the first output token, storage is asked whether the results container exists."""
    found: dict[str, SasObservation] = {}
    policy_checked = False
    refused: Blocker | None = None
    for access, location, path in sas_locations(spec, status):
        existing = kube.get_secret(spec.namespace, sas_secret_name(spec.name, access))
        if existing is not None and uid not in owner_uids(existing):
            existing = None  # an older job's of the same name: minting ours waits until it is gone
        altered = _altered(existing, location) if existing is not None else None
        if altered is not None:
            log.warning("%s/%s: Secret %s %s: minting it again", spec.namespace, spec.name,
                        sas_secret_name(spec.name, access), altered)  # fmt: skip
        fresh = existing is not None and not secret_rotation_due(existing, now, config.sas_rotate_fraction)
        if existing is not None and fresh and altered is None:
            annotations = existing["metadata"].get("annotations") or {}
            issued = parse_time(annotations[ANNOTATION_ISSUED])
            expires = parse_time(annotations[ANNOTATION_EXPIRES])
            due = rotation_time(issued, expires, config.sas_rotate_fraction) - now
            found[access.value] = SasObservation(mint_needed=False, rotate_in_s=due.total_seconds())
            continue
        if not policy_checked:  # nothing is signed for a location the namespace may not use
            refused, policy_checked = storage_allowed(kube, spec, config), True
        blocked = refused or _credentials_blocker(kube, spec.namespace, location, path)
        if blocked is None and existing is None and access is Access.OUTPUT:
            blocked = _missing_output_container(kube, spec.namespace, location, path)
        if blocked is not None:
            log.warning("%s/%s: %s", spec.namespace, spec.name, blocked.message)
        found[access.value] = SasObservation(mint_needed=True, blocked=blocked, altered=altered)
    return found


def _altered(secret: Mapping[str, Any], location: BlobLocation) -> str | None:
    """How a SAS Secret of ours differs from what the operator wrote, or None. Its annotations say when to
    rotate, but anyone who may edit Secrets in the namespace may change its data and keep them: the operator
    never trusts a container URL it did not write (rank 0 would upload the results there)."""
    data = secret.get("data") or {}
    try:
        url = base64.b64decode(data.get(SECRET_URL_KEY) or "", validate=True).decode()
        token = base64.b64decode(data.get(SECRET_TOKEN_KEY) or "", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return "holds data that is not what the operator wrote"
    if url != location.container_url:
        return f"names container URL {url[:200]!r}, not the spec's {location.container_url!r}"
    if not token:
        return "has no token"
    return None


def mint_sas(
    kube: Kube,
    spec: JobSpec,
    access: Access,
    not_after: datetime | None,
    owner: Json,
    now: datetime,
    config: OperatorConfig,
) -> None:
    """Create `<job>-sas-<access>` with a fresh token, or replace the token of the one there (rotation).
    StorageRefused when the credentials do not allow it; NotLeader, before anything is signed, on a replica
    that does not hold the leader Lease."""
    kube.check_leader()
    wanted = {a: (location, path) for a, location, path in sas_locations(spec, JobStatus())}
    location, path = wanted[access]
    try:
        start, expiry = validity_window(now, location.sas_lifetime, not_after)
    except ValueError:
        return  # the deadline has passed: the state machine fails the job
    directory = output_directory(spec, location, str(owner.get("uid", "")), config, access)
    sas = _mint(kube, spec.namespace, location, path, access, start, expiry, directory)
    secret = sas_secret(spec.name, spec.namespace, access, sas, issued_at=now, owner_reference=owner)
    existing = kube.get_secret(spec.namespace, sas_secret_name(spec.name, access))
    if existing is None:
        applied = kube.ensure(secret)
        if applied is Applied.NOT_OURS:
            raise NotOurs(f"Secret {sas_secret_name(spec.name, access)}")
        if applied is Applied.CREATED:
            metrics.sas_minted(access.value, rotation=False)
        return
    if not is_ours(existing, secret):
        raise NotOurs(f"Secret {sas_secret_name(spec.name, access)}")
    kube.replace_secret(secret, existing["metadata"]["resourceVersion"])
    metrics.sas_minted(access.value, rotation=True)
    log.info("rotated the SAS in %s/%s; it now expires at %s", spec.namespace,
             sas_secret_name(spec.name, access), sas.expiry.isoformat())  # fmt: skip


def output_directory(
    spec: JobSpec, location: BlobLocation, uid: str, config: OperatorConfig, access: Access
) -> str | None:
    """The run's directory (`<prefix>/<namespace>/<job>/<uid>`) when the output SAS can be scoped to it: on
    the accounts the installer names as hierarchical-namespace ones (DTJOB_HNS_ACCOUNTS). None: container."""
    if access is not Access.OUTPUT or location.account_name not in config.hns_accounts or not uid:
        return None
    return run_prefix(location.prefix, spec.namespace, spec.name, uid).rstrip("/")


def _missing_output_container(
    kube: Kube, namespace: str, location: BlobLocation, path: str
) -> Blocker | None:
    """Before the first output token: the results container must exist, or the run would find out only when
    rank 0 uploads, hours later (a create+write token cannot create it). A blocker while it is missing, so the
    job waits naming the field. Asked with the credentials the token is signed with, one quick try per look;
    when storage cannot answer, minting goes on (the results upload retries while storage is away)."""
    from azure.core.exceptions import AzureError

    from dtjob.azure.clients import container_exists

    creds = location.credentials
    if creds.auth_mode is AuthMode.ACCOUNT_KEY:
        key = _account_key(kube, namespace, location, path)
        credential: Any = {"account_name": location.account_name, "account_key": key}
    else:
        credential = workload_identity_credential(creds.client_id)
    try:
        exists = container_exists(
            location.endpoint, location.container, credential, CONTAINER_CHECK_DEADLINES
        )
    except AzureError as err:
        first_line = redact(str(err)).splitlines()[0] if str(err) else type(err).__name__
        log.warning("%s: could not check that container %s exists: %s", path, location.container, first_line)
        return None
    if exists:
        return None
    return Blocker(
        "StorageContainerNotFound",
        f"{path.removesuffix('.credentials')}.container: container {location.container!r} does not exist in "
        f"storage account "
        f"{location.account_name!r}; the results could not be uploaded there: create it (az storage "
        "container create, or dtjob data upload --create-container); waiting for it",
    )


def _credentials_blocker(kube: Kube, namespace: str, location: BlobLocation, path: str) -> Blocker | None:
    """What stops an account-key mint before Azure is asked (workload identity is checked by minting)."""
    if location.credentials.auth_mode is not AuthMode.ACCOUNT_KEY:
        return None
    try:
        _account_key(kube, namespace, location, path)
    except StorageRefused as refused:
        return refused.blocker
    return None


def _account_key(kube: Kube, namespace: str, location: BlobLocation, path: str) -> str:
    ref = location.credentials.secret_ref
    assert ref is not None
    secret = kube.get_secret(namespace, ref.name)
    if secret is None:
        raise StorageRefused(Blocker(
            "StorageCredentialsNotFound",
            f"{path}.secretRef: Secret {ref.name!r} not found in namespace {namespace}; waiting for it",
        ))  # fmt: skip
    encoded = (secret.get("data") or {}).get(ref.key)
    if not encoded:
        raise StorageRefused(Blocker(
            "StorageCredentialsNotFound",
            f"{path}.secretRef.key: Secret {ref.name!r} has no key {ref.key!r}; waiting for it",
        ))  # fmt: skip
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(STORAGE_KEY_LABEL) != "true":
        raise StorageRefused(Blocker(
            "StorageCredentialsNotAllowed",
            f"{path}.secretRef: Secret {ref.name!r} is not labelled {STORAGE_KEY_LABEL}=true; the "
            "operator uses only account keys whose Secret opts in with that label; waiting for it",
        ))  # fmt: skip
    return _decoded_key(encoded, ref.name, ref.key, path)


def _decoded_key(encoded: object, secret: str, key: str, path: str) -> str:
    """The account key held base64-encoded in a Secret's data, itself base64 as Azure issues it: checked
    before anything is signed (the signer decodes it too, and raised out of every reconcile). Anything else is
    a blocker naming the Secret and the key (never its value): the job waits for the Secret to be fixed."""
    try:
        if not isinstance(encoded, str):
            raise ValueError("not a string")
        account_key = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
        if not account_key or not base64.b64decode(account_key, validate=True):
            raise ValueError("empty")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        raise StorageRefused(Blocker(
            "StorageCredentialsInvalid",
            f"{path}.secretRef.key: key {key!r} of Secret {secret!r} is not a base64 storage account key "
            "(as `az storage account keys list` prints it); waiting for the Secret to be fixed",
        )) from None  # fmt: skip
    return account_key


def _mint(
    kube: Kube,
    namespace: str,
    location: BlobLocation,
    path: str,
    access: Access,
    start: datetime,
    expiry: datetime,
    directory: str | None = None,
) -> ContainerSas:
    creds = location.credentials
    if creds.auth_mode is AuthMode.ACCOUNT_KEY:
        key = _account_key(kube, namespace, location, path)
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
    return _mint(kube, spec.namespace, location, "spec.output.credentials", Access.OUTPUT, start, expiry,
                 directory)  # fmt: skip


def delete_sas_secrets(kube: Kube, namespace: str, job: str, uid: str) -> None:
    """Revoke the job's SAS Secrets: those the job `uid` owns, never another owner's of the same name."""
    for access in Access:
        kube.delete_secret(namespace, sas_secret_name(job, access), uid)


def observe_staging(
    kube: Kube, namespace: str, staging_job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]
) -> StagingOutcome | None:
    """The staging Job's outcome, with live progress from the running stager's log tail."""
    if staging_job is None:
        return None
    stagers = sorted(
        (p for p in pods if pod_state(p).role == names.ROLE_STAGER),
        key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""),
    )
    outcome = staging_outcome(dict(staging_job), [dict(p) for p in stagers])
    running = [p for p in stagers if (p.get("status") or {}).get("phase") == "Running"]
    if outcome.phase != "Running" or not running:
        return outcome
    try:
        tail = kube.read_pod_log(
            namespace, pod_state(running[-1]).name, names.STAGER_CONTAINER, STAGING_LOG_TAIL_LINES
        )
    except LogUnavailable:
        return outcome  # progress is a nicety; the outcome does not depend on it
    return staging_outcome(dict(staging_job), [dict(p) for p in stagers], tail)


def upload_pod_logs(
    kube: Kube,
    spec: JobSpec,
    uid: str,
    pods: Iterable[Mapping[str, Any]],
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
    import threading
    from contextlib import closing

    from dtjob.azure.clients import container_client
    from dtjob.azure.logs import LOG_UPLOAD_CONCURRENCY, LogCap, stop_when, upload_log
    from dtjob.azure.parallel import run_bounded

    assert spec.output is not None
    prefix = spec.output.target.prefix
    sources: list[tuple[str, str]] = []
    for pod in pods:
        state = pod_state(pod)
        name, container = state.name, names.CONTAINER_OF_ROLE.get(state.role)
        if name and container is not None:
            sources.append((name, container))
    kube.check_leader()
    try:
        sas = log_upload_sas(kube, spec, uid, now or datetime.now(UTC), config)
    except StorageRefused as refused:
        return LogUpload(False, error=refused.blocker.message[:300])
    client = container_client(sas.container_url, sas.token, LOG_UPLOAD_CONCURRENCY)
    cap = LogCap(cap_bytes)
    missing: list[str] = []
    truncated: list[str] = []

    def upload_one(source: tuple[str, str], cancel: threading.Event) -> None:
        name, container = source
        blob = log_blob_name(prefix, spec.namespace, spec.name, uid, name, attempt)
        kube.check_leader()
        with closing(kube.stream_pod_log(spec.namespace, name, container)) as chunks:
            try:
                summary = upload_log(client, blob, stop_when(cancel, _while_leading(kube, chunks)), cap)
            except LogUnavailable as err:
                log.info("log unavailable: %s", err)
                missing.append(name)
                return
        if summary.truncated:
            log.info("the log of %s/%s is %d bytes, over the %d-byte cap: kept the first %d and last %d",
                     spec.namespace, name, summary.total_bytes, cap_bytes, summary.head_bytes,
                     summary.tail_bytes)  # fmt: skip
            truncated.append(name)

    try:
        with client:  # closes its connections after
            run_bounded(sources, upload_one, LOG_UPLOAD_CONCURRENCY, "log-upload")
    except NotLeader:
        raise  # not a failed upload: the new leader uploads them all
    except Exception as err:  # any Azure or network failure: retried until the grace period ends
        text = redact(f"{type(err).__name__}: {err}").splitlines()[0]
        log.warning("uploading logs of %s/%s failed: %s", spec.namespace, spec.name, text)
        # No missing pods with a failure: the retry reads every log again and says which are missing then.
        return LogUpload(False, error=text[:300])
    log.info("uploaded %d pod logs of %s/%s", len(sources) - len(missing), spec.namespace, spec.name)
    return LogUpload(True, tuple(sorted(missing)), truncated=tuple(sorted(truncated)), cap_bytes=cap_bytes)


def _while_leading(kube: Kube, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks`, until this replica loses the leader Lease: then NotLeader, and the half-read log is never
    committed (the new leader uploads it whole)."""
    for chunk in chunks:
        kube.check_leader()
        yield chunk
