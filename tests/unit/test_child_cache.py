"""The children cache: watch events keep it current, and a LIST corrects it the way an informer's re-list
does (what the LIST no longer holds is forgotten), without undoing what happened while the LIST ran."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from dtjob.gang import kueue
from dtjob.names import AVOIDED_NODES_ANNOTATION
from dtjob.runtime.child_cache import (
    CONTAINER_STATUSES_KEPT,
    JOBS,
    PODS,
    SLICES,
    URGENT_EVERY_S,
    URGENT_PER_NAMESPACE,
    ChildCache,
    projection,
)
from dtjob.state.observed import pod_state

NS = "ns"


def child(
    name: str, uid: str, version: int, job: str = "j", role: str = "worker", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": str(version),
            "labels": {"dtjob.io/job-name": job, "dtjob.io/role": role},
        },
        "status": status,
    }


def pod_names(cache: ChildCache, job: str = "j") -> list[str]:
    return [p["metadata"]["name"] for p in cache.children((NS, job)).pods]


def test_events_add_update_and_delete_and_an_older_version_never_wins() -> None:
    cache = ChildCache()
    assert cache.observe(PODS, child("j-worker-0", "u0", 10, phase="Pending"), deleted=False) == (NS, "j")
    assert cache.observe(PODS, child("j-worker-0", "u0", 12, phase="Running"), deleted=False) == (NS, "j")
    assert cache.observe(PODS, child("j-worker-0", "u0", 11, phase="Pending"), deleted=False) is None
    assert cache.children((NS, "j")).pods[0]["status"] == {"phase": "Running"}
    assert cache.observe(PODS, child("j-worker-0", "u0", 13), deleted=True) == (NS, "j")
    assert pod_names(cache) == []
    # A late event for the deleted uid does not bring it back.
    assert cache.observe(PODS, child("j-worker-0", "u0", 12), deleted=False) is None
    assert pod_names(cache) == []


def test_children_are_grouped_by_job_and_jobs_by_role() -> None:
    cache = ChildCache()
    cache.observe(PODS, child("j-worker-0", "u0", 1), deleted=False)
    cache.observe(PODS, child("k-worker-0", "u1", 1, job="k"), deleted=False)
    cache.observe(JOBS, child("j-launcher", "u2", 1, role="launcher"), deleted=False)
    cache.observe(JOBS, child("j-stage", "u3", 1, role="stager"), deleted=False)
    children = cache.children((NS, "j"))
    assert [p["metadata"]["name"] for p in children.pods] == ["j-worker-0"]
    assert children.launcher is not None and children.launcher["metadata"]["name"] == "j-launcher"
    assert children.staging is not None and children.staging["metadata"]["name"] == "j-stage"
    assert pod_names(cache, "k") == ["k-worker-0"] and cache.namespaces() == {NS}
    assert (
        cache.observe(PODS, {"metadata": {"name": "x", "namespace": NS, "uid": "u9"}}, deleted=False) is None
    )


def test_a_batch_job_under_another_name_with_the_jobs_labels_stands_in_for_no_launcher_or_stager() -> None:
    """A namespace admin may make batch Jobs labelled as the job's launcher and stager: seen first, they hid
    the real launcher (the job stuck in Starting, or its world restarted as LauncherLost) and a completed one
    read as a staging run that never happened."""
    cache = ChildCache()
    cache.observe(JOBS, child("j-a", "f1", 1, role="launcher", succeeded=1), deleted=False)
    cache.observe(JOBS, child("j-b", "f2", 1, role="stager", succeeded=1), deleted=False)
    forged_only = cache.children((NS, "j"))
    assert forged_only.launcher is None and forged_only.staging is None
    cache.observe(JOBS, child("j-launcher", "u1", 1, role="launcher"), deleted=False)
    cache.observe(JOBS, child("j-stage", "u2", 1, role="stager"), deleted=False)
    children = cache.children((NS, "j"))
    assert children.launcher is not None and children.launcher["metadata"]["uid"] == "u1"
    assert children.staging is not None and children.staging["metadata"]["uid"] == "u2"


def test_a_relist_forgets_what_vanished_while_the_watch_was_down() -> None:
    cache = ChildCache()
    cache.observe(PODS, child("j-worker-0", "u0", 5), deleted=False)
    cache.observe(PODS, child("j-worker-1", "u1", 6), deleted=False)
    before = cache.uids(NS)
    # worker-1 was deleted while no watch was open: the LIST simply lacks it.
    changed = cache.replace(NS, [(PODS, child("j-worker-0", "u0", 5))], before)
    assert changed == {(NS, "j")}
    assert pod_names(cache) == ["j-worker-0"]
    assert cache.replace(NS, [(PODS, child("j-worker-0", "u0", 5))], cache.uids(NS)) == set()


def test_a_relist_adds_and_refreshes_what_events_missed_but_never_rolls_back() -> None:
    cache = ChildCache()
    cache.observe(PODS, child("j-worker-0", "u0", 5, phase="Pending"), deleted=False)
    before = cache.uids(NS)
    listed = [
        (PODS, child("j-worker-0", "u0", 7, phase="Running")),
        (JOBS, child("j-launcher", "u2", 8, role="launcher")),
    ]
    assert cache.replace(NS, listed, before) == {(NS, "j")}
    assert cache.children((NS, "j")).pods[0]["status"] == {"phase": "Running"}
    assert cache.children((NS, "j")).launcher is not None
    # A LIST older than what an event brought meanwhile changes nothing.
    cache.observe(PODS, child("j-worker-0", "u0", 9, phase="Succeeded"), deleted=False)
    cache.replace(NS, [(PODS, child("j-worker-0", "u0", 7, phase="Running"))], cache.uids(NS))
    assert cache.children((NS, "j")).pods[0]["status"] == {"phase": "Succeeded"}


def test_what_happens_while_a_list_runs_is_not_undone_by_it() -> None:
    cache = ChildCache()
    cache.observe(PODS, child("j-worker-0", "u0", 5), deleted=False)
    before = cache.uids(NS)
    # During the LIST: worker-1 is created (after the list's snapshot) and worker-0 deleted (before it).
    cache.observe(PODS, child("j-worker-1", "u1", 20), deleted=False)
    cache.observe(PODS, child("j-worker-0", "u0", 21), deleted=True)
    cache.replace(NS, [(PODS, child("j-worker-0", "u0", 5))], before)
    assert pod_names(cache) == ["j-worker-1"], "the new pod stays, the deleted one does not come back"


def test_a_relist_of_one_namespace_leaves_the_others_alone() -> None:
    cache = ChildCache()
    other = child("j-worker-0", "u7", 1)
    other["metadata"]["namespace"] = "elsewhere"
    cache.observe(PODS, other, deleted=False)
    cache.replace(NS, [], cache.uids(NS))
    assert [p["metadata"]["uid"] for p in cache.children(("elsewhere", "j")).pods] == ["u7"]


def test_workers_all_ready_counts_only_the_workers_cached() -> None:
    cache = ChildCache()
    ready = [{"type": "Ready", "status": "True"}]
    assert not cache.workers_all_ready((NS, "j")), "no workers: nothing to start a launcher on"
    cache.observe(PODS, child("w0", "u0", 1, conditions=ready), deleted=False)
    cache.observe(PODS, child("w1", "u1", 1), deleted=False)
    cache.observe(PODS, child("j-launcher", "u2", 1, role="launcher"), deleted=False)  # not Ready: no matter
    assert not cache.workers_all_ready((NS, "j"))
    cache.observe(PODS, child("w1", "u1", 2, conditions=ready), deleted=False)
    assert cache.workers_all_ready((NS, "j"))


def test_a_job_goes_ahead_once_its_workers_all_turn_ready_and_not_again_for_a_while() -> None:
    """A namespace admin's pods labelled as a job's workers that turn Ready and not Ready again and again
    would keep that job ahead of every other tenant's: a job goes ahead at most once in URGENT_EVERY_S."""
    now = [0.0]
    cache = ChildCache(clock=lambda: now[0])
    ready = [{"type": "Ready", "status": "True"}]
    cache.observe(PODS, child("w0", "u0", 1), deleted=False)
    assert not cache.goes_ahead((NS, "j")), "not Ready"
    cache.observe(PODS, child("w0", "u0", 2, conditions=ready), deleted=False)
    assert cache.goes_ahead((NS, "j"))
    cache.observe(PODS, child("w0", "u0", 3), deleted=False)
    cache.observe(PODS, child("w0", "u0", 4, conditions=ready), deleted=False)
    now[0] = URGENT_EVERY_S - 0.1
    assert not cache.goes_ahead((NS, "j")), "flapped back to Ready within the bound"
    now[0] = URGENT_EVERY_S + 0.1
    assert cache.goes_ahead((NS, "j")), "a new world, or a worker back, after the bound"
    cache.observe(PODS, child("w0", "u0", 5), deleted=True)
    cache.observe(PODS, child("w1", "u1", 1, conditions=ready), deleted=False)
    assert cache.goes_ahead((NS, "j")), "a job whose children were all gone starts afresh"


def test_a_namespaces_jobs_together_go_ahead_a_bounded_number_of_times() -> None:
    """An admin's many jobs would each get a turn: a namespace's jobs together go ahead at most
    URGENT_PER_NAMESPACE times in URGENT_EVERY_S, and another namespace's job is not held back by them."""
    now = [0.0]
    cache = ChildCache(clock=lambda: now[0])
    ready = [{"type": "Ready", "status": "True"}]
    jobs = [f"j{i}" for i in range(3 * URGENT_PER_NAMESPACE)]
    for i, job in enumerate(jobs):
        cache.observe(PODS, child(f"{job}-w0", f"u{i}", 1, job=job, conditions=ready), deleted=False)
    other = {**child("k-w0", "uk", 1, job="k", conditions=ready)}
    other["metadata"] = {**other["metadata"], "namespace": "other"}
    cache.observe(PODS, other, deleted=False)
    ahead = [job for job in jobs if cache.goes_ahead((NS, job))]
    assert ahead == jobs[:URGENT_PER_NAMESPACE]
    assert cache.goes_ahead(("other", "k")), "another namespace's job is not held back"
    now[0] = URGENT_EVERY_S / 2
    assert not cache.goes_ahead((NS, jobs[-1])), "the namespace's turns are spent within the bound"
    now[0] = URGENT_EVERY_S
    later = [job for job in jobs if cache.goes_ahead((NS, job))]
    assert later == jobs[:URGENT_PER_NAMESPACE], "the first again, their own bound over"
    now[0] = 3 * URGENT_EVERY_S
    cache.goes_ahead(("other", "k"))
    assert list(cache._namespace_turns) == ["other"], "a namespace without a recent turn is forgotten"


def test_a_services_endpoint_slices_are_kept_with_their_hosts() -> None:
    cache = ChildCache()
    endpoint = {"addresses": ["10.0.0.1"], "hostname": "j-worker-0", "conditions": {"ready": True}}
    body = {**child("j-workers", "u9", 1, role=""), "addressType": "IPv4", "endpoints": [endpoint]}
    body["ports"] = [{"name": "ssh", "port": 2222, "protocol": "TCP"}]
    assert cache.observe(SLICES, body, deleted=False) == (NS, "j")
    (kept,) = cache.children((NS, "j")).endpoint_slices
    assert (kept["addressType"], kept["endpoints"], kept["ports"]) == ("IPv4", [endpoint], body["ports"])
    assert pod_names(cache) == [] and cache.children((NS, "j")).launcher is None
    # Another Service's slice with the job's labels (a namespace admin's) is kept without its hosts.
    cache.observe(SLICES, {**body, "metadata": {**body["metadata"], "name": "j-other", "uid": "u8"}}, False)
    other = [s for s in cache.children((NS, "j")).endpoint_slices if s["metadata"]["name"] == "j-other"]
    assert len(other) == 1 and not {"addressType", "endpoints", "ports"} & other[0].keys(), other


def test_a_child_as_large_as_the_api_server_takes_is_kept_as_small_as_ours() -> None:
    """Anyone who may make pods in a served namespace may put the watch's labels on one, and with them as
    many labels, finalizers and scheduling gates as its 1.5 MiB holds (a gated pod runs nothing): the cache
    keeps what the operator reads, the same few hundred bytes as for a pod of its own."""
    body = child("big", "u1", 1, role="worker")
    meta = body["metadata"]
    meta["labels"].update({f"pad.example.com/l{i:05d}": "v" * 63 for i in range(10_000)})
    meta["labels"].update({"dtjob.io/attempt": "2", "dtjob.io/worker-index": "1", "dtjob.io/world-size": "4"})
    meta["finalizers"] = [f"example.com/f{i}" for i in range(5_000)] + [kueue.POD_FINALIZER]
    meta["ownerReferences"] = [{"uid": "x" * 100_000}, *({"uid": f"owner-{i}"} for i in range(1_000))]
    meta["annotations"] = {AVOIDED_NODES_ANNOTATION: "n," * 100_000, "pad": "p" * 200_000}
    gates = [{"name": f"example.com/g{i}"} for i in range(5_000)] + [{"name": kueue.ADMISSION_GATE}]
    body["spec"] = {"schedulingGates": gates, "nodeName": "node-1"}
    assert len(json.dumps(body)) > 1_000_000

    kept = projection(body)
    assert len(json.dumps(kept)) < 2_048, kept
    state = pod_state(kept)
    assert (state.role, state.attempt, state.index, state.world_size) == ("worker", 2, 1, 4)
    assert state.gated and state.kueue_finalizer and state.node == "node-1"
    assert [ref["uid"] for ref in kept["metadata"]["ownerReferences"]] == ["owner-0", "owner-1", "owner-2"]
    cache = ChildCache()
    assert cache.observe(PODS, body, deleted=False) == (NS, "j")
    assert pod_names(cache) == ["big"]


def test_a_pods_status_is_kept_as_pod_state_reads_it_however_many_containers_the_spec_makes() -> None:
    """The kubelet writes one status per container, each naming its image and, while it cannot be pulled,
    a message that names it again: a template with hundreds of sidecars of long image names makes a status of
    a megabyte. The cache keeps what pod_state reads, and reads the same of it."""
    image = "registry.example.com/" + "i" * 350
    pull = {"waiting": {"reason": "ErrImagePull", "message": f"failed to pull {image}: " + "e" * 5_000}}
    sidecars = [{"name": f"s{i}", "image": image, "imageID": image, "containerID": "c" * 80, "ready": False,
                 "restartCount": 0, "state": pull, "lastState": {}, "volumeMounts": [{"name": "v" * 60}] * 20}
                for i in range(300)]  # fmt: skip
    oom = "rank 0: out of memory" + "!" * 3000
    failed = {"terminated": {"exitCode": 3, "reason": "Error", "message": oom}}
    worker = {"name": "worker", "image": image, "ready": False, "restartCount": 2, "state": failed}
    conditions = [{"type": "Ready", "status": "False", "message": "m" * 10_000}]
    body = child("w0", "u0", 1, phase="Running", podIP="10.0.0.9", conditions=conditions,
                 containerStatuses=[worker, *sidecars])  # fmt: skip
    assert len(json.dumps(body)) > 1_000_000
    kept = projection(body)
    assert len(json.dumps(kept)) < len(json.dumps(body)) / 5, len(json.dumps(kept))
    state = pod_state(kept)
    assert state == pod_state(body)
    assert (state.exit_code, state.address, state.waiting) == (3, "10.0.0.9", "ErrImagePull")
    assert state.reason == f"Error, exit code 3: {oom}", "a terminated container's message is kept whole"


def _sidecar(
    i: int, state: dict[str, Any] | None = None, last: dict[str, Any] | None = None
) -> dict[str, Any]:
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    return {
        "name": f"s{i}",
        "ready": True,
        "restartCount": 0,
        "state": state or running,
        "lastState": last or {},
    }


@pytest.mark.parametrize("seed", range(8))
def test_of_a_thousand_sidecars_a_few_are_kept_and_pod_state_reads_the_same(seed: int) -> None:
    """A template may add any number of containers: past the first entries the cache keeps the operator's
    own container's and the first each read of pod_state finds something in, wherever they stand."""
    rng = random.Random(seed)
    sidecars = [_sidecar(i) for i in range(1_000)]
    crashed = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "m"}}
    pulled = {"waiting": {"reason": "ImagePullBackOff", "message": "cannot pull"}}
    sidecars[rng.randrange(20, 1_000)] = _sidecar(2_000, last=crashed)  # restarted after a crash
    sidecars[rng.randrange(20, 1_000)] = _sidecar(2_001, state=pulled)
    sidecars[rng.randrange(20, 1_000)] = _sidecar(2_002, state=crashed)
    worker = {"name": "worker", "ready": False, "restartCount": 0, "state": rng.choice([crashed, pulled, {}])}
    sidecars.insert(rng.randrange(0, 1_000), worker)
    inits = [_sidecar(3_000 + i, state={"terminated": {"exitCode": 0}}) for i in range(500)]
    body = child("w0", "u0", 1, phase="Running", containerStatuses=sidecars, initContainerStatuses=inits)
    kept = projection(body)
    assert pod_state(kept) == pod_state(body)
    assert len(kept["status"]["containerStatuses"]) <= CONTAINER_STATUSES_KEPT + 4
    assert len(kept["status"]["initContainerStatuses"]) == CONTAINER_STATUSES_KEPT
    assert "worker" in {cs["name"] for cs in kept["status"]["containerStatuses"]}
