"""The staging program (`python -m dtjob.stager`) against Azurite, run as the staging Job runs it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import ContainerClient, ContentSettings
from dtjob.azure.download import Stager
from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.azure.sas import ContainerSas, mint_with_account_key
from dtjob.contract.transfer_report import ExitCode, ProgressSnapshot, parse_progress
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.helpers import (
    mint,
    mint_raw,
    run_stager,
    sas_files,
    seed,
    stager_argv,
    stager_env,
    tree_of,
)

pytestmark = pytest.mark.azure

NESTED = {
    "imagenet/train/n01440764/a.JPEG": os.urandom(3000),
    "imagenet/train/n01440764/b.JPEG": os.urandom(70_000),
    "imagenet/train/n01443537/deep/er/c.JPEG": os.urandom(5),
    "imagenet/train/empty.txt": b"",
    "imagenet/train/labels with space.txt": b"tench\ngoldfish\n",
    "imagenet/train/unicodé.bin": b"\x00\x01",
    "imagenet/val/other.JPEG": b"not under the prefix",
    "imagenet/trainval.txt": b"a sibling that shares the prefix's first letters",
}


def expected_train() -> dict[str, bytes]:
    prefix = "imagenet/train/"
    return {k[len(prefix) :]: v for k, v in NESTED.items() if k.startswith(prefix)}


def test_stages_a_nested_tree_exactly_and_reports_progress(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    seed(container, NESTED)
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    dest, progress_file, term = tmp_path / "data", tmp_path / "progress.json", tmp_path / "termination"
    done = run_stager(
        files, "--prefix", "imagenet/train", "--dest", str(dest), "--concurrency", "4",
        "--progress-file", str(progress_file), "--termination-file", str(term),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert tree_of(dest) == expected_train()
    final = ProgressSnapshot.from_json(term.read_text())
    assert final.phase == "done"
    assert (final.files_total, final.files_done, final.files_skipped) == (6, 6, 0)
    assert final.bytes_total == final.bytes_done == sum(len(v) for v in expected_train().values())
    assert ProgressSnapshot.from_json(progress_file.read_text()) == final
    assert parse_progress(done.stdout) == final
    assert json.loads((dest / ".dtjob-staged.json").read_text())["files"] == 6


def test_rerun_skips_files_already_staged(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    seed(container, NESTED)
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    dest = tmp_path / "data"
    args = ("--prefix", "imagenet/train/", "--dest", str(dest), "--termination-file", str(tmp_path / "t"))
    assert run_stager(files, *args).returncode == 0
    inodes = {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file() and not p.name.startswith(".")}
    again = run_stager(files, *args)
    assert again.returncode == 0, again.stderr
    snap = ProgressSnapshot.from_json((tmp_path / "t").read_text())
    assert (snap.files_done, snap.files_skipped, snap.bytes_done) == (0, 6, 0)
    assert {p: p.stat().st_ino for p in inodes} == inodes
    # A changed blob is fetched again; the others stay.
    container.upload_blob("imagenet/train/empty.txt", b"now with content", overwrite=True)
    third = run_stager(files, *args)
    assert third.returncode == 0, third.stderr
    snap = ProgressSnapshot.from_json((tmp_path / "t").read_text())
    assert (snap.files_done, snap.files_skipped) == (1, 5)
    assert (dest / "empty.txt").read_bytes() == b"now with content"


def test_resumes_after_a_kill_without_refetching_finished_files(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    many = {f"shards/{i // 25:02d}/f{i:04d}.bin": os.urandom(16_384) for i in range(200)}
    seed(container, many)
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    dest = tmp_path / "data"
    args = ("--prefix", "shards", "--dest", str(dest), "--concurrency", "1", "--no-fsync")
    proc = subprocess.Popen(
        stager_argv(files, *args, "--termination-file", str(tmp_path / "t1")),
        env=stager_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(dest.rglob("f*.bin"))) < 20:
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finished = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("f*.bin")}
    assert 20 <= len(finished) < len(many), "the kill must land mid-run"
    assert not (dest / ".dtjob-staged.json").exists()
    for path in finished:  # whatever has its final name is complete
        assert path.read_bytes() == many[f"shards/{path.relative_to(dest).as_posix()}"]

    resumed = run_stager(files, *args, "--termination-file", str(tmp_path / "t2"))
    assert resumed.returncode == 0, resumed.stderr
    snap = ProgressSnapshot.from_json((tmp_path / "t2").read_text())
    assert snap.files_skipped >= len(finished)
    assert snap.files_done + snap.files_skipped == len(many)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished} == finished
    assert tree_of(dest) == {k.removeprefix("shards/"): v for k, v in many.items()}
    assert not list(dest.rglob("*.dtjob-part"))


def test_denied_sas_fails_cleanly_with_a_reason(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    seed(container, NESTED)
    # Lists fine, but every read is denied: the failure comes after the plan, mid-transfer.
    files = sas_files(tmp_path / "sas", mint_raw(azurite, container.container_name, "l"))
    dest, term = tmp_path / "data", tmp_path / "termination"
    failed = run_stager(
        files, "--prefix", "imagenet/train", "--dest", str(dest), "--termination-file", str(term),
        "--credentials-hint", "Secret r50-sas-in",
    )  # fmt: skip
    assert failed.returncode == ExitCode.DENIED
    snap = ProgressSnapshot.from_json(term.read_text())
    assert snap.phase == "failed"
    assert snap.reason.startswith(f"input container {container.container_name}: access denied (403")
    assert snap.reason.endswith("check Secret r50-sas-in")
    assert snap.reason in failed.stderr
    assert tree_of(dest) == {}
    assert not list(dest.rglob("*.dtjob-part"))
    assert not (dest / ".dtjob-staged.json").exists()
    assert (
        files.token_file.read_text().strip().split("sig=")[1].split("&")[0]
        not in failed.stdout + failed.stderr
    )


def test_expired_sas_is_denied_at_listing(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    seed(container, NESTED)
    past = datetime.now(UTC) - timedelta(hours=2)
    expired = mint_with_account_key(
        azurite.endpoint, azurite.account_name, azurite.account_key, container.container_name,
        Access.INPUT, past, past + timedelta(hours=1),
    )  # fmt: skip
    files = sas_files(tmp_path / "sas", expired)
    failed = run_stager(files, "--dest", str(tmp_path / "d"), "--termination-file", str(tmp_path / "t"))
    assert failed.returncode == ExitCode.DENIED
    assert "access denied (403" in ProgressSnapshot.from_json((tmp_path / "t").read_text()).reason


def test_missing_container_and_empty_prefix_are_not_found(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    seed(container, NESTED)
    missing = sas_files(tmp_path / "a", mint(azurite, container.container_name + "nope", Access.INPUT))
    failed = run_stager(missing, "--dest", str(tmp_path / "d1"), "--termination-file", str(tmp_path / "t1"))
    assert failed.returncode == ExitCode.NOT_FOUND
    assert "not found (404" in (tmp_path / "t1").read_text()
    files = sas_files(tmp_path / "b", mint(azurite, container.container_name, Access.INPUT))
    empty = run_stager(
        files,
        "--prefix",
        "no/such/dir",
        "--dest",
        str(tmp_path / "d2"),
        "--termination-file",
        str(tmp_path / "t2"),
    )
    assert empty.returncode == ExitCode.NOT_FOUND
    assert "no blobs under prefix 'no/such/dir/'" in (tmp_path / "t2").read_text()


def test_unreadable_credential_files_are_a_usage_error(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    files = sas_files(tmp_path / "sas", ContainerSas("http://127.0.0.1:9/acct/c", "sv=x", now, now))
    files.token_file.unlink()
    failed = run_stager(files, "--dest", str(tmp_path / "d"), "--termination-file", str(tmp_path / "t"))
    assert failed.returncode == ExitCode.USAGE
    assert "cannot read the SAS token file" in failed.stderr
    assert "cannot read the SAS token file" in ProgressSnapshot.from_json((tmp_path / "t").read_text()).reason


def _in_process_stager(azurite: Azurite, container: ContainerClient, dest: Path, **kwargs: Any) -> Stager:
    sas = mint(azurite, container.container_name, Access.INPUT)
    # Small transfer sizes force the SDK to fetch a large blob in several ranges.
    client = ContainerClient.from_container_url(
        sas.container_url, credential=sas.token, max_single_get_size=64 * 1024, max_chunk_get_size=64 * 1024
    )
    return Stager(lambda: client, lambda: None, dest, Progress(), "input container c", "Secret x", **kwargs)


def test_large_blobs_download_in_ranges_and_verify(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    tree = {"shards/train-000.tar": os.urandom(700_000), "shards/small.txt": b"tiny"}
    seed(container, tree)
    stager = _in_process_stager(
        azurite, container, tmp_path / "d", large_file_bytes=100_000, range_concurrency=3
    )
    snap = stager.run("shards")
    assert (snap.files_done, snap.bytes_done) == (2, 700_004)
    assert tree_of(tmp_path / "d") == {k.removeprefix("shards/"): v for k, v in tree.items()}


@pytest.mark.parametrize("large_file_bytes", [1 << 40, 1], ids=["stream", "ranges"])
def test_content_md5_mismatch_fails_and_leaves_nothing(
    azurite: Azurite, container: ContainerClient, tmp_path: Path, large_file_bytes: int
) -> None:
    wrong_md5 = bytearray(hashlib.md5(b"something else", usedforsecurity=False).digest())
    blob = container.upload_blob("x/bad.bin", os.urandom(200_000))
    # Set Blob Properties stores an MD5 without checking it, as a buggy uploader would.
    blob.set_http_headers(ContentSettings(content_md5=wrong_md5))
    stager = _in_process_stager(azurite, container, tmp_path / "d", large_file_bytes=large_file_bytes)
    with pytest.raises(StorageFailure) as failed:
        stager.run("x")
    assert failed.value.code == ExitCode.INTEGRITY
    assert "x/bad.bin does not match its Content-MD5" in failed.value.reason
    assert tree_of(tmp_path / "d") == {}
    assert not list((tmp_path / "d").rglob("*.dtjob-part"))


@pytest.mark.parametrize("name", [".dtjob-manifest.jsonl", ".dtjob-staged.json", "sub/.a.JPEG.dtjob-part"])
def test_a_blob_named_like_the_stagers_bookkeeping_is_refused_by_name(
    azurite: Azurite, container: ContainerClient, tmp_path: Path, name: str
) -> None:
    seed(container, {"x/a.JPEG": b"data", f"x/{name}": b'{"forged": true}\n'})
    stager = _in_process_stager(azurite, container, tmp_path / "d")
    with pytest.raises(StorageFailure) as refused:
        stager.run("x")
    assert refused.value.code == ExitCode.USAGE
    assert f"blob name 'x/{name}' collides with the stager's own bookkeeping files" in refused.value.reason
    assert tree_of(tmp_path / "d") == {}  # refused before anything was fetched


def test_local_files_no_longer_listed_are_kept_and_reported(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    """The stager never deletes in its destination: a file the prefix no longer has stays, and the run says
    which (stderr, the staging pod's log), so a staged tree with extra files is never a silent surprise."""
    seed(container, {"x/keep.txt": b"keep", "x/sub/gone.txt": b"soon deleted"})
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    dest = tmp_path / "data"
    args = ("--prefix", "x/", "--dest", str(dest), "--termination-file", str(tmp_path / "t"))
    first = run_stager(files, *args)
    assert first.returncode == 0, first.stderr
    assert "kept" not in first.stderr
    container.delete_blob("x/sub/gone.txt")
    (dest / "mine.log").write_text("put there by hand")
    again = run_stager(files, *args)
    assert again.returncode == 0, again.stderr
    assert f"kept 2 local file(s) under {dest} that are not under prefix 'x/': mine.log, sub/gone.txt" in (
        again.stderr
    )
    assert tree_of(dest) == {
        "keep.txt": b"keep",
        "mine.log": b"put there by hand",
        "sub/gone.txt": b"soon deleted",
    }


def test_a_blob_without_md5_is_checked_by_its_length(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    """A blob with no Content-MD5 (another tool's upload) is still checked: what arrives must have the length
    the listing gave. Here it is replaced by a longer one between the listing and the download."""
    blob = container.upload_blob("x/a.bin", os.urandom(1000))
    blob.set_http_headers(ContentSettings())  # no Content-MD5
    assert container.get_blob_client("x/a.bin").get_blob_properties().content_settings.content_md5 is None
    sas = mint(azurite, container.container_name, Access.INPUT)
    client = ContainerClient.from_container_url(sas.container_url, credential=sas.token)
    calls = 0

    def factory() -> ContainerClient:
        nonlocal calls
        calls += 1
        if calls == 2:  # the listing is done; the first download is next
            replaced = container.upload_blob("x/a.bin", os.urandom(1500), overwrite=True)
            replaced.set_http_headers(ContentSettings())
        return client

    stager = Stager(factory, lambda: None, tmp_path / "d", Progress(), "input container c", "Secret x")
    with pytest.raises(StorageFailure) as failed:
        stager.run("x")
    assert failed.value.code == ExitCode.INTEGRITY
    assert "x/a.bin came with 1500 bytes where the listing said 1000" in failed.value.reason
    assert tree_of(tmp_path / "d") == {}
