"""Which storage accounts, containers and workload-identity client IDs a namespace's jobs may use, and for
what: reading (`spec.dataset.stageFrom`) is not writing (`spec.output`).

The operator signs SAS tokens with its own Azure identity (workloadIdentity) or with keys users hand it, so
what a job may reach is the installer's decision, not the job author's. Pure: no I/O.

Five lists, each comma-separated:
- cluster-wide, from the operator's environment (Helm `storagePolicy`): DTJOB_ALLOWED_STORAGE_ACCOUNTS
  (default: none), DTJOB_READ_CONTAINERS (default: `*`; DTJOB_ALLOWED_STORAGE_CONTAINERS is its former
  name), DTJOB_WRITE_CONTAINERS (default: none), DTJOB_ALLOWED_CLIENT_IDS (default: none);
- per namespace, annotations on the Namespace, each replacing its cluster-wide list for that namespace:
  `dtjob.io/storage-accounts`, `dtjob.io/read-containers` (formerly `dtjob.io/storage-containers`),
  `dtjob.io/write-containers`, `dtjob.io/client-ids`.

`*` means any. A container entry may hold `{namespace}`, which stands for the job's namespace:
`results-{namespace}` gives every namespace a container of its own with one cluster-wide entry.

Writing is what can poison another team's data, so the write rules are strict:
- nothing is writable until a write list names it;
- a `*` in a write list never reaches a container that a read list names (a shared dataset such as
  `imagenet`): only the container's own name in a write list makes it writable;
- a `*` in a read list never reaches another namespace's own container (one a `{namespace}` write entry
  gives another namespace); naming it in a read list does;
- a namespace may read what it may write.

Namespaces are cluster-scoped: the built-in admin and edit roles do not let a namespace's users annotate
their own Namespace, so only cluster administrators widen what a namespace may use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from dtjob.spec.storage import AuthMode, BlobLocation

ANY = "*"
NAMESPACE_PLACEHOLDER = "{namespace}"
ANNOTATION_ACCOUNTS = "dtjob.io/storage-accounts"
ANNOTATION_READ_CONTAINERS = "dtjob.io/read-containers"
ANNOTATION_WRITE_CONTAINERS = "dtjob.io/write-containers"
ANNOTATION_CONTAINERS = "dtjob.io/storage-containers"  # the former name of dtjob.io/read-containers
ANNOTATION_CLIENT_IDS = "dtjob.io/client-ids"
ENV_ACCOUNTS = "DTJOB_ALLOWED_STORAGE_ACCOUNTS"
ENV_READ_CONTAINERS = "DTJOB_READ_CONTAINERS"
ENV_WRITE_CONTAINERS = "DTJOB_WRITE_CONTAINERS"
ENV_CONTAINERS = "DTJOB_ALLOWED_STORAGE_CONTAINERS"  # the former name of DTJOB_READ_CONTAINERS
ENV_CLIENT_IDS = "DTJOB_ALLOWED_CLIENT_IDS"
DEFAULTS = {ENV_ACCOUNTS: "", ENV_READ_CONTAINERS: ANY, ENV_WRITE_CONTAINERS: "", ENV_CLIENT_IDS: ""}
# A namespace is a DNS label: what `{namespace}` may stand for in a container name.
_NAMESPACE_PATTERN = "([a-z0-9]([-a-z0-9]*[a-z0-9])?)"


class Use(Enum):
    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class Allowlist:
    entries: frozenset[str]  # lowercase; ANY admits everything
    source: str  # where the list was set, for messages

    def allows(self, value: str, namespace: str = "") -> bool:
        return self.has_any or self.names(value, namespace)

    @property
    def has_any(self) -> bool:
        return ANY in self.entries

    def names(self, value: str, namespace: str) -> bool:
        """Whether an entry names `value` itself (not through `*`), `{namespace}` standing for `namespace`."""
        value = value.lower()
        return any(e != ANY and e.replace(NAMESPACE_PLACEHOLDER, namespace) == value for e in self.entries)

    def owner_namespaces(self, value: str) -> set[str]:
        """The namespaces whose own container `value` is, by a `{namespace}` entry."""
        owners: set[str] = set()
        for entry in self.entries:
            if NAMESPACE_PLACEHOLDER not in entry:
                continue
            pattern = re.escape(entry).replace(re.escape(NAMESPACE_PLACEHOLDER), _NAMESPACE_PATTERN)
            match = re.fullmatch(pattern, value.lower())
            if match is not None:
                owners.add(match.group(1))
        return owners

    def describe(self) -> str:
        shown = ", ".join(sorted(self.entries)) if self.entries else "none"
        return f"allowed: {shown} ({self.source})"


@dataclass(frozen=True)
class StoragePolicy:
    accounts: Allowlist
    read_containers: Allowlist
    write_containers: Allowlist
    client_ids: Allowlist
    # The cluster-wide container lists, which say for every namespace which containers are shared or owned.
    cluster_read_containers: Allowlist | None = None
    cluster_write_containers: Allowlist | None = None


@dataclass(frozen=True)
class Violation:
    path: str  # the field, e.g. spec.output.credentials.clientId
    message: str


def parse_list(text: str) -> frozenset[str]:
    return frozenset(item.strip().lower() for item in text.split(",") if item.strip())


def cluster_policy(env: Mapping[str, str]) -> StoragePolicy:
    """The installer's cluster-wide lists (unset variables take DEFAULTS)."""

    def from_env(name: str, former: str | None = None) -> Allowlist:
        if name not in env and former is not None and former in env:
            return Allowlist(parse_list(env[former]), f"operator setting {former}")
        return Allowlist(parse_list(env.get(name, DEFAULTS[name])), f"operator setting {name}")

    read = from_env(ENV_READ_CONTAINERS, ENV_CONTAINERS)
    write = from_env(ENV_WRITE_CONTAINERS)
    return StoragePolicy(from_env(ENV_ACCOUNTS), read, write, from_env(ENV_CLIENT_IDS), read, write)


def namespace_policy(cluster: StoragePolicy, namespace: str, annotations: Mapping[str, str]) -> StoragePolicy:
    """The lists that apply in `namespace`: each annotation present replaces the cluster-wide list."""

    def pick(default: Allowlist, key: str, former: str | None = None) -> Allowlist:
        if key not in annotations and former is not None and former in annotations:
            key = former
        if key not in annotations:
            return default
        return Allowlist(parse_list(annotations[key]), f"annotation {key} on Namespace {namespace}")

    return StoragePolicy(
        pick(cluster.accounts, ANNOTATION_ACCOUNTS),
        pick(cluster.read_containers, ANNOTATION_READ_CONTAINERS, ANNOTATION_CONTAINERS),
        pick(cluster.write_containers, ANNOTATION_WRITE_CONTAINERS),
        pick(cluster.client_ids, ANNOTATION_CLIENT_IDS),
        cluster.cluster_read_containers or cluster.read_containers,
        cluster.cluster_write_containers or cluster.write_containers,
    )


def container_refusal(policy: StoragePolicy, namespace: str, container: str, use: Use) -> str | None:
    """Why a job in `namespace` may not `use` `container`, or None."""
    read, write = policy.read_containers, policy.write_containers
    shared_read = [lst for lst in (read, policy.cluster_read_containers) if lst is not None]
    if use is Use.WRITE:
        if write.names(container, namespace):
            return None
        if not write.has_any:
            return f"container {container!r} is not writable in namespace {namespace} ({write.describe()})"
        for listed in shared_read:
            if listed.names(container, namespace):
                return (
                    f"container {container!r} is read by jobs ({listed.source} names it), so a `*` in the "
                    f"write list does not make it writable in namespace {namespace}; name it in the write "
                    f"list to allow that ({write.describe()})"
                )
        return None
    if write.names(container, namespace) or read.names(container, namespace):
        return None
    if not read.has_any:
        return f"container {container!r} is not readable in namespace {namespace} ({read.describe()})"
    owners: set[str] = set()
    for owning in (write, policy.cluster_write_containers):
        if owning is not None:
            owners |= owning.owner_namespaces(container)
    others = sorted(owners - {namespace})
    if others:
        return (
            f"container {container!r} is namespace {others[0]}'s own output container, so a `*` in the read "
            f"list does not reach it from namespace {namespace}; name it in the read list to allow that "
            f"({read.describe()})"
        )
    return None


def check_location(
    policy: StoragePolicy, namespace: str, location: BlobLocation, path: str, use: Use = Use.READ
) -> Violation | None:
    """Whether a job in `namespace` may have the operator sign for `location` (`path`: its spec field), to
    read from it or to write to it."""
    if not policy.accounts.allows(location.account_name):
        return Violation(
            f"{path}.account",
            f"storage account {location.account_name!r} is not allowed in namespace {namespace} "
            f"({policy.accounts.describe()})",
        )
    refused = container_refusal(policy, namespace, location.container, use)
    if refused is not None:
        return Violation(f"{path}.container", refused)
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
    policy: StoragePolicy, namespace: str, locations: Iterable[tuple[BlobLocation, str, Use]]
) -> Violation | None:
    """The first location the policy refuses, or None."""
    for location, path, use in locations:
        violation = check_location(policy, namespace, location, path, use)
        if violation is not None:
            return violation
    return None
