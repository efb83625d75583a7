"""The results upload after training: its bounded retry, the lines it prints and how the operator reads them.

Rank 0's pod uploads the output directory once training has ended (the launcher's script runs it). Storage
can be away for a while after a run of hours, so the upload retries with backoff for
spec.output.uploadRetrySeconds, printing one line per try; the operator reads them from the launcher's log to
say in status whether the results are uploading, retrying (and why) or failed. Only when storage refused for
the whole time does the launcher exit, with UPLOAD_FAILED_EXIT (outside the exit codes of user code), and the
job ends ResultsUploadFailed: an infrastructure failure that keeps the trained results, never a restart.
`dtjob results upload JOB` then runs the same upload again on the pod that kept them, with the caller's
credentials, and records its outcome on the job (ANNOTATION_UPLOADED_LATER) for the operator to finish it.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

# The launcher's exit code when training succeeded and the results upload failed for good. Outside 1-127
# (the user's code, and the default runPolicy.permanentExitCodes) and 128+N (killed by signal N).
UPLOAD_FAILED_EXIT = 200
MAX_BACKOFF_SECONDS = 60.0
LINE_PREFIX = "dtjob results upload: "

UPLOADING = "Uploading"
RETRYING = "Retrying"
FAILED = "Failed"
UPLOADED = "Uploaded"

# Set on the job by `dtjob results upload` once the upload it ran succeeded: the uploader's done line.
ANNOTATION_UPLOADED_LATER = "dtjob.io/results-uploaded"


@dataclass(frozen=True)
class UploadReport:
    state: str  # UPLOADING, RETRYING, FAILED or UPLOADED
    message: str


def backoff_seconds(attempt: int) -> float:
    """The wait after failed try `attempt` (1, 2, ...): 2, 4, 8, ... seconds, at most a minute."""
    return float(min(MAX_BACKOFF_SECONDS, 2 ** max(1, attempt)))


def started_line() -> str:
    return f"{LINE_PREFIX}started"


def retry_line(attempt: int, wait_s: float, left_s: float, reason: str) -> str:
    return (
        f"{LINE_PREFIX}retrying in {wait_s:.0f} s (try {attempt} failed, {left_s:.0f} s of retries left): "
        f"{_one_line(reason)}"
    )


def failed_line(attempts: int, seconds: float, reason: str) -> str:
    return f"{LINE_PREFIX}failed after {attempts} tries in {seconds:.0f} s: {_one_line(reason)}"


def done_line(files: int, size: int, attempts: int) -> str:
    return f"{LINE_PREFIX}done: {files} files, {size} bytes, after {attempts} tries"


def latest_report(log_text: str) -> UploadReport | None:
    """What the newest upload line of a launcher log says, or None before the upload started."""
    for line in reversed(log_text.splitlines()):
        at = line.find(LINE_PREFIX)
        if at < 0:
            continue
        text = line[at + len(LINE_PREFIX) :].strip()[:500]
        if text.startswith("retrying"):
            return UploadReport(RETRYING, text)
        if text.startswith("failed"):
            return UploadReport(FAILED, text)
        if text.startswith("done"):
            return UploadReport(UPLOADED, text)
        return UploadReport(UPLOADING, "uploading the results")
    return None


def uploaded_later(annotation: str | None) -> UploadReport | None:
    """What `dtjob results upload` recorded on the job: an upload done after the job failed it, or None."""
    if annotation is None:
        return None
    report = latest_report(annotation if LINE_PREFIX in annotation else LINE_PREFIX + annotation)
    return report if report is not None and report.state == UPLOADED else None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
