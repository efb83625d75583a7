"""LISTs come a page at a time, each item cut to what the caller keeps as its page is read: a namespace of a
thousand jobs holds five thousand pods, and decoding them whole was the operator's peak. A page is decoded
whole, and whoever may create an object a LIST selects sizes it: a page that runs past a bound in bytes is
dropped unread and asked again smaller."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from dtjob.kube import rest as kube
from dtjob.kube.connect import ApiClient
from dtjob.kube.credentials import Credentials

from tests.unit.local_server import serving


class ListingStandIn(BaseHTTPRequestHandler):
    """Answers a LIST of pods `limit` at a time from `pods`, its continue token the next item's index, over
    keep-alive connections; records each page asked and each connection."""

    protocol_version = "HTTP/1.1"
    pods: ClassVar[list[dict[str, Any]]] = []
    asked: ClassVar[list[tuple[int, str | None]]] = []
    connections: ClassVar[set[tuple[str, int]]] = set()

    def do_GET(self) -> None:
        params = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        token = params.get("continue")
        ListingStandIn.asked.append((int(params["limit"]), token))
        ListingStandIn.connections.add(self.client_address)
        start = int(token or 0)
        end = start + int(params["limit"])
        more = {"continue": str(end)} if end < len(self.pods) else {}
        page = {"metadata": {"resourceVersion": "42", **more}, "items": self.pods[start:end]}
        body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client dropped a page too large to read
            self.close_connection = True

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[ApiClient]:
    ListingStandIn.asked, ListingStandIn.connections = [], set()
    with serving(ListingStandIn) as url:
        yield ApiClient(Credentials(server=url), (5, 5), False)


def pod(i: int, padding: int = 100) -> dict[str, Any]:
    return {"metadata": {"name": f"p{i}"}, "spec": {"big": "x" * padding}}


def name_only(item: dict[str, Any]) -> dict[str, Any]:
    return {"name": item["metadata"]["name"]}


def test_every_page_is_read_and_only_what_keep_returns_is_kept(
    api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ListingStandIn.pods = [pod(i) for i in range(7)]
    monkeypatch.setattr(kube, "LIST_PAGE", 3)
    items, version = kube.list_pages(api, "Pod", "ml", [("labelSelector", "a=b")], name_only)
    assert items == [{"name": f"p{i}"} for i in range(7)] and version == "42"
    assert ListingStandIn.asked == [(3, None), (3, "3"), (3, "6")]
    assert len(ListingStandIn.connections) == 1, "pages read whole hand their connection back"
    ListingStandIn.asked.clear()
    kube.list_pages(api, "Pod", "ml", [], dict, page_size=5)
    assert ListingStandIn.asked == [(5, None), (5, "5")], "a page size of the caller's own"


def test_a_page_past_the_bound_in_bytes_is_asked_again_smaller_down_to_one_item(api: ApiClient) -> None:
    """Item 23, 50 KB, is larger than the bound: the page of 20 holding it comes again as pages of 2, the one
    holding it again as pages of 1 (one item is read whatever its size, as the API server bounds an object),
    and the rest of the LIST keeps pages of 1. Every item arrives once, in order, and the client goes on
    after each dropped answer."""
    ListingStandIn.pods = [pod(i, 50_000 if i == 23 else 100) for i in range(26)]
    items, _ = kube.list_pages(api, "Pod", "ml", [], name_only, page_size=20, page_bytes=20_000)
    assert items == [{"name": f"p{i}"} for i in range(26)]
    assert ListingStandIn.asked == [
        (20, None), (20, "20"), (2, "20"), (2, "22"), (1, "22"), (1, "23"), (1, "24"), (1, "25"),
    ]  # fmt: skip
    assert len(ListingStandIn.connections) == 3, "each dropped answer closed its connection, no more"
