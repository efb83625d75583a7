"""dtjob.datasets.fileserver_volume: the job's volume stanza, the PV and claim --apply writes, and which jobs
use a
share (what `dtjob fileserver delete` refuses on)."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.config import OperatorConfig
from dtjob.datasets.fileserver_volume import (
    Share,
    blocking,
    nfs_stanza,
    persistent_volume,
    persistent_volume_claim,
    pv_conflict,
    pvc_conflict,
    pvc_stanza,
    share_users,
)
from dtjob.spec.parse import parse_spec

SHARE = Share("mlfiles", "datasets", "mlfiles.file.core.windows.net", 1024)
SERVER, PATH = SHARE.server, SHARE.path


def parsed_volume(volume: dict[str, Any]) -> Any:
    body = {
        "metadata": {"name": "r50", "namespace": "ml", "uid": "u1"},
        "spec": {
            "framework": "pytorch",
            "workers": 2,
            "gpusPerWorker": 4,
            "dataset": {"source": "imagenet", "volume": volume},
        },
    }
    return parse_spec(body, OperatorConfig()).dataset.volume


def test_the_stanzas_parse_as_the_jobs_dataset_volume() -> None:
    inline = parsed_volume(nfs_stanza(SHARE))
    assert (inline.nfs.server, inline.nfs.path, inline.mount_path) == (
        "mlfiles.file.core.windows.net",
        "/mlfiles/datasets",
        "/data",
    )
    claim = parsed_volume(pvc_stanza("datasets", "/mnt/data"))
    assert (claim.pvc.claim_name, claim.mount_path) == ("datasets", "/mnt/data")


def test_the_pv_is_a_retained_nfs41_volume_pre_bound_to_its_claim() -> None:
    pv = persistent_volume(SHARE, "ml", "imagenet")
    assert pv["metadata"]["name"] == "dtjob-mlfiles-datasets"
    spec = pv["spec"]
    assert spec["nfs"] == {"server": "mlfiles.file.core.windows.net", "path": "/mlfiles/datasets"}
    assert spec["mountOptions"] == ["vers=4", "minorversion=1", "sec=sys"]
    assert spec["accessModes"] == ["ReadWriteMany"]
    assert spec["capacity"] == {"storage": "1024Gi"}
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert spec["storageClassName"] == ""
    assert (spec["claimRef"]["namespace"], spec["claimRef"]["name"]) == ("ml", "imagenet")
    pvc = persistent_volume_claim(SHARE, "ml", "imagenet")
    assert pvc["spec"]["volumeName"] == "dtjob-mlfiles-datasets"
    assert pvc["spec"]["storageClassName"] == ""
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1024Gi"
    assert pvc["metadata"]["labels"]["dtjob.io/fileserver"] == "mlfiles"


def test_an_existing_pv_of_another_share_or_claim_is_a_conflict_a_resize_is_not() -> None:
    desired = persistent_volume(SHARE, "ml", "imagenet")
    resized = persistent_volume(Share("mlfiles", "datasets", SERVER, 2048), "ml", "imagenet")
    assert pv_conflict(resized, desired) is None
    other_share = persistent_volume(Share("mlfiles", "other", SERVER, 1024), "ml", "imagenet")
    assert "mounts" in str(pv_conflict(other_share, desired))
    other_claim = persistent_volume(SHARE, "team-b", "imagenet")
    assert "team-b/imagenet" in str(pv_conflict(other_claim, desired))
    claim = persistent_volume_claim(SHARE, "ml", "imagenet")
    assert pvc_conflict(claim, claim) is None
    assert "fast-ssd" in str(pvc_conflict({"spec": {"volumeName": "fast-ssd"}}, claim))


def job(name: str, phase: str | None = None, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    if phase:
        body["status"] = {"phase": phase}
    return body


def nfs(server: str = SERVER, path: str = PATH) -> dict[str, Any]:
    return {"volume": {"nfs": {"server": server, "path": path}}}


def test_inline_nfs_users_on_the_dataset_or_the_checkpoints() -> None:
    jobs = [
        job("data", "Running", dataset=nfs()),
        job("sub", "Staging", dataset=nfs(SERVER.upper(), PATH + "/imagenet")),  # DNS is case-insensitive
        job("ckpt", None, checkpoints={"nfs": {"server": SERVER, "path": PATH + "/ckpt"}}),
        job("done", "Succeeded", dataset=nfs()),
        job("other-share", "Running", dataset=nfs(path="/mlfiles/datasets2")),  # a prefix is not the share
        job("other-server", "Running", dataset=nfs("files.example.com")),
        job("synthetic", "Running"),
    ]
    uses = share_users(jobs, [], [], SERVER, PATH)
    assert [(u.job, u.via) for u in uses] == [
        ("data", "spec.dataset.volume.nfs"),
        ("sub", "spec.dataset.volume.nfs"),
        ("ckpt", "spec.checkpoints.nfs"),
        ("done", "spec.dataset.volume.nfs"),
    ]
    assert [u.job for u in blocking(uses)] == ["data", "sub", "ckpt"]
    assert str(blocking(uses)[2]) == "ml/ckpt (no phase yet; spec.checkpoints.nfs)"


def test_claim_users_through_a_pv_of_the_share() -> None:
    pv = persistent_volume(SHARE, "ml", "imagenet")
    foreign_pv = {"metadata": {"name": "local"}, "spec": {"hostPath": {"path": "/x"}}}
    pvcs = [
        {"metadata": {"name": "imagenet", "namespace": "ml"}, "spec": {"volumeName": pv["metadata"]["name"]}},
        {
            "metadata": {"name": "bound-by-hand", "namespace": "ml"},
            "spec": {"volumeName": "dtjob-mlfiles-datasets"},
        },
        {"metadata": {"name": "scratch", "namespace": "ml"}, "spec": {"volumeName": "local"}},
    ]
    jobs = [
        job("via-claim", "Running", dataset={"volume": {"persistentVolumeClaim": {"claimName": "imagenet"}}}),
        job("by-hand", "Restarting", checkpoints={"persistentVolumeClaim": {"claimName": "bound-by-hand"}}),
        job("scratch", "Running", dataset={"volume": {"persistentVolumeClaim": {"claimName": "scratch"}}}),
        # The same claim name in another namespace is another claim.
        job(
            "elsewhere",
            "Running",
            "team-b",
            dataset={"volume": {"persistentVolumeClaim": {"claimName": "imagenet"}}},
        ),
    ]
    uses = share_users(jobs, [pv, foreign_pv], pvcs, SERVER, PATH)
    assert [(u.job, u.via) for u in uses] == [
        ("via-claim", "spec.dataset.volume: claim imagenet"),
        ("by-hand", "spec.checkpoints: claim bound-by-hand"),
    ]


def test_a_claim_not_yet_created_still_counts_through_the_pvs_claim_ref() -> None:
    pv = persistent_volume(SHARE, "ml", "imagenet")
    jobs = [job("early", "Pending", dataset={"volume": {"persistentVolumeClaim": {"claimName": "imagenet"}}})]
    assert [u.job for u in blocking(share_users(jobs, [pv], [], SERVER, PATH))] == ["early"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_jobs_do_not_block(phase: str) -> None:
    uses = share_users([job("old", phase, dataset=nfs())], [], [], SERVER, PATH)
    assert len(uses) == 1
    assert blocking(uses) == []
