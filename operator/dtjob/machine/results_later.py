"""Results whose upload failed for good, uploaded later by `dtjob results upload`. Pure.

The record that command leaves on the job (dtjob.io/results-uploaded) is anyone's to write who may edit the
job, so it is taken only when it names this run (the job's UID, the world attempt that failed to upload, the
kept pod by name and UID, all as the status says now, which the job's editors cannot write) and the operator
has found the results in storage itself (the run's manifest and every file it lists, read with its own
credentials). A record that names another run, an older job of the same name's or another attempt's, changes
nothing; so does one whose results storage does not hold.
"""

from __future__ import annotations

from dataclasses import replace

from dtjob.contract.results_upload import ANNOTATION_UPLOADED_LATER, UPLOADED, ResultsRecord
from dtjob.machine.builder import Builder
from dtjob.printable import printable
from dtjob.state.decision import Event
from dtjob.state.observed import Observed, StoredResults
from dtjob.state.status import FAILED, SUCCEEDED, JobStatus
from dtjob.timefmt import format_time

RESULTS_UPLOADED_LATER = "ResultsUploadedLater"
RECORD_IGNORED = "ResultsRecordIgnored"
RESULTS_NOT_STORED = "ResultsNotInStorage"
# Warnings that tell of a state that holds while nothing changes (decided anew at every resync): the runtime
# posts each once in a while, not at every pass (dtjob.runtime.cached_kube).
HELD_STATE_WARNINGS = frozenset({RECORD_IGNORED, RESULTS_NOT_STORED})
# Storage could not be asked whether it holds the results: look again after this long.
STORAGE_RECHECK_SECONDS = 30.0


def record_mismatch(record: ResultsRecord, status: JobStatus, uid: str) -> str | None:
    """Why `record` is not about the results this job keeps, or None when it is."""
    if record.job_uid != uid:
        return f"it names job UID {record.job_uid}, not this job's {uid} (an older job of the same name's)"
    if record.attempt != status.restarts:
        return f"it names attempt {record.attempt}, not the one that kept the results ({status.restarts})"
    if (record.pod, record.pod_uid) != (status.results_pod, status.results_pod_uid):
        return (
            f"it names pod {record.pod} (UID {record.pod_uid}), not the one that kept the results "
            f"({status.results_pod}, UID {status.results_pod_uid})"
        )
    return None


def uploaded_later(b: Builder, observed: Observed) -> None:
    """A finished job that keeps results: Succeeded once a record of this run's upload is on the job and
    storage holds the results it names; a record about something else, or whose results storage lacks, is
    said in an event and changes nothing."""
    record = observed.results_record
    if record is None or b.prev.results_pod is None:
        return
    kept = f"the results stay on pod {b.prev.results_pod}"
    wrong = record_mismatch(record, b.prev, observed.uid)
    if wrong is not None:
        text = f"annotation {ANNOTATION_UPLOADED_LATER} ignored: {printable(wrong)}; {kept}"
        b.events.append(Event("Warning", RECORD_IGNORED, text))
        return
    stored = observed.results_stored
    if stored is None:
        return
    if not stored.complete:
        text = f"annotation {ANNOTATION_UPLOADED_LATER} not taken yet: {printable(stored.message)}; {kept}"
        b.events.append(Event("Warning", RESULTS_NOT_STORED, text))
        if stored.retry:
            b.requeue(STORAGE_RECHECK_SECONDS)
        return
    _succeeded(b, stored)


def _succeeded(b: Builder, stored: StoredResults) -> None:
    """The run has done what it was for: the job becomes Succeeded, and cleanPodPolicy frees the pod that
    kept the results. The TTL counts from now."""
    message = f"the results were uploaded after the job had failed to upload them: {stored.message}"
    b.status = replace(
        b.status,
        results_state=UPLOADED,
        results_message=stored.message,
        results_pod=None,
        results_pod_uid=None,
        completion_time=format_time(b.now),
    )
    b.cond(FAILED, False, RESULTS_UPLOADED_LATER, message)
    b.cond(SUCCEEDED, True, RESULTS_UPLOADED_LATER, message)
    b.phase(SUCCEEDED, message, "Normal", RESULTS_UPLOADED_LATER)
