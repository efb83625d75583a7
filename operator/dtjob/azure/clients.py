"""ContainerClients sized for parallel transfers, and a SAS source that follows rotation of mounted files."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtjob.azure.errors import StorageFailure
from dtjob.transfer_report import ExitCode

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


def container_client(url: str, credential: Any, concurrency: int = 8) -> ContainerClient:
    """A client for the container at `url` whose HTTP pool holds a connection per worker thread
    (requests' default of 10 would make extra threads open and drop connections on every request)."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from azure.storage.blob import ContainerClient

    session = requests.Session()
    pool = max(10, concurrency + 2)
    adapter = requests.adapters.HTTPAdapter(pool_connections=pool, pool_maxsize=pool)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    transport = RequestsTransport(session=session, session_owner=True)
    client: ContainerClient = ContainerClient.from_container_url(
        url, credential=credential, transport=transport
    )
    return client


def _read_text(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as err:
        raise StorageFailure(ExitCode.USAGE, f"cannot read the {what} file {path}: {err.strerror}") from err
    if not value:
        raise StorageFailure(ExitCode.USAGE, f"the {what} file {path} is empty")
    return value


@dataclass
class SasFileSource:
    """Container URL and SAS token read from files of a mounted Secret.

    The kubelet replaces a mounted Secret's files in place when the operator rotates the token, so the files
    are re-read at most every `refresh_s` (once per request batch) and on demand after a denial, never cached
    for the life of the process. Calling the source returns a client for the current token."""

    url_file: Path
    token_file: Path
    concurrency: int = 8
    refresh_s: float = 10.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _client: ContainerClient | None = field(default=None, repr=False)
    _token: str = field(default="", repr=False)
    _url: str = field(default="", repr=False)
    _read_at: float = field(default=float("-inf"), repr=False)

    def __call__(self) -> ContainerClient:
        with self._lock:
            if self._client is None or time.monotonic() - self._read_at >= self.refresh_s:
                self._reload()
            assert self._client is not None
            return self._client

    def refresh(self) -> None:
        """Re-read the files now (after a 403, in case the token was rotated a moment ago)."""
        with self._lock:
            self._reload()

    @property
    def container_url(self) -> str:
        return _read_text(self.url_file, "container URL")

    def _reload(self) -> None:
        url = _read_text(self.url_file, "container URL")
        token = _read_text(self.token_file, "SAS token").lstrip("?")
        self._read_at = time.monotonic()
        if self._client is None or token != self._token or url != self._url:
            self._token, self._url = token, url
            self._client = container_client(url, token, self.concurrency)
