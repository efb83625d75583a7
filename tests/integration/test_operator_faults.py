"""API and storage faults between the operator and the real API server: nothing lost, status true.

The operator talks to the real API server through the test bed's fault proxy (testbed/faultproxy.py), which
refuses, fails, hangs or cuts requests and watch streams by rule while the operator runs. Jobs must still
reach the right phase with exactly one world, a missed event must heal, and a hung call (Kubernetes or
Blob Storage) must not hold up the other jobs. The last test restarts the control plane itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dtjob import PLURAL
from dtjob.names import STORAGE_KEY_LABEL
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed import controlplane
from testbed.azurite import DEV_ACCOUNT_KEY, DEV_ACCOUNT_NAME
from testbed.blackhole import Blackhole
from testbed.faultproxy import Fault, FaultProxy, Rule
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log

pytestmark = pytest.mark.integration

QUICK = {"podAnnotations": {"sim.dtjob.io/run-duration": "2s"}}
LONG = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
CHILDREN = frozenset({"pods", "jobs", "configmaps", "services", "secrets"})
RESYNC_S = 5


def faults_env(resync_s: int = RESYNC_S) -> dict[str, str]:
    return {
        "DTJOB_RESYNC_SECONDS": str(resync_s),
        "DTJOB_KUBE_TIMEOUT_SECONDS": "3",
        "DTJOB_RECONCILE_SLOW_SECONDS": "3",
        "DTJOB_AZURE_TIMEOUT_SECONDS": "3",
        "DTJOB_AZURE_RETRIES": "1",
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME,
        "DTJOB_WRITE_CONTAINERS": "*",
    }


@pytest.fixture
def operator_env() -> dict[str, str]:
    return faults_env()


@pytest.fixture
def operator(proxied_operator: OperatorProcess) -> OperatorProcess:
    """The operator, every API call of it through the fault proxy."""
    return proxied_operator


def assert_one_world(jobs: Jobs, name: str, workers: int) -> None:
    """Exactly the children one world has: no pod or Secret twice, whatever the API answered."""
    pods = [p.metadata.name for p in jobs.pods(name, "worker") if p.metadata.deletion_timestamp is None]
    assert sorted(pods) == [f"{name}-worker-{i}" for i in range(workers)], pods
    selector = f"dtjob.io/job-name={name}"
    # One launcher pod, under its one name; no batch Job (the operator makes the launcher's pod itself).
    assert [p.metadata.name for p in jobs.pods(name, "launcher")] == [f"{name}-launcher"]
    assert jobs.batch.list_namespaced_job(jobs.ns, label_selector=selector).items == []
    for kind in ("secret", "config_map", "service"):
        listed = getattr(jobs.core, f"list_namespaced_{kind}")(jobs.ns, label_selector=selector).items
        names = [item.metadata.name for item in listed]
        assert len(names) == len(set(names)) == 1, (kind, names)


# Resyncs further apart than the wait for Running below, so that reaching it within the wait shows that no
# refused create waited for one (a bound on the time taken would measure the machine's load as well).
@pytest.mark.parametrize("operator_env", [faults_env(resync_s=600)], ids=["resync-600s"])
def test_conflicts_on_status_patches_and_creates_converge_with_one_world(
    jobs: Jobs, operator: OperatorProcess, proxy: FaultProxy
) -> None:
    # Every other status patch is refused as stale; every other create is refused as existing before it
    # reaches the API server, and every third one that does reach it is answered with a 500.
    proxy.add(
        Rule(Fault.ERROR, status=409, verbs={"patch"}, resources={PLURAL}, subresource="status", every=2)
    )
    proxy.add(Rule(Fault.ERROR, status=409, verbs={"create"}, resources=CHILDREN, every=2))
    proxy.add(Rule(Fault.ERROR, status=500, verbs={"create"}, resources=CHILDREN, every=3, after=True))
    jobs.create("conflicted", launcher=LONG)
    # A create refused with 409 for an object that is not there is retried at once, not at the next resync.
    status = jobs.wait_phase("conflicted", "Running", timeout=90)
    assert len(proxy.injected(Fault.ERROR)) >= 4
    assert status["restarts"] == 0 and status["workersReady"] == "2/2"
    assert_one_world(jobs, "conflicted", 2)
    uid = (jobs.get("conflicted") or {})["metadata"]["uid"]
    assert all(p.metadata.owner_references[0].uid == uid for p in jobs.pods("conflicted", "worker"))


def test_500s_on_every_verb_and_a_short_outage_converge(
    jobs: Jobs, operator: OperatorProcess, proxy: FaultProxy
) -> None:
    # The job's first two patches fail (its start makes only a few, so a share of all requests could miss
    # them all), as does every other create of its world; every third of the other requests fails too,
    # whatever its verb: lists and watches included.
    rules = [
        Rule(Fault.ERROR, status=500, verbs={"patch"}, resources={PLURAL}, times=2),
        Rule(Fault.ERROR, status=500, verbs={"create"}, resources=CHILDREN, every=2),
        Rule(Fault.ERROR, status=500, every=3),
    ]
    for rule in rules:
        proxy.add(rule)
    jobs.create("flaky", launcher=LONG)
    jobs.wait_phase("flaky", "Running", timeout=90)
    assert_one_world(jobs, "flaky", 2)
    failed = [r.request for r in proxy.injected(Fault.ERROR)]
    assert sum(r.verb == "patch" and r.resource == PLURAL for r in failed) >= 2, failed
    assert sum(r.verb == "create" and r.resource in CHILDREN for r in failed) >= 2, failed
    for rule in rules:
        proxy.remove(rule)
    # Then every request fails for 15 s; kopf and the controller ride it out.
    outage = proxy.add(Rule(Fault.ERROR, status=500))
    time.sleep(15)
    proxy.remove(outage)
    assert operator.probes() is not None, "the operator survived the outage"
    jobs.create("after-outage", launcher=QUICK)
    jobs.wait_phase("after-outage", "Succeeded", timeout=90)
    assert jobs.status("flaky")["phase"] == "Running" and jobs.status("flaky")["restarts"] == 0


def running_job(jobs: Jobs, name: str) -> dict[str, Any]:
    jobs.create(name, workers=2, gpusPerWorker=1, launcher=LONG)
    return jobs.wait_phase(name, "Running", timeout=90)


def kill_pod(jobs: Jobs, pod: str) -> None:
    """Delete a pod at once, behind the operator's back (straight to the API server, not via the proxy)."""
    jobs.core.delete_namespaced_pod(pod, jobs.ns, grace_period_seconds=0)

    def gone() -> bool:
        try:
            jobs.core.read_namespaced_pod(pod, jobs.ns)
        except ApiException as err:
            return bool(err.status == 404)
        return False

    wait_for(gone, timeout=30, what=f"{pod} gone")


def watch_down(proxy: FaultProxy) -> Rule:
    """Cut the operator's pod watch and hold every new one: from now on it hears nothing about pods."""
    hold = proxy.add(Rule(Fault.HANG, verbs={"watch"}, resources={"pods"}))
    assert proxy.end_watches(["pods"], cut=True) >= 1
    wait_for(lambda: proxy.injected(Fault.HANG), timeout=30, what="the operator's pod watch re-opened, held")
    return hold


def test_a_watch_cut_and_resumed_replays_what_it_missed(
    jobs: Jobs, operator: OperatorProcess, proxy: FaultProxy
) -> None:
    running_job(jobs, "resumed")
    hold = watch_down(proxy)
    kill_pod(jobs, "resumed-worker-1")
    proxy.remove(hold)
    proxy.release_hung()  # the watch reconnects from its last resourceVersion: the API server replays
    jobs.wait_phase("resumed", "Restarting", "Starting", "Running", timeout=30)
    wait_for(lambda: jobs.status("resumed").get("restarts") == 1, timeout=30, what="the lost worker counted")
    jobs.wait_event("resumed", "WorkerLost")  # posted after the status patch it goes with


def test_a_pod_deleted_while_the_watch_was_down_leaves_the_cache_after_a_relist(
    jobs: Jobs, operator: OperatorProcess, proxy: FaultProxy
) -> None:
    running_job(jobs, "relisted")
    hold = watch_down(proxy)
    kill_pod(jobs, "relisted-worker-1")
    proxy.remove(hold)
    # The next watch is told its resourceVersion is too old (410 Gone): kopf lists the pods again and
    # watches from there. The list no longer holds the worker, and no watch event says it went.
    proxy.add(Rule(Fault.GONE, verbs={"watch"}, resources={"pods"}, times=1))
    proxy.release_hung()
    wait_for(lambda: proxy.injected(Fault.GONE), timeout=30, what="the watch expired")
    # The wait's timeout is the bound (a few resyncs, with room for a busy machine).
    wait_for(
        lambda: jobs.status("relisted").get("restarts") == 1,
        timeout=RESYNC_S * 3 + 15,
        what="the vanished worker noticed (at the latest at the next resync)",
    )
    jobs.wait_event("relisted", "WorkerLost")


def test_a_hung_api_call_does_not_pin_the_only_worker(
    jobs: Jobs, proxy: FaultProxy, namespace: str, tmp_path: Path, operator_env: dict[str, str]
) -> None:
    env = {**operator_env, "DTJOB_RECONCILE_WORKERS": "1"}
    process = OperatorProcess(str(proxy.kubeconfig), namespace, tmp_path / "operator.log", env=env)
    process.start()
    try:
        # Every status write of job "stuck" hangs: its reconcile waits on the API server that never answers.
        hang = proxy.add(Rule(Fault.HANG, verbs={"patch"}, resources={PLURAL}, names={"stuck"}))
        jobs.create("stuck", launcher=QUICK)
        wait_for(lambda: proxy.injected(Fault.HANG), timeout=30, what="the stuck job's reconcile hanging")
        jobs.create("healthy", launcher=QUICK)
        jobs.wait_phase("healthy", "Succeeded", timeout=60)
        assert "timed out" in process.log_path.read_text(), "the hung call ended with a timeout"
        proxy.remove(hang)
        proxy.release_hung()
        jobs.wait_phase("stuck", "Succeeded", timeout=60)
    finally:
        process.stop()


def test_eight_jobs_with_a_blackholed_storage_endpoint_do_not_starve_a_ninth(
    jobs: Jobs, operator: OperatorProcess, proxy: FaultProxy, api_client: client.ApiClient, tmp_path: Path
) -> None:
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="storage-key", labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": DEV_ACCOUNT_KEY},
    )
    jobs.core.create_namespaced_secret(jobs.ns, secret)
    with Blackhole() as blackhole:
        output = {
            "endpoint": f"{blackhole.url}/{DEV_ACCOUNT_NAME}",
            "container": "results",
            "prefix": "runs",
            "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
        }
        for i in range(8):
            # A worker log to upload (kwok serves the file as the pod's log).
            log = tmp_path / f"blackholed-{i}.log"
            append_log(log, "sshd listening on port 22")
            serve_pod_log(api_client, jobs.ns, f"blackholed-{i}-worker-0", "worker", log)
            jobs.create(f"blackholed-{i}", workers=1, gpusPerWorker=1, launcher=QUICK, output=output)

        # Each finished job uploads its pod logs before it cleans up, to a port that never answers.
        def launcher_done(i: int) -> bool:
            launcher = jobs.launcher(f"blackholed-{i}")
            return launcher is not None and launcher.status.phase == "Succeeded"

        wait_for(lambda: all(launcher_done(i) for i in range(8)), timeout=120, what="eight launchers done")
        wait_for(lambda: blackhole.accepted >= 1, timeout=30, what="log uploads hanging")
        started = time.monotonic()
        jobs.create("ninth", workers=1, gpusPerWorker=1, launcher=QUICK)
        # Bounded by the wait alone: how long the ninth takes also measures the machine's load (that a hung
        # reconcile releases its worker is tested in tests/unit/test_controller_queue.py).
        jobs.wait_phase("ninth", "Succeeded", timeout=60)
        print(f"the ninth job succeeded {time.monotonic() - started:.0f}s after its create")
        # The uploads end with a timeout, are retried, and say so in status.
        wait_for(
            lambda: all(
                "timed out"
                in (jobs.status(f"blackholed-{i}").get("output") or {}).get("logsError", "").lower()
                for i in range(8)
            ),
            timeout=120,
            what="every blackholed upload failing with a timeout",
        )


@pytest.fixture
def direct_operator(
    kubeconfig: str, namespace: str, tmp_path: Path, jobs: Jobs, operator_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """The operator talking to the API server straight, no proxy."""
    process = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", env=operator_env)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_control_plane_restarted_mid_run_the_operator_recovers_without_a_restart(
    jobs: Jobs, direct_operator: OperatorProcess, local_control_plane: Path, core_v1: client.CoreV1Api
) -> None:
    running_job(jobs, "survivor")
    pid = direct_operator.proc.pid if direct_operator.proc else None
    # etcd, the API server, the scheduler and the controller-manager stop (every watch and connection of
    # the operator breaks), stay down for 5 s, and start again; kwok's simulated nodes ride it out.
    controlplane.restart(local_control_plane, controlplane.CONTROL_PLANE, down_s=5)
    wait_for(lambda: _ready(core_v1), timeout=120, what="the API server back")
    assert direct_operator.proc is not None and direct_operator.proc.pid == pid
    assert direct_operator.proc.poll() is None, "the operator kept running"
    # Its watches came back: a worker lost now is noticed, and a new job runs.
    kill_pod(jobs, "survivor-worker-0")
    wait_for(lambda: jobs.status("survivor").get("restarts") == 1, timeout=60, what="the lost worker counted")
    jobs.create("newcomer", workers=1, gpusPerWorker=1, launcher=QUICK)
    jobs.wait_phase("newcomer", "Succeeded", timeout=90)


def _ready(core_v1: client.CoreV1Api) -> bool:
    try:
        nodes = core_v1.list_node(label_selector="type=kwok").items
    except Exception:  # down, or starting
        return False
    return bool(nodes) and all(
        c.status == "True" for n in nodes for c in n.status.conditions or [] if c.type == "Ready"
    )
