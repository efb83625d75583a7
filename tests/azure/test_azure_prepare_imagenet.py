"""`dtjob data prepare-imagenet` straight into Blob Storage (Azurite): the tree under a prefix, markers the
stager leaves out, and a resume after a failed run that leaves the finished classes' blobs untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient
from dtjob.cli.main import main
from dtjob.names import Access

from testbed.azurite import Azurite
from tests.azure.helpers import mint, run_stager, sas_files, service, tree_of
from tests.imagenet_tarballs import CLASSES, MiniImagenet, generated_images, make_tarballs

pytestmark = pytest.mark.azure

PREFIX = "datasets/ilsvrc-mini"


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> MiniImagenet:
    return make_tarballs(tmp_path_factory.mktemp("ilsvrc"), generated_images())


@pytest.fixture
def container(azurite: Azurite, container_name: str) -> Iterator[ContainerClient]:
    client = service(azurite).get_container_client(container_name)
    yield client
    client.delete_container()


def prepare(mini: MiniImagenet, azurite: Azurite, container: str, *extra: str) -> list[str]:
    return [
        "data",
        "prepare-imagenet",
        "--train-tar",
        str(mini.train_tar),
        "--val-tar",
        str(mini.val_tar),
        "--val-labels",
        str(mini.labels["kaggle-csv"]),
        "--endpoint",
        azurite.endpoint,
        "--container",
        container,
        "--prefix",
        PREFIX,
        "--concurrency",
        "4",
        "--no-progress",
        *mini.expect_args(),
        *extra,
    ]


def etags(container: ContainerClient) -> dict[str, str]:
    return {blob.name: str(blob.etag) for blob in container.list_blobs(name_starts_with=f"{PREFIX}/")}


def test_prepare_into_blob_then_stage_resume_and_skip(
    azurite: Azurite,
    container: ContainerClient,
    key_env: None,
    mini: MiniImagenet,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A lease on one image of the third class: its upload is refused (412) mid-class and the run fails.
    container.create_container()
    held = container.upload_blob(f"{PREFIX}/train/{CLASSES[2]}/{CLASSES[2]}_1003.JPEG", b"old")
    lease = held.acquire_lease()
    assert main(prepare(mini, azurite, container.container_name)) == 6
    assert "storage error (412 LeaseIdMissing)" in capsys.readouterr().err
    done = sorted(n for n in etags(container) if "/_prepare/" in n)
    assert done == [f"{PREFIX}/_prepare/train/{c}.json" for c in CLASSES[:2]]
    before = {n: e for n, e in etags(container).items() if f"/{CLASSES[0]}" in n or f"/{CLASSES[1]}" in n}
    assert len(before) == 2 * 5 + 2

    lease.break_lease()
    assert main(prepare(mini, azurite, container.container_name)) == 0
    printed = capsys.readouterr().out
    assert "prepared 2 class(es) (2 already complete), val prepared:" in printed, printed
    assert printed.rstrip().endswith("check: complete")
    after = etags(container)
    assert {n: after[n] for n in before} == before  # the finished classes were not uploaded again

    # Names and counts: exactly the tree, plus one marker per class and one for val.
    images = {n[len(PREFIX) + 1 :] for n in after if "/_prepare/" not in n}
    assert images == set(mini.expected)
    assert sorted(n[len(PREFIX) + 1 :] for n in after if "/_prepare/" in n) == [
        *(f"_prepare/train/{c}.json" for c in CLASSES),
        "_prepare/val.json",
    ]
    blob = container.get_blob_client(
        f"{PREFIX}/train/{CLASSES[0]}/{CLASSES[0]}_1000.JPEG"
    ).get_blob_properties()
    assert blob.content_settings.content_md5  # so the stager verifies every download

    # `dtjob data ls` sees the same, and the stager stages the dataset without the markers.
    where = ["--endpoint", azurite.endpoint, "--container", container.container_name, "--prefix", PREFIX]
    assert main(["data", "ls", *where]) == 0
    assert f"{len(mini.expected) + len(CLASSES) + 1} blob(s)" in capsys.readouterr().err
    files = sas_files(tmp_path / "sas", mint(azurite, container.container_name, Access.INPUT))
    staged = run_stager(files, "--prefix", PREFIX, "--dest", str(tmp_path / "dest"))
    assert staged.returncode == 0, staged.stderr
    assert tree_of(tmp_path / "dest") == mini.expected

    # A rerun finds everything complete and uploads nothing.
    assert main(prepare(mini, azurite, container.container_name)) == 0
    assert (
        "prepared 0 class(es) (4 already complete), val already complete: 0 image(s)"
        in capsys.readouterr().out
    )
    assert etags(container) == after


def test_a_missing_container_is_named(
    azurite: Azurite,
    container_name: str,
    key_env: None,
    mini: MiniImagenet,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(prepare(mini, azurite, container_name)) == 4
    assert "(404 ContainerNotFound) (create it, or pass --create-container)" in capsys.readouterr().err
    assert main(prepare(mini, azurite, container_name, "--create-container")) == 0
    service(azurite).delete_container(container_name)
