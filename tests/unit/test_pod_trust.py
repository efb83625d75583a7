"""What the pods the operator creates may name, judged on the object about to be created (its pod spec after
the template merge): the Secrets it names with the spec field that put each there, the job's own left out;
another job's Secret, an account key or the operator's ServiceAccount fail the job, a Secret not there yet
makes it wait; and act() creates nothing of a refused step. Pure, but for act() over a RecordingKube."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob import desired
from dtjob.config import load_config
from dtjob.desired.common import owner_reference
from dtjob.desired.pod_trust import (
    SECRET_NOT_ALLOWED,
    SERVICE_ACCOUNT_NOT_ALLOWED,
    Untrusted,
    foreign_references,
    judge,
    secret_references,
    to_read,
)
from dtjob.machine.refusals import RETRY_SECONDS, refused
from dtjob.reconcile.act import act
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    Action,
    CreateLauncher,
    CreateWorker,
    DeleteWorld,
    EnsureWorld,
    RefusalKind,
    Refused,
)
from dtjob.state.status import SECRET_NOT_FOUND, JobStatus

from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import RecordingKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
UID = "uid-1"
OWNER = owner_reference("rn50", UID)
KEY = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
OUTPUT = {"account": "acct1", "container": "results", "credentials": KEY}
WORKER = "spec.worker.template.spec"

# Every way a pod spec names a Secret, as a template's fragment, and the field each names it at.
MOUNTS: list[tuple[dict[str, Any], str]] = [
    ({"volumes": [{"name": "k", "secret": {"secretName": "s"}}]}, "volumes[0].secret.secretName"),
    ({"volumes": [{"name": "k", "projected": {"sources": [{"configMap": {"name": "c"}},
                                                          {"secret": {"name": "s"}}]}}]},
     "volumes[0].projected.sources[1].secret.name"),
    ({"containers": [{"name": "worker", "env": [
        {"name": "A", "value": "1"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]},
     "containers[0].env[1].valueFrom.secretKeyRef.name"),
    ({"initContainers": [{"name": "fetch", "image": "busybox", "envFrom": [{"secretRef": {"name": "s"}}]}]},
     "initContainers[0].envFrom[0].secretRef.name"),
    # Volume plugins that log in with a Secret: the pod gets what it unlocks (an Azure Files share).
    ({"volumes": [{"name": "k", "azureFile": {"secretName": "s", "shareName": "x"}}]},
     "volumes[0].azureFile.secretName"),
    ({"volumes": [{"name": "k", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}]},
     "volumes[0].csi.nodePublishSecretRef.name"),
    ({"volumes": [{"name": "k", "cephfs": {"monitors": ["m"], "secretRef": {"name": "s"}}}]},
     "volumes[0].cephfs.secretRef.name"),
]  # fmt: skip


def _worker(template: dict[str, Any], **spec: Any) -> JobSpec:
    return job_spec(worker={"template": {"spec": template}}, **spec)


def _secret(name: str, labels: dict[str, str] | None = None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner, f"uid-of-{owner}")]
    return {"kind": "Secret", "metadata": meta}


def _judge(spec: JobSpec, *secrets: dict[str, Any], objects: list[Any] | None = None) -> Untrusted | None:
    objects = objects or [desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)]
    known = {s["metadata"]["name"]: s for s in secrets}
    read = {name: known.get(name) for name in to_read(spec, objects)}
    return judge(
        spec,
        UID,
        objects,
        read,
        CONFIG.operator_namespace,
        CONFIG.operator_service_account,
        CONFIG.nfs_shares,
    )


@pytest.mark.parametrize(("template", "field"), MOUNTS)
def test_every_way_a_pod_names_a_secret_is_found_with_its_field(template: dict[str, Any], field: str) -> None:
    assert secret_references(template, WORKER) == [(f"{WORKER}.{field}", "s")]
    pod = desired.worker_pod(_worker(template), OWNER, 1, 0)
    assert [(r.field, r.name) for r in foreign_references(_worker(template), pod)] == [
        (f"{WORKER}.{field}", "s")
    ]


def test_image_pull_secrets_and_the_jobs_own_secrets_are_not_read() -> None:
    spec = job_spec(imagePullSecrets=[{"name": "registry"}], output=OUTPUT)
    objects = [desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)]
    assert "rn50-sas-out" in str(objects[0]) and "rn50-ssh" in str(objects[1])
    assert to_read(spec, objects) == []


def test_a_secret_named_through_spec_env_or_a_merged_env_is_found_in_the_built_pod() -> None:
    """What the merge puts into the operator's own container counts: the template's env replaces the
    operator's of the same name, spec.env reaches every rank."""
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "from-env", "key": "k"}}}]
    template = {
        "containers": [
            {
                "name": "worker",
                "env": [
                    {
                        "name": "DTJOB_EXPECT_GPU",
                        "valueFrom": {"secretKeyRef": {"name": "from-template", "key": "k"}},
                    }
                ],
            }
        ]
    }
    spec = _worker(template, env=env)
    refs = foreign_references(spec, desired.worker_pod(spec, OWNER, 0, 0))
    assert {(r.field, r.name) for r in refs} == {
        ("spec.env[0].valueFrom.secretKeyRef.name", "from-env"),
        (f"{WORKER}.containers[0].env[0].valueFrom.secretKeyRef.name", "from-template"),
    }
    launcher_refs = foreign_references(spec, desired.launcher_pod(spec, OWNER, 0))
    assert [r.name for r in launcher_refs] == ["from-env"]  # the worker's template is not the launcher's


def test_another_jobs_secret_fails_the_job_naming_the_field() -> None:
    spec = _worker(MOUNTS[0][0])
    verdict = _judge(spec, _secret("s", owner="victim"))
    assert verdict == Untrusted(
        SECRET_NOT_ALLOWED, f"{WORKER}.volumes[0].secret.secretName",
        "Secret 's' belongs to DistributedTrainingJob 'victim'; a job's pods may mount only their own job's "
        "keys and tokens",
        fatal=True,
    )  # fmt: skip


def test_a_secret_the_job_itself_owns_or_nobody_owns_is_allowed() -> None:
    spec = _worker(MOUNTS[0][0])
    mine = _secret("s")
    mine["metadata"]["ownerReferences"] = [OWNER]
    assert _judge(spec, mine) is None
    assert _judge(spec, _secret("s")) is None


def test_an_account_key_fails_the_job_labelled_or_named_by_the_spec() -> None:
    labelled = _judge(_worker(MOUNTS[2][0]), _secret("s", {"dtjob.io/storage-key": "true"}))
    assert labelled is not None and labelled.fatal and labelled.reason == SECRET_NOT_ALLOWED
    assert "is a storage account key (dtjob.io/storage-key=true)" in labelled.message
    # The spec's own credentials Secret, even unlabelled (then the operator does not use it either).
    mounted = {"volumes": [{"name": "k", "secret": {"secretName": "storage-key"}}]}
    named = _judge(_worker(mounted, output=OUTPUT), _secret("storage-key"))
    assert named is not None and named.fatal
    assert named.field == f"{WORKER}.volumes[0].secret.secretName"
    assert "holds the storage account key (spec.output.credentials.secretRef.name)" in named.message


def test_a_secret_not_there_yet_waits_and_a_refusal_outranks_it() -> None:
    spec = _worker({
        "volumes": [{"name": "a", "secret": {"secretName": "later"}},
                    {"name": "b", "secret": {"secretName": "stolen"}}],
    })  # fmt: skip
    waits = _judge(spec)
    assert waits is not None and not waits.fatal and waits.reason == SECRET_NOT_FOUND
    assert waits.field == f"{WORKER}.volumes[0].secret.secretName"
    assert waits.message.startswith("Secret 'later' not found in namespace ml")
    fails = _judge(spec, _secret("stolen", owner="victim"))
    assert fails is not None and fails.fatal and fails.field == f"{WORKER}.volumes[1].secret.secretName"


OPERATOR = replace(CONFIG, operator_namespace="ml", operator_service_account="dtjob")
ANY_SHARE = OPERATOR.nfs_shares


@pytest.mark.parametrize("part", ["worker", "launcher"])
@pytest.mark.parametrize("key", ["serviceAccountName", "serviceAccount"])
def test_the_operators_service_account_is_refused_in_the_operators_namespace(part: str, key: str) -> None:
    spec = job_spec(**{part: {"template": {"spec": {key: "dtjob"}}}})
    objects = [desired.worker_pod(spec, OWNER, 0, 0), desired.launcher_pod(spec, OWNER, 0)]
    verdict = judge(
        spec, UID, objects, {}, OPERATOR.operator_namespace, OPERATOR.operator_service_account, ANY_SHARE
    )
    assert verdict is not None and verdict.fatal and verdict.reason == SERVICE_ACCOUNT_NOT_ALLOWED
    assert verdict.field == f"spec.{part}.template.spec.{key}"
    assert "operator's own ServiceAccount" in verdict.message
    # Another ServiceAccount, or the same name in another namespace, is the namespace's RBAC's business.
    other = job_spec(**{part: {"template": {"spec": {key: "trainer"}}}})
    objects = [desired.worker_pod(other, OWNER, 0, 0), desired.launcher_pod(other, OWNER, 0)]
    assert judge(other, UID, objects, {}, "ml", "dtjob", ANY_SHARE) is None
    assert judge(spec, UID, objects, {}, "dtjob-system", "dtjob", ANY_SHARE) is None


def test_the_operator_learns_its_namespace_and_service_account_from_the_downward_api() -> None:
    config = load_config({"POD_NAMESPACE": "dtjob-system", "DTJOB_SERVICE_ACCOUNT": "dtjob"})
    assert (config.operator_namespace, config.operator_service_account) == ("dtjob-system", "dtjob")
    assert load_config({}).operator_service_account is None  # outside a pod: nothing to compare with


PENDING = JobStatus(phase="Pending", observed_generation=4)
RUNNING = JobStatus(phase="Running", observed_generation=4)


def test_an_untrusted_pod_fails_the_job_naming_the_field_and_deletes_its_world() -> None:
    field = f"{WORKER}.volumes[0].secret.secretName"
    text = "Secret 's' belongs to ..."
    refusal = Refused(RefusalKind.UNTRUSTED, CreateWorker(1, 2), text, SECRET_NOT_ALLOWED, field)
    d = refused(RUNNING, refusal, job_spec(), NOW)
    assert d.status.phase == "Failed" and d.status.message == f"{field}: Secret 's' belongs to ..."
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == SECRET_NOT_ALLOWED
    assert d.actions == [DeleteWorld()]


def test_a_secret_not_there_yet_waits_without_deleting_anything() -> None:
    field = f"{WORKER}.volumes[0].secret.secretName"
    text = "Secret 's' not found"
    refusal = Refused(RefusalKind.SECRET_MISSING, CreateWorker(1, 2), text, SECRET_NOT_FOUND, field)
    d = refused(PENDING, refusal, job_spec(), NOW)
    created = d.status.condition("Created")
    assert created is not None and created.reason == SECRET_NOT_FOUND and created.status == "False"
    assert d.status.phase == "Pending" and d.status.message.startswith(f"{field}: Secret 's' not found")
    assert d.actions == [] and d.requeue_after == RETRY_SECONDS


def test_act_creates_no_pod_of_a_refused_step_and_reads_each_secret_once() -> None:
    kube = RecordingKube()
    kube.put(_secret("s", owner="victim"))
    spec = _worker(MOUNTS[0][0])
    actions: list[Action] = [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    results = act(kube, CONFIG, spec, OWNER, actions, (), None, NOW)
    assert len(results) == 1 and isinstance(results[0], Refused)
    assert (results[0].kind, results[0].action) == (RefusalKind.UNTRUSTED, CreateWorker(0, 0))
    assert results[0].field == f"{WORKER}.volumes[0].secret.secretName"
    assert not [c for c in kube.writes() if c[1] in ("Pod", "Job")]
    assert kube.calls.count(("get", "Secret", "s")) == 1


def test_act_creates_the_pods_once_the_secret_they_name_is_the_namespaces() -> None:
    kube = RecordingKube()
    kube.put(_secret("s"))
    results = act(
        kube, CONFIG, _worker(MOUNTS[0][0]), OWNER, [EnsureWorld(), CreateWorker(0, 0)], (), None, NOW
    )
    assert results == [] and ("create", "Pod", "rn50-worker-0") in kube.writes()
