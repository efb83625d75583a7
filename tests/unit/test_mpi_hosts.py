"""The hosts a job's headless Service publishes are the operator's own MPI hosts of the current world, and
nothing else: the Service selects no pods, and the operator writes its EndpointSlice from the pods it observed
as its own (their owner checked), before the launcher that resolves their names."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from dtjob import desired, names
from dtjob.desired.common import owner_reference
from dtjob.desired.hosts import hosts_slice, mpi_hosts
from dtjob.desired.owned import drift
from dtjob.machine import decide
from dtjob.reconcile.job import reconcile
from dtjob.state.decision import CreateLauncher, PublishHosts, RetireSelector
from dtjob.state.hosts import SLICE_CONTROLLER, SLICE_MIRROR, MpiHost, StaleSlice, published_hosts
from dtjob.state.observed import Children, Observed, observe_children
from dtjob.state.status import JobStatus

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
JOB_UID = "uid-1"  # operator_fixtures' job
LAUNCHER_JOB_UID = "uid-launcher-job"
OWNER = owner_reference("rn50", JOB_UID)
SERVICE = "rn50-workers"


def raw_pod(
    name: str, ip: str, role: str = names.ROLE_WORKER, index: int | None = None, ready: bool = True,
    owner: str | None = JOB_UID, deleting: bool = False, phase: str = "Running",
) -> dict[str, Any]:  # fmt: skip
    """A pod as the watch cache holds it: labelled as the job's MPI host, owned by `owner` (None: by no
    one, as a pod someone labelled by hand)."""
    labels = {
        names.JOB_NAME_LABEL: "rn50", names.ROLE_LABEL: role, names.ATTEMPT_LABEL: "0",
        names.MPI_HOST_LABEL: "true",
    }  # fmt: skip
    if index is not None:
        labels[names.WORKER_INDEX_LABEL] = str(index)
    meta: dict[str, Any] = {
        "name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels,
        "ownerReferences": [{"uid": owner}] if owner else [],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-05-01T11:59:00Z"
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip, "conditions": conditions}}


def worker(index: int, ip: str, **kw: Any) -> dict[str, Any]:
    return raw_pod(names.worker_name("rn50", index), ip, index=index, **kw)


def launcher_job() -> dict[str, Any]:
    """A launcher Job that an earlier release of the operator made (today's launcher is the job's own pod)."""
    labels = {names.ROLE_LABEL: names.ROLE_LAUNCHER, names.ATTEMPT_LABEL: "0", names.WORLD_SIZE_LABEL: "2"}
    meta = {"name": "rn50-launcher", "uid": LAUNCHER_JOB_UID, "labels": labels, "ownerReferences": [OWNER]}
    return {"metadata": meta, "status": {"ready": 1}}


def observed(
    pods: list[dict[str, Any]], launcher: dict[str, Any] | None = None, slices: tuple[Any, ...] = ()
) -> Observed:
    seen = observe_children(pods, launcher, JOB_UID, names.launcher_name("rn50"))
    return replace(seen, uid=JOB_UID, published=published_hosts(slices, "rn50", JOB_UID))


def host(index: int, ip: str, ready: bool = True) -> MpiHost:
    name = names.worker_name("rn50", index)
    return MpiHost(name, ip, name, f"uid-{name}", ready)


def published(action_list: list[Any]) -> tuple[MpiHost, ...]:
    found = [a for a in action_list if isinstance(a, PublishHosts)]
    assert len(found) == 1, action_list
    return found[0].hosts


def test_a_pod_labelled_like_a_worker_is_never_published_and_the_launcher_comes_after_the_hosts() -> None:
    # Same labels, attempt and index as worker 0; one owned by no one, one by another job of the same name.
    pods = [
        worker(0, "10.0.0.1"),
        worker(1, "10.0.0.2"),
        raw_pod("rogue", "10.9.9.9", index=0, owner=None),
        raw_pod("rogue-owned-elsewhere", "10.9.9.8", index=1, owner="uid-of-another-job"),
    ]
    d = decide(job_spec(), observed(pods), JobStatus(), NOW)
    assert published(d.actions) == (host(0, "10.0.0.1"), host(1, "10.0.0.2"))
    kinds = [type(a) for a in d.actions]
    assert kinds.index(PublishHosts) < kinds.index(CreateLauncher), "names resolve before the launcher"


def test_a_fixed_world_publishes_every_pod_with_an_address_as_ready() -> None:
    # As publishNotReadyAddresses did: a name resolves as soon as its pod has an address.
    pods = [worker(0, "10.0.0.1", ready=False), worker(1, "")]
    d = decide(job_spec(), observed(pods), JobStatus(), NOW)
    assert published(d.actions) == (host(0, "10.0.0.1"),)


def test_an_elastic_world_marks_only_its_ready_pods_ready() -> None:
    spec = job_spec(workers=2, elastic={"minWorkers": 1, "maxWorkers": 3})
    pods = [worker(0, "10.0.0.1"), worker(1, "10.0.0.2", ready=False)]
    d = decide(spec, observed(pods), JobStatus(), NOW)
    assert published(d.actions) == (host(0, "10.0.0.1"), host(1, "10.0.0.2", ready=False))


def test_pods_being_deleted_or_ended_are_left_out() -> None:
    pods = [
        worker(0, "10.0.0.1", deleting=True),
        worker(1, "10.0.0.2", phase="Failed", ready=False),
        worker(2, "10.0.0.3"),
    ]
    assert mpi_hosts(job_spec(workers=3), observed(pods).pods) == (host(2, "10.0.0.3"),)


def test_a_launcher_that_runs_ranks_is_published_under_its_hostname() -> None:
    spec = job_spec(launcher={"runAsWorker": True})
    pods = [
        worker(0, "10.0.0.1"),
        worker(1, "10.0.0.2"),
        raw_pod("rn50-launcher", "10.0.0.9", role="launcher"),
    ]
    d = decide(spec, observed(pods), JobStatus(), NOW)
    launcher = MpiHost("rn50-launcher", "10.0.0.9", "rn50-launcher", "uid-rn50-launcher", True)
    assert published(d.actions) == (launcher, host(0, "10.0.0.1"), host(1, "10.0.0.2"))
    # A launcher that does not run ranks is no MPI host.
    d = decide(job_spec(), observed(pods), JobStatus(), NOW)
    assert published(d.actions) == (host(0, "10.0.0.1"), host(1, "10.0.0.2"))


def test_the_pod_of_a_legacy_launcher_job_that_runs_ranks_is_published_under_the_launchers_hostname() -> None:
    spec = job_spec(launcher={"runAsWorker": True})
    launcher_pod = raw_pod(
        "rn50-launcher-x7k2p", "10.0.0.9", role=names.ROLE_LAUNCHER, owner=LAUNCHER_JOB_UID
    )
    pods = [worker(0, "10.0.0.1"), worker(1, "10.0.0.2"), launcher_pod]
    d = decide(spec, observed(pods, launcher_job()), JobStatus(), NOW)
    launcher = MpiHost("rn50-launcher", "10.0.0.9", "rn50-launcher-x7k2p", "uid-rn50-launcher-x7k2p", True)
    assert published(d.actions) == (launcher, host(0, "10.0.0.1"), host(1, "10.0.0.2"))


def test_hosts_already_published_are_not_written_again_and_a_change_is_a_patch() -> None:
    pods = [worker(0, "10.0.0.1"), worker(1, "10.0.0.2")]
    current = hosts_slice(job_spec(), OWNER, (host(0, "10.0.0.1"), host(1, "10.0.0.2")))
    d = decide(job_spec(), observed(pods, slices=(current,)), JobStatus(), NOW)
    assert not any(isinstance(a, PublishHosts) for a in d.actions)
    older = hosts_slice(job_spec(), OWNER, (host(0, "10.0.0.1"),))
    d = decide(job_spec(), observed(pods, slices=(older,)), JobStatus(), NOW)
    assert PublishHosts((host(0, "10.0.0.1"), host(1, "10.0.0.2")), published=True) in d.actions
    # A slice of that name another job owns is not the operator's: it is created (and refused as NotOurs).
    theirs = hosts_slice(job_spec(), owner_reference("rn50", "uid-of-another-job"), ())
    d = decide(job_spec(), observed(pods, slices=(theirs,)), JobStatus(), NOW)
    assert PublishHosts((host(0, "10.0.0.1"), host(1, "10.0.0.2")), published=False) in d.actions


def test_the_slices_kubernetes_made_for_a_service_with_a_selector_are_retired_first() -> None:
    labels = {
        "kubernetes.io/service-name": SERVICE,
        "endpointslice.kubernetes.io/managed-by": SLICE_CONTROLLER,
    }
    meta = {
        "name": "rn50-workers-abcde",
        "uid": "uid-s",
        "labels": labels,
        "ownerReferences": [{"uid": "svc"}],
    }
    d = decide(job_spec(), observed([worker(0, "10.0.0.1")], slices=({"metadata": meta},)), JobStatus(), NOW)
    assert d.actions[0] == RetireSelector((StaleSlice("rn50-workers-abcde", "uid-s", frozenset({"svc"})),))


def test_a_suspended_or_finished_job_publishes_nothing() -> None:
    pods = [worker(0, "10.0.0.1"), worker(1, "10.0.0.2")]
    current = hosts_slice(job_spec(), OWNER, (host(0, "10.0.0.1"), host(1, "10.0.0.2")))
    suspended = job_spec(runPolicy={"suspend": True})
    d = decide(suspended, observed(pods, slices=(current,)), JobStatus(phase="Running"), NOW)
    assert PublishHosts((), published=True) in d.actions
    d = decide(job_spec(), observed(pods, slices=(current,)), JobStatus(phase="Succeeded"), NOW)
    assert PublishHosts((), published=True) in d.actions


def test_the_slice_names_each_host_and_pod_on_the_services_port() -> None:
    obj = hosts_slice(job_spec(), OWNER, (host(0, "10.0.0.1", ready=False),))
    labels = obj["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == SERVICE
    assert labels["endpointslice.kubernetes.io/managed-by"] == names.SLICE_MANAGER != SLICE_CONTROLLER
    assert labels[names.JOB_NAME_LABEL] == "rn50" and obj["metadata"]["ownerReferences"] == [OWNER]
    assert obj["addressType"] == "IPv4"
    assert obj["endpoints"] == [{
        "addresses": ["10.0.0.1"],
        "hostname": "rn50-worker-0",
        "targetRef": {"kind": "Pod", "namespace": "ml", "name": "rn50-worker-0", "uid": "uid-rn50-worker-0"},
        "conditions": {"ready": False},
    }]  # fmt: skip
    service = desired.workers_service(job_spec(), OWNER)
    assert obj["ports"] == [{"name": "ssh", "port": service["spec"]["ports"][0]["port"], "protocol": "TCP"}]
    assert "selector" not in service["spec"], "Kubernetes would publish every pod labelled alike"
    assert hosts_slice(job_spec(), OWNER, (host(0, "fd00::1"),))["addressType"] == "IPv6"


def test_drift_brings_a_slice_back_to_its_hosts_and_a_service_off_its_selector() -> None:
    want = hosts_slice(job_spec(), OWNER, (host(0, "10.0.0.1"),))
    assert drift(want, {**want, "metadata": {"uid": "x"}}) is None
    edited = {**want, "endpoints": [{**want["endpoints"][0], "addresses": ["10.9.9.9"]}]}
    assert drift(want, edited) == {"endpoints": want["endpoints"], "ports": want["ports"]}
    service = desired.workers_service(job_spec(), OWNER)
    older = {**service, "spec": {**service["spec"], "selector": {names.JOB_NAME_LABEL: "rn50"}}}
    patch = drift(service, older)
    assert patch is not None and patch["spec"]["selector"] is None


def test_a_reconcile_creates_the_slice_before_the_launcher_then_patches_it() -> None:
    kube = RecordingKube()
    kube.put({**job_body(), "kind": JOB_KIND})
    pods = (worker(0, "10.0.0.1"), worker(1, "10.0.0.2"))
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=pods), NOW)
    writes = kube.writes()
    assert writes.index(("create", "EndpointSlice", SERVICE)) < writes.index(
        ("create", "Pod", "rn50-launcher")
    )
    created = kube.objects[("EndpointSlice", "ml", SERVICE)]
    assert [e["addresses"] for e in created["endpoints"]] == [["10.0.0.1"], ["10.0.0.2"]]
    # Worker 1 has a new address: one patch of the slice the cache holds.
    kube.calls.clear()
    moved = (worker(0, "10.0.0.1"), worker(1, "10.0.0.7"), kube.objects[("Pod", "ml", "rn50-launcher")])
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=moved, endpoint_slices=(created,)), NOW)
    assert [w for w in kube.writes() if w[1] == "EndpointSlice"] == [("patch", "EndpointSlice", SERVICE)]
    patched = kube.objects[("EndpointSlice", "ml", SERVICE)]
    assert [e["addresses"] for e in patched["endpoints"]] == [["10.0.0.1"], ["10.0.0.7"]]


def test_a_services_selector_is_taken_off_and_what_kubernetes_made_for_it_deleted() -> None:
    """The EndpointSlice controller's slices only while the job's Service owns them; a mirrored slice, and the
    Endpoints object of the Service's name it mirrors (the Endpoints controller left it behind)."""
    kube = RecordingKube()
    kube.put({**job_body(), "kind": JOB_KIND})
    service = desired.workers_service(job_spec(), OWNER)
    older = kube.put({**service, "spec": {**service["spec"], "selector": {names.JOB_NAME_LABEL: "rn50"}}})
    endpoints = kube.put({"kind": "Endpoints", "metadata": {"name": SERVICE, "namespace": "ml"}})

    def made_by(manager: str, name: str, owner: str) -> dict[str, Any]:
        labels = {"kubernetes.io/service-name": SERVICE, "endpointslice.kubernetes.io/managed-by": manager}
        meta = {"name": name, "namespace": "ml", "labels": labels, "ownerReferences": [{"uid": owner}]}
        return kube.put({"kind": "EndpointSlice", "metadata": meta})

    slices = (
        made_by(SLICE_CONTROLLER, "rn50-workers-abcde", older["metadata"]["uid"]),
        made_by(SLICE_CONTROLLER, "rn50-workers-zzzzz", "uid-of-another-service"),
        made_by(SLICE_MIRROR, "rn50-workers-mirror", endpoints["metadata"]["uid"]),
    )
    reconcile(kube, CONFIG, "ml", "rn50", Children(endpoint_slices=slices), NOW)
    assert "selector" not in kube.objects[("Service", "ml", SERVICE)]["spec"]
    left = {name for kind, _, name in kube.objects if kind in ("EndpointSlice", "Endpoints")}
    assert left == {"rn50-workers-zzzzz"}, "not that Service's"
