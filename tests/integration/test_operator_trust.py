"""Pod templates may not hand a job's pods what is not the job's: against a real API server (kwok-simulated
pods). A template mounting another job's SSH key Secret, or a storage account key, fails the job naming the
field, before anything is created."""

from __future__ import annotations

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration


def test_a_template_mounting_another_jobs_key_or_an_account_key_fails_naming_the_field(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("victim", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}})
    wait_for(lambda: secret_exists(jobs, "victim-ssh"), timeout=60, what="the victim's SSH key Secret")
    volumes = [{"name": "stolen", "secret": {"secretName": "victim-ssh"}}]
    jobs.create("thief", worker={"template": {"spec": {"volumes": volumes}}})
    status = jobs.wait_phase("thief", "Failed", timeout=60)
    field = "spec.worker.template.spec.volumes[0].secret.secretName"
    assert status["message"].startswith(f"{field}: Secret 'victim-ssh' belongs to DistributedTrainingJob")
    assert jobs.pods("thief") == [] and jobs.launcher("thief") is None
    # A storage account key (opted in for the operator's use) is never handed to a pod either.
    meta = client.V1ObjectMeta(name="account-key", labels={"dtjob.io/storage-key": "true"})
    jobs.core.create_namespaced_secret(jobs.ns, client.V1Secret(metadata=meta, string_data={"k": "v"}))
    env_from = [{"secretRef": {"name": "account-key"}}]
    containers = [{"name": "launcher", "envFrom": env_from}]
    jobs.create("keyed", launcher={"template": {"spec": {"containers": containers}}})
    status = jobs.wait_phase("keyed", "Failed", timeout=60)
    field = "spec.launcher.template.spec.containers[0].envFrom[0].secretRef.name"
    assert status["message"].startswith(f"{field}: Secret 'account-key' is a storage account key")
    assert jobs.pods("keyed") == []
    # The victim's own world is untouched.
    assert jobs.status("victim").get("phase") not in ("Failed",)


def secret_exists(jobs: Jobs, name: str) -> bool:
    return any(s.metadata.name == name for s in jobs.core.list_namespaced_secret(jobs.ns).items)
