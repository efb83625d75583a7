"""spec.managedBy against a real API server with the operator running: a job that names another controller
(here Kueue's MultiKueue, with no queue to dispatch it on) gets no children and no status from this operator,
while a job beside it runs (tests/integration/test_multikueue.py dispatches one);
the CRD refuses a malformed value and any change of it."""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

SELECTOR = "dtjob.io/job-name={}"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def _pods_and_secrets(jobs: Jobs, name: str) -> list[str]:
    selector = SELECTOR.format(name)
    pods = jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items
    secrets = jobs.core.list_namespaced_secret(jobs.ns, label_selector=selector).items
    return [str(p.metadata.name) for p in pods] + [str(s.metadata.name) for s in secrets]


def test_a_job_managed_elsewhere_is_left_alone(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("elsewhere", managedBy=MULTIKUEUE)
    jobs.create("here", managedBy="dtjob.io/operator")
    jobs.wait_phase("here", "Running", timeout=120)
    # The operator has reconciled a job created after this one; a few resync-free seconds more for good
    # measure, then nothing may exist for the foreign job.
    time.sleep(3)
    assert _pods_and_secrets(jobs, "elsewhere") == []
    assert jobs.status("elsewhere") == {}
    assert _pods_and_secrets(jobs, "here") != []


@pytest.mark.parametrize("value", ["multikueue", "Kueue.x-k8s.io/multikueue", "a/b/c", "x" * 60 + ".io/y"])
def test_the_crd_refuses_a_malformed_managed_by(jobs: Jobs, value: str) -> None:
    with pytest.raises(ApiException) as refused:
        jobs.create("bad", managedBy=value)
    assert refused.value.status == 422 and "spec.managedBy" in str(refused.value.body), refused.value.body
    assert jobs.get("bad") is None


@pytest.mark.parametrize(
    ("created_with", "patch"),
    [
        ({"managedBy": MULTIKUEUE}, {"managedBy": "dtjob.io/operator"}),
        ({"managedBy": MULTIKUEUE}, {"managedBy": None}),
        ({}, {"managedBy": MULTIKUEUE}),
    ],
)
def test_managed_by_cannot_change_after_creation(
    jobs: Jobs, created_with: dict[str, str], patch: dict[str, str | None]
) -> None:
    jobs.create("fixed", **created_with)
    with pytest.raises(ApiException) as refused:
        jobs.patch_spec("fixed", patch)
    assert refused.value.status == 422 and "spec.managedBy is immutable" in str(refused.value.body)
    assert (jobs.get("fixed") or {})["spec"].get("managedBy") == created_with.get("managedBy")
