"""Which storage accounts, containers and workload-identity client IDs a namespace's jobs may use.

The operator signs SAS tokens with its own Azure identity (workloadIdentity) or with keys users hand it, so
what a job may reach is the installer's decision, not the job author's. Pure: no I/O.

Three allowlists, each a comma-separated list where `*` means any:
- cluster-wide defaults, from the operator's environment (Helm `storagePolicy`):
  DTJOB_ALLOWED_STORAGE_ACCOUNTS (default: none), DTJOB_ALLOWED_STORAGE_CONTAINERS (default: `*`),
  DTJOB_ALLOWED_CLIENT_IDS (default: none);
- per namespace, annotations on the Namespace, each replacing its cluster-wide list for that namespace:
  `dtjob.io/storage-accounts`, `dtjob.io/storage-containers`, `dtjob.io/client-ids`.

Namespaces are cluster-scoped: the built-in admin and edit roles do not let a namespace's users annotate
their own Namespace, so only cluster administrators widen what a namespace may use. With the defaults no job
may use storage until the installer names accounts, and no job may pick a client ID other than the
operator's own identity (credentials without clientId) until the installer names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dtjob.storage_spec import AuthMode, BlobLocation

ANY = "*"
ANNOTATION_ACCOUNTS = "dtjob.io/storage-accounts"
ANNOTATION_CONTAINERS = "dtjob.io/storage-containers"
ANNOTATION_CLIENT_IDS = "dtjob.io/client-ids"
ENV_ACCOUNTS = "DTJOB_ALLOWED_STORAGE_ACCOUNTS"
ENV_CONTAINERS = "DTJOB_ALLOWED_STORAGE_CONTAINERS"
ENV_CLIENT_IDS = "DTJOB_ALLOWED_CLIENT_IDS"
DEFAULTS = {ENV_ACCOUNTS: "", ENV_CONTAINERS: ANY, ENV_CLIENT_IDS: ""}


@dataclass(frozen=True)
class Allowlist:
    entries: frozenset[str]  # lowercase; ANY admits everything
    source: str  # where the list was set, for messages

    def allows(self, value: str) -> bool:
        return ANY in self.entries or value.lower() in self.entries

    def describe(self) -> str:
        shown = ", ".join(sorted(self.entries)) if self.entries else "none"
        return f"allowed: {shown} ({self.source})"


@dataclass(frozen=True)
class StoragePolicy:
    accounts: Allowlist
    containers: Allowlist
    client_ids: Allowlist


@dataclass(frozen=True)
class Violation:
    path: str  # the field, e.g. spec.output.credentials.clientId
    message: str


def parse_list(text: str) -> frozenset[str]:
    return frozenset(item.strip().lower() for item in text.split(",") if item.strip())


def cluster_policy(env: Mapping[str, str]) -> StoragePolicy:
    """The installer's cluster-wide lists (unset variables take DEFAULTS)."""

    def from_env(name: str) -> Allowlist:
        return Allowlist(parse_list(env.get(name, DEFAULTS[name])), f"operator setting {name}")

    return StoragePolicy(from_env(ENV_ACCOUNTS), from_env(ENV_CONTAINERS), from_env(ENV_CLIENT_IDS))


def namespace_policy(cluster: StoragePolicy, namespace: str, annotations: Mapping[str, str]) -> StoragePolicy:
    """The lists that apply in `namespace`: each annotation present replaces the cluster-wide list."""

    def pick(default: Allowlist, key: str) -> Allowlist:
        if key not in annotations:
            return default
        return Allowlist(parse_list(annotations[key]), f"annotation {key} on Namespace {namespace}")

    return StoragePolicy(
        pick(cluster.accounts, ANNOTATION_ACCOUNTS),
        pick(cluster.containers, ANNOTATION_CONTAINERS),
        pick(cluster.client_ids, ANNOTATION_CLIENT_IDS),
    )


def check_location(
    policy: StoragePolicy, namespace: str, location: BlobLocation, path: str
) -> Violation | None:
    """Whether a job in `namespace` may have the operator sign for `location` (`path`: its spec field)."""
    if not policy.accounts.allows(location.account_name):
        return Violation(
            f"{path}.account",
            f"storage account {location.account_name!r} is not allowed in namespace {namespace} "
            f"({policy.accounts.describe()})",
        )
    if not policy.containers.allows(location.container):
        return Violation(
            f"{path}.container",
            f"container {location.container!r} is not allowed in namespace {namespace} "
            f"({policy.containers.describe()})",
        )
    creds = location.credentials
    explicit_id = creds.client_id if creds.auth_mode is AuthMode.WORKLOAD_IDENTITY else None
    if explicit_id is not None and not policy.client_ids.allows(explicit_id):
        return Violation(
            f"{path}.credentials.clientId",
            f"client ID {explicit_id} is not allowed in namespace {namespace} "
            f"({policy.client_ids.describe()}); omit clientId to use the operator's own identity",
        )
    return None


def check_locations(
    policy: StoragePolicy, namespace: str, locations: Iterable[tuple[BlobLocation, str]]
) -> Violation | None:
    """The first location the policy refuses, or None."""
    for location, path in locations:
        violation = check_location(policy, namespace, location, path)
        if violation is not None:
            return violation
    return None
