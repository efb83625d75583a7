"""Azurite (the Azure Storage emulator, from the npm registry) for the tests marked `azure`.

One in-memory azurite-blob per test session on 127.0.0.1 and a free port, stopped at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.storage.blob import ContainerClient

from testbed.azurite import Azurite, run_azurite
from tests.azure.helpers import service


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    with run_azurite(tmp_path_factory.mktemp("azurite")) as emulator:
        yield emulator


@pytest.fixture
def container_name() -> str:
    """A fresh container per test, so tests sharing one Azurite never see each other's blobs."""
    return f"t{uuid.uuid4().hex[:20]}"


@pytest.fixture
def container(azurite: Azurite, container_name: str) -> Iterator[ContainerClient]:
    """That fresh container, created, and deleted with what the test left in it."""
    client = service(azurite).create_container(container_name)
    yield client
    client.delete_container()


@pytest.fixture
def key_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dtjob commands' credentials as a user sets them: Azurite's key in AZURE_STORAGE_KEY, no SAS."""
    monkeypatch.setenv("AZURE_STORAGE_KEY", azurite.account_key)
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
