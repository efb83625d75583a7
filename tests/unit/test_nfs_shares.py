"""The NFS shares a namespace's jobs may mount: the installer's list and a Namespace's own, an entry's reach
(a server, an export and what lies below it, segment by segment), every volume that names a share in a pod
the operator builds, with the spec field behind it, and the refusal before any create. Pure, but for the
reconcile step over a RecordingKube."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob import desired
from dtjob.config import load_config
from dtjob.desired.common import owner_reference
from dtjob.desired.pod_shares import mounted_shares, mounts_a_share, refused_shares
from dtjob.desired.pod_trust import NFS_SHARE_NOT_ALLOWED
from dtjob.kube.errors import Forbidden
from dtjob.machine.decide import decide
from dtjob.machine.refusals import refused
from dtjob.reconcile.pod_trust import untrusted
from dtjob.spec.nfs_shares import (
    ANNOTATION_NFS_SHARES,
    ENV_NFS_SHARES,
    clean_path,
    cluster_shares,
    namespace_shares,
    parse_shares,
)
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import CreateWorker, RefusalKind, Refused
from dtjob.state.observed import Observed
from dtjob.state.status import NFS_SHARES_UNREADABLE, JobStatus

from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import RecordingKube

UID = "uid-1"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
OWNER = owner_reference("rn50", UID)
DATA = {"nfs": {"server": "10.0.0.4", "path": "/export/imagenet"}}
CHECKPOINTS = {"nfs": {"server": "files.internal", "path": "/ckpt/team-a"}}


def _shares(text: str) -> Any:
    return parse_shares(text, "test")


def _pods(spec: JobSpec) -> list[dict[str, Any]]:
    return [desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)]


@pytest.mark.parametrize(
    ("entries", "server", "path", "admitted"),
    [
        ("*", "anything", "/at/all", True),
        ("10.0.0.4", "10.0.0.4", "/any/export", True),
        ("Files.Internal", "files.INTERNAL", "/x", True),  # host names compare without case
        ("10.0.0.4:/export", "10.0.0.4", "/export", True),
        ("10.0.0.4:/export/", "10.0.0.4", "/export/imagenet/train", True),
        ("10.0.0.4:/export", "10.0.0.4", "//export//imagenet/", True),
        ("10.0.0.4:/", "10.0.0.4", "/etc", True),
        ("10.0.0.4:/export", "10.0.0.4", "/exports", False),  # a prefix of a segment is not a parent
        ("10.0.0.4:/export", "10.0.0.4", "/", False),
        ("10.0.0.4:/export", "10.0.0.5", "/export", False),
        ("10.0.0.4:/export", "10.0.0.4", "/export/../etc", False),  # the server says where .. leads
        ("10.0.0.4:/export", "10.0.0.4", "export", False),
        ("10.0.0.4:export", "10.0.0.4", "/export", False),  # a typo matches nothing
        ("10.0.0.4:/a/../b", "10.0.0.4", "/b", False),
        ("", "10.0.0.4", "/export", False),
        ("10.0.0.9, 10.0.0.4:/export", "10.0.0.4", "/export/x", True),
        # ASCII case only, as the chart's admission policy reads it: the Kelvin sign lowers to k in Unicode.
        ("files.\u212aube", "files.kube", "/x", False),
        ("files.kube", "files.\u212aube", "/x", False),
        ("\u00a0files.kube\u3000", "files.kube", "/x", True),  # white space as CEL's trim() knows it
        ("\x1cfiles.kube", "files.kube", "/x", False),  # not white space to Go: a server of another name
        ("\tfiles.kube ,", "files.kube", "/x", True),
    ],
)
def test_an_entry_admits_its_server_and_what_lies_below_its_export(
    entries: str, server: str, path: str, admitted: bool
) -> None:
    assert (_shares(entries).refusal(server, path) is None) is admitted


def test_a_refusal_names_the_share_and_where_the_list_was_set() -> None:
    why = cluster_shares({ENV_NFS_SHARES: "10.0.0.4:/export"}).refusal("10.9.9.9", "/secrets")
    assert why is not None
    assert "10.9.9.9:/secrets" in why and "10.0.0.4:/export" in why and ENV_NFS_SHARES in why
    dotted = _shares("10.0.0.4:/export").refusal("10.0.0.4", "/export/./x")
    assert dotted is not None and "'.' or '..'" in dotted


def test_the_default_admits_any_share_and_a_namespace_annotation_replaces_the_installers_list() -> None:
    assert load_config({}).nfs_shares.refusal("any", "/where") is None
    cluster = load_config({ENV_NFS_SHARES: "10.0.0.4:/export"}).nfs_shares
    assert namespace_shares(cluster, "a", {}) is cluster
    narrowed = namespace_shares(cluster, "a", {ANNOTATION_NFS_SHARES: "10.0.0.4:/export/team-a"})
    assert narrowed.refusal("10.0.0.4", "/export/team-b") is not None
    assert narrowed.refusal("10.0.0.4", "/export/team-a/imagenet") is None
    assert f"annotation {ANNOTATION_NFS_SHARES} on Namespace a" in narrowed.describe()
    widened = namespace_shares(cluster, "lab", {ANNOTATION_NFS_SHARES: "*"})
    assert widened.refusal("10.9.9.9", "/x") is None
    closed = namespace_shares(widened, "b", {ANNOTATION_NFS_SHARES: ""})
    assert closed.refusal("10.0.0.4", "/export") is not None


def test_clean_path_drops_repeated_slashes_and_refuses_dot_segments() -> None:
    assert clean_path("//a///b/") == "/a/b"
    assert clean_path("/") == "/"
    assert clean_path("/a/./b") is None and clean_path("/a/..") is None and clean_path("a") is None


def test_every_share_a_built_pod_mounts_is_found_with_the_spec_field_behind_it() -> None:
    template = {
        "volumes": [
            {"name": "extra", "nfs": {"server": "10.0.0.7", "path": "/home"}},
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "via-csi",
                "csi": {
                    "driver": "nfs.csi.k8s.io",
                    "volumeAttributes": {"server": "10.0.0.8", "share": "/vol/", "subDir": "team"},
                },
            },
            {"name": "other-csi", "csi": {"driver": "file.csi.azure.com", "volumeAttributes": {}}},
        ]
    }
    spec = job_spec(
        dataset={"volume": DATA}, checkpoints=CHECKPOINTS, worker={"template": {"spec": template}}
    )
    worker0 = desired.worker_pod(spec, OWNER, 0, 0)  # rank 0 mounts the checkpoints
    found = {(m.field, m.server, m.path) for m in mounted_shares(spec, worker0)}
    assert found == {
        ("spec.dataset.volume.nfs", "10.0.0.4", "/export/imagenet"),
        ("spec.checkpoints.nfs", "files.internal", "/ckpt/team-a"),
        ("spec.worker.template.spec.volumes[0].nfs", "10.0.0.7", "/home"),
        ("spec.worker.template.spec.volumes[2].csi", "10.0.0.8", "/vol/team"),
    }
    launcher = desired.launcher_pod(spec, OWNER, 0)
    assert not any(m.field.startswith("spec.worker") for m in mounted_shares(spec, launcher))
    assert mounts_a_share([worker0]) and not mounts_a_share([desired.launcher_pod(job_spec(), OWNER, 0)])


def test_the_stagers_writable_mount_of_the_dataset_share_is_judged_too() -> None:
    spec = job_spec(
        dataset={
            "source": "imagenet",
            "volume": DATA,
            "stageFrom": {
                "account": "acct1",
                "container": "imagenet",
                "destination": "/data/imagenet",
                "credentials": {"authMode": "workloadIdentity"},
            },
        }
    )
    stager = desired.staging_job(spec, OWNER, CONFIG.stager_image)
    refused = refused_shares(spec, [stager], _shares("10.0.0.9"))
    assert [r.field for r in refused] == ["spec.dataset.volume.nfs"]


def test_each_refused_field_is_named_once_and_an_any_list_refuses_nothing() -> None:
    spec = job_spec(dataset={"volume": DATA})
    assert refused_shares(spec, _pods(spec), _shares("*")) == []
    refused = refused_shares(spec, [*_pods(spec), desired.worker_pod(spec, OWNER, 1, 0)], _shares("10.0.0.9"))
    assert [r.field for r in refused] == ["spec.dataset.volume.nfs"]
    assert "10.0.0.4:/export/imagenet" in refused[0].message


def test_the_reconcile_reads_the_namespace_for_its_list_only_when_a_pod_mounts_a_share() -> None:
    config = replace(CONFIG, nfs_shares=cluster_shares({ENV_NFS_SHARES: "10.0.0.4:/export"}))
    kube = RecordingKube()
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "annotations": {
        ANNOTATION_NFS_SHARES: "10.0.0.4:/export/other"}}})  # fmt: skip
    spec = job_spec(dataset={"volume": DATA})
    verdict = untrusted(kube, config, spec, UID, _pods(spec))
    assert verdict is not None and verdict.fatal and verdict.reason == NFS_SHARE_NOT_ALLOWED
    assert verdict.field == "spec.dataset.volume.nfs" and "Namespace ml" in verdict.message
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "annotations": {}}})
    assert untrusted(kube, config, spec, UID, _pods(spec)) is None  # the installer's list admits it
    calls = len(kube.calls)
    plain = job_spec()
    assert untrusted(kube, config, plain, UID, _pods(plain)) is None
    assert len(kube.calls) == calls  # nothing mounts a share: nothing read


def _csi(attributes: dict[str, str]) -> JobSpec:
    volume = {"name": "b", "csi": {"driver": "nfs.csi.k8s.io", "volumeAttributes": attributes}}
    return job_spec(worker={"template": {"spec": {"volumes": [volume]}}})


@pytest.mark.parametrize(
    "attributes",
    [
        {"server": "10.0.0.4", "share": "/export", "SubDir": "../etc"},  # the driver reads keys without case
        {"Server": "10.0.0.9", "Share": "/etc"},
        {"server": "10.0.0.4", "share": "/export", "SHARE": "/etc"},  # which one counts is the driver's order
        {"server": "10.0.0.4", "Server": "10.0.0.9", "share": "/export"},
        {"server": "10.0.0.4", "share": "/export", "subdİr": "../etc"},  # Go lowers İ to i, Python not
        {
            "server": "10.0.0.4",
            "share": "/export",
            "subDir": "${pvc.metadata.name}",
            "csi.storage.k8s.io/pvc/name": "../../etc",
        },  # the driver fills the placeholder
        {"server": "10.0.0.4", "share": "/export", "mountOptions": "nfsvers=3,mountaddr=10.0.0.9"},
        {"server": "10.0.0.4", "share": "/export", "mountOptions": "port=2050"},
    ],
)
def test_an_nfs_csi_volumes_attributes_are_read_as_the_driver_reads_them(attributes: dict[str, str]) -> None:
    spec = _csi(attributes)
    refused = refused_shares(spec, _pods(spec), _shares("10.0.0.4:/export"))
    assert [r.field for r in refused] == ["spec.worker.template.spec.volumes[0].csi"], refused
    assert refused_shares(spec, _pods(spec), _shares("*")) == []


def test_the_same_share_by_any_case_of_its_keys_is_admitted() -> None:
    spec = _csi(
        {"SERVER": "10.0.0.4", "Share": "/export", "subdir": "team-a", "mountOptions": "nfsvers=4.1,hard"}
    )
    assert refused_shares(spec, _pods(spec), _shares("10.0.0.4:/export/team-a")) == []


class _NamespaceForbidden(RecordingKube):
    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Any:
        if kind == "Namespace":
            raise Forbidden(f"get Namespace {name} refused by the API server: forbidden")
        return super().get(kind, namespace, name, api_version)


def test_a_list_the_operator_may_not_read_makes_the_job_wait_naming_it() -> None:
    spec = job_spec(dataset={"volume": DATA})
    verdict = untrusted(_NamespaceForbidden(), CONFIG, spec, UID, _pods(spec))
    assert verdict is not None and not verdict.fatal and verdict.reason == NFS_SHARES_UNREADABLE
    assert verdict.field == "spec.dataset.volume.nfs" and ANNOTATION_NFS_SHARES in verdict.message
    assert "grant it get on namespaces" in verdict.message
    # In a running world's replacement too: the job waits under that reason, nothing deleted.
    refusal = Refused(
        RefusalKind.SECRET_MISSING, CreateWorker(1, 2), verdict.message, verdict.reason, verdict.field
    )
    decision = refused(JobStatus(phase="Pending"), refusal, spec, NOW)
    created = decision.status.condition("Created")
    assert created is not None and created.reason == NFS_SHARES_UNREADABLE and decision.actions == []


def test_a_wait_for_the_list_holds_across_looks_and_says_so_once() -> None:
    """The next look retries the creates and keeps the wait's condition and message: no Created=True in
    between, no second Warning for the same wait."""
    spec = job_spec(dataset={"volume": DATA})
    first = decide(spec, Observed(), JobStatus(), NOW)
    message = "the operator may not read Namespace ml for its dtjob.io/nfs-shares"
    refusal = Refused(RefusalKind.SECRET_MISSING, CreateWorker(0, 0), message, NFS_SHARES_UNREADABLE,
                      "spec.dataset.volume.nfs")  # fmt: skip
    waiting = refused(first.status, refusal, spec, NOW)
    assert [e.reason for e in waiting.events] == [NFS_SHARES_UNREADABLE]
    later = NOW + timedelta(seconds=30)
    again = decide(spec, Observed(), waiting.status, later)
    assert CreateWorker(0, 0) in again.actions, "the creates are tried again"
    created = again.status.condition("Created")
    assert created is not None and (created.status, created.reason) == ("False", NFS_SHARES_UNREADABLE)
    assert again.status.message == waiting.status.message
    assert refused(again.status, refusal, spec, later).events == []


def test_what_fails_the_job_whatever_the_list_says_comes_before_the_wait_for_it() -> None:
    operator = replace(CONFIG, operator_namespace="ml", operator_service_account="dtjob")
    spec = job_spec(dataset={"volume": DATA}, worker={"template": {"spec": {"serviceAccountName": "dtjob"}}})
    verdict = untrusted(_NamespaceForbidden(), operator, spec, UID, _pods(spec))
    assert verdict is not None and verdict.fatal and verdict.reason == "ServiceAccountNotAllowed"
