"""`dtjob data upload` / `dtjob data ls` against Azurite: round trip, resume, and clear errors."""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient
from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.cli.blob_access import progress_lines
from dtjob.cli.data import _endpoint_and_account
from dtjob.cli.main import main
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.helpers import mint, mint_raw, run_stager, sas_files, service, tree_of

pytestmark = pytest.mark.azure


def make_tree(root: Path) -> dict[str, bytes]:
    tree = {
        "train/n01/a.JPEG": os.urandom(20_000),
        "train/n01/b.JPEG": os.urandom(1),
        "train/n02/deeper/c.JPEG": os.urandom(300_000),
        "val/x.JPEG": b"",
        "LOC_synset_mapping.txt": b"n01 tench\n",
    }
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return tree


def test_upload_round_trips_a_tree_and_resumes(
    azurite: Azurite,
    container: ContainerClient,
    key_env: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tree = make_tree(tmp_path / "src")
    where = ["--endpoint", azurite.endpoint, "--container", container.container_name, "--prefix", "imagenet"]
    assert main(["data", "upload", str(tmp_path / "src"), *where, "--concurrency", "4"]) == 0
    assert "uploaded 5 file(s)" in capsys.readouterr().out

    assert main(["data", "ls", *where]) == 0
    listed = capsys.readouterr()
    assert listed.out.split() == sorted(f"imagenet/{rel}" for rel in tree)
    assert "5 blob(s)" in listed.err

    # Stage it back down with a read SAS, as a job would: the same bytes come back.
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    staged = run_stager(files, "--prefix", "imagenet", "--dest", str(tmp_path / "dest"))
    assert staged.returncode == 0, staged.stderr
    assert tree_of(tmp_path / "dest") == tree

    # Resume: one file changed locally, the rest are skipped by size + MD5.
    (tmp_path / "src" / "val" / "x.JPEG").write_bytes(b"changed")
    assert main(["data", "upload", str(tmp_path / "src"), *where, "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    assert "uploaded 1 file(s), 7 bytes" in out
    assert "(4 already there)" in out
    assert container.download_blob("imagenet/val/x.JPEG").readall() == b"changed"


def test_upload_with_a_sas_token(
    azurite: Azurite, container: ContainerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    make_tree(tmp_path / "src")
    # A user's own SAS: `dtjob data upload` lists first to skip what is there, so it needs list too.
    sas = mint_raw(azurite, container.container_name, "cwl")
    args = ["--endpoint", azurite.endpoint, "--container", container.container_name, "--sas", sas.token]
    assert main(["data", "upload", str(tmp_path / "src"), *args]) == 0
    assert len(list(container.list_blobs())) == 5


def test_bad_key_is_a_clear_denial(
    azurite: Azurite,
    container: ContainerClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_tree(tmp_path / "src")
    wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ=="
    monkeypatch.setenv("AZURE_STORAGE_KEY", wrong)
    where = ["--endpoint", azurite.endpoint, "--container", container.container_name]
    assert main(["data", "upload", str(tmp_path / "src"), *where]) == ExitCode.DENIED
    err = capsys.readouterr().err
    assert "access denied (403" in err
    assert "check the account key (--account-key / AZURE_STORAGE_KEY)" in err
    assert wrong not in err
    assert main(["data", "ls", *where]) == ExitCode.DENIED
    assert list(container.list_blobs()) == []


def test_missing_container_and_unreadable_files(
    azurite: Azurite,
    container: ContainerClient,
    key_env: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_tree(tmp_path / "src")
    missing = ["--endpoint", azurite.endpoint, "--container", container.container_name + "-missing"]
    assert main(["data", "upload", str(tmp_path / "src"), *missing]) == ExitCode.NOT_FOUND
    assert (
        "not found (404 ContainerNotFound) (create it, or pass --create-container)" in capsys.readouterr().err
    )
    assert main(["data", "upload", str(tmp_path / "src"), *missing, "--create-container"]) == 0
    service(azurite).delete_container(container.container_name + "-missing")

    (tmp_path / "src" / "train" / "dangling.JPEG").symlink_to(tmp_path / "nowhere")
    here = ["--endpoint", azurite.endpoint, "--container", container.container_name]
    assert main(["data", "upload", str(tmp_path / "src"), *here]) == ExitCode.LOCAL_IO
    err = capsys.readouterr().err
    assert "cannot read 1 file(s)" in err
    assert "dangling.JPEG: broken symbolic link" in err
    assert list(container.list_blobs()) == []  # nothing uploaded before the tree was known good

    assert main(["data", "upload", str(tmp_path / "nope"), *here]) == ExitCode.USAGE
    assert "is not a directory" in capsys.readouterr().err


def test_bad_arguments_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "ls", "--account", "Bad_Name", "--container", "c"]) == ExitCode.USAGE
    assert "--account: must be 3-24" in capsys.readouterr().err
    assert (
        main(["data", "ls", "--endpoint", "http://storage.example.com", "--container", "c"]) == ExitCode.USAGE
    )
    refused = capsys.readouterr().err
    assert "--endpoint: host 'storage.example.com' is not an Azure Blob Storage endpoint" in refused


def test_an_emulator_host_is_allowed_as_the_operator_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(account=None, endpoint="http://10.224.0.1:10000/devstoreaccount1")
    with pytest.raises(StorageFailure, match="not an Azure Blob Storage endpoint"):
        _endpoint_and_account(args)
    monkeypatch.setenv("DTJOB_EMULATOR_HOSTS", "10.224.0.1")
    assert _endpoint_and_account(args) == ("http://10.224.0.1:10000/devstoreaccount1", "devstoreaccount1")


def test_progress_without_a_terminal_is_plain_lines() -> None:
    progress = Progress()
    progress.planned(4, 4 * 2**20)
    progress.skipped(2**20)
    progress.add_bytes(2**20)
    progress.file_done()
    out = io.StringIO()
    with progress_lines(progress, "upload", 0.01, out):
        deadline = time.monotonic() + 10
        while "\n" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    first = out.getvalue().splitlines()[0]
    assert first.startswith("upload: 2/4 files, 2.0/4.0 MiB, ")
    assert first.endswith(" MiB/s")
