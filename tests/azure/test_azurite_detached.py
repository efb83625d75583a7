"""Azurite started detached (the demo's, left running for a user): a second start reuses it with what it
holds, a stale pidfile gets a fresh one, and stopping it leaves no process."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from testbed import pidfile
from testbed.azurite import free_port, start_azurite_detached, stop_azurite_detached

pytestmark = pytest.mark.azure


def _service(endpoint: str, key: dict[str, str]) -> BlobServiceClient:
    return BlobServiceClient(endpoint, credential=key)


def test_detached_azurite_is_reused_restarted_when_stale_and_stopped(tmp_path: Path) -> None:
    pid_path = tmp_path / "azurite.pid"
    port = free_port()
    try:
        first = start_azurite_detached(tmp_path / "azurite", pid_path, port=port)
        _service(first.endpoint, first.shared_key).create_container("kept")

        again = start_azurite_detached(tmp_path / "azurite", pid_path, port=port)
        assert again.pid == first.pid
        names = [c.name for c in _service(again.endpoint, again.shared_key).list_containers()]
        assert names == ["kept"]

        os.kill(first.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # this process's child, unless subprocess reaped it
            os.waitpid(first.pid, 0)
        fresh = start_azurite_detached(tmp_path / "azurite", pid_path, port=port)
        assert fresh.pid != first.pid
        assert list(_service(fresh.endpoint, fresh.shared_key).list_containers()) == []
    finally:
        stop_azurite_detached(pid_path)
    assert pidfile.running(pid_path) is None
    assert not pid_path.exists()
