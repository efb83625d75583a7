"""A TCP port on 127.0.0.1 that accepts connections, reads whatever is sent, and never answers: the storage
endpoint that hangs (a firewall that drops replies, a wedged load balancer), for timeout tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Blackhole:
    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return len(self._connections)

    def __enter__(self) -> Blackhole:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._spawn(self._accept)

    def stop(self) -> None:
        """Close the port and every connection (clients still waiting see them reset)."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(connection)
            self._spawn(self._drain, connection)

    def _drain(self, connection: socket.socket) -> None:
        # Read so that a client's upload never blocks on a full buffer: only the answer is missing.
        with contextlib.suppress(OSError):
            while connection.recv(65536):
                pass
