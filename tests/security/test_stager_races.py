"""The stager on a volume other jobs share: the jobs of a sweep stage one dataset onto one PVC or NFS share,
and anyone who may write that volume may plant links in it and name blobs. Real stager processes (as the
staging Job runs them) against Azurite; no cluster is needed."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from azure.storage.blob import ContainerClient
from dtjob.contract.transfer_report import PROGRESS_MARKER, ExitCode, ProgressSnapshot
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.conftest import azurite, container, container_name  # noqa: F401
from tests.azure.helpers import (
    SasFiles,
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

VICTIM = b"a file outside the destination that the stager must never touch\n"
WAITED = "waiting for another stager writing"


def stage_args(dest: Path, termination: Path, *extra: str) -> list[str]:
    return ["--prefix", "x", "--dest", str(dest), "--termination-file", str(termination), *extra]


def input_sas(azurite: Azurite, container: ContainerClient, tmp_path: Path) -> SasFiles:  # noqa: F811
    """The files of the staging Job's mounted `<job>-sas-in` Secret."""
    return sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".dtjob-part")]


def test_a_second_stager_on_the_same_destination_waits_then_skips_every_file(
    azurite: Azurite,  # noqa: F811
    container: ContainerClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A sweep's second job starts its stager while the first is mid-transfer on the same destination: the
    second waits for the first (saying so), then finds every file there; neither truncates, sweeps or renames
    the other's temp files, and every file is whole."""
    blobs = {f"x/d{i % 6}/f{i:04d}.bin": os.urandom(24_576) for i in range(600)}
    seed(container, blobs)
    files = input_sas(azurite, container, tmp_path)
    dest = tmp_path / "shared"

    def start(name: str, concurrency: str) -> subprocess.Popen[str]:
        argv = stager_argv(files, *stage_args(dest, tmp_path / name, "--concurrency", concurrency))
        return subprocess.Popen(
            argv, env=stager_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    first = start("first", "1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(dest.rglob("f*.bin"))) < 20 and first.poll() is None:
        time.sleep(0.01)
    second = start("second", "4")
    second_err = second.communicate(timeout=180)[1]
    first_err = first.communicate(timeout=180)[1]
    assert (first.returncode, second.returncode) == (0, 0), f"first: {first_err}\nsecond: {second_err}"
    assert tree_of(dest) == {k.removeprefix("x/"): v for k, v in blobs.items()}
    assert temp_files(dest) == []
    assert WAITED not in first_err
    assert f"stager: {WAITED} {dest}" in second_err
    done = ProgressSnapshot.from_json((tmp_path / "first").read_text())
    assert done.files_done + done.files_skipped == len(blobs)
    waited = ProgressSnapshot.from_json((tmp_path / "second").read_text())
    assert (waited.phase, waited.files_done, waited.files_skipped) == ("done", 0, len(blobs))


def test_a_stager_that_holds_the_destination_too_long_is_waited_for_only_as_long_as_allowed(
    azurite: Azurite,  # noqa: F811
    container: ContainerClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A stager that never lets go (hung on a dead share, say) holds up the next one for --lock-wait seconds,
    not for ever: the waiter reports its wait while it lasts, then fails naming the lock, having written
    nothing."""
    seed(container, {"x/a.bin": b"a"})
    dest = tmp_path / "shared"
    dest.mkdir()
    holder = os.open(dest / ".dtjob-stage.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        extra = ("--lock-wait", "2", "--progress-interval", "0.2")
        files = input_sas(azurite, container, tmp_path)
        waited = run_stager(files, *stage_args(dest, tmp_path / "t", *extra))
    finally:
        os.close(holder)
    assert waited.returncode == ExitCode.LOCAL_IO, waited.stderr
    reason = ProgressSnapshot.from_json((tmp_path / "t").read_text()).reason
    assert reason == f"another stager still holds {dest / '.dtjob-stage.lock'} after a wait of 2s"
    assert f"stager: {WAITED} {dest}" in waited.stderr
    lines = waited.stdout.splitlines()
    snapshots = [json.loads(line.removeprefix(PROGRESS_MARKER)) for line in lines if PROGRESS_MARKER in line]
    assert ("waiting", f"{WAITED} {dest}") in {(s["phase"], s["reason"]) for s in snapshots}
    assert sorted(p.name for p in dest.iterdir()) == [".dtjob-stage.lock"]


def _link_a_directory(dest: Path, outside: Path) -> None:
    (dest / "sub").symlink_to(outside, target_is_directory=True)


def _link_the_manifest(dest: Path, outside: Path) -> None:
    (dest / ".dtjob-manifest.jsonl").symlink_to(outside / "victim.bin")


def _link_the_lock(dest: Path, outside: Path) -> None:
    (dest / ".dtjob-stage.lock").symlink_to(outside / "victim.bin")


def _link_a_final_name(dest: Path, outside: Path) -> None:
    """A link at a staged file's name, to a file holding the blob's very bytes, so a check that follows it
    finds the file present."""
    (outside / "same.bin").write_bytes(b"top")
    (dest / "top.bin").unlink()
    (dest / "top.bin").symlink_to(outside / "same.bin")


def _link_the_old_temp_names(dest: Path, outside: Path) -> None:
    """Links where a stager that names its temp files after their file would write next: the changed blob's
    and the completion marker's."""
    (dest / "sub" / ".a.bin.dtjob-part").symlink_to(outside / "victim.bin")
    (dest / ".dtjob-staged.json.dtjob-part").symlink_to(outside / "victim.bin")


REFUSED = {
    "a directory": (_link_a_directory, "sub"),
    "the manifest": (_link_the_manifest, ".dtjob-manifest.jsonl"),
    "the lock file": (_link_the_lock, ".dtjob-stage.lock"),
}


@pytest.mark.parametrize("where", list(REFUSED))
def test_a_link_planted_where_the_stager_writes_is_refused_naming_it(
    azurite: Azurite,  # noqa: F811
    container: ContainerClient,  # noqa: F811
    tmp_path: Path,
    where: str,
) -> None:
    """A link in place of a directory or of the stager's own bookkeeping fails the run, naming the link:
    nothing is written through it, so the file outside the destination keeps its bytes."""
    plant, name = REFUSED[where]
    seed(container, {"x/sub/victim.bin": b"the blob's bytes", "x/top.bin": b"top"})
    dest, outside = tmp_path / "data", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (outside / "victim.bin").write_bytes(VICTIM)
    plant(dest, outside)
    failed = run_stager(input_sas(azurite, container, tmp_path), *stage_args(dest, tmp_path / "t"))
    assert (outside / "victim.bin").read_bytes() == VICTIM
    assert sorted(p.name for p in outside.iterdir()) == ["victim.bin"]
    assert failed.returncode == ExitCode.LOCAL_IO, failed.stderr
    reason = ProgressSnapshot.from_json((tmp_path / "t").read_text()).reason
    assert reason.startswith(f"{dest / name} is a symbolic link"), reason
    assert reason in failed.stderr


PASSED_BY = {
    "a staged file's name": _link_a_final_name,
    "the temp names of an earlier stager": _link_the_old_temp_names,
}


@pytest.mark.parametrize("where", list(PASSED_BY))
def test_a_link_at_a_name_the_stager_replaces_is_never_followed(
    azurite: Azurite,  # noqa: F811
    container: ContainerClient,  # noqa: F811
    tmp_path: Path,
    where: str,
) -> None:
    """A link at a file's final name is replaced by the file (the name is the stager's to write); links at
    the names an earlier stager gave its temp files are left alone. Neither is followed, for a read or a
    write."""
    seed(container, {"x/sub/a.bin": b"first version", "x/top.bin": b"top"})
    files, dest, outside = input_sas(azurite, container, tmp_path), tmp_path / "data", tmp_path / "outside"
    assert run_stager(files, *stage_args(dest, tmp_path / "t")).returncode == 0
    outside.mkdir()
    (outside / "victim.bin").write_bytes(VICTIM)
    PASSED_BY[where](dest, outside)
    container.upload_blob("x/sub/a.bin", b"second version", overwrite=True)
    again = run_stager(files, *stage_args(dest, tmp_path / "t"))
    assert (outside / "victim.bin").read_bytes() == VICTIM
    assert again.returncode == 0, again.stderr
    for name, data in {"sub/a.bin": b"second version", "top.bin": b"top"}.items():
        assert not (dest / name).is_symlink(), name
        assert (dest / name).read_bytes() == data


def put_raw(emulator: Azurite, container_named: str, encoded_name: str, data: bytes) -> None:
    """A blob under a name the SDK would normalize before sending (dot segments), sent percent-encoded as any
    HTTP client can: Blob Storage stores it as the decoded name."""
    sas = mint_raw(emulator, container_named, "cw")
    response = requests.put(
        f"{sas.container_url}/{encoded_name}?{sas.token}",
        data=data,
        headers={"x-ms-blob-type": "BlockBlob", "x-ms-version": "2021-08-06"},
        timeout=30,
    )
    assert response.status_code == 201, response.text


ESCAPES: dict[str, Callable[[Path], str]] = {
    "up the tree": lambda dest: "x/%2E%2E/%2E%2E/escaped.bin",
    "down then up the tree": lambda dest: "x/sub/%2E%2E/%2E%2E/%2E%2E/escaped.bin",
    "an absolute path": lambda dest: "x/" + str(dest.parent / "escaped.bin"),
}


@pytest.mark.parametrize("how", list(ESCAPES))
def test_a_blob_named_to_escape_the_destination_is_refused_before_anything_is_written(
    azurite: Azurite,  # noqa: F811
    container: ContainerClient,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    dest = tmp_path / "volume" / "data"
    encoded = ESCAPES[how](dest)
    put_raw(azurite, container.container_name, encoded, b"escaped")
    seed(container, {"x/fine.bin": b"fine"})
    [name] = [b.name for b in container.list_blobs() if b.name.endswith("escaped.bin")]
    assert ".." in name or "//" in name, name  # stored as the escape it is
    failed = run_stager(input_sas(azurite, container, tmp_path), *stage_args(dest, tmp_path / "t"))
    assert failed.returncode != 0
    assert f"blob name {name!r} would escape the destination" in failed.stderr
    assert [p for p in tmp_path.rglob("escaped.bin")] == []
    assert tree_of(dest) == {}
