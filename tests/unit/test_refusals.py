"""A create refused with 403 becomes a clear status instead of "creating N worker pod(s)" forever."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dtjob.machine import decide
from dtjob.machine.refusals import POD_SECURITY_VIOLATION, RETRY_SECONDS, create_forbidden, pod_security_field
from dtjob.state.decision import CreateLauncher, CreateWorker, EnsureWorld
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import CREATE_FORBIDDEN, JobStatus

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
QUOTA = (
    'Pod rn50-worker-1 refused by the API server: pods "rn50-worker-1" is forbidden: exceeded quota: '
    "gpus, requested: requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=4, limited: "
    "requests.nvidia.com/gpu=4"
)
PSA = (
    'Pod rn50-worker-0 refused by the API server: pods "rn50-worker-0" is forbidden: violates PodSecurity '
    '"restricted:latest": restricted volume types (volume "data" uses restricted volume type "nfs")'
)


def test_a_pod_security_refusal_fails_the_job_naming_the_field() -> None:
    d = create_forbidden(JobStatus(phase="Pending"), PSA, NOW, 3)
    assert d.status.phase == "Failed"
    assert d.status.message.startswith("spec.dataset.volume.nfs: Pod rn50-worker-0 refused")
    assert "persistentVolumeClaim" in d.status.message
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == POD_SECURITY_VIOLATION
    assert d.requeue_after is None and d.status.observed_generation == 3


def test_a_quota_refusal_waits_saying_why_and_retries() -> None:
    d = create_forbidden(JobStatus(phase="Pending"), QUOTA, NOW, 1)
    assert d.status.phase == "Pending" and "exceeded quota" in d.status.message
    cond = d.status.condition("Created")
    assert cond is not None and cond.status == "False" and cond.reason == CREATE_FORBIDDEN
    assert d.requeue_after == RETRY_SECONDS
    assert [e.reason for e in d.events] == [CREATE_FORBIDDEN]
    again = create_forbidden(d.status, QUOTA, NOW + timedelta(seconds=30), 1)
    assert again.status == d.status and again.events == []  # no new event, no status write


def test_decide_keeps_the_refusal_in_view_while_it_retries_the_create() -> None:
    refused = create_forbidden(JobStatus(phase="Pending"), QUOTA, NOW, 1).status
    worker0 = PodState(name="rn50-worker-0", role="worker", attempt=0, index=0, phase="Pending",
                       scheduled=False, ready=False, deleting=False, reason=None)  # fmt: skip
    d = decide(job_spec(), Observed(pods=(worker0,), generation=1), refused, NOW)
    assert d.actions == [EnsureWorld(), CreateWorker(1, 0), CreateLauncher(0)]  # tried again...
    assert d.status.message == refused.message  # ...without claiming "creating 1 worker pod(s)"
    assert d.status.condition("Created") == refused.condition("Created")
    assert d.events == []


def test_once_the_create_succeeds_the_world_counts_as_created() -> None:
    refused = create_forbidden(JobStatus(phase="Pending"), QUOTA, NOW, 1).status
    pods = tuple(
        PodState(name=f"rn50-worker-{i}", role="worker", attempt=0, index=i, phase="Pending", scheduled=False,
                 ready=False, deleting=False, reason=None)
        for i in range(2)
    )  # fmt: skip
    # The refused create stopped the pass before the launcher's pod: it comes next, the refusal still named.
    d = decide(job_spec(), Observed(pods=pods, generation=1), refused, NOW)
    assert d.actions == [CreateLauncher(0)] and "exceeded quota" in d.status.message
    held = LauncherState(attempt=0, deleting=False, running=False, succeeded=False, failed=False, held=True)
    d = decide(job_spec(), Observed(pods=pods, launcher=held, generation=1), refused, NOW)
    assert d.actions == []
    assert d.status.is_true("Created") and "exceeded quota" not in d.status.message


def test_a_pod_security_refusal_of_what_a_template_adds_names_the_template() -> None:
    text = (
        'Pod rn50-worker-0 refused by the API server: pods "rn50-worker-0" is forbidden: violates '
        'PodSecurity "baseline:latest": host namespaces (hostIPC=true), non-default capabilities (container '
        '"worker" must not include "IPC_LOCK" in securityContext.capabilities.add)'
    )
    d = create_forbidden(JobStatus(phase="Pending"), text, NOW, 1)
    assert d.status.message.startswith("spec.worker.template: Pod rn50-worker-0 refused")
    both = PSA + ", host namespaces (hostIPC=true)"
    assert create_forbidden(JobStatus(phase="Pending"), both, NOW, 1).status.message.startswith(
        "spec.dataset.volume.nfs and spec.worker.template: "
    )
    # NFS alone stays NFS's, whatever its volume list says in parentheses.
    assert create_forbidden(JobStatus(phase="Pending"), PSA, NOW, 1).status.message.startswith(
        "spec.dataset.volume.nfs: "
    )


def test_a_pod_security_refusal_of_the_launchers_pod_names_the_launchers_template() -> None:
    text = (
        'Pod rn50-launcher refused by the API server: pods "rn50-launcher" is forbidden: violates '
        'PodSecurity "baseline:latest": host namespaces (hostIPC=true)'
    )
    assert pod_security_field(text) == "spec.launcher.template"
    d = create_forbidden(JobStatus(phase="Pending"), text, NOW, 1)
    assert d.status.phase == "Failed" and d.status.message.startswith(
        "spec.launcher.template: Pod rn50-launcher "
    )
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == POD_SECURITY_VIOLATION
    # A worker's pod, also of a job whose name reads like a launcher's, is the worker template's.
    worker = text.replace("rn50-launcher", "rn50-launcher-worker-0")
    assert pod_security_field(worker) == "spec.worker.template"
    # What is no pod of the job's names the spec as a whole.
    job = text.replace("Pod rn50-launcher", "Job rn50-stage", 1)
    assert pod_security_field(job) == "spec"
