"""Ready, Reconciling and Stalled (the kstatus conditions GitOps tools read) on every decision of the state
machine, one phase per test; the job's own conditions stay as they were."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from dtjob.machine import decide, invalid_spec
from dtjob.machine.refusals import child_not_ours, create_forbidden
from dtjob.state.conditions import with_kstatus_conditions
from dtjob.state.observed import Blocker, Observed
from dtjob.state.status import JobStatus, set_condition

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_operator_status import NOW, launcher, started, worker

QUOTA = 'Pod rn50-worker-1 refused by the API server: pods "rn50-worker-1" is forbidden: exceeded quota: gpus'


def kstatus(status: JobStatus) -> dict[str, tuple[str, str]]:
    """{type: (status, reason)} of the three kstatus conditions."""
    found = {}
    for kind in ("Ready", "Reconciling", "Stalled"):
        cond = status.condition(kind)
        assert cond is not None, f"{kind} missing from {status.conditions}"
        found[kind] = (cond.status, cond.reason)
    return found


def test_a_new_job_is_reconciling_and_names_its_generation() -> None:
    d = decide(job_spec(), Observed(generation=4), JobStatus(), NOW)
    assert d.status.phase == "Pending"
    assert kstatus(d.status) == {
        "Ready": ("False", "Pending"), "Reconciling": ("True", "Pending"), "Stalled": ("False", "Pending"),
    }  # fmt: skip
    assert d.status.observed_generation == 4
    reconciling = d.status.condition("Reconciling")
    assert reconciling is not None and reconciling.message == d.status.message
    # The job's own conditions come first, untouched.
    assert [c.type for c in d.status.conditions] == ["Created", "Ready", "Reconciling", "Stalled"]


def test_a_running_job_is_still_reconciling_toward_its_end() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(), generation=1)
    d = decide(job_spec(), obs, started(phase="Starting"), NOW)
    assert d.status.phase == "Running" and d.status.is_true("Running")
    assert kstatus(d.status) == {
        "Ready": ("False", "Running"), "Reconciling": ("True", "Running"), "Stalled": ("False", "Running"),
    }  # fmt: skip


def test_a_restarting_job_is_reconciling() -> None:
    obs = Observed(pods=(worker(0), worker(1, phase="Failed", ready=False)), launcher=launcher())
    d = decide(job_spec(), obs, started(), NOW)
    assert d.status.phase == "Restarting"
    assert kstatus(d.status)["Reconciling"] == ("True", "Restarting")
    assert kstatus(d.status)["Stalled"][0] == "False"


def test_success_is_ready_and_nothing_else() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(running=False, succeeded=True))
    d = decide(job_spec(), obs, started(), NOW)
    assert d.status.phase == "Succeeded"
    assert kstatus(d.status) == {
        "Ready": ("True", "LauncherSucceeded"),
        "Reconciling": ("False", "LauncherSucceeded"),
        "Stalled": ("False", "LauncherSucceeded"),
    }


def test_failure_is_stalled_with_the_failures_reason_and_message() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    d = decide(job_spec(runPolicy={"activeDeadlineSeconds": 5}), obs, started(), NOW)
    assert d.status.phase == "Failed"
    assert kstatus(d.status) == {
        "Ready": ("False", "DeadlineExceeded"),
        "Reconciling": ("False", "DeadlineExceeded"),
        "Stalled": ("True", "DeadlineExceeded"),
    }
    stalled = d.status.condition("Stalled")
    assert stalled is not None and "activeDeadlineSeconds" in stalled.message


def test_a_spec_the_operator_refuses_is_stalled_naming_the_field() -> None:
    d = invalid_spec(JobStatus(), "spec.workers", "must be >= 1", NOW, 2)
    assert kstatus(d.status)["Stalled"] == ("True", "InvalidSpec")
    stalled = d.status.condition("Stalled")
    assert stalled is not None and stalled.message == "spec.workers: must be >= 1"


def test_a_blocked_first_world_is_stalled_not_reconciling_until_it_clears() -> None:
    blocker = Blocker("PVCNotFound", "spec.dataset.volume.persistentVolumeClaim.claimName: 'x' not found")
    blocked = decide(job_spec(), Observed(blocker=blocker), JobStatus(), NOW)
    assert blocked.status.phase == "Pending"
    assert kstatus(blocked.status) == {
        "Ready": ("False", "PVCNotFound"), "Reconciling": ("False", "PVCNotFound"),
        "Stalled": ("True", "PVCNotFound"),
    }  # fmt: skip
    # The PVC appears: the world is created and the job reconciles again.
    cleared = decide(job_spec(), Observed(), blocked.status, NOW + timedelta(seconds=15))
    assert cleared.status.is_true("Created")
    assert kstatus(cleared.status)["Reconciling"] == ("True", "Pending")
    assert kstatus(cleared.status)["Stalled"] == ("False", "Pending")


def test_refused_creates_are_stalled() -> None:
    quota = create_forbidden(JobStatus(phase="Pending"), QUOTA, NOW, 1)
    assert quota.status.phase == "Pending"
    assert kstatus(quota.status)["Stalled"] == ("True", "CreateForbidden")
    assert kstatus(quota.status)["Reconciling"][0] == "False"
    held = child_not_ours(JobStatus(phase="Restarting"), "ConfigMap rn50-hostfile", NOW, 1)
    assert held.status.phase == "Restarting"
    assert kstatus(held.status)["Stalled"] == ("True", "ChildNotOwned")


def test_a_suspended_job_rests_where_its_spec_asks_neither_reconciling_nor_stalled() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    d = decide(job_spec(runPolicy={"suspend": True}), obs, started(), NOW)
    assert d.status.phase == "Suspended" and d.status.is_true("Suspended")
    assert kstatus(d.status) == {
        "Ready": ("True", "Suspended"), "Reconciling": ("False", "Suspended"),
        "Stalled": ("False", "Suspended"),
    }  # fmt: skip
    resumed = decide(job_spec(), Observed(), d.status, NOW)
    assert kstatus(resumed.status) == {
        "Ready": ("False", "Pending"), "Reconciling": ("True", "Pending"), "Stalled": ("False", "Pending"),
    }  # fmt: skip


def test_transition_times_move_only_when_a_condition_flips() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    first = decide(job_spec(), obs, started(phase="Starting"), NOW)
    later = decide(job_spec(), obs, first.status, NOW + timedelta(minutes=5))
    for kind in ("Ready", "Reconciling", "Stalled"):
        assert first.status.condition(kind) == later.status.condition(kind)
    done = decide(
        job_spec(),
        Observed(pods=(worker(0), worker(1)), launcher=launcher(running=False, succeeded=True)),
        later.status,
        NOW + timedelta(minutes=10),
    )
    ready = done.status.condition("Ready")
    assert ready is not None and ready.last_transition_time == "2025-01-01T12:10:00Z"
    stalled = done.status.condition("Stalled")
    assert stalled is not None and stalled.last_transition_time == "2025-01-01T12:00:00Z"


def test_a_status_from_an_older_operator_gains_them_without_losing_its_own() -> None:
    old = replace(
        JobStatus(phase="Succeeded", message="launcher pod x completed"),
        conditions=set_condition((), "Succeeded", True, "LauncherSucceeded", "ok", NOW),
    )
    later = datetime(2025, 2, 1, tzinfo=UTC)
    new = with_kstatus_conditions(old, later)
    assert new.condition("Succeeded") == old.condition("Succeeded")
    assert kstatus(new)["Ready"] == ("True", "LauncherSucceeded")
    assert with_kstatus_conditions(new, later + timedelta(hours=1)) == new
