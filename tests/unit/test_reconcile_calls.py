"""The exact API calls of one reconcile, against an in-memory recording Kube, as mpi-operator's controller
tests check their fake clientset's actions. The integration tests prove the same paths against a real API
server."""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.azure.sas import ANNOTATION_EXPIRES, ANNOTATION_ISSUED
from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.desired.common import owner_reference
from dtjob.fence import NotLeader
from dtjob.kube.client import Conflict
from dtjob.names import STORAGE_KEY_LABEL, Access
from dtjob.reconcile import storage_act
from dtjob.reconcile.job import reconcile
from dtjob.reconcile.observe import observe
from dtjob.reconcile.storage_observe import token_sha256
from dtjob.spec.parse import parse_spec
from dtjob.spec.tenancy import ANNOTATION_ACCOUNTS, ANNOTATION_WRITE_CONTAINERS
from dtjob.state.observed import Children
from dtjob.state.status import JobStatus
from dtjob.timefmt import parse_time

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
JOB = "DistributedTrainingJob"
# Storage on loopback with nothing listening: the operator's one network call here (whether the results
# container exists, before the first output token) is refused at once, and minting goes on as it must.
ENDPOINT = "http://127.0.0.1:1/acct1"
OUTPUT = {
    "endpoint": ENDPOINT,
    "container": "results",
    "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
}


def new_job(kube: RecordingKube, **spec: Any) -> dict[str, Any]:
    return kube.put({**job_body(**spec), "kind": JOB_KIND})


def test_a_new_job_records_its_intent_then_creates_its_world() -> None:
    kube = RecordingKube()
    new_job(kube)
    requeue = reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.writes() == [
        ("patch-status", JOB, "rn50"),
        ("create", "Secret", "rn50-ssh"),
        ("create", "ConfigMap", "rn50-hostfile"),
        ("create", "Service", "rn50-workers"),
        ("create", "Pod", "rn50-worker-0"),
        ("create", "Pod", "rn50-worker-1"),
        ("create", "Pod", "rn50-launcher"),
    ]
    # Before the first world: the preflight lookups. The launcher's pod comes with the workers, held.
    launcher = kube.objects[("Pod", "ml", "rn50-launcher")]
    assert launcher["spec"]["schedulingGates"] == [{"name": "dtjob.io/workers-ready"}]
    assert launcher["metadata"]["ownerReferences"][0]["kind"] == JOB
    assert ("list", "Node", "kubernetes.azure.com/agentpool=gpu") in kube.calls
    assert requeue is None
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    assert status["phase"] == "Pending" and status["workersReady"] == "0/2"
    # A second pass over the same (empty) cache creates nothing new: every create answers "exists".
    kube.calls.clear()
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert [c for c in kube.writes() if c[0] != "create"] == []


def test_a_child_the_api_server_rejects_fails_the_job_and_leaves_no_half_world() -> None:
    kube = RecordingKube(reject={"Pod"})
    new_job(kube)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    writes = kube.writes()
    assert writes[:6] == [
        ("patch-status", JOB, "rn50"),
        ("create", "Secret", "rn50-ssh"),
        ("create", "ConfigMap", "rn50-hostfile"),
        ("create", "Service", "rn50-workers"),
        ("create", "Pod", "rn50-worker-0"),
        ("create", "Pod", "rn50-worker-1"),  # a world's pods go out together: each is tried
    ]
    # No legacy launcher Job of the job's was listed, so none is deleted (never one by its name alone).
    assert writes[6:] == [("patch-status", JOB, "rn50")]
    assert ("list", "Job", "dtjob.io/job-name=rn50,dtjob.io/role=launcher") in kube.calls
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ChildRejected" and "Pod rn50-worker-0" in failed["message"]


def _storage(kube: RecordingKube) -> None:
    kube.put({
        "kind": "Namespace",
        "metadata": {
            "name": "ml",
            "annotations": {ANNOTATION_ACCOUNTS: "acct1", ANNOTATION_WRITE_CONTAINERS: "results"},
        },
    })  # fmt: skip
    key = base64.b64encode(base64.b64encode(b"k" * 32)).decode()
    kube.put({
        "kind": "Secret",
        "metadata": {"name": "storage-key", "namespace": "ml", "labels": {STORAGE_KEY_LABEL: "true"}},
        "data": {"azurestorageaccountkey": key},
    })  # fmt: skip


def _sas_secret(issued: datetime, expires: datetime) -> dict[str, Any]:
    return {
        "kind": "Secret",
        "metadata": {
            "name": "rn50-sas-out",
            "namespace": "ml",
            "ownerReferences": [owner_reference("rn50", "uid-1")],
            "annotations": {
                ANNOTATION_ISSUED: issued.strftime("%Y-%m-%dT%H:%M:%SZ"),
                ANNOTATION_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        },
        # What the operator writes: the spec's container URL and a token.
        "data": {
            "container-url": base64.b64encode(f"{ENDPOINT}/results".encode()).decode(),
            "sas-token": base64.b64encode(b"sv=2025-01-05&sig=x").decode(),
        },
    }


def test_the_output_sas_is_minted_before_the_world_that_mounts_it() -> None:
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, output=OUTPUT)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    writes = kube.writes()
    assert writes[:2] == [("patch-status", JOB, "rn50"), ("create", "Secret", "rn50-sas-out")]
    assert writes.index(("create", "Secret", "rn50-sas-out")) < writes.index(
        ("create", "Pod", "rn50-worker-0")
    )
    token = kube.objects[("Secret", "ml", "rn50-sas-out")]
    assert token["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_a_sas_past_its_rotation_time_is_replaced_and_a_fresh_one_is_left_alone() -> None:
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, output=OUTPUT)
    kube.put(_sas_secret(NOW - timedelta(hours=9), NOW + timedelta(hours=1)))  # 90% of its life used
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert ("replace", "Secret", "rn50-sas-out") in kube.writes()
    kube.calls.clear()
    kube.put(_sas_secret(NOW, NOW + timedelta(hours=10)))
    # The status vouches for the token that Secret holds.
    kube.objects[(JOB, "ml", "rn50")]["status"]["sasTokenDigests"] = {
        "out": token_sha256("sv=2025-01-05&sig=x")
    }
    requeue = reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert not [c for c in kube.writes() if c[2] == "rn50-sas-out"]
    # Looked at again when 80% of its life is used, not before.
    assert requeue == pytest.approx(8 * 3600)
    # A fresh token costs one Secret read: no Namespace read, no key Secret read.
    assert ("get", "Namespace", "ml") not in kube.calls and ("get", "Secret", "storage-key") not in kube.calls


def test_the_installers_lifetime_cap_shortens_a_jobs_tokens_and_their_rotation() -> None:
    """A SAS cannot be revoked: a copy of one outlives its job until it expires. The installer's cap bounds
    that, whatever the job's sasLifetimeSeconds asks (10 hours here); the token is rotated within the cap."""
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, output={**OUTPUT, "sasLifetimeSeconds": 36_000})
    capped = replace(CONFIG, sas_lifetime_max_seconds=3600)
    reconcile(kube, capped, "ml", "rn50", Children(), NOW)
    annotations = kube.objects[("Secret", "ml", "rn50-sas-out")]["metadata"]["annotations"]
    assert parse_time(annotations[ANNOTATION_EXPIRES]) == NOW + timedelta(hours=1)
    kube.calls.clear()
    reconcile(kube, capped, "ml", "rn50", Children(), NOW + timedelta(minutes=50))  # 83% of the capped life
    assert ("replace", "Secret", "rn50-sas-out") in kube.writes()
    # A token signed before the installer set the cap is signed again at once, within it.
    kube.put(_sas_secret(NOW, NOW + timedelta(hours=10)))
    kube.objects[(JOB, "ml", "rn50")]["status"]["sasTokenDigests"] = {
        "out": token_sha256("sv=2025-01-05&sig=x")
    }
    kube.calls.clear()
    reconcile(kube, capped, "ml", "rn50", Children(), NOW + timedelta(minutes=1))
    assert ("replace", "Secret", "rn50-sas-out") in kube.writes()
    annotations = kube.objects[("Secret", "ml", "rn50-sas-out")]["metadata"]["annotations"]
    assert parse_time(annotations[ANNOTATION_EXPIRES]) == NOW + timedelta(hours=1, minutes=1)


def test_a_replica_that_does_not_lead_neither_signs_a_sas_nor_uploads_a_log() -> None:
    kube = RecordingKube(leading=False)
    _storage(kube)
    spec = parse_spec(new_job(kube, output=OUTPUT), CONFIG)
    kube.calls.clear()
    with pytest.raises(NotLeader):
        storage_act.mint_sas(kube, spec, Access.OUTPUT, None, owner_reference("rn50", "uid-1"), NOW, CONFIG)
    with pytest.raises(NotLeader):
        storage_act.upload_pod_logs(
            kube, spec, "uid-1", [], cap_bytes=CONFIG.log_cap_bytes, config=CONFIG, now=NOW
        )
    assert kube.calls == [], "not even the account key or the SAS Secret was read"


def test_a_conflict_on_the_status_write_stops_the_pass_before_any_action() -> None:
    kube = RecordingKube(conflict_next=True)
    new_job(kube)
    with pytest.raises(Conflict):
        reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.writes() == [("patch-status", JOB, "rn50")]  # the controller requeues; nothing was created


def test_a_name_held_by_another_owner_is_never_adopted() -> None:
    kube = RecordingKube()
    new_job(kube)
    old = {"kind": "Secret", "metadata": {"name": "rn50-ssh", "namespace": "ml",
           "ownerReferences": [owner_reference("rn50", "uid-of-the-old-job")]}}  # fmt: skip
    held = kube.put(old)
    requeue = reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    # The world's other objects go out beside the Secret (ours, so they wait for the name with the job), but
    # no pod: nothing may start on another job's keys.
    assert not [c for c in kube.writes() if c[1] == "Pod"]
    assert kube.objects[("Secret", "ml", "rn50-ssh")] == held, "the old job's Secret is left as it was"
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert created["status"] == "False" and created["reason"] == "ChildNotOwned"
    assert "Secret rn50-ssh" in created["message"] and requeue == 30


STAGED = {
    "source": "imagenet",
    "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports"}, "mountPath": "/data"},
    "dataDir": "/data/imagenet",
    "stageFrom": {**OUTPUT, "container": "datasets"},
}


def _completed_staging_job(owner_uid: str) -> dict[str, Any]:
    labels = {"dtjob.io/job-name": "rn50", "dtjob.io/role": "stager"}
    return {
        "kind": "Job",
        "metadata": {"name": "rn50-stage", "namespace": "ml", "uid": "stage-uid", "labels": labels,
                     "ownerReferences": [owner_reference("rn50", owner_uid)]},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }  # fmt: skip


def test_a_completed_staging_job_of_another_owner_is_not_this_jobs_staging() -> None:
    """A job deleted with --cascade=orphan and made again under its name (or a namespace admin) leaves a
    completed `rn50-stage`: the new job never takes that for its own staging and starts no world on a dataset
    it never staged; it waits for the name, as for any child another owner holds."""
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, dataset=STAGED)
    old = kube.put(_completed_staging_job("uid-of-the-old-job"))
    requeue = reconcile(kube, CONFIG, "ml", "rn50", Children(staging=old), NOW)
    assert not [c for c in kube.writes() if c[1] == "Pod"], kube.writes()
    assert kube.objects[("Job", "ml", "rn50-stage")] == old, "the other owner's Job is left as it was"
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    assert not [c for c in status.get("conditions") or () if c["type"] == "Staged" and c["status"] == "True"]
    waiting = [c for c in status["conditions"] if c["reason"] == "ChildNotOwned"]
    assert waiting and "Job rn50-stage" in waiting[0]["message"] and requeue == 30, status

    # The same Job owned by this job is its staging, done: the world follows. A pod labelled as its stager
    # that the staging Job does not own says nothing of the staging: its termination message is not read.
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, dataset=STAGED)
    ours = kube.put(_completed_staging_job("uid-1"))
    snapshot = ProgressSnapshot("done", 999, 999, 0, 999, 999, 0, 1.0, 999.0)
    terminated = {"terminated": {"exitCode": 0, "message": snapshot.to_json()}}
    lookalike = {
        "kind": "Pod",
        "metadata": {"name": "rn50-stage-x", "namespace": "ml", "labels": ours["metadata"]["labels"]},
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "stager", "state": terminated}]},
    }
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=(lookalike,), staging=ours), NOW)
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    assert [c for c in status["conditions"] if c["type"] == "Staged" and c["status"] == "True"], status
    assert (status.get("staging") or {}).get("filesTotal") != 999, status


def test_pods_labelled_as_the_jobs_that_it_does_not_own_are_not_its_children() -> None:
    """A namespace admin's pods under the job's labels, or an older job's of the same name: none is read as
    the job's, and none is among the children whose logs the job's run uploads (nor whose names its
    status.output.logsMissing lists)."""
    labels = {"dtjob.io/job-name": "rn50", "dtjob.io/role": "worker", "dtjob.io/attempt": "0"}

    def pod(name: str, **meta: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "uid": name, "labels": labels, **meta},
            "status": {"phase": "Running"},
        }

    ours = pod("rn50-worker-0", ownerReferences=[owner_reference("rn50", "uid-1")])
    older = pod("rn50-worker-1", ownerReferences=[owner_reference("rn50", "uid-of-the-old-job")])
    children = Children(pods=(ours, older, pod("rn50-worker-7")))
    seen = observe(
        RecordingKube(), CONFIG, job_spec(), job_body(), JobStatus(phase="Succeeded"), children, NOW
    )
    assert [p.name for p in seen.children] == ["rn50-worker-0"]
    assert [p.name for p in seen.pods] == ["rn50-worker-0"]


def test_an_output_job_reconciled_again_writes_no_status() -> None:
    # status.output.logsError is always in the patch (null clears an old error); null equals absent.
    kube = RecordingKube()
    _storage(kube)
    new_job(kube, output=OUTPUT)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    kube.calls.clear()
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert ("patch-status", JOB, "rn50") not in kube.writes()


def test_an_edit_the_operator_rejects_mid_run_frees_the_world_and_revokes_the_tokens() -> None:
    kube = RecordingKube()
    job = new_job(kube, workers=0)  # past the schema (a direct write, an older CRD), refused by parse_spec
    job["status"] = {"phase": "Running", "startTime": "2026-05-01T11:00:00Z"}
    ours = [owner_reference("rn50", job["metadata"]["uid"])]
    for name, role in (
        ("rn50-worker-0", "worker"),
        ("rn50-worker-1", "worker"),
        ("rn50-launcher", "launcher"),
    ):
        labels = {"dtjob.io/job-name": "rn50", "dtjob.io/role": role}
        meta = {"name": name, "namespace": "ml", "labels": labels, "ownerReferences": ours}
        kube.put({"kind": "Pod", "metadata": meta})
    for access in ("in", "out"):
        kube.put({"kind": "Secret", "metadata": {"name": f"rn50-sas-{access}", "namespace": "ml",
                                                 "ownerReferences": ours}})  # fmt: skip
    # A launcher Job an earlier release of the operator made goes too.
    launcher = {
        "kind": "Job",
        "metadata": {
            "name": "rn50-launcher", "namespace": "ml", "ownerReferences": ours,
            "labels": {"dtjob.io/job-name": "rn50", "dtjob.io/role": "launcher"},
        },
    }  # fmt: skip
    kube.put(launcher)
    reconcile(kube, CONFIG, "ml", "rn50", Children(launcher=launcher), NOW)
    writes = kube.writes()
    assert writes[0] == ("patch-status", JOB, "rn50")
    pods = {
        ("delete", "Pod", "rn50-worker-0"),
        ("delete", "Pod", "rn50-worker-1"),
        ("delete", "Pod", "rn50-launcher"),
    }
    assert pods <= set(writes)
    assert ("delete", "Job", "rn50-launcher") in writes
    assert {("delete", "Secret", "rn50-sas-in"), ("delete", "Secret", "rn50-sas-out")} <= set(writes)
    status = kube.objects[(JOB, "ml", "rn50")]["status"]
    assert status["phase"] == "Failed" and status["sasSecretsDeleted"] is True
    assert not [k for k in kube.objects if k[0] == "Pod"]


def test_a_rejected_job_never_deletes_what_another_owner_holds_under_its_names() -> None:
    """Deletes by name or label check the owner first, as creates do: a rejected job `rn50` leaves another
    owner's `rn50-sas-in`, a Secret nobody owns, a pod that only carries its label, and the launcher pod and
    (legacy) launcher Job of an older job of the same name."""
    kube = RecordingKube()
    job = new_job(kube, workers=0)
    job["status"] = {"phase": "Running", "startTime": "2026-05-01T11:00:00Z"}
    other = [owner_reference("rn50", "uid-of-another-job")]
    foreign: dict[tuple[str, str], dict[str, Any]] = {
        ("Secret", "rn50-sas-in"): {"ownerReferences": other},
        ("Secret", "rn50-sas-out"): {},
        ("Pod", "rn50-worker-0"): {"labels": {"dtjob.io/job-name": "rn50"}},
        ("Pod", "rn50-launcher"): {
            "labels": {"dtjob.io/job-name": "rn50", "dtjob.io/role": "launcher"},
            "ownerReferences": other,
        },
        ("Job", "rn50-launcher"): {"ownerReferences": other},
    }
    for (kind, name), meta in foreign.items():
        kube.put({"kind": kind, "metadata": {"name": name, "namespace": "ml", **meta}})
    reconcile(
        kube, CONFIG, "ml", "rn50", Children(launcher=kube.objects[("Job", "ml", "rn50-launcher")]), NOW
    )
    assert kube.objects[(JOB, "ml", "rn50")]["status"]["phase"] == "Failed"
    deleted = [w for w in kube.writes() if w[0] == "delete"]
    assert deleted == [], deleted
    assert all((kind, "ml", name) in kube.objects for kind, name in foreign)


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the scheduler leaves it: on a node, not yet running."""
    conditions = [{"type": "PodScheduled", "status": "True"}]
    return {
        **pod,
        "spec": {**pod["spec"], "nodeName": "aks-gpu-0"},
        "status": {"phase": "Pending", "conditions": conditions},
    }


def test_a_pass_that_only_moves_the_status_on_says_the_job_is_settled_at_its_write() -> None:
    kube = RecordingKube()
    new_job(kube)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.settled == {}, "it created the world: the pods' events bring the next pass"
    pods = tuple(scheduled(kube.objects[("Pod", "ml", f"rn50-worker-{i}")]) for i in range(2))
    pods += (kube.objects[("Pod", "ml", "rn50-launcher")],)  # held until the workers are Ready
    before = len(kube.writes())
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=pods), NOW)
    assert kube.writes()[before:] == [("patch-status", JOB, "rn50")]
    job = kube.objects[(JOB, "ml", "rn50")]
    assert job["status"]["phase"] == "Starting"
    assert kube.settled == {("ml", "rn50"): job["metadata"]["resourceVersion"]}
    # A pass that writes nothing has no write to settle at.
    kube.settled.clear()
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=pods), NOW)
    assert kube.writes()[before + 1 :] == [] and kube.settled == {}
