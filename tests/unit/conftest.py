"""Unit tests reach no network: a connection to anything but loopback or a local socket fails the test that
made it, naming the address (a storage call that slipped into the pure core, or a fixture naming a real
host, shows here instead of going out)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import pytest
from dtjob.reconcile import ensure

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_getaddrinfo = socket.getaddrinfo
T = TypeVar("T")


def _local(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a Unix socket path
    host = str(address[0])
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not _local(address):
        raise AssertionError(f"a unit test connected to {address!r}: unit tests reach no network")
    _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not _local(address):
        raise AssertionError(f"a unit test connected to {address!r}: unit tests reach no network")
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if host is not None and not _local((host.decode() if isinstance(host, bytes) else host, 0)):
        raise AssertionError(f"a unit test looked up {host!r}: unit tests reach no network")
    return _getaddrinfo(host, *args, **kwargs)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", _guarded_getaddrinfo)
    yield


class InlineExecutor(Executor):
    """Runs each submitted call at once, in the caller's thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


@pytest.fixture(autouse=True)
def _creates_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world's objects are ensured one after another, in order, so that the calls a test records are
    deterministic (test_parallel_creates checks the parallel pool itself)."""
    monkeypatch.setattr(ensure, "CREATES", InlineExecutor())
