"""Results and logs land at the output prefix with the write SAS; a rotated token file is picked up."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import ContainerClient
from dtjob.azure.clients import SasFileSource, container_client
from dtjob.azure.logs import LogCap, upload_log
from dtjob.config import DEFAULT_LOG_CAP_BYTES
from dtjob.contract.results_upload import MANIFEST_NAME, parse_manifest
from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.names import Access, log_blob_name, output_url, run_prefix

from testbed.azurite import Azurite
from tests.azure.helpers import mint, mint_raw, run_stager, sas_files, stager_argv, stager_env

pytestmark = pytest.mark.azure


def _write_tree(root: Path) -> dict[str, bytes]:
    tree = {
        "checkpoints/epoch-1.pt": os.urandom(50_000),
        "checkpoints/epoch-2.pt": os.urandom(50_000),
        "model/final.pt": os.urandom(80_000),
        "metrics.json": b'{"top1": 0.76}',
    }
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return tree


def test_results_and_logs_land_at_the_output_prefix(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    tree = _write_tree(tmp_path / "out")
    sas = mint(azurite, container.container_name, Access.OUTPUT)
    files = sas_files(tmp_path / "sas", sas)
    prefix = run_prefix("runs", "team-a", "r50", "0b1c-uid")
    assert prefix == "runs/team-a/r50/0b1c-uid/"

    # As rank 0 runs it: the output SAS cannot list, so every file is uploaded without looking first.
    args = (
        "upload",
        "--src",
        str(tmp_path / "out"),
        "--prefix",
        prefix,
        "--overwrite",
        "--termination-file",
        str(tmp_path / "t"),
    )
    uploaded = run_stager(files, *args)
    assert uploaded.returncode == 0, uploaded.stderr
    assert ProgressSnapshot.from_json((tmp_path / "t").read_text()).files_done == 4

    logs = {
        "r50-launcher": "epoch 1 ... done\n",
        "r50-worker-0": "sshd ready\n",
        "r50-worker-1": "ünïcode ok\n",
    }
    # As the operator stores them, with the same SAS.
    writer = container_client(sas.container_url, sas.token)
    for pod, text in logs.items():
        name = log_blob_name("runs", "team-a", "r50", "0b1c-uid", pod)
        assert name == f"{prefix}logs/{pod}.log"
        upload_log(writer, name, [text.encode()], LogCap(DEFAULT_LOG_CAP_BYTES))

    # Read back with the account key (the write SAS itself cannot read).
    stored = {b.name: container.download_blob(b.name).readall() for b in container.list_blobs()}
    manifest = stored.pop(prefix + MANIFEST_NAME)  # written last: the run's results are complete
    assert parse_manifest(manifest.decode()) == {rel: len(data) for rel, data in tree.items()}
    assert stored == {
        **{prefix + rel: data for rel, data in tree.items()},
        **{f"{prefix}logs/{pod}.log": text.encode() for pod, text in logs.items()},
    }
    for blob in container.list_blobs(name_starts_with=prefix + "model/"):
        assert blob.content_settings.content_md5  # stored so downloads and the stager can verify
    url = output_url(sas.container_url, "runs", "team-a", "r50", "0b1c-uid")
    assert url == f"{azurite.endpoint}/{container.container_name}/runs/team-a/r50/0b1c-uid/"
    assert "sig=" not in url

    # A retried upload (the launcher failed after it) rewrites the run's own files.
    again = run_stager(files, *args)
    assert again.returncode == 0, again.stderr
    snap = ProgressSnapshot.from_json((tmp_path / "t").read_text())
    assert (snap.files_done, snap.files_skipped) == (4, 0)
    # Without --overwrite the uploader would list first, which the output SAS does not allow.
    listing = run_stager(files, *[a for a in args if a != "--overwrite"])
    assert listing.returncode != 0 and "403" in listing.stderr, listing.stderr


def test_a_resumable_upload_skips_what_is_there(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    """With a SAS that may list (a user's own, or `dtjob data upload`), unchanged files are not sent again."""
    _write_tree(tmp_path / "out")
    files = sas_files(tmp_path / "sas", mint_raw(azurite, container.container_name, "cwl"))
    args = ("upload", "--src", str(tmp_path / "out"), "--prefix", "p",
            "--termination-file", str(tmp_path / "t"))  # fmt: skip
    assert run_stager(files, *args).returncode == 0
    again = run_stager(files, *args)
    assert again.returncode == 0, again.stderr
    snap = ProgressSnapshot.from_json((tmp_path / "t").read_text())
    assert (snap.files_done, snap.files_skipped) == (0, 4)


def test_upload_with_a_read_sas_is_denied(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    _write_tree(tmp_path / "out")
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    denied = run_stager(
        files, "upload", "--src", str(tmp_path / "out"), "--prefix", "p",
        "--credentials-hint", "Secret r50-sas-out",
    )  # fmt: skip
    assert denied.returncode == 3
    assert "access denied (403" in denied.stderr
    assert "check Secret r50-sas-out" in denied.stderr
    assert list(container.list_blobs()) == []


def test_sas_file_source_follows_a_rotated_token(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    container.upload_blob("x", b"1")
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    source = SasFileSource(files.url_file, files.token_file, refresh_s=0)
    assert [b.name for b in source().list_blobs()] == ["x"]
    # The kubelet swaps the mounted file's content; a list-only token cannot read, so the swap is observable.
    files.write(mint_raw(azurite, container.container_name, "l"))
    with pytest.raises(HttpResponseError) as denied:
        source().download_blob("x").readall()
    assert denied.value.status_code == 403
    files.write(mint(azurite, container.container_name, Access.INPUT))
    assert source().download_blob("x").readall() == b"1"


def test_a_refused_results_upload_retries_with_the_token_read_again_until_it_is_let_in(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    """Storage refuses (a token the operator has not rotated yet): the upload says why on one line per try and
    succeeds on the try after the token file changed, within --retry-for."""
    tree = _write_tree(tmp_path / "out")
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    argv = stager_argv(
        files, "upload", "--src", str(tmp_path / "out"), "--prefix", "runs/r/", "--overwrite",
        "--termination-file", str(tmp_path / "t"), "--retry-for", "120",
    )  # fmt: skip
    with subprocess.Popen(argv, env=stager_env(), stderr=subprocess.PIPE, text=True) as stager:
        assert stager.stderr is not None
        lines: list[str] = []
        for line in stager.stderr:
            lines.append(line)
            if "dtjob results upload: retrying" in line:
                break
        assert lines and "access denied (403" in lines[-1] and "sig=" not in lines[-1], lines
        files.write(mint(azurite, container.container_name, Access.OUTPUT))  # the kubelet's refreshed file
        _, rest = stager.communicate(timeout=120)
    lines += rest.splitlines()
    assert stager.returncode == 0, lines
    done = [line for line in lines if "dtjob results upload: done: 4 files" in line]
    assert done and done[0].rstrip().endswith(f"on pod {socket.gethostname()}"), lines
    stored = {b.name.removeprefix("runs/r/"): b.name for b in container.list_blobs()}
    assert set(stored) == {*tree, MANIFEST_NAME}
    assert container.download_blob(stored["model/final.pt"]).readall() == tree["model/final.pt"]


def test_a_results_upload_refused_past_its_retry_bound_says_so_and_fails(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    _write_tree(tmp_path / "out")
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    started = time.monotonic()
    refused = run_stager(
        files, "upload", "--src", str(tmp_path / "out"), "--prefix", "p", "--overwrite",
        "--termination-file", str(tmp_path / "t"), "--retry-for", "5",
    )  # fmt: skip
    assert time.monotonic() - started < 60, "the retry bound holds"
    assert refused.returncode == 3, refused.stderr
    assert "dtjob results upload: retrying" in refused.stderr
    failed = [line for line in refused.stderr.splitlines() if "dtjob results upload: failed after" in line]
    assert failed and "access denied (403" in failed[0], refused.stderr
    assert list(container.list_blobs()) == []
