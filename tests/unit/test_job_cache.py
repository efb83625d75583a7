"""A reconcile reads its job from the watch's copy (dtjob.runtime.job_cache) and writes its status through to
it, so a burst of jobs costs no GET per reconcile, and no reconcile decides from a status older than its own
last patch."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from dtjob.reconcile.reads import get_job, patch_status
from dtjob.runtime.cached_kube import JOB_COPY_MAX_AGE_S, CachedKube
from dtjob.runtime.job_cache import LAST_APPLIED, JobCache

from tests.unit.manual_clock import ManualClock
from tests.unit.recording_kube import Json, RecordingKube, unused_api


def job(version: str, uid: str = "u1", phase: str = "Pending") -> dict[str, Any]:
    meta = {"name": "rn50", "namespace": "ml", "uid": uid, "resourceVersion": version}
    return {"metadata": {**meta, "managedFields": [{"manager": "kubectl"}]}, "status": {"phase": phase}}


def test_a_copy_comes_back_as_a_fresh_dict_without_managed_fields() -> None:
    cache = JobCache(60.0)
    cache.put(job("5"))
    first = cache.get("ml", "rn50")
    assert first is not None and "managedFields" not in first["metadata"]
    assert first["status"] == {"phase": "Pending"} and first["metadata"]["resourceVersion"] == "5"
    first["status"]["phase"] = "Changed by a caller"
    assert cache.get("ml", "rn50") == {**first, "status": {"phase": "Pending"}}
    assert cache.get("ml", "other") is None


def test_kubectls_last_applied_copy_is_dropped_and_every_other_annotation_kept() -> None:
    body = job("5")
    applied = json.dumps(
        {"spec": {"worker": {"template": {"spec": {"containers": [{"name": "w" * 40}] * 50}}}}}
    )
    body["metadata"]["annotations"] = {LAST_APPLIED: applied, "team": "vision"}
    cache = JobCache(60.0)
    cache.put(body)
    copy = cache.get("ml", "rn50")
    assert copy is not None and copy["metadata"]["annotations"] == {"team": "vision"}
    assert body["metadata"]["annotations"][LAST_APPLIED] == applied, "the caller's body is left as it was"


def test_an_older_event_never_replaces_a_newer_write() -> None:
    cache = JobCache(60.0)
    cache.put(job("9", phase="Running"))  # the operator's own patch, answered
    cache.put(job("8", phase="Pending"))  # the watch's event from before it, delivered late
    assert (cache.get("ml", "rn50") or {})["status"] == {"phase": "Running"}
    cache.put(job("10", phase="Succeeded"))
    assert (cache.get("ml", "rn50") or {})["status"] == {"phase": "Succeeded"}


def test_a_job_created_again_under_the_same_name_replaces_the_old_copy() -> None:
    cache = JobCache(60.0)
    cache.put(job("9", uid="old"))
    cache.put(job("3", uid="new"))  # a lower version, but another object
    assert (cache.get("ml", "rn50") or {})["metadata"]["uid"] == "new"


def test_a_copy_unconfirmed_for_its_max_age_is_not_used() -> None:
    clock = ManualClock()
    cache = JobCache(60.0, clock)
    cache.put(job("5"))
    clock.now += 59.9
    assert cache.get("ml", "rn50") is not None
    cache.put(job("5"))  # the same version again (a GET) confirms it
    clock.now += 59.9
    assert cache.get("ml", "rn50") is not None
    clock.now += 0.1
    assert cache.get("ml", "rn50") is None, "a job deleted while the watch was down must not live on"
    cache.forget("ml", "rn50")
    assert len(cache) == 0


@dataclass
class JobApi(RecordingKube):
    """The API server's job endpoints as the client reaches them, in memory; counts GETs."""

    stored: dict[str, Any] = field(default_factory=dict)
    gets: int = 0
    patches: list[dict[str, Any]] = field(default_factory=list)

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        assert (kind, namespace, name) == ("DistributedTrainingJob", "ml", "rn50")
        self.gets += 1
        return copy.deepcopy(self.stored)

    def patch(self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None) -> Json:
        assert (kind, namespace, name) == ("DistributedTrainingJob/status", "ml", "rn50")
        self.patches.append(body)
        version = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        self.stored = {**self.stored, "status": body["status"],
                       "metadata": {**self.stored["metadata"], "resourceVersion": version}}  # fmt: skip
        return copy.deepcopy(self.stored)


def kube_over(api: JobApi, clock: ManualClock) -> CachedKube:
    return CachedKube(api, unused_api(), JobCache(JOB_COPY_MAX_AGE_S, clock))


def test_the_client_reads_the_watch_copy_and_writes_its_status_through() -> None:
    clock = ManualClock()
    api = JobApi(stored=job("5"))
    kube = kube_over(api, clock)
    kube.remember_job(job("5"))  # the watch's event
    for _ in range(5):
        assert (get_job(kube, "ml", "rn50") or {})["metadata"]["resourceVersion"] == "5"
    assert api.gets == 0
    assert patch_status(kube, "ml", "rn50", {"phase": "Running"}, "5") == "6"
    kube.remember_job(job("5"))  # the watch catching up late
    after = get_job(kube, "ml", "rn50") or {}
    assert after["status"] == {"phase": "Running"} and after["metadata"]["resourceVersion"] == "6"
    assert api.gets == 0


def test_the_client_gets_a_job_it_holds_no_recent_copy_of() -> None:
    clock = ManualClock()
    api = JobApi(stored=job("5"))
    kube = kube_over(api, clock)
    assert get_job(kube, "ml", "rn50") is not None and api.gets == 1
    assert get_job(kube, "ml", "rn50") is not None and api.gets == 1, "the answer is kept"
    clock.now += JOB_COPY_MAX_AGE_S
    assert get_job(kube, "ml", "rn50") is not None and api.gets == 2
    kube.forget_job("ml", "rn50")  # the watch's DELETED
    get_job(kube, "ml", "rn50")
    assert api.gets == 3


def listed(*jobs: dict[str, Any]) -> list[dict[str, Any]]:
    """A LIST of the jobs' metadata, as the API server answers a PartialObjectMetadataList."""
    return [
        {"metadata": {k: j["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion")}}
        for j in jobs
    ]


def test_a_list_of_the_jobs_metadata_confirms_the_copies_it_shows_and_names_the_jobs_gone() -> None:
    clock = ManualClock()
    cache = JobCache(60.0, clock)
    cache.put(job("5"))
    other = job("7")
    other["metadata"]["name"] = "gone"
    cache.put(other)
    clock.now += 50
    since = clock.now
    assert cache.confirm("ml", listed(job("5")), since) == [("ml", "gone")]
    clock.now += 59.9
    assert cache.get("ml", "rn50") is not None, "confirmed as of the LIST"
    clock.now += 0.1
    assert cache.get("ml", "rn50") is None


def test_a_list_leaves_an_older_copy_to_age_and_judges_nothing_put_while_it_ran() -> None:
    clock = ManualClock()
    cache = JobCache(60.0, clock)
    cache.put(job("5"))
    clock.now += 50
    since = clock.now
    assert cache.confirm("ml", listed(job("6")), since) == []
    clock.now += 10
    assert cache.get("ml", "rn50") is None, "the API server holds a newer version: read it"
    cache.put(job("8"))  # a watch event while a LIST, begun earlier, ran
    assert cache.confirm("ml", [], clock.now - 1) == [], "put after the LIST began: not gone"
    assert cache.confirm("other", [], clock.now + 1) == [], "another namespace's LIST says nothing of it"


def test_a_job_created_again_under_its_name_loses_its_old_copy_not_its_place() -> None:
    clock = ManualClock()
    cache = JobCache(60.0, clock)
    cache.put(job("5", uid="old"))
    clock.now += 1
    assert cache.confirm(None, listed(job("9", uid="new")), clock.now) == []
    assert cache.get("ml", "rn50") is None
