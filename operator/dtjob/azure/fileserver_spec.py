"""The dtjob file server's requests, pure: its names and their rules, the account's and the share's request
bodies, the comparison with what exists, and one line from an ARM failure. dtjob.azure.fileserver makes the
calls (azure-mgmt-storage, azure-mgmt-network, azure-mgmt-containerservice). See docs/azure.md, "The file
server".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dtjob.azure.errors import arm_exit_code
from dtjob.contract.transfer_report import ExitCode

KIND = "FileStorage"
SKU = "Premium_LRS"  # NFS shares exist only on premium (SSD) FileStorage accounts
# Azure tag names may not contain '/', so the marker cannot be the dtjob.io/... label key.
TAG_KEY, TAG_VALUE = "dtjob-fileserver", "true"
TAGS = {TAG_KEY: TAG_VALUE, "managed-by": "dtjob"}
STORAGE_SERVICE = "Microsoft.Storage"
DEFAULT_SHARE = "datasets"
MIN_SIZE_GIB, MAX_SIZE_GIB = 100, 102_400  # a premium share's provisioned size
FILE_SUFFIX = "file.core.windows.net"
ACCOUNT_RE = re.compile(r"^[a-z0-9]{3,24}$")
SHARE_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
SUBNET_RE = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/"
    r"virtualNetworks/(?P<vnet>[^/]+)/subnets/(?P<subnet>[^/]+)$",
    re.IGNORECASE,
)
# 409 answers that mean "busy, try again": another operation on the subnet, an account still being
# provisioned, a share of the same name still being deleted.
BUSY_CODES = frozenset(
    {
        "AnotherOperationInProgress",
        "StorageAccountIsNotProvisioned",
        "ShareBeingDeleted",
        "OperationInProgress",
    }
)


USAGE = ExitCode.USAGE


class FileServerError(Exception):
    """A file server request that cannot be made or that Azure refused; `str()` is one line for the CLI,
    `exit_code` its exit status (by default 1: refused as things stand, e.g. a share in use)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)


@dataclass(frozen=True)
class FileServerSpec:
    account: str
    share: str = DEFAULT_SHARE
    size_gib: int = 1024
    location: str = ""
    subnet_ids: tuple[str, ...] = ()


def validate_names(account: str, share: str) -> None:
    """Raise FileServerError naming the CLI flag of a name Azure would refuse."""
    if not ACCOUNT_RE.match(account):
        raise FileServerError(f"--account: 3-24 lowercase letters and digits, got {account!r}", USAGE)
    if not SHARE_RE.match(share):
        raise FileServerError(
            f"--share: 3-63 lowercase letters, digits and single hyphens, starting and ending with a letter "
            f"or digit, got {share!r}",
            USAGE,
        )


def validate(spec: FileServerSpec) -> None:
    validate_names(spec.account, spec.share)
    if not MIN_SIZE_GIB <= spec.size_gib <= MAX_SIZE_GIB:
        raise FileServerError(
            f"--size-gib: a premium share is {MIN_SIZE_GIB}-{MAX_SIZE_GIB} GiB, got {spec.size_gib}", USAGE
        )
    for subnet in spec.subnet_ids:
        if not SUBNET_RE.match(subnet):
            raise FileServerError(
                f"--subnet-id: expected /subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.Network/"
                f"virtualNetworks/<vnet>/subnets/<subnet>, got {subnet!r}",
                USAGE,
            )


def _network_acls(subnet_ids: Iterable[str]) -> dict[str, Any]:
    return {
        "defaultAction": "Deny",
        "bypass": "AzureServices",
        "virtualNetworkRules": [{"id": s, "action": "Allow"} for s in subnet_ids],
        "ipRules": [],
    }


def account_body(spec: FileServerSpec) -> dict[str, Any]:
    """The ARM StorageAccount to create (the PUT body)."""
    validate(spec)
    return {
        "location": spec.location,
        "kind": KIND,
        "sku": {"name": SKU},
        "tags": dict(TAGS),
        "properties": {
            # NFS 4.1 on Azure Files carries no encryption in transit of its own, and the service refuses
            # NFS traffic on accounts that require secure transfer.
            "supportsHttpsTrafficOnly": False,
            "minimumTlsVersion": "TLS1_2",
            "allowBlobPublicAccess": False,
            "publicNetworkAccess": "Enabled",  # then narrowed to the subnets by networkAcls
            "networkAcls": _network_acls(spec.subnet_ids),
        },
    }


def share_body(spec: FileServerSpec) -> dict[str, Any]:
    """The ARM FileShare to create (the PUT body)."""
    validate(spec)
    return {
        "properties": {
            "enabledProtocols": "NFS",
            # The share's root is root's; NoRootSquash lets a pod running as root chown it once for the
            # stager's and the trainers' non-root users (docs/azure.md).
            "rootSquash": "NoRootSquash",
            "shareQuota": spec.size_gib,
        }
    }


def same_id(a: str, b: str) -> bool:
    return a.lower().rstrip("/") == b.lower().rstrip("/")


def account_patch(
    current: Mapping[str, Any], spec: FileServerSpec
) -> tuple[dict[str, Any] | None, list[str]]:
    """The PATCH that brings an existing account in line with spec, and what it changes; (None, []) when
    it already matches. Refuses an account that could never serve NFS (another kind or SKU)."""
    kind, sku = current.get("kind"), (current.get("sku") or {}).get("name")
    if kind != KIND or sku != SKU:
        raise FileServerError(
            f"--account: storage account {spec.account} exists as {kind} {sku}; NFS shares need {KIND} "
            f"{SKU}: choose another --account"
        )
    props = current.get("properties") or {}
    patch_props: dict[str, Any] = {}
    changes = []
    if props.get("supportsHttpsTrafficOnly", True):
        patch_props["supportsHttpsTrafficOnly"] = False
        changes.append("secure transfer required -> off (NFS needs it off)")
    acls = props.get("networkAcls") or {}
    rules = list(acls.get("virtualNetworkRules") or [])
    missing = [s for s in spec.subnet_ids if not any(same_id(str(r.get("id")), s) for r in rules)]
    if missing or acls.get("defaultAction") != "Deny":
        # A PATCH replaces networkAcls whole: everything set by hand (IP rules, resource access rules, other
        # subnets) is carried over.
        patch_props["networkAcls"] = {
            **acls,
            "defaultAction": "Deny",
            "bypass": acls.get("bypass") or "AzureServices",
            "virtualNetworkRules": rules + [{"id": s, "action": "Allow"} for s in missing],
        }
        if acls.get("defaultAction") != "Deny":
            changes.append("network default action -> Deny")
        changes += [f"network rule for subnet {s.rsplit('/', 1)[-1]} added" for s in missing]
    tags = dict(current.get("tags") or {})
    patch: dict[str, Any] = {}
    if any(tags.get(k) != v for k, v in TAGS.items()):
        patch["tags"] = {**tags, **TAGS}
        changes.append(f"tag {TAG_KEY}={TAG_VALUE} added")
    if patch_props:
        patch["properties"] = patch_props
    return (patch or None), changes


def share_patch(current: Mapping[str, Any], spec: FileServerSpec) -> tuple[dict[str, Any] | None, list[str]]:
    """The PATCH that brings an existing share in line with spec (quota, root squash), and what it
    changes; refuses an SMB share (the protocol is fixed at creation)."""
    props = current.get("properties") or {}
    if props.get("enabledProtocols", "SMB") != "NFS":
        raise FileServerError(
            f"--share: share {spec.share} of {spec.account} exists as an "
            f"{props.get('enabledProtocols', 'SMB')} share; the protocol cannot change: choose another "
            f"--share"
        )
    patch_props: dict[str, Any] = {}
    changes = []
    if props.get("shareQuota") != spec.size_gib:
        patch_props["shareQuota"] = spec.size_gib
        changes.append(f"size {props.get('shareQuota')} GiB -> {spec.size_gib} GiB")
    if props.get("rootSquash") != "NoRootSquash":
        patch_props["rootSquash"] = "NoRootSquash"
        changes.append(f"root squash {props.get('rootSquash')} -> NoRootSquash")
    return ({"properties": patch_props} if patch_props else None), changes


def subnet_with_storage_endpoint(subnet: Mapping[str, Any]) -> dict[str, Any] | None:
    """The subnet (as read) with the Microsoft.Storage service endpoint added, for a PUT; None when it has
    one already. Everything else is carried over, so the PUT changes nothing but the endpoint."""
    props = dict(subnet.get("properties") or {})
    endpoints = list(props.get("serviceEndpoints") or [])
    if any(str(e.get("service")).lower() == STORAGE_SERVICE.lower() for e in endpoints):
        return None
    props["serviceEndpoints"] = [*endpoints, {"service": STORAGE_SERVICE}]
    return {**subnet, "properties": props}


def file_host(account: Mapping[str, Any] | None, name: str) -> str:
    """The NFS server name of an account: its file endpoint's host (other clouds have other suffixes)."""
    endpoint = str(
        (((account or {}).get("properties") or {}).get("primaryEndpoints") or {}).get("file") or ""
    )
    match = re.match(r"^https?://([^/:]+)", endpoint)
    return match.group(1) if match else f"{name}.{FILE_SUFFIX}"


def is_fileserver(account: Mapping[str, Any]) -> bool:
    return account.get("kind") == KIND and (account.get("tags") or {}).get(TAG_KEY) == TAG_VALUE


def resource_group_of(resource_id: str) -> str:
    match = re.search(r"/resourceGroups/([^/]+)/", resource_id, re.IGNORECASE)
    return match.group(1) if match else ""


def explain_arm_error(err: Exception, action: str) -> FileServerError:
    """One line from an ARM failure, naming the operation, with a next step for the usual ones."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    if isinstance(err, FileServerError):
        return err
    if isinstance(err, ClientAuthenticationError) and err.status_code is None:
        return FileServerError(
            f"{action}: no Azure credentials ({err.message.splitlines()[0]}); run `az login`", ExitCode.DENIED
        )
    if not isinstance(err, HttpResponseError):
        return FileServerError(f"{action}: {type(err).__name__}: {err}", ExitCode.STORAGE)
    code = err.error.code if err.error is not None and err.error.code else None
    message = err.error.message if err.error is not None and err.error.message else (err.message or "")
    message = " ".join(message.split())
    status = f"{err.status_code} {code}" if err.status_code else (code or "failed")
    if err.status_code in (200, 201, 202):  # the operation's status was read fine: the operation failed
        status = f"the operation failed: {code or 'no error code'}"
    hint = ""
    if code in ("StorageAccountAlreadyTaken", "StorageAccountAlreadyExists"):
        hint = " Account names are global across Azure: choose another --account (or -g, if it is yours)."
    elif err.status_code == 404:
        hint = " Check --subscription, --resource-group and --cluster."
    elif err.status_code == 403:
        hint = (
            " Your identity needs Storage Account Contributor on the resource group and Network Contributor "
            "on the cluster's subnet."
        )
    return FileServerError(f"{action}: {status}: {message}{hint}", arm_exit_code(err.status_code))
