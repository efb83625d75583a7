"""The results upload after training: its bounded retry, the lines it prints and how the operator reads them.

Rank 0's pod uploads the output directory once training has ended (the launcher's script runs it). Storage
can be away for a while after a run of hours, so the upload retries with backoff for
spec.output.uploadRetrySeconds, printing one line per try; the operator reads them from the launcher's log to
say in status whether the results are uploading, retrying (and why) or failed. The last line names the pod the
upload ran on: an elastic world's rank 0 moves when its host is lost, so the pod holding the results is the
one the upload says, never assumed. Once every file is up, the uploader writes the run's manifest
(MANIFEST_NAME) last, so storage itself says whether a run's results are complete. Only when storage refused
for the whole time does the launcher exit, with UPLOAD_FAILED_EXIT (outside the exit codes of user code), and
the job ends ResultsUploadFailed: an infrastructure failure that keeps the trained results, never a restart.
`dtjob results upload JOB` then runs the same upload again on the pod that kept them, with the caller's
credentials, and records it on the job (ANNOTATION_UPLOADED_LATER): a ResultsRecord bound to the job's UID,
the failed attempt and the kept pod, which the operator takes only once storage holds the manifest it names.
Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dtjob.printable import printable

# The launcher's exit code when training succeeded and the results upload failed for good. Outside 1-127
# (the user's code, and the default runPolicy.permanentExitCodes) and 128+N (killed by signal N).
UPLOAD_FAILED_EXIT = 200
MAX_BACKOFF_SECONDS = 60.0
LINE_PREFIX = "dtjob results upload: "

UPLOADING = "Uploading"
RETRYING = "Retrying"
FAILED = "Failed"
UPLOADED = "Uploaded"

# Set on the job by `dtjob results upload` once the upload it ran succeeded: a ResultsRecord (JSON).
ANNOTATION_UPLOADED_LATER = "dtjob.io/results-uploaded"
# The run's manifest, under its prefix: every file uploaded and its size, written once all of them are up.
MANIFEST_NAME = ".dtjob-results.json"
# The most of a manifest the operator reads (a run of a hundred thousand files fits).
MANIFEST_MAX_BYTES = 8 * 1024 * 1024
RECORD_MAX_CHARS = 2000

# " on pod <name>" in the failed and done lines: a pod name is a DNS subdomain.
_ON_POD = re.compile(r" on pod ([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?=:|$)")
_DONE = re.compile(r"^done: (\d+) files, (\d+) bytes")


@dataclass(frozen=True)
class UploadReport:
    state: str  # UPLOADING, RETRYING, FAILED or UPLOADED
    message: str
    pod: str | None = None  # the pod the upload ran on, as its failed or done line says


def backoff_seconds(attempt: int) -> float:
    """The wait after failed try `attempt` (1, 2, ...): 2, 4, 8, ... seconds, at most a minute."""
    return float(min(MAX_BACKOFF_SECONDS, 2 ** max(1, attempt)))


def started_line(pod: str) -> str:
    return f"{LINE_PREFIX}started on pod {pod}"


def retry_line(attempt: int, wait_s: float, left_s: float, reason: str) -> str:
    return (
        f"{LINE_PREFIX}retrying in {wait_s:.0f} s (try {attempt} failed, {left_s:.0f} s of retries left): "
        f"{_one_line(reason)}"
    )


def failed_line(attempts: int, seconds: float, reason: str, pod: str) -> str:
    return f"{LINE_PREFIX}failed after {attempts} tries in {seconds:.0f} s on pod {pod}: {_one_line(reason)}"


def done_line(files: int, size: int, attempts: int, pod: str) -> str:
    return f"{LINE_PREFIX}done: {files} files, {size} bytes, after {attempts} tries on pod {pod}"


def latest_report(log_text: str) -> UploadReport | None:
    """What the newest upload line of a launcher log says, or None before the upload started."""
    for line in reversed(log_text.splitlines()):
        at = line.find(LINE_PREFIX)
        if at < 0:
            continue
        text = printable(line[at + len(LINE_PREFIX) :].strip()[:500])
        if text.startswith("retrying"):
            return UploadReport(RETRYING, text)
        if text.startswith("failed"):
            # The pod is named before the reason, which is free text and may say anything.
            return UploadReport(FAILED, text, _pod(text.split(": ", 1)[0]))
        if text.startswith("done"):
            return UploadReport(UPLOADED, text, _pod(text))
        return UploadReport(UPLOADING, "uploading the results")
    return None


def done_counts(message: str) -> tuple[int, int] | None:
    """(files, bytes) of a done line's text, or None."""
    found = _DONE.match(message)
    return (int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True)
class ResultsRecord:
    """What `dtjob results upload` records on the job once its upload succeeded, bound to the run it uploaded
    for: the job's UID, the world attempt that failed to upload (status.restarts), the kept pod (name and
    UID), and what the upload said it put into storage. The operator takes it only when all of these match
    its status and storage holds a manifest of as many files and bytes."""

    job_uid: str
    attempt: int
    pod: str
    pod_uid: str
    files: int
    bytes: int
    at: str  # when it was recorded

    def to_annotation(self) -> str:
        return json.dumps({
            "jobUID": self.job_uid, "attempt": self.attempt, "pod": self.pod, "podUID": self.pod_uid,
            "files": self.files, "bytes": self.bytes, "at": self.at,
        }, separators=(",", ":"))  # fmt: skip


def parse_record(annotation: str | None) -> ResultsRecord | None:
    """The record of `dtjob results upload` on the job, or None for no record or anything that is not one
    (the annotation is anyone's to write who may edit the job: it is input, never a fact)."""
    if not annotation or len(annotation) > RECORD_MAX_CHARS:
        return None
    try:
        raw = json.loads(annotation)
    except ValueError:
        return None
    if not isinstance(raw, Mapping):
        return None
    texts = [raw.get(k) for k in ("jobUID", "pod", "podUID", "at")]
    counts = [raw.get(k) for k in ("attempt", "files", "bytes")]
    if not all(isinstance(t, str) and t for t in texts) or not all(_count(c) for c in counts):
        return None
    job_uid, pod, pod_uid, at = (str(t) for t in texts)
    attempt, files, size = (c for c in counts if isinstance(c, int))
    return ResultsRecord(job_uid, attempt, pod, pod_uid, files, size, at)


def manifest_text(files: Mapping[str, int]) -> str:
    """The run's manifest: every file uploaded (its path under the run's prefix) and its size."""
    return json.dumps({"files": dict(sorted(files.items())), "bytes": sum(files.values())}, indent=0)


def parse_manifest(text: str) -> dict[str, int] | None:
    """A manifest's files and sizes, or None for anything that is not a manifest."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    files = raw.get("files") if isinstance(raw, Mapping) else None
    if not isinstance(files, Mapping):
        return None
    if not all(isinstance(k, str) and _count(v) for k, v in files.items()):
        return None
    return {str(k): int(v) for k, v in files.items()}


def _pod(text: str) -> str | None:
    named = _ON_POD.search(text)
    return named.group(1) if named else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
