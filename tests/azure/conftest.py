"""Azurite (the Azure Storage emulator, from the npm registry) for the tests marked `azure`.

One in-memory azurite-blob per test session on 127.0.0.1 and a free port, stopped at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from testbed.azurite import Azurite, run_azurite


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    with run_azurite(tmp_path_factory.mktemp("azurite")) as emulator:
        yield emulator


@pytest.fixture
def container_name() -> str:
    """A fresh container per test, so tests sharing one Azurite never see each other's blobs."""
    return f"t{uuid.uuid4().hex[:20]}"
