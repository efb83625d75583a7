"""A state that holds is decided anew at every resync (each minute): a results record that names another run,
or one whose results storage lacks, said so in a new Warning each time, and looked in storage each time (a
manifest of up to 8 MiB read and up to 100,000 blobs listed) for as long as the pod kept the results. The
runtime posts a Warning the same as one it posted about the same job within EVENT_REPEAT_S once, and reuses
what storage answered a look for the same record for RESULTS_LOOK_REUSE_S."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.reconcile import observe
from dtjob.reconcile.reads import remembered_look
from dtjob.runtime.cached_kube import EVENT_REPEAT_S, RESULTS_LOOK_REUSE_S, CachedKube
from dtjob.runtime.ttl_cache import TtlCache
from dtjob.state.observed import StoredResults

from tests.unit.manual_clock import ManualClock
from tests.unit.operator_fixtures import CONFIG
from tests.unit.recording_kube import RecordingKube, unused_api
from tests.unit.test_results_upload import failed_for_good, record_of

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def runtime_kube(clock: ManualClock) -> tuple[CachedKube, RecordingKube]:
    recording = RecordingKube()
    cached = CachedKube(recording, unused_api())
    cached.events_posted = TtlCache(EVENT_REPEAT_S, clock, max_entries=100)
    cached.looks = TtlCache(RESULTS_LOOK_REUSE_S, clock, max_entries=100)
    return cached, recording


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "rn50", "namespace": "ml", "uid": uid}}


def test_a_warning_said_again_within_the_bound_is_posted_once_a_step_each_time() -> None:
    clock = ManualClock()
    cached, recording = runtime_kube(clock)
    for _ in range(3):
        cached.emit_event(job("uid-1"), "Warning", "ResultsRecordIgnored", "names attempt 1", NOW)
        cached.emit_event(job("uid-1"), "Normal", "WorkerJoined", "1 worker(s) Ready to join the world", NOW)
        cached.emit_event(job("uid-1"), "Warning", "WorkerLost", "worker 1 lost: its node went away", NOW)
    assert (
        recording.events
        == [("Warning", "ResultsRecordIgnored")]
        + [
            ("Normal", "WorkerJoined"),
            ("Warning", "WorkerLost"),
        ]
        * 3
    )
    recording.events.clear()
    cached.emit_event(job("uid-1"), "Warning", "ResultsRecordIgnored", "names attempt 2", NOW)  # news
    cached.emit_event(job("uid-2"), "Warning", "ResultsRecordIgnored", "names attempt 1", NOW)  # another job
    clock.now += EVENT_REPEAT_S
    cached.emit_event(
        job("uid-1"), "Warning", "ResultsRecordIgnored", "names attempt 1", NOW
    )  # said long ago
    assert recording.events == [("Warning", "ResultsRecordIgnored")] * 3


def test_what_storage_answered_a_look_is_reused_for_the_same_record_but_not_a_failed_look() -> None:
    clock = ManualClock()
    cached, _ = runtime_kube(clock)
    looks: list[str] = []

    def look(answer: StoredResults) -> StoredResults:
        looks.append(answer.message)
        return answer

    lacking = StoredResults(False, "no manifest")
    away = StoredResults(False, "storage did not answer", retry=True)
    for _ in range(3):
        assert remembered_look(cached, ("uid-1", "record-a"), lambda: look(lacking)) == lacking
        assert remembered_look(cached, ("uid-1", "record-b"), lambda: look(away)) == away
    assert looks == ["no manifest"] + ["storage did not answer"] * 3
    clock.now += RESULTS_LOOK_REUSE_S
    remembered_look(cached, ("uid-1", "record-a"), lambda: look(lacking))
    assert looks[-1] == "no manifest" and len(looks) == 5
    # A client that remembers nothing (a test's, the CLI's) looks each time.
    remembered_look(RecordingKube(), ("uid-1", "record-a"), lambda: look(lacking))
    assert len(looks) == 6


def test_a_reconciles_look_for_a_record_goes_through_the_runtimes_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reconcile of a job whose record storage does not bear out asks storage once in the bound, and a
    new record (another upload) is looked for at once."""
    spec, status = failed_for_good({"cleanPodPolicy": "Running"})
    looked: list[int] = []

    def stored_results(*args: Any) -> StoredResults:
        looked.append(1)
        return StoredResults(False, "no manifest")

    monkeypatch.setattr(observe, "stored_results", stored_results)
    cached, _ = runtime_kube(ManualClock())
    record = record_of(status)
    body = {**job("uid-1"), "metadata": {**job("uid-1")["metadata"], "annotations": {
        "dtjob.io/results-uploaded": record.to_annotation()}}}  # fmt: skip
    for _ in range(3):
        found, stored = observe._results_record(cached, CONFIG, spec, body, status, NOW)
        assert found == record and stored == StoredResults(False, "no manifest")
    assert len(looked) == 1
    again = record_of(status, at="2026-11-28T10:00:00Z")
    body["metadata"]["annotations"]["dtjob.io/results-uploaded"] = again.to_annotation()
    observe._results_record(cached, CONFIG, spec, body, status, NOW)
    assert len(looked) == 2
