"""Blob Storage reads of one reconcile: the per-job SAS Secrets (fresh, due for rotation, altered), what
stops a mint (the namespace's storage policy, the credentials, a missing results container), and the staging
Job's progress.

Kubernetes I/O goes through dtjob.kube.client and Azure I/O through dtjob.azure; this module only sequences
them. No token, key or signed URL is ever logged, put into an event or into status: errors pass through
redact(). dtjob.reconcile.storage_act mints, revokes and uploads.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from dtjob import names
from dtjob.azure.clients import Deadlines
from dtjob.azure.sas import (
    ANNOTATION_EXPIRES,
    ANNOTATION_ISSUED,
    rotation_time,
    secret_rotation_due,
    workload_identity_credential,
)
from dtjob.config import OperatorConfig
from dtjob.desired.owned import owner_uids
from dtjob.kube.client import Forbidden, Kube, LogUnavailable
from dtjob.machine.deadline import active_deadline
from dtjob.names import (
    SECRET_TOKEN_KEY,
    SECRET_URL_KEY,
    STORAGE_KEY_LABEL,
    Access,
    run_prefix,
    sas_secret_name,
)
from dtjob.redaction import redact
from dtjob.spec.parse import JobSpec
from dtjob.spec.storage import AuthMode, BlobLocation
from dtjob.spec.tenancy import ClusterView, Use, check_locations, cluster_view, namespace_policy
from dtjob.state.observed import Blocker, PodState, SasObservation
from dtjob.state.staging import StagingOutcome, staging_outcome
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time, parse_time

log = logging.getLogger(__name__)

STAGING_LOG_TAIL_LINES = 20
# Twenty of the stager's lines are a few KB; anything else in its log is written by whoever may exec into
# its pod.
STAGING_LOG_TAIL_BYTES = 32 * 1024
# The output container's check before the first output token: one quick try, never a reconcile held long.
CONTAINER_CHECK_DEADLINES = Deadlines(connect_s=5.0, read_s=5.0, retries=0, backoff_s=1)


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
    may not use that way (read for stageFrom, write for output). The job's own Namespace is read afresh; the
    other namespaces' lists (who else reads or writes a container) may come from a list a few seconds old
    (the runtime's, dtjob.runtime.cached_kube), so a cluster admin's change to them counts from then on."""
    locations = spec_locations(spec)
    if not locations:
        return None
    namespace = kube.get("Namespace", None, spec.namespace) or {}
    annotations = (namespace.get("metadata") or {}).get("annotations") or {}
    try:
        view = _cluster_view(kube)
    except Forbidden:
        return Blocker(
            "StoragePolicyUnreadable",
            "the operator may not list Namespaces, so it cannot tell which containers other namespaces read "
            "or write: grant it list on namespaces (the chart does); waiting",
        )
    policy = namespace_policy(config.storage_policy, spec.namespace, annotations, view)
    violation = check_locations(policy, spec.namespace, locations)
    if violation is None:
        return None
    return Blocker("StorageNotAllowed", f"{violation.path}: {violation.message}", fatal=True)


def _cluster_view(kube: Kube) -> ClusterView:
    """Every namespace's own storage lists, from their annotations."""
    namespaces = kube.list("Namespace", None, cached=True)
    metas = [ns.get("metadata") or {} for ns in namespaces]
    return cluster_view((str(meta.get("name")), meta.get("annotations") or {}) for meta in metas)


def observe_sas(
    kube: Kube, spec: JobSpec, status: JobStatus, uid: str, now: datetime, config: OperatorConfig
) -> dict[str, SasObservation]:
    """Each SAS Secret the job needs now: present and fresh (seconds to its rotation), or in need of a mint
    (missing, due, altered, or outliving a deadline shortened since it was minted), and then whether the
    namespace's storage policy and the credentials allow one. The policy and the credentials are read only
    when a token is due, so a running job costs one Secret read per location; before the first output token,
    storage is asked whether the results container exists."""
    found: dict[str, SasObservation] = {}
    policy_checked = False
    refused: Blocker | None = None
    deadline = active_deadline(spec, status.start_time)
    for access, location, path in sas_locations(spec, status):
        existing = kube.get("Secret", spec.namespace, sas_secret_name(spec.name, access))
        if existing is not None and uid not in owner_uids(existing):
            existing = None  # an older job's of the same name: minting ours waits until it is gone
        recorded = status.sas_token_digests.get(access.value)
        altered = _altered(existing, location, recorded) if existing is not None else None
        if altered is not None:
            log.warning("%s/%s: Secret %s %s: minting it again", spec.namespace, spec.name,
                        sas_secret_name(spec.name, access), altered)  # fmt: skip
        # No digest recorded: minted before the operator recorded them (or that record was lost); minted
        # again, quietly, so that its token is one the status vouches for.
        fresh = (
            existing is not None
            and recorded is not None
            and not secret_rotation_due(existing, now, config.sas_rotate_fraction)
        )
        if existing is not None and fresh and altered is None:
            annotations = existing["metadata"].get("annotations") or {}
            issued = parse_time(annotations[ANNOTATION_ISSUED])
            expires = parse_time(annotations[ANNOTATION_EXPIRES])
            cap = config.sas_lifetime_cap
            # A minute's slack: the two times are written to the second.
            within_cap = cap is None or expires - issued <= cap + timedelta(minutes=1)
            if (deadline is None or expires <= deadline) and within_cap:
                due = rotation_time(issued, expires, config.sas_rotate_fraction) - now
                found[access.value] = SasObservation(mint_needed=False, rotate_in_s=due.total_seconds())
                continue
            # runPolicy.activeDeadlineSeconds, or the installer's cap, was shortened: no token outlives them.
            log.info("%s/%s: Secret %s outlives the job's deadline (%s) or the lifetime cap (%s s): "
                     "minting it again", spec.namespace, spec.name, sas_secret_name(spec.name, access),
                     format_time(deadline) if deadline else "none",
                     config.sas_lifetime_max_seconds or "none")  # fmt: skip
        if not policy_checked:  # nothing is signed for a location the namespace may not use
            refused, policy_checked = storage_allowed(kube, spec, config), True
        blocked = refused or _credentials_blocker(kube, spec.namespace, location, path)
        if blocked is None and existing is None and access is Access.OUTPUT:
            blocked = _missing_output_container(kube, spec.namespace, location, path)
        if blocked is not None:
            log.warning("%s/%s: %s", spec.namespace, spec.name, blocked.message)
        found[access.value] = SasObservation(mint_needed=True, blocked=blocked, altered=altered)
    return found


def token_sha256(token: str) -> str:
    """What the status records of a token the operator wrote (status.sasTokenDigests): never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _altered(secret: Mapping[str, Any], location: BlobLocation, recorded: str | None) -> str | None:
    """How a SAS Secret of ours differs from what the operator wrote, or None. Its annotations say when to
    rotate, but anyone who may edit Secrets in the namespace may change its data and keep them: the operator
    never trusts a container URL it did not write (rank 0 would upload the results there), nor a token
    whose digest is not the one the status recorded (`recorded`; None: none recorded): one signed elsewhere,
    wider or longer-lived than the operator's, would be handed to the pods as the operator's."""
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
    if recorded is not None and token_sha256(token) != recorded:
        return "holds a token the operator did not write"
    return None


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
        key = account_key(kube, namespace, location, path)
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
        account_key(kube, namespace, location, path)
    except StorageRefused as refused:
        return refused.blocker
    return None


def account_key(kube: Kube, namespace: str, location: BlobLocation, path: str) -> str:
    """The account key of an accountKey location, read and checked; StorageRefused naming what is wrong."""
    ref = location.credentials.secret_ref
    assert ref is not None
    secret = kube.get("Secret", namespace, ref.name)
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


def observe_staging(
    kube: Kube,
    namespace: str,
    staging_job: Mapping[str, Any] | None,
    pods: Sequence[tuple[Mapping[str, Any], PodState]],
) -> StagingOutcome | None:
    """The staging Job's outcome, with live progress from the running stager's log tail. `pods`: each child
    pod with its parsed state (the outcome reads the stagers' termination messages from the pods)."""
    if staging_job is None:
        return None
    # The staging Job's own pods: a pod labelled as its stager that it does not own says nothing of it.
    job_uid = str((staging_job.get("metadata") or {}).get("uid") or "")
    stagers = sorted(
        ((p, state) for p, state in pods if state.role == names.ROLE_STAGER and job_uid in owner_uids(p)),
        key=lambda found: str((found[0].get("metadata") or {}).get("creationTimestamp") or ""),
    )
    raw = [dict(p) for p, _ in stagers]
    outcome = staging_outcome(dict(staging_job), raw)
    running = [state for _, state in stagers if state.phase == "Running"]
    if outcome.phase != "Running" or not running:
        return outcome
    try:
        lines, size = STAGING_LOG_TAIL_LINES, STAGING_LOG_TAIL_BYTES
        tail = kube.read_log(namespace, running[-1].name, names.STAGER_CONTAINER, lines, size)
    except LogUnavailable:
        return outcome  # progress is a nicety; the outcome does not depend on it
    return staging_outcome(dict(staging_job), raw, tail)
