"""The dtjob file server: a Premium FileStorage account with an NFS 4.1 share that the AKS nodes' subnets
reach through a service endpoint. The calls (azure-mgmt-storage, azure-mgmt-network,
azure-mgmt-containerservice); the request bodies and the comparison with what exists are
dtjob.azure.fileserver_spec's (pure).

Every step reads first and writes only what differs, so a second `create` with the same arguments sends no
write at all. See docs/azure.md, "The file server".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtjob.azure.fileserver_spec import (
    BUSY_CODES,
    KIND,
    SKU,
    STORAGE_SERVICE,
    SUBNET_RE,
    USAGE,
    FileServerError,
    FileServerSpec,
    account_body,
    account_patch,
    explain_arm_error,
    file_host,
    is_fileserver,
    resource_group_of,
    same_id,
    share_body,
    share_patch,
    subnet_with_storage_endpoint,
    validate,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.pipeline.transport import HttpTransport


ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class ShareInfo:
    account: str
    resource_group: str
    location: str
    share: str
    size_gib: int | None
    protocol: str
    server: str

    @property
    def path(self) -> str:
        return f"/{self.account}/{self.share}"


@dataclass
class FileServers:
    """File server operations in one resource group. `transport`, `polling_interval` and `busy_wait_s`
    exist for tests; by default the SDK's own transport and ARM's Retry-After pacing are used."""

    subscription_id: str
    resource_group: str
    credential: TokenCredential
    transport: HttpTransport[Any, Any] | None = None
    polling_interval: float | None = None
    progress: ProgressFn = lambda _line: None
    busy_retries: int = 6
    busy_wait_s: float = 10.0
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    def _options(self) -> dict[str, Any]:
        from dtjob.azure.clients import Deadlines, client_options

        # Each ARM request: 10 s to connect, 60 s for an answer, four more tries on 408/429/5xx (honouring
        # Retry-After); long-running operations pace their polls by ARM's Retry-After.
        kwargs: dict[str, Any] = client_options(Deadlines(connect_s=10, read_s=60, retries=4, backoff_s=2))
        if self.transport is not None:
            kwargs["transport"] = self.transport
        if self.polling_interval is not None:
            kwargs["polling_interval"] = self.polling_interval
        return kwargs

    def _client(self, kind: str, subscription_id: str | None = None) -> Any:
        subscription = subscription_id or self.subscription_id
        key = (kind, subscription)
        if key not in self._clients:
            try:
                if kind == "storage":
                    from azure.mgmt.storage import StorageManagementClient as Client
                elif kind == "network":
                    from azure.mgmt.network import NetworkManagementClient as Client  # type: ignore[assignment]
                else:
                    from azure.mgmt.containerservice import (  # type: ignore[assignment]
                        ContainerServiceClient as Client,
                    )
            except ImportError as err:  # the operator and stager images leave the management SDKs out
                raise FileServerError(f"{err.name} is not installed: pip install 'dtjob[azure]'") from err
            self._clients[key] = Client(self.credential, subscription, **self._options())
        return self._clients[key]

    # --- the cluster's network -------------------------------------------------------------------------

    def cluster_network(self, cluster: str, resource_group: str = "") -> tuple[str, tuple[str, ...]]:
        """The cluster's location and its node pools' subnets. A cluster on an AKS-managed VNet names no
        subnet in its pools: then the single subnet of the VNet in its node resource group."""
        clusters, group = self._client("aks").managed_clusters, resource_group or self.resource_group
        found = self._call(f"read cluster {group}/{cluster}", lambda: clusters.get(group, cluster).as_dict())
        props = found.get("properties") or {}
        subnets: list[str] = []
        for pool in props.get("agentPoolProfiles") or []:
            subnet = pool.get("vnetSubnetID")
            if subnet and not any(same_id(subnet, s) for s in subnets):
                subnets.append(subnet)
        if not subnets:
            subnets = self._managed_vnet_subnets(str(props.get("nodeResourceGroup") or ""), cluster)
        return str(found.get("location") or ""), tuple(subnets)

    def _managed_vnet_subnets(self, node_group: str, cluster: str) -> list[str]:
        networks = self._client("network").virtual_networks
        vnets = self._call(
            f"list the virtual networks of {node_group}",
            lambda: [v.as_dict() for v in networks.list(node_group)],
        )
        subnets = [str(s["id"]) for v in vnets for s in (v.get("properties") or {}).get("subnets") or []]
        if len(subnets) != 1:
            raise FileServerError(
                f"cluster {cluster} names no subnet in its node pools and its node resource group "
                f"{node_group} holds {len(subnets)} subnets: pass --subnet-id"
            )
        return subnets

    def ensure_service_endpoint(self, subnet_id: str) -> bool:
        """Add the Microsoft.Storage service endpoint to the subnet if it lacks one; True when added."""
        match = SUBNET_RE.match(subnet_id)
        if match is None:
            raise FileServerError(f"--subnet-id: not a subnet resource ID: {subnet_id!r}", USAGE)
        subnets = self._client("network", match["sub"]).subnets
        where = (match["rg"], match["vnet"], match["subnet"])
        name = f"{match['vnet']}/{match['subnet']}"
        current = self._call(f"read subnet {name}", lambda: subnets.get(*where).as_dict())
        body = subnet_with_storage_endpoint(current)
        if body is None:
            return False
        from azure.mgmt.network.models import Subnet

        # As a model, not a dict: the SDK then leaves out the read-only fields (provisioningState, the IP
        # configurations) as ARM expects of a PUT.
        action = f"add the {STORAGE_SERVICE} service endpoint to subnet {name}"
        self._call(action, lambda: self._wait(subnets.begin_create_or_update(*where, Subnet(body)), action))
        return True

    # --- the account and the share -----------------------------------------------------------------------

    def get_account(self, account: str) -> dict[str, Any] | None:
        accounts = self._client("storage").storage_accounts
        found = self._call(
            f"read storage account {account}",
            lambda: accounts.get_properties(self.resource_group, account).as_dict(),
            missing_ok=True,
        )
        return dict(found) if found is not None else None

    def ensure_account(self, spec: FileServerSpec) -> list[str]:
        """Create the account, or bring an existing one in line; what changed ([] for nothing)."""
        accounts = self._client("storage").storage_accounts
        current = self.get_account(spec.account)
        if current is None:
            action = f"create storage account {spec.account} in {self.resource_group}"
            body = account_body(spec)
            self._call(
                action,
                lambda: self._wait(accounts.begin_create(self.resource_group, spec.account, body), action),
            )
            return [f"storage account {spec.account} created ({KIND} {SKU}, {spec.location})"]
        patch, changes = account_patch(current, spec)
        if patch is None:
            return []
        self._call(
            f"update storage account {spec.account}",
            lambda: accounts.update(self.resource_group, spec.account, patch),
        )
        return [f"storage account {spec.account}: {c}" for c in changes]

    def get_share(self, account: str, share: str) -> dict[str, Any] | None:
        shares = self._client("storage").file_shares
        found = self._call(
            f"read share {account}/{share}",
            lambda: shares.get(self.resource_group, account, share).as_dict(),
            missing_ok=True,
        )
        return dict(found) if found is not None else None

    def ensure_share(self, spec: FileServerSpec) -> list[str]:
        shares = self._client("storage").file_shares
        current = self.get_share(spec.account, spec.share)
        if current is None:
            body = share_body(spec)
            self._call(
                f"create share {spec.account}/{spec.share}",
                lambda: shares.create(self.resource_group, spec.account, spec.share, body),
            )
            return [f"NFS share {spec.share} created ({spec.size_gib} GiB)"]
        patch, changes = share_patch(current, spec)
        if patch is None:
            return []
        self._call(
            f"update share {spec.account}/{spec.share}",
            lambda: shares.update(self.resource_group, spec.account, spec.share, patch),
        )
        return [f"share {spec.share}: {c}" for c in changes]

    def create(self, spec: FileServerSpec) -> tuple[dict[str, Any], list[str]]:
        """Everything create does, in order: the subnets' service endpoint (the account's network rules
        reference it), the account, the share. Returns the account as it stands and the changes."""
        validate(spec)
        changes = [
            f"subnet {s.rsplit('/', 1)[-1]}: service endpoint {STORAGE_SERVICE} added"
            for s in spec.subnet_ids
            if self.ensure_service_endpoint(s)
        ]
        changes += self.ensure_account(spec)
        changes += self.ensure_share(spec)
        return self.get_account(spec.account) or {}, changes

    # --- listing and deleting ----------------------------------------------------------------------------

    def list_shares(self, all_groups: bool = False) -> list[ShareInfo]:
        """Every share of every file server (FileStorage accounts carrying the dtjob tag) in the resource
        group, or in the subscription."""
        storage = self._client("storage")
        pager: Callable[[], Any] = (
            storage.storage_accounts.list
            if all_groups
            else lambda: storage.storage_accounts.list_by_resource_group(self.resource_group)
        )
        accounts = self._call("list storage accounts", lambda: [a.as_dict() for a in pager()])
        found = []
        for account in sorted((a for a in accounts if is_fileserver(a)), key=lambda a: str(a.get("name"))):
            name, group = str(account.get("name")), resource_group_of(str(account.get("id")))
            shares = self._call(f"list shares of {name}", _listing(storage.file_shares.list, group, name))
            for share in sorted(shares, key=lambda s: str(s.get("name"))):
                props = share.get("properties") or {}
                quota = props.get("shareQuota")
                found.append(
                    ShareInfo(
                        account=name,
                        resource_group=group,
                        location=str(account.get("location") or ""),
                        share=str(share.get("name")),
                        size_gib=int(quota) if quota is not None else None,
                        protocol=str(props.get("enabledProtocols") or "SMB"),
                        server=file_host(account, name),
                    )
                )
        return found

    def share_names(self, account: str) -> list[str]:
        shares = self._client("storage").file_shares
        names: list[str] = self._call(
            f"list shares of {account}",
            lambda: [str(s.as_dict().get("name")) for s in shares.list(self.resource_group, account)],
        )
        return names

    def delete_share(self, account: str, share: str) -> None:
        shares = self._client("storage").file_shares
        self._call(
            f"delete share {account}/{share}", lambda: shares.delete(self.resource_group, account, share)
        )

    def delete_account(self, account: str) -> None:
        accounts = self._client("storage").storage_accounts
        self._call(f"delete storage account {account}", lambda: accounts.delete(self.resource_group, account))

    # --- pacing ------------------------------------------------------------------------------------------

    def _call(self, action: str, call: Callable[[], Any], missing_ok: bool = False) -> Any:
        """Run call; a 409 that means "busy" (BUSY_CODES) is tried again after the answer's Retry-After (or
        busy_wait_s), 408/429/5xx are the SDK retry policy's. Any other failure becomes one line naming the
        action; a 404 returns None when missing_ok."""
        from azure.core.exceptions import HttpResponseError

        for attempt in range(self.busy_retries + 1):
            try:
                return call()
            except HttpResponseError as err:
                code = err.error.code if err.error is not None else None
                if err.status_code == 404 and missing_ok:
                    return None
                if err.status_code != 409 or code not in BUSY_CODES or attempt == self.busy_retries:
                    raise explain_arm_error(err, action) from err
                wait = _retry_after(err)
                wait = self.busy_wait_s if wait is None else wait
                self.progress(f"{action}: 409 {code}, trying again in {wait:g}s")
                time.sleep(wait)
            except Exception as err:
                raise explain_arm_error(err, action) from err
        raise AssertionError("unreachable")

    def _wait(self, poller: Any, action: str) -> Any:
        """Wait for a long-running operation, reporting its state every 10 s."""
        started = time.monotonic()
        self.progress(f"{action}: started")
        while not poller.done():
            poller.wait(timeout=10)
            if not poller.done():
                self.progress(f"{action}: {poller.status()} ({time.monotonic() - started:.0f}s)")
        result = poller.result()
        self.progress(f"{action}: {poller.status()} after {time.monotonic() - started:.0f}s")
        return result


def _listing(pager: Callable[..., Iterable[Any]], *args: str) -> Callable[[], list[dict[str, Any]]]:
    """A call that reads every page of pager(*args) as wire-format dicts."""
    return lambda: [item.as_dict() for item in pager(*args)]


def _retry_after(err: Any) -> float | None:
    response = getattr(err, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
