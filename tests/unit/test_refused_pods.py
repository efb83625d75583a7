"""A launcher or stager pod refused by admission: a Pod Security refusal fails the job at once naming the
field, anything else waits visibly and fails at runPolicy.startupDeadlineSeconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dtjob.machine import decide
from dtjob.machine.refused_pods import refused_pod
from dtjob.state.decision import DeletePod
from dtjob.state.failed_create import CreateRefusal
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
POD_SECURITY = (
    'Error creating: pods "rn50-launcher-abcde" is forbidden: violates PodSecurity "restricted:latest": '
    "runAsUser=0 (pod must not set runAsUser=0)"
)
QUOTA = 'Error creating: pods "rn50-launcher-abcde" is forbidden: exceeded quota: pods, requested: pods=1'


def observed(message: str, created: datetime) -> Observed:
    workers = tuple(
        PodState(f"rn50-worker-{i}", "worker", 0, i, "Running", scheduled=True, ready=True, deleting=False)
        for i in range(2)
    )
    launcher = LauncherState(0, deleting=False, running=False, succeeded=False, failed=False)
    refusal = CreateRefusal("rn50-launcher", message, created)
    return Observed(pods=workers, launcher=launcher, launcher_refused=refusal, uid="uid-1")


def starting() -> JobStatus:
    return JobStatus(phase="Starting", start_time=format_time(NOW - timedelta(minutes=5)))


def test_pod_security_fails_at_once_naming_the_launcher_template_and_frees_the_workers() -> None:
    spec = job_spec(runPolicy={"backoffLimit": 3, "cleanPodPolicy": "Running"})
    d = decide(spec, observed(POD_SECURITY, NOW), starting(), NOW)
    failed = d.status.condition("Failed")
    assert d.status.phase == "Failed" and failed is not None and failed.reason == "PodRefused"
    assert failed.message.startswith(
        "spec.launcher.template: the launcher's pod (Job rn50-launcher) is refused"
    )
    assert d.status.restarts == 0


def test_a_quota_refusal_waits_visibly_then_fails_at_the_startup_deadline() -> None:
    spec = job_spec(runPolicy={"startupDeadlineSeconds": 300})
    d = decide(spec, observed(QUOTA, NOW - timedelta(seconds=100)), starting(), NOW)
    created = d.status.condition("Created")
    assert d.status.phase == "Starting" and created is not None and created.status == "False"
    assert created.reason == "PodRefused" and "exceeded quota: pods" in created.message
    assert d.status.message == created.message
    assert d.requeue_after is not None and d.requeue_after <= 15
    late = decide(spec, observed(QUOTA, NOW - timedelta(seconds=301)), starting(), NOW)
    failed = late.status.condition("Failed")
    assert late.status.phase == "Failed" and failed is not None and failed.reason == "StartupDeadlineExceeded"
    unbounded = decide(job_spec(), observed(QUOTA, NOW - timedelta(days=1)), starting(), NOW)
    assert unbounded.status.phase == "Starting"
    assert "set runPolicy.startupDeadlineSeconds to bound it" in unbounded.status.message


def test_a_stager_refused_for_an_inline_nfs_volume_names_the_volume() -> None:
    spec = job_spec()
    message = 'pods "x" is forbidden: violates PodSecurity "restricted:latest": restricted volume types '
    message += '(volume "data" uses restricted volume type "nfs")'
    failure, _, _ = refused_pod(spec, "stager", CreateRefusal("rn50-stage", message, NOW), NOW)
    assert failure is not None and failure.permanent
    assert failure.message.startswith("spec.dataset.volume.nfs: the stager's pod (Job rn50-stage) is refused")


def test_a_refused_launcher_never_deletes_a_worker_while_it_waits() -> None:
    d = decide(job_spec(), observed(QUOTA, NOW), starting(), NOW)
    assert not [a for a in d.actions if isinstance(a, DeletePod)]
