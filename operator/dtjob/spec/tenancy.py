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

Writing is what can poison another team's data, and a container a team writes holds its results, so:
- nothing is writable until a write list names it;
- a container that any read list names (a shared dataset such as `imagenet`), the cluster-wide one or any
  namespace's own, is not reached by a `*` in a write list: only its own name in a write list makes it
  writable;
- a container that any write list names belongs to its writers: the namespaces whose write list names it
  (literally or through `{namespace}`), a namespace without its own annotation using the cluster-wide list.
  A `*`, in a read list or a write list, never reaches it from another namespace; naming it does;
- a namespace may read what it may write.
A container the cluster-wide write list names literally is written by every namespace that uses that list:
`results-{namespace}` is what keeps teams apart.

The rules that look beyond the job's own namespace need every namespace's own lists: ClusterView, built from
every Namespace's annotations.

Namespaces are cluster-scoped: the built-in admin and edit roles do not let a namespace's users annotate
their own Namespace, so only cluster administrators widen what a namespace may use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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

    def names_for_all(self, value: str) -> bool:
        """Whether an entry without `{namespace}` names `value`: the same container in every namespace."""
        return value.lower() in {e for e in self.entries if e != ANY and NAMESPACE_PLACEHOLDER not in e}

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
class ClusterView:
    """The container lists of the namespaces that set their own (by annotation), namespace -> list: who else
    reads or writes a container. Every other namespace uses the cluster-wide list."""

    read: Mapping[str, Allowlist] = field(default_factory=dict)
    write: Mapping[str, Allowlist] = field(default_factory=dict)


@dataclass(frozen=True)
class StoragePolicy:
    accounts: Allowlist
    read_containers: Allowlist
    write_containers: Allowlist
    client_ids: Allowlist
    # The cluster-wide container lists, which say for every namespace which containers are shared or owned.
    cluster_read_containers: Allowlist | None = None
    cluster_write_containers: Allowlist | None = None
    view: ClusterView = field(default_factory=ClusterView)  # what the other namespaces read and write


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


def namespace_policy(
    cluster: StoragePolicy, namespace: str, annotations: Mapping[str, str], view: ClusterView | None = None
) -> StoragePolicy:
    """The lists that apply in `namespace`: each annotation present replaces the cluster-wide list. `view`:
    every namespace's own container lists (cluster_view); None: no namespace sets any."""

    def pick(default: Allowlist, key: str, former: str | None = None) -> Allowlist:
        own = _own_list(namespace, annotations, key, former)
        return default if own is None else own

    return StoragePolicy(
        pick(cluster.accounts, ANNOTATION_ACCOUNTS),
        pick(cluster.read_containers, ANNOTATION_READ_CONTAINERS, ANNOTATION_CONTAINERS),
        pick(cluster.write_containers, ANNOTATION_WRITE_CONTAINERS),
        pick(cluster.client_ids, ANNOTATION_CLIENT_IDS),
        cluster.cluster_read_containers or cluster.read_containers,
        cluster.cluster_write_containers or cluster.write_containers,
        view or ClusterView(),
    )


def cluster_view(namespaces: Iterable[tuple[str, Mapping[str, str]]]) -> ClusterView:
    """The container lists that namespaces set for themselves, from every Namespace's (name, annotations)."""
    read: dict[str, Allowlist] = {}
    write: dict[str, Allowlist] = {}
    for name, set_on_it in namespaces:
        own_read = _own_list(name, set_on_it, ANNOTATION_READ_CONTAINERS, ANNOTATION_CONTAINERS)
        own_write = _own_list(name, set_on_it, ANNOTATION_WRITE_CONTAINERS)
        if own_read is not None:
            read[name] = own_read
        if own_write is not None:
            write[name] = own_write
    return ClusterView(read, write)


def _own_list(
    namespace: str, annotations: Mapping[str, str], key: str, former: str | None = None
) -> Allowlist | None:
    """The list the Namespace's annotation `key` (or its `former` name) sets, or None when it sets none."""
    if key not in annotations and former is not None and former in annotations:
        key = former
    if key not in annotations:
        return None
    return Allowlist(parse_list(annotations[key]), f"annotation {key} on Namespace {namespace}")


def container_refusal(policy: StoragePolicy, namespace: str, container: str, use: Use) -> str | None:
    """Why a job in `namespace` may not `use` `container`, or None."""
    read, write = policy.read_containers, policy.write_containers
    if write.names(container, namespace) or (use is Use.READ and read.names(container, namespace)):
        return None
    star = write if use is Use.WRITE else read  # only a `*` can still admit it
    if not star.has_any:
        able = "writable" if use is Use.WRITE else "readable"
        return f"container {container!r} is not {able} in namespace {namespace} ({star.describe()})"
    readers = _read_by(policy, namespace, container) if use is Use.WRITE else None
    if readers is not None:
        return (
            f"container {container!r} is read by jobs ({readers}), so a `*` in the write list does not make "
            f"it writable in namespace {namespace}; name it in the write list to allow that "
            f"({write.describe()})"
        )
    cluster_write = policy.cluster_write_containers
    writers = _others_naming(policy.view.write, cluster_write, namespace, container, "write")
    if writers is None:
        return None
    return (
        f"container {container!r} is written by another namespace ({writers}), so a `*` in the {use.value} "
        f"list does not reach it from namespace {namespace}; name it in the {use.value} list to allow that "
        f"({star.describe()})"
    )


def _read_by(policy: StoragePolicy, namespace: str, container: str) -> str | None:
    """Which read list names `container` (a shared dataset), or None."""
    for listed in (policy.read_containers, policy.cluster_read_containers):
        if listed is not None and listed.names(container, namespace):
            return f"{listed.source} names it"
    return _others_naming(policy.view.read, policy.cluster_read_containers, namespace, container, "read")


def _others_naming(
    own_lists: Mapping[str, Allowlist], cluster: Allowlist | None, namespace: str, container: str, use: str
) -> str | None:
    """Why the `use` list of a namespace other than `namespace` names `container`, or None: its own list
    (`own_lists`), or the cluster-wide one, which every namespace without its own uses; a `{namespace}` entry
    there keeps its container for that namespace even while the namespace sets a list of its own. Never
    which namespace's annotation names it: that is another team's setup."""
    if any(listed.names(container, other) for other, listed in own_lists.items() if other != namespace):
        return f"another namespace's own {use} list names it"
    if cluster is None:
        return None
    if cluster.names_for_all(container):
        return f"{cluster.source} names it, for every namespace without a {use} list of its own"
    owners = sorted(cluster.owner_namespaces(container) - {namespace})
    if owners:
        return f"it is namespace {owners[0]}'s own, by {cluster.source}"
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
