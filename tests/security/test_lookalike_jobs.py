"""A namespace admin may create batch Jobs, and label them as it likes: one labelled as a job's launcher under
another name hid the real launcher from the operator (taken first from its cache), so the job waited in
Starting while its world held its GPUs, or restarted as LauncherLost. The launcher is a pod the operator
makes itself now; a launcher Job is only an earlier release's (still handled). A Job labelled as the
launcher, under another name or under that very name, is never taken for one, nor touched: the operator
knows its launcher by the name it gives it and by its owner, the job."""

from __future__ import annotations

import time
from typing import Any

import pytest
from dtjob import names
from kubernetes import client

from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, Tenant

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


@pytest.mark.parametrize("lookalike_name", ["mine-a", names.launcher_name("mine")])
def test_a_batch_job_labelled_as_a_jobs_launcher_does_not_stand_in_for_it(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient, lookalike_name: str
) -> None:
    labels = names.labels("mine", "launcher", names.ROLE_LAUNCHER)
    lookalike: Any = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": lookalike_name, "labels": labels},
        "spec": {
            "suspend": True,  # no pod: only its labels count
            "template": {
                "metadata": {"labels": {}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    # Made before the job, so that the operator's cache holds it first, as a LIST in name order would too.
    batch = client.BatchV1Api(tenant_a.api(ADMIN))
    planted = batch.create_namespaced_job(tenant_a.namespace, lookalike)
    tenant_a.jobs().create("mine", launcher=LONG_LAUNCHER)
    mine = Jobs(api_client, tenant_a.namespace)
    mine.wait_phase("mine", "Running", timeout=120)
    time.sleep(3)  # a few more reconciles: none takes the look-alike for a launcher that ended or went
    status = mine.status("mine")
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    # The launch is the operator's own launcher pod, owned by the job, not anything the look-alike stands for.
    launcher = mine.launcher("mine")
    assert launcher is not None and launcher.status.phase == "Running"
    job_uid = (mine.get("mine") or {})["metadata"]["uid"]
    assert [(r.kind, r.uid) for r in launcher.metadata.owner_references or ()] == [
        ("DistributedTrainingJob", job_uid)
    ]
    assert status["launcher"] == {"state": "Running", "pod": launcher.metadata.name}, status
    # The look-alike is left as it was: not adopted, not deleted.
    kept = batch.read_namespaced_job(lookalike_name, tenant_a.namespace)
    assert kept.metadata.uid == planted.metadata.uid and not kept.metadata.owner_references
