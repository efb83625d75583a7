"""An azure-core HttpTransport that plays Azure Resource Manager's side for AKS clusters and agent pools,
virtual network subnets, Storage accounts with their file shares, and the compute quota and VM sizes of a
region.

No ARM emulator exists, so this is the one stand-in the tests use: the real azure-mgmt-containerservice,
azure-mgmt-network, azure-mgmt-storage and azure-mgmt-compute clients (serialization, long-running-operation
polling, paging, retries, error mapping) run unchanged on top of it. It plays the protocol as each resource
provider does:
- every request must carry an `api-version` query (400 MissingApiVersionParameter otherwise);
- agent pool PUT: 201 + Azure-AsyncOperation; DELETE: 202 + Azure-AsyncOperation; the operation URL answers
  InProgress, then the configured terminal status;
- subnet PUT: 200 + Azure-AsyncOperation (the client then GETs the subnet);
- storage account PUT: 202 + Location; the Location answers 202 while in progress, then 200 with the account,
  or the failure's own status code and ARM error body;
- account PATCH, share PUT/PATCH/DELETE, account DELETE: synchronous;
- compute usage (Usage - List) and VM sizes (Resource Skus - List, `$filter=location eq '<region>'`, the one
  filter ARM supports): read-only lists, paged by `page_size` items with ARM's nextLink;
- `Retry-After` on every long-running answer (`retry_after`), and `faults`: canned error answers (409, 429,
  500...) with an optional Retry-After, each for a number of matching requests, before the real answer.
It records every request with the time it arrived.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import CaseInsensitiveDict

ARM = "https://management.azure.com"
POOL_PATH = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.ContainerService/"
    r"managedClusters/(?P<cluster>[^/]+)/agentPools(?:/(?P<name>[^/]+))?$"
)
CLUSTER_PATH = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.ContainerService/"
    r"managedClusters/(?P<cluster>[^/]+)$"
)
VNETS_PATH = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/virtualNetworks$"
)
SUBNET_PATH = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/virtualNetworks/"
    r"(?P<vnet>[^/]+)/subnets/(?P<subnet>[^/]+)$"
)
ACCOUNTS_PATH = re.compile(
    r"^/subscriptions/[^/]+(?:/resourceGroups/(?P<rg>[^/]+))?/providers/Microsoft\.Storage/storageAccounts"
    r"(?:/(?P<account>[^/]+))?$"
)
USAGES_PATH = re.compile(
    r"^/subscriptions/[^/]+/providers/Microsoft\.Compute/locations/(?P<location>[^/]+)/usages$"
)
SKUS_PATH = re.compile(r"^/subscriptions/[^/]+/providers/Microsoft\.Compute/skus$")
LOCATION_FILTER = re.compile(r"^location eq '(?P<location>[^']+)'$")
SHARES_PATH = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Storage/storageAccounts/"
    r"(?P<account>[^/]+)/fileServices/default/shares(?:/(?P<share>[^/]+))?$"
)


@dataclass
class Recorded:
    method: str
    url: str
    body: Any
    at: float = 0.0  # time.monotonic() when it arrived

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


@dataclass
class Fault:
    """Answer `times` requests whose method is `method` and whose path contains `path` (after the
    api-version check) with `status` and an ARM error body, instead of the real answer."""

    method: str
    path: str
    status: int
    code: str
    message: str = "injected"
    retry_after: int | None = None
    times: int = 1


@dataclass
class ArmPlayer(HttpTransport[Any, Any]):
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    # (status, code, message) to answer the next PUT with, e.g. (409, "QuotaExceeded", "...").
    fail_put: tuple[int, str, str] | None = None
    # An error the async operation ends with instead of Succeeded.
    fail_operation: tuple[str, str] | None = None
    polls_before_done: int = 1
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    vnets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by "<resource group>/<name>"
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    shares: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # by (account, share)
    faults: list[Fault] = field(default_factory=list)
    # Usage - List rows by region (lowercase), and Resource Skus - List entries (each names its `locations`).
    usages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skus: list[dict[str, Any]] = field(default_factory=list)
    page_size: int | None = None  # items per page of those two lists; None: one page
    retry_after: int = 0  # the Retry-After of long-running answers, in seconds
    _operations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __enter__(self) -> ArmPlayer:
        return self

    def __exit__(self, *args: object) -> None:
        return None

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def send(self, request: Any, **kwargs: Any) -> Any:
        body = json.loads(request.content) if request.content else None
        self.requests.append(Recorded(request.method, request.url, body, time.monotonic()))
        parts = urlsplit(request.url)
        if "api-version" not in parse_qs(parts.query):
            return self._error(
                request, 400, "MissingApiVersionParameter", "The api-version query is required."
            )
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.path in parts.path:
                fault.times -= 1
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                return self._error(request, fault.status, fault.code, fault.message, headers)
        if parts.path.startswith("/operations/"):
            return self._operation(request, parts.path.rsplit("/", 1)[-1])
        for pattern, handler in (
            (CLUSTER_PATH, self._cluster),
            (VNETS_PATH, self._vnets),
            (SUBNET_PATH, self._subnet),
            (ACCOUNTS_PATH, self._account),
            (SHARES_PATH, self._share),
            (USAGES_PATH, self._usages),
            (SKUS_PATH, self._skus),
        ):
            if (found := pattern.match(parts.path)) is not None:
                return handler(request, found, body)
        match = POOL_PATH.match(parts.path)
        if match is None:
            return self._respond(request, 404, {"error": {"code": "NotFound", "message": parts.path}})
        name = match["name"]
        if request.method == "GET" and name is None:
            return self._respond(request, 200, {"value": list(self.pools.values())})
        if request.method == "GET":
            if name not in self.pools:
                message = f"Could not find agent pool {name}"
                return self._respond(request, 404, {"error": {"code": "NotFound", "message": message}})
            return self._respond(request, 200, self.pools[name])
        if request.method == "PUT":
            return self._put(request, parts.path, name, body or {})
        if request.method == "DELETE":
            op = self._start_operation(lambda: self.pools.pop(name, None))
            return self._respond(request, 202, None, {"Azure-AsyncOperation": op, "Location": op})
        return self._respond(request, 405, {"error": {"code": "MethodNotAllowed", "message": request.method}})

    def _put(self, request: Any, path: str, name: str, body: dict[str, Any]) -> Any:
        if self.fail_put is not None:
            status, code, message = self.fail_put
            return self._respond(request, status, {"error": {"code": code, "message": message}})
        resource = {
            "id": path,
            "name": name,
            "type": "Microsoft.ContainerService/managedClusters/agentPools",
            "properties": {**body["properties"], "provisioningState": "Creating"},
        }
        self.pools[name] = resource

        def finish() -> None:
            resource["properties"]["provisioningState"] = "Succeeded"

        op = self._start_operation(finish)
        return self._respond(request, 201, resource, {"Azure-AsyncOperation": op})

    def _start_operation(self, on_success: Any, location_result: Callable[[], Any] | None = None) -> str:
        """A long-running operation's URL. Azure-AsyncOperation style by default; with `location_result`,
        Location style: the URL answers 202 until done, then 200 with location_result()."""
        op_id = f"op{len(self._operations) + 1}"
        self._operations[op_id] = {"polls": 0, "on_success": on_success, "result": location_result}
        return f"{ARM}/operations/{op_id}?api-version=2016-03-30"

    def _operation(self, request: Any, op_id: str) -> Any:
        op = self._operations[op_id]
        op["polls"] += 1
        wait = {"Retry-After": str(self.retry_after)}
        location_style = op["result"] is not None
        if op["polls"] < self.polls_before_done:
            if location_style:
                return self._respond(request, 202, None, {**wait, "Location": request.url})
            return self._respond(request, 200, {"status": "InProgress"}, wait)
        if self.fail_operation is not None:
            code, message = self.fail_operation
            if location_style:  # the Location answers with the failure's own status and error body
                return self._error(request, 400, code, message)
            return self._respond(
                request, 200, {"status": "Failed", "error": {"code": code, "message": message}}
            )
        op["on_success"]()
        if location_style:
            return self._respond(request, 200, op["result"]())
        return self._respond(request, 200, {"status": "Succeeded"})

    # --- clusters and networks ---------------------------------------------------------------------------

    def _cluster(self, request: Any, match: re.Match[str], body: Any) -> Any:
        if request.method != "GET":
            return self._error(request, 405, "MethodNotAllowed", request.method)
        if match["cluster"] not in self.clusters:
            return self._error(request, 404, "ResourceNotFound", f"managed cluster {match['cluster']}")
        return self._respond(request, 200, self.clusters[match["cluster"]])

    def _vnets(self, request: Any, match: re.Match[str], body: Any) -> Any:
        prefix = f"{match['rg']}/".lower()
        value = [v for key, v in self.vnets.items() if key.lower().startswith(prefix)]
        return self._respond(request, 200, {"value": value})

    def _find_subnet(self, match: re.Match[str]) -> dict[str, Any] | None:
        vnet = self.vnets.get(f"{match['rg']}/{match['vnet']}")
        for subnet in (vnet or {}).get("properties", {}).get("subnets", []):
            if subnet["name"] == match["subnet"]:
                return dict(subnet)
        return None

    def _subnet(self, request: Any, match: re.Match[str], body: Any) -> Any:
        subnet = self._find_subnet(match)
        if subnet is None:
            return self._error(request, 404, "NotFound", f"subnet {match['vnet']}/{match['subnet']}")
        if request.method == "GET":
            return self._respond(request, 200, subnet)
        if request.method != "PUT":
            return self._error(request, 405, "MethodNotAllowed", request.method)
        vnet = self.vnets[f"{match['rg']}/{match['vnet']}"]
        stored = next(s for s in vnet["properties"]["subnets"] if s["name"] == match["subnet"])

        def finish() -> None:
            stored["properties"] = {
                **stored["properties"],
                **body["properties"],
                "provisioningState": "Succeeded",
            }

        stored["properties"]["provisioningState"] = "Updating"
        op = self._start_operation(finish)
        headers = {"Azure-AsyncOperation": op, "Retry-After": str(self.retry_after)}
        return self._respond(request, 200, stored, headers)

    # --- storage accounts and file shares ----------------------------------------------------------------

    def _account(self, request: Any, match: re.Match[str], body: Any) -> Any:
        name = match["account"]
        if name is None:
            if request.method != "GET":
                return self._error(request, 405, "MethodNotAllowed", request.method)
            rg = (match["rg"] or "").lower()
            value = [
                a for a in self.accounts.values() if not rg or f"/resourcegroups/{rg}/" in a["id"].lower()
            ]
            return self._respond(request, 200, {"value": value})
        if request.method == "GET":
            if name not in self.accounts:
                return self._error(request, 404, "ResourceNotFound", f"storage account {name} not found")
            return self._respond(request, 200, self.accounts[name])
        if request.method == "PUT":
            return self._put_account(request, urlsplit(request.url).path, name, body or {})
        if request.method == "PATCH":
            if name not in self.accounts:
                return self._error(request, 404, "ResourceNotFound", f"storage account {name} not found")
            account = self.accounts[name]
            if "tags" in body:
                account["tags"] = body["tags"]
            account["properties"] = {**account["properties"], **(body.get("properties") or {})}
            return self._respond(request, 200, account)
        if request.method == "DELETE":
            self.accounts.pop(name, None)
            for key in [k for k in self.shares if k[0] == name]:
                del self.shares[key]
            return self._respond(request, 200, None)
        return self._error(request, 405, "MethodNotAllowed", request.method)

    def _put_account(self, request: Any, path: str, name: str, body: dict[str, Any]) -> Any:
        if self.fail_put is not None:
            status, code, message = self.fail_put
            return self._error(request, status, code, message)
        account = {
            "id": path,
            "name": name,
            "type": "Microsoft.Storage/storageAccounts",
            "location": body["location"],
            "kind": body["kind"],
            "sku": {
                **body["sku"],
                "tier": "Premium" if body["sku"]["name"].startswith("Premium") else "Standard",
            },
            "tags": body.get("tags") or {},
            "properties": {
                **body["properties"],
                "provisioningState": "Creating",
                "primaryEndpoints": {"file": f"https://{name}.file.core.windows.net/"},
            },
        }

        def finish() -> None:
            account["properties"]["provisioningState"] = "Succeeded"
            self.accounts[name] = account

        op = self._start_operation(finish, location_result=lambda: account)
        return self._respond(request, 202, None, {"Location": op, "Retry-After": str(self.retry_after)})

    def _share(self, request: Any, match: re.Match[str], body: Any) -> Any:
        account, name = match["account"], match["share"]
        if account not in self.accounts:
            return self._error(request, 404, "ResourceNotFound", f"storage account {account} not found")
        if name is None:
            value = [s for (a, _), s in self.shares.items() if a == account]
            return self._respond(request, 200, {"value": value})
        key = (account, name)
        if request.method == "GET":
            if key not in self.shares:
                return self._error(request, 404, "ShareNotFound", "The specified share does not exist.")
            return self._respond(request, 200, self.shares[key])
        if request.method == "PUT":
            self.shares[key] = {
                "id": urlsplit(request.url).path,
                "name": name,
                "type": "Microsoft.Storage/storageAccounts/fileServices/shares",
                "properties": {"enabledProtocols": "SMB", **(body.get("properties") or {})},
            }
            return self._respond(request, 201, self.shares[key])
        if request.method == "PATCH":
            if key not in self.shares:
                return self._error(request, 404, "ShareNotFound", "The specified share does not exist.")
            share = self.shares[key]
            share["properties"] = {**share["properties"], **(body.get("properties") or {})}
            return self._respond(request, 200, share)
        if request.method == "DELETE":
            existed = self.shares.pop(key, None) is not None
            return self._respond(request, 200 if existed else 204, None)
        return self._error(request, 405, "MethodNotAllowed", request.method)

    # --- compute quota and VM sizes ----------------------------------------------------------------------

    def _usages(self, request: Any, match: re.Match[str], body: Any) -> Any:
        if request.method != "GET":
            return self._error(request, 405, "MethodNotAllowed", request.method)
        return self._page(request, self.usages.get(match["location"].lower(), []))

    def _skus(self, request: Any, match: re.Match[str], body: Any) -> Any:
        if request.method != "GET":
            return self._error(request, 405, "MethodNotAllowed", request.method)
        query = parse_qs(urlsplit(request.url).query)
        wanted = None
        if "$filter" in query:
            found = LOCATION_FILTER.match(query["$filter"][0])
            if found is None:
                return self._error(
                    request, 400, "InvalidFilter", "Only location filter is supported currently."
                )
            wanted = found["location"].lower()
        value = [
            sku
            for sku in self.skus
            if wanted is None or wanted in (loc.lower() for loc in sku.get("locations") or [])
        ]
        return self._page(request, value)

    def _page(self, request: Any, items: list[dict[str, Any]]) -> Any:
        """One page of a list, with ARM's nextLink (the same URL with a $skiptoken) when more follow."""
        parts = urlsplit(request.url)
        query = parse_qs(parts.query)
        start = int(query.pop("$skiptoken", ["0"])[0])
        end = len(items) if self.page_size is None else start + self.page_size
        page: dict[str, Any] = {"value": items[start:end]}
        if end < len(items):
            rest = "&".join(f"{k}={quote(v[0])}" for k, v in query.items())
            page["nextLink"] = f"{ARM}{parts.path}?{rest}&$skiptoken={end}"
        return self._respond(request, 200, page)

    def _error(
        self, request: Any, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> Any:
        return self._respond(request, status, {"error": {"code": code, "message": message}}, headers)

    @staticmethod
    def _respond(request: Any, status: int, body: Any, headers: dict[str, str] | None = None) -> Any:
        content = json.dumps(body).encode() if body is not None else b""
        response = HttpResponseImpl(
            request=request,
            internal_response=SimpleNamespace(close=lambda: None),
            block_size=4096,
            status_code=status,
            reason="OK" if status < 400 else "Error",
            content_type="application/json",
            headers=CaseInsensitiveDict({"Content-Type": "application/json", **(headers or {})}),
            stream_download_generator=None,
        )
        response._content = content
        return response

    def puts(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "PUT"]

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in ("PUT", "PATCH", "POST", "DELETE")]


class StaticToken:
    """A TokenCredential with a fixed token: ARM's bearer policy needs one, and the player ignores it."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return SimpleNamespace(token="test-token", expires_on=4_102_444_800)

    def get_token_info(self, *scopes: str, options: Any = None) -> Any:
        return SimpleNamespace(
            token="test-token", expires_on=4_102_444_800, token_type="Bearer", refresh_on=None
        )
