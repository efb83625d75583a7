"""`dtjob data hash` against Azurite: blobs uploaded without Content-MD5 get the right one, nothing else of
theirs changes, a blob rewritten meanwhile is never given a wrong hash, and the stager then verifies their
bytes (and says when it could not)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient, ContentSettings
from dtjob.azure import download, hashing
from dtjob.azure.download import Stager
from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.cli.main import main
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.helpers import mint, mint_raw, put_without_md5, run_stager, sas_files, tree_of

pytestmark = pytest.mark.azure

KEPT = ContentSettings(
    content_type="image/jpeg",
    content_encoding="identity",
    content_language="en",
    content_disposition="inline",
    cache_control="max-age=60",
)


def md5_of(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def stored_md5(container: ContainerClient, name: str) -> bytes | None:
    raw = container.get_blob_client(name).get_blob_properties().content_settings.content_md5
    return bytes(raw) if raw else None


def where(azurite: Azurite, container: ContainerClient, prefix: str = "x") -> list[str]:
    return ["--endpoint", azurite.endpoint, "--container", container.container_name, "--prefix", prefix]


def in_process_stager(azurite: Azurite, container: ContainerClient, dest: Path) -> Stager:
    sas = mint(azurite, container.container_name, Access.INPUT)
    client = ContainerClient.from_container_url(sas.container_url, credential=sas.token)
    return Stager(lambda: client, lambda: None, dest, Progress(), "input container c", "Secret x")


def test_records_the_right_md5_keeps_the_content_settings_and_a_rerun_changes_nothing(
    azurite: Azurite, container: ContainerClient, key_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, dressed = os.urandom(70_000), os.urandom(3)
    put_without_md5(container, "x/plain.bin", plain)
    put_without_md5(container, "x/dressed.JPEG", dressed, KEPT)
    container.upload_blob("x/has-one.bin", b"uploaded whole")  # a single Put Blob: the service computes one
    put_without_md5(container, "elsewhere/not-under-x.bin", b"left alone")
    assert stored_md5(container, "x/plain.bin") is None
    assert stored_md5(container, "x/dressed.JPEG") is None
    had_one = container.get_blob_client("x/has-one.bin").get_blob_properties().etag

    assert main(["data", "hash", *where(azurite, container), "--concurrency", "2"]) == 0
    out = capsys.readouterr().out
    assert "hashed 2 blob(s), 1 already had a Content-MD5, 0 changed meanwhile" in out
    assert stored_md5(container, "x/plain.bin") == md5_of(plain)
    assert stored_md5(container, "x/dressed.JPEG") == md5_of(dressed)
    kept = container.get_blob_client("x/dressed.JPEG").get_blob_properties().content_settings
    assert (
        kept.content_type,
        kept.content_encoding,
        kept.content_language,
        kept.content_disposition,
        kept.cache_control,
    ) == ("image/jpeg", "identity", "en", "inline", "max-age=60")
    assert container.get_blob_client("x/has-one.bin").get_blob_properties().etag == had_one
    assert stored_md5(container, "elsewhere/not-under-x.bin") is None
    assert container.download_blob("x/plain.bin").readall() == plain

    etags = {b.name: b.etag for b in container.list_blobs()}
    assert main(["data", "hash", *where(azurite, container)]) == 0
    assert "hashed 0 blob(s), 3 already had a Content-MD5, 0 changed meanwhile" in capsys.readouterr().out
    assert {b.name: b.etag for b in container.list_blobs()} == etags  # not one blob touched


def test_after_hashing_a_same_length_swap_under_the_old_md5_is_refused_by_the_stager(
    azurite: Azurite, container: ContainerClient, key_env: None, tmp_path: Path
) -> None:
    """Bytes that change at rest or on the way while the length stays: without a Content-MD5 the stager can
    only compare lengths and takes them; once hashed, they fail the MD5 check."""
    first, swapped, corrupt = os.urandom(4096), os.urandom(4096), os.urandom(4096)
    put_without_md5(container, "x/a.bin", first)
    put_without_md5(container, "x/a.bin", swapped)
    before = in_process_stager(azurite, container, tmp_path / "before").run("x")
    assert before.files_done == 1
    assert tree_of(tmp_path / "before") == {"a.bin": swapped}  # taken: nothing to check its bytes against

    assert main(["data", "hash", *where(azurite, container), "--no-progress"]) == 0
    put_without_md5(container, "x/a.bin", corrupt, ContentSettings(content_md5=bytearray(md5_of(swapped))))
    assert stored_md5(container, "x/a.bin") == md5_of(swapped)
    with pytest.raises(StorageFailure) as refused:
        in_process_stager(azurite, container, tmp_path / "after").run("x")
    assert refused.value.code == ExitCode.INTEGRITY
    assert "x/a.bin does not match its Content-MD5" in refused.value.reason
    assert tree_of(tmp_path / "after") == {}


def test_a_blob_rewritten_after_the_listing_is_not_given_the_old_version_hash(
    azurite: Azurite, container: ContainerClient
) -> None:
    put_without_md5(container, "x/a.bin", b"version one")
    [stale] = hashing.list_blobs(container, "x/")
    put_without_md5(container, "x/a.bin", b"version two")
    hasher = hashing.Hasher(container, Progress(), "container c", "the credentials")
    assert hasher.hash_one(stale) is hashing.Outcome.CHANGED
    assert stored_md5(container, "x/a.bin") is None


def test_a_blob_rewritten_between_read_and_record_is_not_given_the_hash_read(
    azurite: Azurite, container: ContainerClient
) -> None:
    put_without_md5(container, "x/a.bin", b"version one", KEPT)
    [listed] = hashing.list_blobs(container, "x/")
    md5 = hashing.read_md5(container, listed, lambda _size: None)
    assert md5 == md5_of(b"version one")
    put_without_md5(container, "x/a.bin", b"version two")
    assert hashing.record_md5(container, listed, md5) is False
    assert stored_md5(container, "x/a.bin") is None
    # The same record on the version it was read from takes.
    [fresh] = hashing.list_blobs(container, "x/")
    assert hashing.record_md5(container, fresh, md5_of(b"version two")) is True
    assert stored_md5(container, "x/a.bin") == md5_of(b"version two")


def test_blobs_changed_meanwhile_are_named_and_the_exit_says_to_rerun(
    azurite: Azurite,
    container: ContainerClient,
    key_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    put_without_md5(container, "x/moving.bin", b"old")
    put_without_md5(container, "x/still.bin", b"still")
    listed = hashing.list_blobs

    def listing_then_a_rewrite(client: ContainerClient, prefix: str) -> list[hashing.Listed]:
        blobs = listed(client, prefix)
        put_without_md5(container, "x/moving.bin", b"new content")
        return blobs

    monkeypatch.setattr(hashing, "list_blobs", listing_then_a_rewrite)
    assert main(["data", "hash", *where(azurite, container)]) == 1
    printed = capsys.readouterr()
    assert "hashed 1 blob(s), 0 already had a Content-MD5, 1 changed meanwhile" in printed.out
    assert "1 blob(s) changed or went away while being hashed" in printed.err
    assert "x/moving.bin; run the same command again to hash them" in printed.err
    assert stored_md5(container, "x/moving.bin") is None
    assert stored_md5(container, "x/still.bin") == md5_of(b"still")

    monkeypatch.setattr(hashing, "list_blobs", listed)
    assert main(["data", "hash", *where(azurite, container)]) == 0
    assert stored_md5(container, "x/moving.bin") == md5_of(b"new content")


@pytest.mark.parametrize(
    ("permission", "step", "needs"),
    [
        ("rl", "recording the Content-MD5 of x/a.bin", "write permission on the blobs (w in a SAS"),
        ("l", "reading x/a.bin", "read permission on the blobs (r in a SAS"),
    ],
    ids=["no-write", "no-read"],
)
def test_a_denial_names_the_permission_missing(
    azurite: Azurite,
    container: ContainerClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    permission: str,
    step: str,
    needs: str,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    put_without_md5(container, "x/a.bin", b"data")
    sas = mint_raw(azurite, container.container_name, permission)
    assert main(["data", "hash", *where(azurite, container), "--sas", sas.token]) == ExitCode.DENIED
    err = capsys.readouterr().err
    assert f"container {container.container_name}: {step}: access denied (403" in err
    assert f"check the SAS token (--sas / AZURE_STORAGE_SAS_TOKEN); recording hashes needs {needs}" in err
    assert stored_md5(container, "x/a.bin") is None


def test_the_stager_says_how_many_blobs_it_checked_by_length_only_and_keeps_them_after_hashing(
    azurite: Azurite,
    container: ContainerClient,
    key_env: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hashing gives a blob a new ETag; the manifest's MD5 (computed at download) matches the Content-MD5 it
    gets, so a staged tree is not fetched again."""
    tree = {"x/a.bin": os.urandom(3000), "x/sub/b.bin": os.urandom(10)}
    for name, data in tree.items():
        put_without_md5(container, name, data)
    container.upload_blob("x/hashed.bin", b"has its Content-MD5")
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    dest = tmp_path / "data"
    args = ("--prefix", "x", "--dest", str(dest), "--termination-file", str(tmp_path / "t"))
    first = run_stager(files, *args)
    assert first.returncode == 0, first.stderr
    line = (
        "stager: fetched 2 blob(s) under prefix 'x/' without Content-MD5, checked by their length only; "
        "`dtjob data hash` records one for them"
    )
    assert line in first.stderr
    inodes = {p: p.stat().st_ino for p in dest.rglob("*.bin")}
    assert len(inodes) == 3

    etags = {b.name: b.etag for b in container.list_blobs()}
    assert main(["data", "hash", *where(azurite, container), "--no-progress"]) == 0
    changed = {b.name for b in container.list_blobs() if b.etag != etags[b.name]}
    assert changed == set(tree)  # the hashed blobs are new versions to the stager

    def no_rereading(fd: int) -> str:
        raise AssertionError(f"a staged file (fd {fd}) hashed again: the manifest's MD5 should have matched")

    # Neither fetched nor read again: a million staged files are not hashed anew after `dtjob data hash`.
    monkeypatch.setattr(download, "fd_md5_b64", no_rereading)
    stager = in_process_stager(azurite, container, dest)
    snap = stager.run("x")
    assert (snap.files_done, snap.files_skipped, snap.bytes_done) == (0, 3, 0)
    assert stager.unhashed == 0
    assert {p: p.stat().st_ino for p in inodes} == inodes

    fresh = run_stager(files, "--prefix", "x", "--dest", str(tmp_path / "fresh"))
    assert fresh.returncode == 0, fresh.stderr
    assert "without Content-MD5" not in fresh.stderr  # every blob verified by its MD5 now
