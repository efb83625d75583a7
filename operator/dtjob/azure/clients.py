"""Blob Storage clients with deadlines and bounded retries, sized for parallel transfers, and a SAS source
that follows rotation of mounted files.

Every client built here (and so every Blob Storage call of the operator, the CLI and the stager) has a
connection and a read timeout on each try and a bounded number of tries: a storage endpoint that accepts
connections and never answers costs at most (1 + retries) x read timeout plus the backoffs, never a thread
for good. The operator sets its own, shorter deadlines at start (set_default_deadlines)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtjob.azure.errors import StorageFailure
from dtjob.contract.transfer_report import ExitCode

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient, ContainerClient


@dataclass(frozen=True)
class Deadlines:
    """Per try: seconds to connect and to wait between bytes of the answer; then how many more tries, the
    first after about `backoff_s` seconds and each next one a little later."""

    connect_s: float = 20.0
    read_s: float = 60.0
    retries: int = 3
    backoff_s: int = 4


_defaults = Deadlines()
_defaults_lock = threading.Lock()


def set_default_deadlines(deadlines: Deadlines) -> None:
    """The deadlines of every client this process builds from now on without deadlines of its own."""
    global _defaults
    with _defaults_lock:
        _defaults = deadlines


def default_deadlines() -> Deadlines:
    with _defaults_lock:
        return _defaults


def client_options(deadlines: Deadlines | None = None) -> dict[str, Any]:
    """Keyword arguments for any azure-core client (storage, identity): timeouts and a bounded retry."""
    chosen = deadlines or default_deadlines()
    return {
        "connection_timeout": chosen.connect_s,
        "read_timeout": chosen.read_s,
        "retry_total": chosen.retries,
        "retry_backoff_factor": chosen.backoff_s / 2,  # azure-core waits factor * 2**n
        "retry_backoff_max": chosen.backoff_s * 2 ** max(chosen.retries - 1, 0),
    }


def _storage_options(deadlines: Deadlines | None) -> dict[str, Any]:
    from azure.storage.blob import ExponentialRetry

    chosen = deadlines or default_deadlines()
    retry = ExponentialRetry(
        initial_backoff=chosen.backoff_s, increment_base=2, retry_total=chosen.retries, random_jitter_range=1
    )
    return {"connection_timeout": chosen.connect_s, "read_timeout": chosen.read_s, "retry_policy": retry}


def container_client(
    url: str, credential: Any, concurrency: int = 8, deadlines: Deadlines | None = None
) -> ContainerClient:
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
    options = _storage_options(deadlines)
    # A transport given to the client ignores the client's timeouts: they go to the transport itself.
    transport = RequestsTransport(
        session=session,
        session_owner=True,
        connection_timeout=options.pop("connection_timeout"),
        read_timeout=options.pop("read_timeout"),
    )
    client: ContainerClient = ContainerClient.from_container_url(
        url, credential=credential, transport=transport, **options
    )
    return client


def container_exists(endpoint: str, container: str, credential: Any, deadlines: Deadlines) -> bool:
    """Whether the account holds the container (Get Container Properties; 404 is False). Raises AzureError
    when the account cannot say."""
    service = blob_service_client(endpoint, credential, deadlines)
    exists: bool = service.get_container_client(container).exists()
    return exists


def blob_service_client(
    endpoint: str, credential: Any, deadlines: Deadlines | None = None
) -> BlobServiceClient:
    """A client for the account at `endpoint`, with deadlines and bounded retries."""
    from azure.storage.blob import BlobServiceClient

    service: BlobServiceClient = BlobServiceClient(
        endpoint, credential=credential, **_storage_options(deadlines)
    )
    return service


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
