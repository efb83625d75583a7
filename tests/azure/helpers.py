"""Helpers shared by the Azurite tests: seeding containers, minting SAS files, running the stager."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from azure.storage.blob import (
    BlobBlock,
    BlobServiceClient,
    ContainerClient,
    ContentSettings,
    generate_container_sas,
)
from dtjob.azure.sas import ContainerSas, mint_with_account_key, validity_window
from dtjob.names import Access

from testbed.azurite import Azurite

REPO = Path(__file__).resolve().parents[2]


def service(azurite: Azurite) -> BlobServiceClient:
    return BlobServiceClient(azurite.endpoint, credential=azurite.account_key)


def seed(container: ContainerClient, tree: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: container.upload_blob(item[0], item[1], overwrite=True), tree.items()))


def put_without_md5(
    container: ContainerClient, name: str, data: bytes, settings: ContentSettings | None = None
) -> None:
    """A blob as azcopy without --put-md5 or any Put Block List upload leaves it: the service stores no
    Content-MD5 (a single Put Blob would have it computed). `settings` may carry one the bytes do not have."""
    blob = container.get_blob_client(name)
    block_id = "YmxvY2stMDAwMA=="  # base64, as Put Block wants its ids
    blob.stage_block(block_id, data)
    blob.commit_block_list([BlobBlock(block_id)], content_settings=settings or ContentSettings())


def mint(
    azurite: Azurite, container: str, access: Access, lifetime: timedelta = timedelta(hours=1)
) -> ContainerSas:
    start, expiry = validity_window(datetime.now(UTC), lifetime)
    return mint_with_account_key(
        azurite.endpoint, azurite.account_name, azurite.account_key, container, access, start, expiry
    )


def mint_raw(azurite: Azurite, container: str, permission: str) -> ContainerSas:
    """A SAS with arbitrary permissions, for tests that need a deliberately under-privileged token."""
    start, expiry = validity_window(datetime.now(UTC), timedelta(hours=1))
    token = generate_container_sas(
        azurite.account_name,
        container,
        account_key=azurite.account_key,
        permission=permission,
        start=start,
        expiry=expiry,
    )
    return ContainerSas(f"{azurite.endpoint}/{container}", token, start, expiry)


@dataclass(frozen=True)
class SasFiles:
    url_file: Path
    token_file: Path

    def write(self, sas: ContainerSas) -> None:
        self.url_file.write_text(sas.container_url + "\n")
        self.token_file.write_text(sas.token + "\n")


def sas_files(directory: Path, sas: ContainerSas) -> SasFiles:
    """The files a mounted `<job>-sas-*` Secret would present to the pod."""
    directory.mkdir(parents=True, exist_ok=True)
    files = SasFiles(directory / "container-url", directory / "sas-token")
    files.write(sas)
    return files


def stager_argv(files: SasFiles, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dtjob.stager",
        *args,
        "--container-url-file",
        str(files.url_file),
        "--sas-file",
        str(files.token_file),
    ]


def stager_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run_stager(files: SasFiles, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stager_argv(files, *args), env=stager_env(), capture_output=True, text=True, timeout=120, check=False
    )


def tree_of(root: Path) -> dict[str, bytes]:
    """Every visible file under root (the stager's hidden manifest and marker excluded)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".dtjob")
    }
