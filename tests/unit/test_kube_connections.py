"""Writes whose answer the operator does not read still hand their connection back to the pool: thirty
creates, deletes and events over one connection, not a new TCP connection and TLS handshake each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.kube.credentials import Credentials

from tests.unit.local_server import serving


class ApiServerStandIn(BaseHTTPRequestHandler):
    """Answers every request 201 with a small JSON body over keep-alive connections; counts connections."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[tuple[str, int]]] = set()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        ApiServerStandIn.connections.add(self.client_address)
        body = json.dumps({"kind": "Status", "metadata": {"resourceVersion": "1"}, "padding": "x" * 4096})
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    ApiServerStandIn.connections = set()
    with serving(ApiServerStandIn) as url:
        yield KubeClient(ApiClient(Credentials(server=url), (5, 5), retries=False))


def test_unread_answers_release_their_connection(kube: KubeClient) -> None:
    job = {"metadata": {"name": "a", "namespace": "ns", "uid": "u"}}
    for i in range(10):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "ns"}}
        assert kube.create(pod)
        kube.delete("Pod", "ns", f"p{i}")
        kube.emit_event(job, "Normal", "Test", "one event", datetime.now(UTC))
    assert len(ApiServerStandIn.connections) == 1
