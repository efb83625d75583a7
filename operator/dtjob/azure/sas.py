"""Container shared access signatures: minting, rotation timing, and the per-job Secrets that carry them.

Pods never see an account key: the operator signs a container SAS (with the account key from a Secret the user
names, or with a user delegation key obtained through workload identity) and hands pods only the token and the
container URL, as files of a mounted Secret. Tokens are short-lived and replaced before they expire; mounted
Secrets update in place, so consumers re-read the token file instead of caching it.

Nothing here logs a token; `ContainerSas` keeps its token out of repr() so a stray log line cannot leak it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dtjob import names
from dtjob.config import DEFAULT_SAS_ROTATE_FRACTION
from dtjob.names import SECRET_EXPIRES_KEY, SECRET_TOKEN_KEY, SECRET_URL_KEY, Access, sas_secret_name
from dtjob.redaction import redact as redact
from dtjob.spec.storage import DEFAULT_SAS_LIFETIME_S, MAX_SAS_LIFETIME_S
from dtjob.timefmt import format_time, parse_time

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

# Clocks on the operator's node and on the storage front end disagree a little; a start time slightly in
# the past keeps a freshly minted token from being "not yet valid".
START_SKEW = timedelta(minutes=5)
# Azure caps user delegation keys at 7 days; a SAS signed with one cannot outlive it (nor may the spec ask).
MAX_USER_DELEGATION = timedelta(seconds=MAX_SAS_LIFETIME_S)

ANNOTATION_ISSUED = "dtjob.io/sas-issued-at"
ANNOTATION_EXPIRES = "dtjob.io/sas-expires-at"


@dataclass(frozen=True)
class ContainerSas:
    container_url: str
    token: str = field(repr=False)
    start: datetime
    expiry: datetime

    def __repr__(self) -> str:
        return (
            f"ContainerSas(container_url={self.container_url!r}, expiry={self.expiry.isoformat()}, token=***)"
        )

    __str__ = __repr__


def allowed_protocol(endpoint: str) -> str:
    """HTTPS only, except for an emulator, which speaks plain HTTP: the spec admits an http endpoint only for
    an emulator (loopback, or a host the operator allows), so the endpoint's scheme decides."""
    return "https,http" if urlsplit(endpoint).scheme == "http" else "https"


def validity_window(
    now: datetime,
    lifetime: timedelta = timedelta(seconds=DEFAULT_SAS_LIFETIME_S),
    deadline: datetime | None = None,
    cap: timedelta | None = None,
) -> tuple[datetime, datetime]:
    """(start, expiry) for a token minted at `now`: start skewed back, expiry at `now + lifetime`, never past
    the job's deadline (or `cap` from now). Raises ValueError when nothing valid is left."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if lifetime <= timedelta(0):
        raise ValueError(f"SAS lifetime must be positive, got {lifetime}")
    expiry = now + lifetime
    if deadline is not None:
        expiry = min(expiry, deadline)
    if cap is not None:
        expiry = min(expiry, now + cap)
    if expiry <= now:
        raise ValueError(f"the job's deadline {deadline.isoformat() if deadline else ''} has already passed")
    return now - START_SKEW, expiry.replace(microsecond=0)


def rotation_time(
    issued_at: datetime, expires_at: datetime, fraction: float = DEFAULT_SAS_ROTATE_FRACTION
) -> datetime:
    """When a token issued at `issued_at` should be replaced: after `fraction` of its life."""
    if not 0 < fraction < 1:
        raise ValueError(f"rotation fraction must be in (0, 1), got {fraction}")
    return issued_at + (expires_at - issued_at) * fraction


def rotation_due(
    issued_at: datetime, expires_at: datetime, now: datetime, fraction: float = DEFAULT_SAS_ROTATE_FRACTION
) -> bool:
    return now >= rotation_time(issued_at, expires_at, fraction)


def container_url(endpoint: str, container: str) -> str:
    return f"{endpoint.rstrip('/')}/{container}"


def _generate(
    account_name: str,
    container: str,
    access: Access,
    start: datetime,
    expiry: datetime,
    protocol: str,
    directory: str | None,
    **credential: Any,
) -> str:
    """A container SAS (sr=c), or with `directory` a directory SAS (sr=d, sdd = its depth) that reaches only
    the blobs under `<directory>/`, which Azure accepts on hierarchical-namespace accounts only."""
    from azure.storage.blob import generate_blob_sas, generate_container_sas

    common: dict[str, Any] = {
        "permission": access.permission, "start": start, "expiry": expiry, "protocol": protocol, **credential,
    }  # fmt: skip
    if directory is None:
        token: str = generate_container_sas(account_name, container, **common)
        return token
    name = directory.strip("/")
    if not name:
        raise ValueError("a directory SAS needs a directory")
    token = generate_blob_sas(account_name, container, name, is_directory=True, **common)
    return token


def mint_with_account_key(
    endpoint: str,
    account_name: str,
    account_key: str,
    container: str,
    access: Access,
    start: datetime,
    expiry: datetime,
    directory: str | None = None,
) -> ContainerSas:
    """A service SAS for one container (or one directory of it), signed with the account key (the key itself
    never leaves here)."""
    protocol = allowed_protocol(endpoint)
    token = _generate(
        account_name, container, access, start, expiry, protocol, directory, account_key=account_key
    )
    return ContainerSas(container_url(endpoint, container), token, start, expiry)


def delegation_expiry(start: datetime, expiry: datetime) -> datetime:
    """A user delegation SAS cannot outlive its key, and Azure issues keys for at most 7 days."""
    return min(expiry, start + MAX_USER_DELEGATION)


def mint_with_user_delegation(
    endpoint: str,
    account_name: str,
    credential: TokenCredential,
    container: str,
    access: Access,
    start: datetime,
    expiry: datetime,
    directory: str | None = None,
) -> ContainerSas:
    """A user delegation SAS for clusters without account keys: the operator's workload identity (Entra ID)
    obtains a delegation key and signs with it. Needs the "Storage Blob Delegator" role plus data access."""
    from dtjob.azure.clients import blob_service_client

    expiry = delegation_expiry(start, expiry)
    service = blob_service_client(endpoint, credential)
    key = service.get_user_delegation_key(key_start_time=start, key_expiry_time=expiry)
    protocol = allowed_protocol(endpoint)
    token = _generate(
        account_name, container, access, start, expiry, protocol, directory, user_delegation_key=key
    )
    return ContainerSas(container_url(endpoint, container), token, start, expiry)


def workload_identity_credential(client_id: str | None = None) -> TokenCredential:
    """The credential AKS workload identity injects into the operator pod (federated token file + env)."""
    from azure.identity import DefaultAzureCredential

    from dtjob.azure.clients import client_options

    # Token requests (to Entra ID, or the node's metadata endpoint) get the same deadlines as storage calls.
    credential: TokenCredential = DefaultAzureCredential(
        managed_identity_client_id=client_id, workload_identity_client_id=client_id, **client_options()
    )
    return credential


def sas_secret(
    job_name: str,
    namespace: str,
    access: Access,
    sas: ContainerSas,
    issued_at: datetime,
    owner_reference: dict[str, Any],
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `<job>-sas-in` / `<job>-sas-out` Secret. Pods mount it; its files are `sas-token`, `container-url`
    and `expires-at`. Issue and expiry times are annotations too, so the operator can schedule rotation
    without reading the token."""
    labels = {**names.labels(job_name, "sas", f"sas-{access.value}"), **(extra_labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": sas_secret_name(job_name, access),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                ANNOTATION_ISSUED: format_time(issued_at),
                ANNOTATION_EXPIRES: format_time(sas.expiry),
            },
            "ownerReferences": [owner_reference],
        },
        "stringData": {
            SECRET_TOKEN_KEY: sas.token,
            SECRET_URL_KEY: sas.container_url,
            SECRET_EXPIRES_KEY: format_time(sas.expiry),
        },
    }


def secret_rotation_due(
    secret: dict[str, Any], now: datetime, fraction: float = DEFAULT_SAS_ROTATE_FRACTION
) -> bool:
    """Whether an existing SAS Secret (as read from the API) needs a new token; a Secret without the
    annotations (hand-edited, or from an older operator) is treated as due."""
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    try:
        issued = parse_time(annotations[ANNOTATION_ISSUED])
        expires = parse_time(annotations[ANNOTATION_EXPIRES])
    except (KeyError, ValueError):
        return True
    return rotation_due(issued, expires, now, fraction)
