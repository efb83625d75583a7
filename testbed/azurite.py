"""Start and stop Azurite's Blob service, for tests, benchmarks and the local demo.

Azurite comes from the npm registry via hack/install-azurite.sh (cached). It runs in memory on 127.0.0.1 (or,
for pods of the real node, on the node's address inside the test bed's network namespace), with telemetry
off (it would reach the internet) and the API-version check off (current azure-storage-blob speaks a newer
service version than Azurite 3.35 knows).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from testbed import pidfile

# Azurite's documented, well-known development account. It exists only inside the emulator.
DEV_ACCOUNT_NAME = "devstoreaccount1"
DEV_ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Azurite:
    endpoint: str  # http://127.0.0.1:<port>/devstoreaccount1
    account_name: str = DEV_ACCOUNT_NAME
    account_key: str = field(default=DEV_ACCOUNT_KEY, repr=False)
    pid: int = 0  # of the azurite-blob process (benchmarks read its CPU time)

    def container_url(self, container: str) -> str:
        return f"{self.endpoint}/{container}"

    @property
    def shared_key(self) -> dict[str, str]:
        """The account key as azure-storage-blob takes it on any host: the SDK reads the account name from a
        path-style URL on localhost and 127.0.0.1 only, not on the real node's address."""
        return {"account_name": self.account_name, "account_key": self.account_key}


def azurite_blob_binary() -> str:
    """Path of azurite-blob: $DTJOB_AZURITE_BLOB, else the cached install (installed on first use)."""
    override = os.environ.get("DTJOB_AZURITE_BLOB")
    if override:
        return override
    script = _REPO / "hack" / "install-azurite.sh"
    out = subprocess.run([str(script)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _serving(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(f"{endpoint}?comp=list", timeout=1)
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 without credentials) means it is serving
    except OSError:
        return False


def _wait_until_serving(endpoint: str, exited: Callable[[], str | None], timeout_s: float) -> None:
    """Until `endpoint` answers; `exited` says why the process has ended, or None while it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        why = exited()
        if why is not None:
            raise RuntimeError(f"azurite-blob exited early: {why}")
        if _serving(endpoint):
            return
        time.sleep(0.1)
    raise RuntimeError(f"azurite-blob did not answer on {endpoint} within {timeout_s:.0f}s")


def _argv(host: str, port: int) -> list[str]:
    return [
        azurite_blob_binary(),
        "--blobHost",
        host,
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]


@contextmanager
def run_azurite(
    workdir: Path, port: int | None = None, timeout_s: float = 30.0, host: str = "127.0.0.1"
) -> Iterator[Azurite]:
    """Run an in-memory azurite-blob until the block exits; the process is always reaped. It listens on
    loopback, or on `host`: the real node's address, inside the test bed's network namespace, so pods reach
    it too."""
    port = port or free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    argv = _argv(host, port)
    endpoint = f"http://{host}:{port}/{DEV_ACCOUNT_NAME}"
    with (workdir / "azurite.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)

        def exited() -> str | None:
            return None if proc.poll() is None else f"status {proc.returncode}"

        try:
            _wait_until_serving(endpoint, exited, timeout_s)
            yield Azurite(endpoint=endpoint, pid=proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def start_azurite_detached(
    workdir: Path, pidfile_path: Path, host: str = "127.0.0.1", port: int = 10000, timeout_s: float = 30.0
) -> Azurite:
    """An in-memory azurite-blob that outlives this process (the demo's, for a user to look at afterwards),
    tracked by `pidfile_path`; stop it with stop_azurite_detached. Idempotent: the pidfile's Azurite, still
    serving on this endpoint (in this network namespace), is kept with what it holds; a stale pidfile, or an
    Azurite this namespace cannot reach (its own namespace deleted), is replaced by a fresh one."""
    endpoint = f"http://{host}:{port}/{DEV_ACCOUNT_NAME}"
    pid = pidfile.running(pidfile_path)
    if pid is not None and _serving(endpoint):
        return Azurite(endpoint=endpoint, pid=pid)
    pidfile.stop(pidfile_path)
    pid = pidfile.spawn(_argv(host, port), pidfile_path, workdir / "azurite.log", cwd=workdir)

    def exited() -> str | None:
        return None if pidfile.running(pidfile_path) == pid else f"see {workdir / 'azurite.log'}"

    try:
        _wait_until_serving(endpoint, exited, timeout_s)
    except RuntimeError:
        pidfile.stop(pidfile_path)
        raise
    return Azurite(endpoint=endpoint, pid=pid)


def stop_azurite_detached(pidfile_path: Path) -> None:
    """Stop what start_azurite_detached started (nothing when the pidfile is missing or stale)."""
    pidfile.stop(pidfile_path)
