"""The test bed's loopback ports: never the same one twice in a process (an operator's liveness and metrics
servers took one port between them when bind(0) handed it out again)."""

from __future__ import annotations

import socket

from testbed.operator_harness import free_port


def test_no_port_is_handed_out_twice_and_each_is_free() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # nothing listens there
