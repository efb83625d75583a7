"""A TCP proxy in front of a storage endpoint (Azurite) that can play an outage: for a while, every new
connection is answered `503 Service Unavailable` and closed, as a storage front end that is down answers;
otherwise bytes are copied both ways untouched.

An outage can start at once, or be armed to start with the first connection that arrives after arming
(the moment a client starts to use storage, e.g. a results upload after training), and it ends by itself
after its duration. The proxy listens on the address it is given (the test bed's node address, so pods reach
it) and connects only to its upstream.

    with OutageProxy(NODE_IP, azurite.host, azurite.port) as proxy:
        proxy.arm(seconds=40)   # the next connection starts a 40 s outage
        ... endpoint = proxy.url + "/devstoreaccount1"
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

_BODY = b"storage is down"
UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    + f"Content-Length: {len(_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _BODY
)


class OutageProxy:
    def __init__(self, host: str, upstream_host: str, upstream_port: int) -> None:
        self.host = host
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed_for: float | None = None
        self._down_until = 0.0
        self.refused = 0  # connections answered 503
        self.forwarded = 0  # connections copied to the upstream
        self.outage_started: float | None = None  # time.monotonic() of the outage's start
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> OutageProxy:
        self._spawn(self._accept)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def arm(self, seconds: float) -> None:
        """The next connection starts an outage of `seconds`."""
        with self._lock:
            self._armed_for = seconds

    def down(self) -> bool:
        with self._lock:
            return time.monotonic() < self._down_until

    def _refuse_now(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._armed_for is not None:
                self._down_until, self._armed_for = now + self._armed_for, None
                self.outage_started = now
            refuse = now < self._down_until
            if refuse:
                self.refused += 1
            else:
                self.forwarded += 1
            return refuse

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        with self._lock:
            self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        if self._refuse_now():
            with contextlib.suppress(OSError):
                client.settimeout(5)
                client.recv(65536)  # the request line and headers, so the client reads our answer
                client.sendall(UNAVAILABLE)
                client.shutdown(socket.SHUT_RDWR)
            client.close()
            return
        try:
            upstream = socket.create_connection(self._upstream, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.append(upstream)
        self._spawn(self._pipe, upstream, client)
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
