"""Two operator replicas with leader election against the real API server: the standby takes over a leader
that is killed mid-job or stopped, and nothing is done twice; a standby writes nothing.

As in test_operator_kill.py, each kill lands at a step found from outside, at the watch event that marks it
(tests/integration/api_history.py), and what was created is counted from the API server's own watch streams.
The Lease's timings are shortened (6 s lease, 4 s renew deadline, 1 s retry) so that a takeover after a kill
costs seconds; bench/failover.py measures the default ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from dtjob.config import OperatorConfig
from dtjob.fence import NotLeader
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.reconcile.deletes import delete_owned, delete_pods, delete_training_job
from dtjob.reconcile.ensure import create_if_absent, ensure
from dtjob.reconcile.reads import get_job, patch_status
from dtjob.runtime.election import ELECTED_REASON
from dtjob.runtime.lease import Leadership
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.integration.api_history import Seen, api_history, job_of, role

pytestmark = pytest.mark.integration
LEASE = OperatorConfig().lease_name
FAST_LEASE = {
    "DTJOB_LEASE_DURATION_SECONDS": "6",
    "DTJOB_LEASE_RENEW_DEADLINE_SECONDS": "4",
    "DTJOB_LEASE_RETRY_PERIOD_SECONDS": "1",
}
Replicas = Callable[..., OperatorProcess]


@pytest.fixture
def replicas(kubeconfig: str, namespace: str, tmp_path: Path, jobs: Jobs) -> Iterator[Replicas]:
    """Starts one operator replica per call, with leader election, named as asked; all stopped at the end."""
    started: list[OperatorProcess] = []

    def start(name: str, **env: str) -> OperatorProcess:
        log = tmp_path / f"operator-{name}.log"
        proc = OperatorProcess(
            kubeconfig, namespace, log, {**FAST_LEASE, **env}, leader_elect=True, name=name
        )
        proc.start()
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


def wait_leading(replica: OperatorProcess, timeout: float = 30) -> None:
    wait_for(replica.leading, timeout=timeout, what=f"{replica.name} leading\n{replica.log_tail()}")


def wait_standing_by(replica: OperatorProcess, leader: OperatorProcess) -> None:
    def standing_by() -> bool:
        body = replica.readiness() or {}
        return bool(body.get("ready")) and not body.get("leader") and body.get("holder") == leader.identity

    wait_for(standing_by, timeout=30, what=f"{replica.name} ready, standing by for {leader.name}")


def lease_events(core: client.CoreV1Api, namespace: str) -> list[str]:
    """The messages of the LeaderElected events on the Lease, oldest first."""
    selector = f"involvedObject.kind=Lease,involvedObject.name={LEASE},reason={ELECTED_REASON}"
    events = core.list_namespaced_event(namespace, field_selector=selector).items
    return [str(e.message) for e in sorted(events, key=lambda e: int(e.metadata.resource_version or 0))]


def uids(jobs: Jobs, name: str) -> dict[str, str]:
    """kind/name -> uid of the job's ConfigMap, Service and SSH Secret (children the history does not watch
    or that must never be replaced)."""
    found: dict[str, Any] = {
        "ConfigMap": jobs.core.read_namespaced_config_map(f"{name}-hostfile", jobs.ns),
        "Service": jobs.core.read_namespaced_service(f"{name}-workers", jobs.ns),
        "Secret": jobs.core.read_namespaced_secret(f"{name}-ssh", jobs.ns),
    }
    return {f"{kind}/{obj.metadata.name}": str(obj.metadata.uid) for kind, obj in found.items()}


def test_the_standby_takes_over_a_killed_leader_mid_job_and_does_nothing_twice(
    jobs: Jobs, replicas: Replicas, api_client: client.ApiClient, core_v1: client.CoreV1Api
) -> None:
    name = "ha"
    mine = job_of(name)
    a = replicas("a")
    wait_leading(a)
    b = replicas("b")
    wait_standing_by(b, a)
    first_holder = a.identity
    at_kill: dict[str, Any] = {}
    with api_history(api_client, jobs.ns) as history:

        def kill(_: Seen) -> None:
            a.kill()
            at_kill["workers"] = sorted(
                history.created("Pod", lambda e: mine(e) and role("worker")(e)).values()
            )
            at_kill["launchers"] = len(history.created("Pod", lambda e: mine(e) and role("launcher")(e)))

        # Both workers exist (created together, in either order); they turn Ready only after 4 s, so the
        # launcher's pod (made with them, by a or, if a died first, by b) is yet to be released by b.
        workers_seen: set[str] = set()

        def both_workers(e: Seen) -> bool:
            if e.kind == "Pod" and mine(e) and role("worker")(e):
                workers_seen.add(e.name)
            return workers_seen >= {f"{name}-worker-0", f"{name}-worker-1"}

        killed = history.when(both_workers, kill)
        jobs.create(
            name,
            worker={"podAnnotations": {"sim.dtjob.io/ready-after": "4s"}},
            launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "3s"}},
        )
        assert killed.wait(60), f"the workers were never created\n{a.log_tail()}"
        children_at_kill = uids(jobs, name)
        assert at_kill["workers"] == [f"{name}-worker-0", f"{name}-worker-1"], at_kill
        wait_leading(b)
        status = jobs.wait_phase(name, "Succeeded", "Failed", timeout=120)
        assert status["phase"] == "Succeeded", f"{status}\n{b.log_tail()}"
        assert status["restarts"] == 0

    # One handover, announced once on the Lease, naming both holders.
    new_holder = b.identity
    messages = lease_events(core_v1, jobs.ns)
    assert len(messages) == 2, messages  # a's election at start, then b's
    assert messages[0].startswith(f"{first_holder} is the leader now")
    assert (
        messages[1] == f"{new_holder} is the leader now (previous holder: {first_holder}, its lease expired)"
    )
    # No child created twice: the world b finished is the one a created (its launcher pod by a or by b).
    workers = history.created("Pod", lambda e: mine(e) and role("worker")(e))
    assert sorted(workers.values()) == [f"{name}-worker-0", f"{name}-worker-1"], workers
    assert list(history.created("Pod", lambda e: mine(e) and role("launcher")(e)).values()) == [
        f"{name}-launcher"
    ]
    assert history.created("Job", mine) == {}  # the launcher is a pod of the operator's, not a batch Job's
    assert list(history.created("Secret", mine).values()) == [f"{name}-ssh"]
    assert uids(jobs, name) == children_at_kill
    # Each of the job's events was posted once, by one replica or the other.
    reasons = Counter(e.reason for e in jobs.events(name))
    assert reasons["Running"] == reasons["LauncherSucceeded"] == 1 and max(reasons.values()) == 1, reasons


def test_a_stopped_leader_releases_the_lease_and_the_standby_takes_over_at_once(
    jobs: Jobs, replicas: Replicas, core_v1: client.CoreV1Api
) -> None:
    # A long lease: a takeover by expiry would take a minute; the release makes it the standby's next look.
    slow = {"DTJOB_LEASE_DURATION_SECONDS": "60", "DTJOB_LEASE_RENEW_DEADLINE_SECONDS": "40"}
    a = replicas("a", **slow)
    wait_leading(a)
    b = replicas("b", **slow)
    wait_standing_by(b, a)
    first_holder = a.identity
    a.stop()  # SIGTERM, as a rolling update or a drain stops a pod
    assert "released the Lease" in a.log_tail()
    wait_leading(b, timeout=20)
    assert lease_events(core_v1, jobs.ns)[-1] == (
        f"{b.identity} is the leader now (previous holder: {first_holder}, released)"
    )
    # b writes: a job created now runs under it.
    jobs.create("after", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "1s"}})
    assert jobs.wait_phase("after", "Succeeded", "Failed", timeout=90)["phase"] == "Succeeded"


def test_a_standby_writes_nothing_while_another_replica_holds_the_lease(
    jobs: Jobs, replicas: Replicas, api_client: client.ApiClient, core_v1: client.CoreV1Api
) -> None:
    coordination = client.CoordinationV1Api(api_client)
    now = datetime.now(UTC)
    elsewhere = "elsewhere_0"  # a leader this test plays: it holds the Lease for an hour and never renews
    held = client.V1LeaseSpec(holder_identity=elsewhere, lease_duration_seconds=3600, acquire_time=now,
                              renew_time=now)  # fmt: skip
    coordination.create_namespaced_lease(
        jobs.ns, client.V1Lease(metadata=client.V1ObjectMeta(name=LEASE), spec=held)
    )
    with api_history(api_client, jobs.ns) as history:
        b = replicas("b", DTJOB_RESYNC_SECONDS="1")
        # /readyz answers (503, ready false) before the replica's first read of the Lease: wait for ready.
        body = wait_for(lambda: (r := b.readiness()) and r["ready"] and r, timeout=30, what="readiness")
        assert body["leader"] is False and body["holder"] == elsewhere, body
        jobs.create("idle")
        # The job's event and two resyncs reached b's queue, and b dropped each.
        wait_for(
            lambda: int((b.probes() or {}).get("skipped", 0)) >= 3, timeout=30, what="b skipping the job"
        )
        assert b.reconciles() == 0
        assert jobs.status("idle") == {}, "status written by a standby"
        # All the API server saw in the namespace: the job's creation (no child, no status, no annotation).
        assert [(e.kind, e.type) for e in history.events] == [("DistributedTrainingJob", "ADDED")]
        assert not jobs.events("idle"), "an event was posted by a standby"
        lease = coordination.read_namespaced_lease(LEASE, jobs.ns)
        assert lease.spec.holder_identity == elsewhere and lease_events(core_v1, jobs.ns) == []

        # The holder lets go: b takes over and the job it left alone starts.
        lease.spec.holder_identity = None
        coordination.replace_namespaced_lease(LEASE, jobs.ns, lease)
        wait_leading(b)
        jobs.wait_phase("idle", "Pending", "Running", "Succeeded", timeout=60)
    assert lease_events(core_v1, jobs.ns) == [
        f"{b.identity} is the leader now (previous holder: {elsewhere}, released)"
    ]


def test_a_fenced_client_writes_nothing_to_the_api_server(jobs: Jobs, operator_api: ApiClient) -> None:
    """What a reconcile still under way meets once its replica has stepped down: every write refused before
    it is sent."""
    job = jobs.create("fenced")
    kube = KubeClient(operator_api, fence=Leadership("stepped-down_0", renew_deadline_s=10))  # never renewed
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "fenced-x", "namespace": jobs.ns},
    }
    version = job["metadata"]["resourceVersion"]
    writes: list[Callable[[], object]] = [
        lambda: create_if_absent(kube, config_map),
        lambda: ensure(kube, config_map),
        lambda: patch_status(kube, jobs.ns, "fenced", {"phase": "Running"}, version),
        lambda: kube.emit_event(job, "Normal", "Fenced", "must not be posted", datetime.now(UTC)),
        lambda: delete_training_job(kube, jobs.ns, "fenced", job["metadata"]["uid"]),
        lambda: delete_pods(kube, jobs.ns, "dtjob.io/job-name=fenced", "uid"),
        lambda: delete_owned(kube, "Secret", jobs.ns, "fenced-ssh", "uid"),
        lambda: kube.delete("Pod", jobs.ns, "fenced-worker-0"),
        kube.check_leader,
    ]
    for write in writes:
        with pytest.raises(NotLeader):
            write()
    with pytest.raises(ApiException) as missing:
        jobs.core.read_namespaced_config_map("fenced-x", jobs.ns)
    assert missing.value.status == 404
    assert jobs.get("fenced") is not None and jobs.status("fenced") == {} and not jobs.events("fenced")
    # Reads are not fenced: a standby keeps its view current.
    assert get_job(kube, jobs.ns, "fenced") is not None
