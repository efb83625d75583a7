"""A namespace admin may create batch Jobs, and label them as it likes: one labelled as a job's launcher under
another name hid the real launcher from the operator (taken first from its cache), so the job waited in
Starting while its world held its GPUs, or restarted as LauncherLost. The operator knows its launcher by the
name it gives it."""

from __future__ import annotations

from typing import Any

from dtjob import names
from kubernetes import client

from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


def test_a_batch_job_labelled_as_a_jobs_launcher_does_not_stand_in_for_it(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    labels = names.labels("mine", "launcher", names.ROLE_LAUNCHER)
    lookalike: Any = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "mine-a", "labels": labels},
        "spec": {
            "suspend": True,  # no pod: only its labels count
            "template": {
                "metadata": {"labels": {}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    # Made before the job, so that the operator's cache holds it first, as a LIST in name order would too.
    client.BatchV1Api(tenant_a.api(ADMIN)).create_namespaced_job(tenant_a.namespace, lookalike)
    tenant_a.jobs().create("mine", launcher=LONG_LAUNCHER)
    mine = Jobs(api_client, tenant_a.namespace)
    mine.wait_phase("mine", "Running", timeout=120)
    status = mine.status("mine")
    assert status["restarts"] == 0, status
    batch = client.BatchV1Api(api_client)
    launcher = batch.read_namespaced_job(names.launcher_name("mine"), tenant_a.namespace)
    assert launcher.metadata.owner_references[0].name == "mine"
