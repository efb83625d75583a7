"""What the Kubernetes client raises, named for what the caller does about it, and how an API server's answer
outside 2xx maps onto them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """The API server answered outside 2xx: its status, reason, body (as text) and headers."""

    def __init__(
        self, status: int, reason: str = "", body: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = dict(headers or {})

    @classmethod
    def from_response(cls, response: Any) -> ApiError:
        """From a urllib3 answer, read whole."""
        data: bytes = response.data or b""
        return cls(int(response.status), str(response.reason or ""), data.decode(errors="replace"),
                   dict(response.headers))  # fmt: skip

    def __str__(self) -> str:
        return f"({self.status})\nReason: {self.reason}\nHTTP response body: {self.body}"


class Conflict(Exception):
    """The object changed since it was read (HTTP 409 on an update): read again and retry."""


class LogUnavailable(Exception):
    """A container's log cannot be read (yet, or any more)."""


class Rejected(Exception):
    """The API server (or the client's own schema check) refused an object built from the spec."""


class Forbidden(Exception):
    """The API server refused a call with 403: admission (Pod Security, a ResourceQuota) or RBAC."""


class ApiNotServed(Exception):
    """The cluster does not serve an API a child needs: a gang scheduler's PodGroup, its CRD not installed."""


class NotOurs(Exception):
    """A child's name is taken by an object another owner holds (an older job of the same name, not yet
    garbage collected): the job waits instead of adopting it."""


def api_message(err: ApiError) -> str:
    """The API server's own words for a refusal (its Status message), else the HTTP reason."""
    try:
        return str(json.loads(err.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(err.reason)


def refusal(err: ApiError, what: str) -> Exception | None:
    """The client's exception for a create or write the API server refused (400/422: the object; 403:
    admission or RBAC), or None for any other answer."""
    if err.status in (400, 422):
        return Rejected(f"{what} rejected by the API server: {api_message(err)}")
    if err.status == 403:
        return Forbidden(f"{what} refused by the API server: {api_message(err)}")
    return None
