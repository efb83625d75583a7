"""Jobs of every phase as the operator writes them (status from the pure state machine), each with the health
Argo CD (docs/gitops.md's check) and kstatus must give it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dtjob.machine import decide
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import Blocker, Observed, StagingOutcome
from dtjob.state.status import JobStatus

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_operator_staging import staged_spec
from tests.unit.test_operator_status import NOW, launcher, started, worker


@dataclass(frozen=True)
class PhaseCase:
    name: str
    job: dict[str, Any]
    argo: str  # Argo CD health status
    kstatus: str  # sigs.k8s.io/cli-utils kstatus status


def job(name: str, status: JobStatus | None, generation: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "dtjob.io/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name, "namespace": "ml", "generation": generation, "uid": f"uid-{name}"},
        "spec": {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4},
    }
    if status is not None:
        body["status"] = status.to_dict()
    return body


def _decided(spec: JobSpec, observed: Observed, prev: JobStatus) -> JobStatus:
    return decide(spec, replace(observed, generation=1), prev, NOW).status


def phase_cases() -> list[PhaseCase]:
    world = (worker(0), worker(1))
    pending = _decided(job_spec(), Observed(), JobStatus())
    # The staging Job created, then running.
    staging = _decided(staged_spec(), Observed(), JobStatus())
    staging = _decided(staged_spec(), Observed(staging=StagingOutcome("Running", None)), staging)
    starting = _decided(
        job_spec(), Observed(pods=(worker(0), worker(1, ready=False))), started(phase="Pending")
    )
    running = _decided(job_spec(), Observed(pods=world, launcher=launcher()), started(phase="Starting"))
    restarting = _decided(
        job_spec(),
        Observed(pods=(worker(0), worker(1, phase="Failed", ready=False)), launcher=launcher()),
        running,
    )
    blocked = _decided(
        job_spec(), Observed(blocker=Blocker("PVCNotFound", "claim 'x' not found")), JobStatus()
    )
    suspended = _decided(job_spec(runPolicy={"suspend": True}), Observed(pods=world), running)
    done = Observed(pods=world, launcher=launcher(running=False, succeeded=True))
    succeeded = _decided(job_spec(), done, running)
    failed = _decided(job_spec(runPolicy={"activeDeadlineSeconds": 5}), Observed(pods=world), running)
    assert [s.phase for s in (pending, staging, starting, running, restarting, blocked, suspended)] == [
        "Pending", "Staging", "Starting", "Running", "Restarting", "Pending", "Suspended",
    ]  # fmt: skip
    assert (succeeded.phase, failed.phase) == ("Succeeded", "Failed")
    return [
        PhaseCase("pending", job("pending", pending), "Progressing", "InProgress"),
        PhaseCase("staging", job("staging", staging), "Progressing", "InProgress"),
        PhaseCase("starting", job("starting", starting), "Progressing", "InProgress"),
        PhaseCase("running", job("running", running), "Progressing", "InProgress"),
        PhaseCase("restarting", job("restarting", restarting), "Progressing", "InProgress"),
        PhaseCase("blocked", job("blocked", blocked), "Degraded", "Failed"),
        PhaseCase("suspended", job("suspended", suspended), "Suspended", "Current"),
        PhaseCase("succeeded", job("succeeded", succeeded), "Healthy", "Current"),
        PhaseCase("failed", job("failed", failed), "Degraded", "Failed"),
        # An edited spec the operator has not reconciled yet: its old Succeeded status says nothing.
        PhaseCase("behind", job("behind", succeeded, generation=2), "Progressing", "InProgress"),
    ]
