"""An azure-core HttpTransport that plays Azure Resource Manager's side for AKS agent pools.

No ARM emulator exists, so this is the one stand-in the tests use: the real azure-mgmt-containerservice client
(serialization, long-running-operation polling, error mapping) runs unchanged on top of it. It answers
PUT with 201 + Azure-AsyncOperation, the operation URL with the configured terminal status, GET/list from its
store, DELETE with 202 + Azure-AsyncOperation, and records every request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import CaseInsensitiveDict

ARM = "https://management.azure.com"
POOL_PATH = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.ContainerService/"
    r"managedClusters/(?P<cluster>[^/]+)/agentPools(?:/(?P<name>[^/]+))?$"
)


@dataclass
class Recorded:
    method: str
    url: str
    body: Any


@dataclass
class ArmPlayer(HttpTransport[Any, Any]):
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    # (status, code, message) to answer the next PUT with, e.g. (409, "QuotaExceeded", "...").
    fail_put: tuple[int, str, str] | None = None
    # An error the async operation ends with instead of Succeeded.
    fail_operation: tuple[str, str] | None = None
    polls_before_done: int = 1
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
        self.requests.append(Recorded(request.method, request.url, body))
        parts = urlsplit(request.url)
        if parts.path.startswith("/operations/"):
            return self._operation(request, parts.path.rsplit("/", 1)[-1])
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

    def _start_operation(self, on_success: Any) -> str:
        op_id = f"op{len(self._operations) + 1}"
        self._operations[op_id] = {"polls": 0, "on_success": on_success}
        return f"{ARM}/operations/{op_id}?api-version=2016-03-30"

    def _operation(self, request: Any, op_id: str) -> Any:
        op = self._operations[op_id]
        op["polls"] += 1
        if op["polls"] < self.polls_before_done:
            return self._respond(request, 200, {"status": "InProgress"})
        if self.fail_operation is not None:
            code, message = self.fail_operation
            return self._respond(
                request, 200, {"status": "Failed", "error": {"code": code, "message": message}}
            )
        op["on_success"]()
        return self._respond(request, 200, {"status": "Succeeded"})

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


class StaticToken:
    """A TokenCredential with a fixed token: ARM's bearer policy needs one, and the player ignores it."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return SimpleNamespace(token="test-token", expires_on=4_102_444_800)

    def get_token_info(self, *scopes: str, options: Any = None) -> Any:
        return SimpleNamespace(
            token="test-token", expires_on=4_102_444_800, token_type="Bearer", refresh_on=None
        )
