"""A refused action is a result like any other: act() returns it as Refused and stops there, and the machine
(settle, refused) turns it into the condition, the phase, the events, the teardown and the next look."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dtjob.desired.common import owner_reference
from dtjob.machine import decide, settle
from dtjob.machine.refusals import (
    CHILD_REJECTED,
    POD_SECURITY_VIOLATION,
    RETRY_SECONDS,
    STARTUP_DEADLINE_EXCEEDED,
    refused,
)
from dtjob.reconcile.act import act
from dtjob.state.decision import (
    Action,
    CreateLauncher,
    CreateWorker,
    Decision,
    DeleteWorld,
    EnsureWorld,
    MintSas,
    PodForceDeleted,
    RefusalKind,
    Refused,
    Result,
)
from dtjob.state.observed import Observed, PodState
from dtjob.state.status import CHILD_NOT_OURS, CREATE_FORBIDDEN, GANG_API_MISSING, JobStatus

from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import RecordingKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
PENDING = JobStatus(phase="Pending", observed_generation=4)
QUOTA = 'Pod rn50-worker-1 refused by the API server: pods "rn50-worker-1" is forbidden: exceeded quota: gpus'
PSA = (
    'Pod rn50-worker-0 refused by the API server: pods "rn50-worker-0" is forbidden: violates PodSecurity '
    '"restricted:latest": host namespaces (hostIPC=true)'
)
VOLCANO = {"runPolicy": {"scheduling": {"gang": {"scheduler": "volcano", "queue": "research"}}}}


def _reason(decision: Decision, kind: str) -> str | None:
    cond = decision.status.condition(kind)
    return cond.reason if cond is not None else None


def test_a_quota_refusal_waits_and_tries_again_without_deleting_anything() -> None:
    d = refused(PENDING, Refused(RefusalKind.FORBIDDEN, CreateWorker(1, 0), QUOTA), job_spec(), NOW)
    assert d.status.phase == "Pending" and _reason(d, "Created") == CREATE_FORBIDDEN
    assert d.actions == [] and d.requeue_after == RETRY_SECONDS
    assert d.status.observed_generation == 4  # the generation the pass decided from


LAUNCHER_QUOTA = (
    'Pod rn50-launcher refused by the API server: pods "rn50-launcher" is forbidden: exceeded quota: cpu, '
    "requested: requests.cpu=2, used: requests.cpu=8, limited: requests.cpu=8"
)
DEADLINE = {"runPolicy": {"startupDeadlineSeconds": 120}}


def workers_made() -> Observed:
    """The world's workers, made before the launcher's pod that the quota refuses."""
    return Observed(pods=tuple(
        PodState(f"rn50-worker-{i}", "worker", 0, i, "Running", scheduled=True, ready=True, deleting=False)
        for i in range(2)
    ))  # fmt: skip


def test_a_quota_refusal_waits_at_most_the_startup_deadline_then_fails_the_job_and_deletes_its_world() -> (
    None
):
    spec = job_spec(**DEADLINE)
    refusal = Refused(RefusalKind.FORBIDDEN, CreateLauncher(0), LAUNCHER_QUOTA)
    first = refused(PENDING, refusal, spec, NOW)
    assert first.status.phase == "Pending" and _reason(first, "Created") == CREATE_FORBIDDEN
    assert first.status.message == (
        f"{LAUNCHER_QUOTA}; retrying every 30s, at most runPolicy.startupDeadlineSeconds (120s)"
    )
    assert first.actions == [] and first.requeue_after == RETRY_SECONDS
    # The passes in between try the create again and keep the refusal, and when it began, in view.
    retry = decide(spec, workers_made(), first.status, NOW + timedelta(seconds=30))
    assert CreateLauncher(0) in retry.actions
    assert retry.status.condition("Created") == first.status.condition("Created")
    # Counted from the first refusal: a later one waits only for what is left ...
    later = refused(retry.status, refusal, spec, NOW + timedelta(seconds=110))
    assert later.status.phase == "Pending" and later.actions == [] and later.requeue_after == 10.0
    # ... and one past it fails the job: the workers made before the refused launcher would hold their GPUs.
    late = refused(later.status, refusal, spec, NOW + timedelta(seconds=120))
    assert late.status.phase == "Failed" and _reason(late, "Failed") == STARTUP_DEADLINE_EXCEEDED
    assert late.status.message == (
        f"{LAUNCHER_QUOTA}; still refused 120s after the first refusal (runPolicy.startupDeadlineSeconds)"
    )
    assert late.actions == [DeleteWorld()] and late.requeue_after is None


def test_without_a_startup_deadline_a_quota_refusal_keeps_waiting() -> None:
    refusal = Refused(RefusalKind.FORBIDDEN, CreateLauncher(0), LAUNCHER_QUOTA)
    first = refused(PENDING, refusal, job_spec(), NOW)
    days = refused(first.status, refusal, job_spec(), NOW + timedelta(days=3))
    assert days.status.phase == "Pending" and _reason(days, "Created") == CREATE_FORBIDDEN
    assert days.actions == [] and days.requeue_after == RETRY_SECONDS
    assert days.status.message == f"{LAUNCHER_QUOTA}; retrying every 30s"


def test_the_startup_deadline_counts_from_the_first_refusal_not_from_the_worlds_creation() -> None:
    # The world was created an hour ago: the first refusal since is no hour old.
    created = decide(job_spec(**DEADLINE), Observed(), JobStatus(), NOW - timedelta(hours=1)).status
    assert created.is_true("Created")
    refusal = Refused(RefusalKind.FORBIDDEN, CreateLauncher(0), LAUNCHER_QUOTA)
    d = refused(created, refusal, job_spec(**DEADLINE), NOW)
    assert d.status.phase == "Pending" and _reason(d, "Created") == CREATE_FORBIDDEN
    assert d.actions == [] and d.requeue_after == RETRY_SECONDS


def test_the_startup_deadline_counts_from_the_first_quota_refusal_not_from_an_earlier_wait() -> None:
    """Created=False keeps its transition time across reasons: ten minutes waiting for an older job's
    ConfigMap to go are no quota refusal, and must not fail the job 30 s after its first one."""
    spec = job_spec(**DEADLINE)
    earlier = NOW - timedelta(minutes=10)
    made = decide(spec, Observed(), JobStatus(), earlier).status
    held = refused(
        made, Refused(RefusalKind.NOT_OURS, EnsureWorld(), "ConfigMap rn50-hostfile"), spec, earlier
    )
    assert _reason(held, "Created") == CHILD_NOT_OURS
    quota = Refused(RefusalKind.FORBIDDEN, CreateLauncher(0), LAUNCHER_QUOTA)
    first = refused(decide(spec, Observed(), held.status, NOW).status, quota, spec, NOW)
    assert first.status.phase == "Pending" and _reason(first, "Created") == CREATE_FORBIDDEN
    later = NOW + timedelta(seconds=30)
    second = refused(decide(spec, workers_made(), first.status, later).status, quota, spec, later)
    assert second.status.phase == "Pending", second.status.message
    assert second.requeue_after == RETRY_SECONDS and second.actions == []


def test_a_pod_security_refusal_fails_the_job_and_deletes_its_world() -> None:
    d = refused(PENDING, Refused(RefusalKind.FORBIDDEN, CreateWorker(0, 0), PSA), job_spec(), NOW)
    assert d.status.phase == "Failed" and _reason(d, "Failed") == POD_SECURITY_VIOLATION
    assert d.actions == [DeleteWorld()] and d.requeue_after is None


def test_a_rejected_child_fails_the_job_naming_the_spec_and_deletes_its_world() -> None:
    message = "Pod rn50-worker-0 rejected by the API server: spec.containers[0].image: Required value"
    d = refused(PENDING, Refused(RefusalKind.REJECTED, CreateWorker(0, 0), message), job_spec(), NOW)
    assert d.status.phase == "Failed" and _reason(d, "Failed") == CHILD_REJECTED
    assert d.status.message == f"spec: {message}"
    assert d.actions == [DeleteWorld()] and d.requeue_after is None


def test_credentials_refused_for_good_fail_the_job_with_the_storage_reason() -> None:
    refusal = Refused(
        RefusalKind.STORAGE, MintSas("out"), "spec.output.credentials: denied", "StorageCredentialsDenied"
    )
    d = refused(PENDING, refusal, job_spec(), NOW)
    assert d.status.phase == "Failed" and _reason(d, "Failed") == "StorageCredentialsDenied"
    assert d.status.message == "spec: spec.output.credentials: denied"
    assert d.actions == [DeleteWorld()]


def test_a_name_held_by_another_owner_waits_naming_it() -> None:
    d = refused(
        PENDING, Refused(RefusalKind.NOT_OURS, EnsureWorld(), "ConfigMap rn50-hostfile"), job_spec(), NOW
    )
    assert _reason(d, "Created") == CHILD_NOT_OURS and d.status.message.startswith(
        "ConfigMap rn50-hostfile exists"
    )
    assert d.actions == [] and d.requeue_after == RETRY_SECONDS


def test_a_name_held_by_another_owner_fails_the_job_at_the_startup_deadline_and_frees_its_world() -> None:
    """A namespace admin's pod under `<job>-launcher` is never adopted: the workers made beside it would hold
    their GPUs for as long as it stays, so the wait is bounded like a refused create's."""
    spec = job_spec(**DEADLINE)
    held = Refused(RefusalKind.NOT_OURS, CreateLauncher(0), "Pod rn50-launcher")
    first = refused(PENDING, held, spec, NOW)
    assert _reason(first, "Created") == CHILD_NOT_OURS and first.actions == []
    assert first.status.message.endswith(
        "waiting for it to be deleted; retrying every 30s, at most runPolicy.startupDeadlineSeconds (120s)"
    )
    later = refused(first.status, held, spec, NOW + timedelta(seconds=100))
    assert later.status.phase == "Pending" and later.actions == [] and later.requeue_after == 20.0
    late = refused(later.status, held, spec, NOW + timedelta(seconds=120))
    assert late.status.phase == "Failed" and _reason(late, "Failed") == STARTUP_DEADLINE_EXCEEDED
    assert late.status.message.startswith("Pod rn50-launcher exists and belongs to another owner")
    assert late.status.message.endswith(
        "still refused 120s after the first refusal (runPolicy.startupDeadlineSeconds)"
    )
    assert late.actions == [DeleteWorld()]
    # Without a deadline it waits as long as the name is held, deleting nothing.
    days = refused(first.status, held, job_spec(), NOW + timedelta(days=2))
    assert days.status.phase == "Pending" and days.actions == []


def test_a_pod_group_api_not_served_waits_naming_the_scheduler() -> None:
    api = "PodGroup (scheduling.volcano.sh/v1beta1)"
    d = refused(PENDING, Refused(RefusalKind.API_NOT_SERVED, EnsureWorld(), api), job_spec(**VOLCANO), NOW)
    assert _reason(d, "Created") == GANG_API_MISSING and "install Volcano" in d.status.message
    assert d.actions == [] and d.requeue_after == RETRY_SECONDS


def test_settle_records_what_ran_before_the_refusal_then_the_refusal() -> None:
    decision = Decision(PENDING, [CreateWorker(0, 0)], [], requeue_after=5.0)
    results: list[Result] = [
        PodForceDeleted("rn50-worker-1", 40.0),
        Refused(RefusalKind.FORBIDDEN, CreateWorker(0, 0), QUOTA),
    ]
    after = settle(decision, results, job_spec(), NOW)
    assert [e.reason for e in after.events] == ["PodForceDeleted", CREATE_FORBIDDEN]
    assert after.requeue_after == RETRY_SECONDS and after.actions == []


def test_settle_without_a_refusal_keeps_the_decisions_next_look() -> None:
    decision = Decision(PENDING, [], [], requeue_after=5.0)
    after = settle(decision, [PodForceDeleted("rn50-worker-1", 40.0)], job_spec(), NOW)
    assert after.status == PENDING and after.requeue_after == 5.0 and after.actions == []


def test_act_returns_a_refused_create_and_runs_nothing_after_it() -> None:
    kube = RecordingKube(reject={"Pod"})
    spec, owner = job_spec(), owner_reference("rn50", "uid-1")
    actions: list[Action] = [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    results = act(kube, CONFIG, spec, owner, actions, (), None, NOW)
    assert len(results) == 1 and isinstance(results[0], Refused)
    assert (results[0].kind, results[0].action) == (RefusalKind.REJECTED, CreateWorker(0, 0))
    assert "Pod rn50-worker-0" in results[0].message
    assert ("create", "Pod", "rn50-launcher") not in kube.writes()


def test_act_returns_a_name_another_owner_holds() -> None:
    kube = RecordingKube()
    other = [owner_reference("rn50", "uid-of-the-old-job")]
    kube.put(
        {"kind": "Secret", "metadata": {"name": "rn50-ssh", "namespace": "ml", "ownerReferences": other}}
    )
    results = act(kube, CONFIG, job_spec(), owner_reference("rn50", "uid-1"), [EnsureWorld()], (), None, NOW)
    assert results == [Refused(RefusalKind.NOT_OURS, EnsureWorld(), "Secret rn50-ssh")]
