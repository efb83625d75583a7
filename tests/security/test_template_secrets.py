"""A tenant's editor (the chart's edit role: jobs, no Secrets, no pods) cannot get a Secret that is not its
job's into a pod by editing a pod template after the job started: during staging, before a restart, before
an elastic replacement, or by naming a Secret that does not exist yet. Every pod and batch Job the API server
saw in the namespace is checked (its watch streams, so a pod deleted a moment after its create counts too).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)
from tests.integration.api_history import ApiHistory, Seen

STORAGE_KEY_LABEL = "dtjob.io/storage-key"
LONG_RUN = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (f"storagePolicy.accounts={{{DEV_ACCOUNT_NAME}}}",)


def test_a_worker_template_edited_during_staging_cannot_mount_another_jobs_ssh_key(
    tenant_a: Tenant,
    admin_jobs: Jobs,
    operator: OperatorProcess,
    history: ApiHistory,
    azurite: Azurite,  # noqa: F811
) -> None:
    editor = tenant_a.jobs()
    editor.create("victim", launcher=LONG_RUN)
    wait_for(lambda: secret(admin_jobs, "victim-ssh"), timeout=60, what="the victim's SSH key Secret")
    account_key(tenant_a, "storage-key", azurite.account_key)
    staged = staged_spec(azurite, "storage-key")
    editor.create("thief", **staged)
    editor.wait_phase("thief", "Staging", timeout=60)
    volumes = [{"name": "stolen", "secret": {"secretName": "victim-ssh"}}]
    editor.patch_spec("thief", {"worker": {"template": {"spec": {"volumes": volumes}}}})

    status = failed_or_named(admin_jobs, history, "thief", "victim-ssh", owner="victim")
    assert naming(history, "victim-ssh", but="victim") == [], "a pod of the thief got the victim's key"
    field = "spec.worker.template.spec.volumes[0].secret.secretName"
    assert status["message"].startswith(f"{field}: Secret 'victim-ssh' belongs to DistributedTrainingJob")
    assert condition(status, "Failed")["reason"] == "SecretNotAllowed"
    assert admin_jobs.status("victim").get("phase") != "Failed"


def test_a_template_naming_a_secret_not_yet_created_never_mounts_the_job_that_later_creates_it(
    tenant_a: Tenant, admin_jobs: Jobs, operator: OperatorProcess, history: ApiHistory
) -> None:
    editor = tenant_a.jobs()
    containers = [{"name": "worker", "env": [
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "later-ssh", "key": "ssh-privatekey"}}},
    ]}]  # fmt: skip
    editor.create("early", worker={"template": {"spec": {"containers": containers}}}, launcher=LONG_RUN)
    field = "spec.worker.template.spec.containers[0].env[0].valueFrom.secretKeyRef.name"

    def settled() -> dict[str, Any] | None:
        """Waiting for the Secret, naming the field; or (the attack's first step worked) its pods created."""
        status = admin_jobs.status("early")
        waits = status.get("phase") == "Pending" and field in str(status.get("message"))
        return status if waits or naming(history, "later-ssh") else None

    before = wait_for(settled, timeout=60, what="early waiting for the Secret it names, or its pods")
    # The Secret appears as another job's: a job named `later` gets its SSH key Secret `later-ssh`.
    editor.create("later", launcher=LONG_RUN)
    wait_for(lambda: secret(admin_jobs, "later-ssh"), timeout=60, what="the later job's SSH key Secret")

    status = failed_or_named(admin_jobs, history, "early", "later-ssh", owner="later")
    assert naming(history, "later-ssh", but="later") == [], "a pod of the early job names the later job's key"
    assert condition(before, "Created")["reason"] == "SecretNotFound"
    assert before["message"].startswith(f"{field}: Secret 'later-ssh' not found"), before["message"]
    assert status["message"].startswith(f"{field}: Secret 'later-ssh' belongs to DistributedTrainingJob")


@pytest.mark.parametrize("how", ["restart", "elastic replacement"])
def test_a_world_built_from_a_template_edited_mid_run_cannot_read_an_account_key(
    how: str, tenant_a: Tenant, admin_jobs: Jobs, operator: OperatorProcess, history: ApiHistory
) -> None:
    # Another system's account key, opted in for the operator's use by the namespace's admin.
    account_key(tenant_a, "team-key", "a2V5")
    editor = tenant_a.jobs()
    elastic = {"elastic": {"minWorkers": 1, "maxWorkers": 2}} if how == "elastic replacement" else {}
    editor.create("drift", launcher=LONG_RUN, **elastic)
    wait_for(lambda: running(admin_jobs, "drift"), timeout=120, what="drift running with 2 workers Ready")
    containers = [{"name": "worker", "envFrom": [{"secretRef": {"name": "team-key"}}]}]
    editor.patch_spec("drift", {"worker": {"template": {"spec": {"containers": containers}}}})
    # The infrastructure takes a worker: a crash restarts the world, a lost pod is replaced in place.
    if how == "restart":
        admin_jobs.annotate_pod("drift-worker-1", {"sim.dtjob.io/outcome": "Failed"})
    else:
        admin_jobs.core.delete_namespaced_pod("drift-worker-1", admin_jobs.ns, grace_period_seconds=0)

    status = failed_or_named(admin_jobs, history, "drift", "team-key")
    assert naming(history, "team-key") == [], "a pod got the account key"
    field = "spec.worker.template.spec.containers[0].envFrom[0].secretRef.name"
    assert status["message"].startswith(f"{field}: Secret 'team-key' is a storage account key")
    assert condition(status, "Failed")["reason"] == "SecretNotAllowed"


def staged_spec(azurite: Azurite, key: str) -> dict[str, Any]:  # noqa: F811
    """A job that stages for 20 s (its stager simulated) before its workers are created."""
    location = {
        "endpoint": azurite.endpoint,
        "container": "datasets",
        "prefix": "ilsvrc2012",
        "credentials": {"authMode": "accountKey", "secretRef": {"name": key}},
        "podAnnotations": {"sim.dtjob.io/run-duration": "20s"},
    }
    return {
        "dataset": {
            "source": "imagenet",
            "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports/imagenet"}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": location,
        },
        "launcher": LONG_RUN,
    }


def account_key(tenant: Tenant, name: str, key: str) -> None:
    """An account key Secret labelled for the operator's use, created by the namespace's admin (an editor may
    not create Secrets)."""
    meta = client.V1ObjectMeta(name=name, labels={STORAGE_KEY_LABEL: "true"})
    body = client.V1Secret(metadata=meta, string_data={"azurestorageaccountkey": key})
    tenant.core(ADMIN).create_namespaced_secret(tenant.namespace, body)


def secret(jobs: Jobs, name: str) -> bool:
    return any(s.metadata.name == name for s in jobs.core.list_namespaced_secret(jobs.ns).items)


def running(jobs: Jobs, name: str) -> dict[str, Any] | None:
    status = jobs.status(name)
    return status if status.get("phase") == "Running" and status.get("workersReady") == "2/2" else None


def naming(history: ApiHistory, secret_name: str, but: str | None = None) -> list[str]:
    """`Kind name` of every pod and batch Job seen in the namespace whose spec names `secret_name`, but the
    job `but`'s (the Secret's owner)."""

    def names_it(seen: Seen) -> bool:
        labels = seen.obj["metadata"].get("labels") or {}
        if but is not None and labels.get("dtjob.io/job-name") == but:
            return False
        return f'"{secret_name}"' in json.dumps(seen.obj.get("spec") or {})

    found = history.of("Pod", names_it) + history.of("Job", names_it)
    return sorted({f"{seen.kind} {seen.name}" for seen in found})


def failed_or_named(
    jobs: Jobs, history: ApiHistory, name: str, secret_name: str, owner: str | None = None
) -> dict[str, Any]:
    """The job's status once it failed, or as soon as a pod or Job that is not `owner`'s names `secret_name`
    (the attack worked: the assertions after say so)."""

    def settled() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("phase") == "Failed" or naming(history, secret_name, owner) else None

    return dict(wait_for(settled, timeout=120, what=f"{name} failed, or a pod naming {secret_name}"))


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found = next((c for c in status.get("conditions") or [] if c["type"] == kind), None)
    assert found is not None, f"no {kind} condition: {status}"
    return dict(found)
