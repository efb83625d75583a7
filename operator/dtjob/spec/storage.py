"""Parse and validate the Blob Storage sections of a job's spec: `spec.dataset.stageFrom` and `spec.output`.

Pure: no I/O. Defaults are applied in memory. Every error is a dtjob.spec.reader.SpecError naming the field
it is about, like the rest of the spec's:

    dataset:
      stageFrom:
        account: mystorage                 # or endpoint: https://mystorage.blob.core.usgovcloudapi.net
        container: imagenet
        prefix: ilsvrc2012                 # a virtual directory; empty = the whole container
        destination: /data/imagenet        # inside the data volume's mountPath; default spec.dataset.dataDir
        concurrency: 16
        sasLifetimeSeconds: 21600
        credentials:
          authMode: accountKey             # or workloadIdentity
          secretRef: {name: storage-key, key: azurestorageaccountkey}
    output:
      account: mystorage
      container: results
      prefix: resnet50
      credentials: {authMode: workloadIdentity, clientId: 00000000-0000-0000-0000-000000000000}
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from dtjob.spec.reader import Reader, SpecError
from dtjob.spec.validators import BLOB_PREFIX, DESTINATION, PATH_MAX

ACCOUNT_RE = re.compile(r"^[a-z0-9]{3,24}$")
# RE2-compatible (no lookarounds), so the CRD schema can use the same pattern; length is checked apart.
CONTAINER_RE = re.compile(r"^[a-z0-9]([a-z0-9]|-[a-z0-9])*$")
SECRET_NAME_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
PUBLIC_BLOB_SUFFIX = "blob.core.windows.net"
# Blob Storage's own DNS suffixes: public Azure, US Government, Azure China, and the public cloud's DNS zone
# endpoints (`<account>.z<NN>.blob.storage.azure.net`). The operator sends its workload identity's bearer
# token (and account-key signed requests) to the endpoint, so it accepts no other host except an emulator.
# The dfs (Data Lake) endpoints are not accepted: the operator and the pods speak the Blob API, which
# hierarchical-namespace accounts serve on their blob endpoint too.
AZURE_BLOB_SUFFIXES = ("blob.core.windows.net", "blob.core.usgovcloudapi.net", "blob.core.chinacloudapi.cn")
AZURE_BLOB_HOST_RE = re.compile(
    r"^([a-z0-9]{3,24})\.(blob\.core\.windows\.net|blob\.core\.usgovcloudapi\.net|"
    r"blob\.core\.chinacloudapi\.cn|z[0-9]{2}\.blob\.storage\.azure\.net)$"
)
# The CRD's pattern for `endpoint` (RE2): an https Azure Blob endpoint, or a path-style emulator endpoint
# (`http://host:port/<account>`). Whether the emulator host is allowed (loopback or DTJOB_EMULATOR_HOSTS) only
# the operator knows; it refuses any other host.
ENDPOINT_PATTERN = (
    r"^(https://[a-z0-9]{3,24}\.(blob\.core\.windows\.net|blob\.core\.usgovcloudapi\.net|"
    r"blob\.core\.chinacloudapi\.cn|z[0-9]{2}\.blob\.storage\.azure\.net)/?"
    r"|https?://[^/?#@]+/[a-z0-9]{3,24}/?)$"
)
DEFAULT_ACCOUNT_KEY_KEY = "azurestorageaccountkey"  # the key name AKS's azure-file Secrets use
DEFAULT_CONCURRENCY = 16
MAX_CONCURRENCY = 256
DEFAULT_SAS_LIFETIME_S = 6 * 3600
# How long the results upload retries while storage refuses, by default and at most (spec.output).
DEFAULT_UPLOAD_RETRY_SECONDS = 600
MAX_UPLOAD_RETRY_SECONDS = 24 * 3600
MIN_SAS_LIFETIME_S = 300  # rotation at 80% must leave the kubelet time to refresh mounted files
MAX_SAS_LIFETIME_S = 7 * 24 * 3600  # a user delegation key lives at most 7 days (dtjob.azure.sas)
MAX_PREFIX_LENGTH = 1024
# The run's path after the output prefix, <namespace>/<job>/<uid>/logs/attempt-<n>/<pod>.log, takes up to
# 63+45+36+4+16+67 characters and 6 slashes: 768 leaves room under Azure's 1024-character blob names.
MAX_OUTPUT_PREFIX_LENGTH = 768
MAX_OUTPUT_PREFIX_SEGMENTS = 254 - 6
_LOOPBACK_NAMES = {"localhost"}


class AuthMode(StrEnum):
    ACCOUNT_KEY = "accountKey"
    WORKLOAD_IDENTITY = "workloadIdentity"


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = DEFAULT_ACCOUNT_KEY_KEY


@dataclass(frozen=True)
class Credentials:
    auth_mode: AuthMode
    secret_ref: SecretKeyRef | None = None  # accountKey: where the operator reads the key
    # workloadIdentity: a user-assigned identity's client ID; None = the operator's own identity.
    client_id: str | None = None


@dataclass(frozen=True)
class BlobLocation:
    endpoint: str  # the account's blob endpoint, no trailing slash
    account_name: str
    container: str
    prefix: str  # no leading or trailing slash; empty = the whole container
    credentials: Credentials
    sas_lifetime: timedelta

    @property
    def container_url(self) -> str:
        return f"{self.endpoint}/{self.container}"

    @property
    def is_local(self) -> bool:
        return is_loopback_host(urlsplit(self.endpoint).hostname or "")


@dataclass(frozen=True)
class StageFrom:
    source: BlobLocation
    destination: str | None  # absolute path inside the data volume; None = spec.dataset.dataDir
    concurrency: int


@dataclass(frozen=True)
class Output:
    target: BlobLocation
    # How long the results upload keeps retrying while storage refuses (dtjob.contract.results_upload).
    upload_retry_seconds: int = DEFAULT_UPLOAD_RETRY_SECONDS


def is_loopback_host(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_emulator_host(host: str, emulator_hosts: Collection[str] = ()) -> bool:
    """Loopback, or a host the operator's installer named as a Blob Storage emulator (Azurite)."""
    return is_loopback_host(host) or host in emulator_hosts


def parse_endpoint(endpoint: str, path: str, emulator_hosts: Collection[str] = ()) -> tuple[str, str]:
    """(normalized endpoint, the account it names).

    Only two kinds of endpoint: an Azure Blob endpoint (`https://<account>.blob.core.windows.net` and the
    sovereign clouds' suffixes, AZURE_BLOB_HOST_RE), https only, no port, no path; or an emulator on loopback
    or on one of `emulator_hosts` (the operator's DTJOB_EMULATOR_HOSTS, e.g. an in-cluster Azurite), http or
    https, path-style (`http://127.0.0.1:10000/devstoreaccount1` carries the account in the path). Any other
    host is refused: the operator would send it a bearer token or account-key signed requests."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        raise SpecError(path, f"must be an https:// URL, got {endpoint!r}")
    if parts.query or parts.fragment:
        raise SpecError(path, "must not carry a query (put no SAS in the spec) or fragment")
    if parts.username or parts.password:
        raise SpecError(path, "must not carry credentials")
    segments = [s for s in parts.path.split("/") if s]
    azure = AZURE_BLOB_HOST_RE.match(host)
    if azure is not None:
        if parts.scheme != "https":
            raise SpecError(path, f"must use https, got {endpoint!r}")
        if parts.netloc != host or segments:
            raise SpecError(
                path, f"must be the account's endpoint in lowercase, without port or path: https://{host}"
            )
        return f"https://{host}", azure.group(1)
    if not is_emulator_host(host, emulator_hosts):
        hint = " (use the account's blob endpoint)" if ".dfs." in f".{host}" else ""
        raise SpecError(
            path,
            f"host {host!r} is not an Azure Blob Storage endpoint{hint}: use https://<account>."
            f"{{{','.join(AZURE_BLOB_SUFFIXES)}}} or https://<account>.zNN.blob.storage.azure.net; "
            "an emulator only on loopback or on a host the operator allows (DTJOB_EMULATOR_HOSTS)",
        )
    if len(segments) != 1 or not ACCOUNT_RE.match(segments[0]):
        raise SpecError(
            path, "an emulator endpoint names the account as its one path segment: http://host:port/<account>"
        )
    return f"{parts.scheme}://{parts.netloc}/{segments[0]}", segments[0]


def _credentials(r: Reader) -> Credentials:
    mode_raw = r.required_string("authMode")
    try:
        mode = AuthMode(mode_raw)
    except ValueError:
        allowed = ", ".join(m.value for m in AuthMode)
        raise SpecError(r.at("authMode"), f"must be one of {allowed}, got {mode_raw!r}") from None
    if mode is AuthMode.ACCOUNT_KEY:
        if "clientId" in r.data:
            raise SpecError(r.at("clientId"), "applies only to authMode workloadIdentity")
        if not r.has("secretRef"):
            raise SpecError(r.at("secretRef"), "is required for authMode accountKey")
        ref = r.child("secretRef")
        name = ref.required_string("name")
        if not SECRET_NAME_RE.fullmatch(name):
            raise SpecError(ref.at("name"), f"is not a valid Secret name: {name!r}")
        key = ref.string("key") or DEFAULT_ACCOUNT_KEY_KEY
        if not SECRET_KEY_RE.fullmatch(key):
            raise SpecError(ref.at("key"), f"is not a valid Secret key: {key!r}")
        return Credentials(mode, secret_ref=SecretKeyRef(name, key))
    if "secretRef" in r.data:
        raise SpecError(r.at("secretRef"), "applies only to authMode accountKey")
    # Set but empty is refused as the CRD's pattern refuses it: an empty string is no UUID.
    client_id = r.string("clientId")
    if client_id is not None and not UUID_RE.match(client_id):
        raise SpecError(r.at("clientId"), f"must be a client ID (a UUID), got {client_id!r}")
    return Credentials(mode, client_id=client_id)


def _location(r: Reader, emulator_hosts: Collection[str]) -> BlobLocation:
    account = r.string("account") or None
    endpoint_raw = r.string("endpoint") or None
    if account is not None and not ACCOUNT_RE.match(account):
        raise SpecError(r.at("account"), f"must be 3-24 lowercase letters and digits, got {account!r}")
    if endpoint_raw is None:
        if account is None:
            raise SpecError(r.path, "set account (public Azure) or endpoint (sovereign clouds, emulators)")
        endpoint, account_name = f"https://{account}.{PUBLIC_BLOB_SUFFIX}", account
    else:
        endpoint, account_name = parse_endpoint(endpoint_raw, r.at("endpoint"), emulator_hosts)
        if account is not None and account != account_name:
            raise SpecError(
                r.at("account"), f"{account!r} does not match endpoint's account {account_name!r}"
            )
    container = r.required_string("container")
    if not (3 <= len(container) <= 63 and CONTAINER_RE.match(container)):
        raise SpecError(
            r.at("container"),
            f"must be 3-63 lowercase letters, digits and single hyphens, starting with a letter or digit; "
            f"got {container!r}",
        )
    raw_prefix = r.string("prefix") or ""
    if len(raw_prefix) > MAX_PREFIX_LENGTH:
        raise SpecError(r.at("prefix"), f"must be at most {MAX_PREFIX_LENGTH} characters")
    if not re.fullmatch(BLOB_PREFIX, raw_prefix):
        raise SpecError(r.at("prefix"), f"must not contain empty, '.' or '..' segments: {raw_prefix!r}")
    prefix = raw_prefix.strip("/")
    if not r.has("credentials"):
        raise SpecError(r.at("credentials"), "is required (authMode accountKey or workloadIdentity)")
    credentials = _credentials(r.child("credentials"))
    lifetime = r.bounded("sasLifetimeSeconds", DEFAULT_SAS_LIFETIME_S, MIN_SAS_LIFETIME_S, MAX_SAS_LIFETIME_S)
    return BlobLocation(endpoint, account_name, container, prefix, credentials, timedelta(seconds=lifetime))


def parse_stage_from(
    raw: Any, path: str = "spec.dataset.stageFrom", emulator_hosts: Collection[str] = ()
) -> StageFrom | None:
    """`spec.dataset.stageFrom`, or None when absent."""
    if raw is None:
        return None
    r = Reader(raw, path)
    source = _location(r, emulator_hosts)
    # Set but empty is refused below, as the CRD's pattern refuses it.
    destination = r.string("destination")
    if destination is not None:
        if len(destination) > PATH_MAX or not re.fullmatch(DESTINATION, destination):
            raise SpecError(
                r.at("destination"),
                f"must be an absolute path without empty, '.' or '..' segments; got {destination!r}",
            )
        destination = posixpath.normpath(destination)
    concurrency = r.bounded("concurrency", DEFAULT_CONCURRENCY, 1, MAX_CONCURRENCY)
    return StageFrom(source, destination, concurrency)


def parse_output(raw: Any, path: str = "spec.output", emulator_hosts: Collection[str] = ()) -> Output | None:
    """`spec.output`, or None when absent."""
    if raw is None:
        return None
    r = Reader(raw, path)
    retry = r.bounded("uploadRetrySeconds", DEFAULT_UPLOAD_RETRY_SECONDS, 0, MAX_UPLOAD_RETRY_SECONDS)
    output = Output(_location(r, emulator_hosts), retry)
    # Blob names are at most 1024 characters and 254 segments: leave room for the run's own path.
    prefix = output.target.prefix
    if len(r.string("prefix") or "") > MAX_OUTPUT_PREFIX_LENGTH:
        raise SpecError(
            r.at("prefix"),
            f"must be at most {MAX_OUTPUT_PREFIX_LENGTH} characters (blob names are at most 1024 characters, "
            "and the run's <namespace>/<job>/<uid>/logs/... path follows the prefix)",
        )
    if prefix and prefix.count("/") + 1 > MAX_OUTPUT_PREFIX_SEGMENTS:
        raise SpecError(
            r.at("prefix"),
            f"must have at most {MAX_OUTPUT_PREFIX_SEGMENTS} segments (blob names have at most 254, and the "
            "run's own path adds up to 6)",
        )
    return output


def resolve_destination(stage: StageFrom, mount_path: str, data_dir: str) -> str:
    """Where the stager writes: `destination`, else the dataset's dataDir; it must lie inside the data
    volume's mountPath, since the stager sees only that volume."""
    target = stage.destination or posixpath.normpath(data_dir)
    mount = posixpath.normpath(mount_path)
    if target != mount and not target.startswith(mount.rstrip("/") + "/"):
        raise SpecError(
            "spec.dataset.stageFrom.destination" if stage.destination else "spec.dataset.dataDir",
            f"{target!r} is outside the data volume's mountPath {mount!r}",
        )
    return target
