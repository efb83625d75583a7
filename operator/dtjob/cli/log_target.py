"""Which log `dtjob logs` follows: the launcher's (every rank's output), one worker's or the stager's, live
from its pod or, once the pods are gone, from the copy the operator uploaded (the launcher's and the workers';
the stager's pods belong to the staging Job, whose log is not uploaded); and how far a pod's log has been
printed, so that reading it again prints only what is new. Pure: it picks among pods, blob names and log
lines."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dtjob import names
from dtjob.state.status import FINISHED, ConditionType


@dataclass(frozen=True)
class LogTarget:
    job: str
    worker: int | None = None  # None: the launcher (or the stager)
    stager: bool = False  # the staging Job's pod, which copies spec.dataset.stageFrom onto the data volume

    @property
    def role(self) -> str:
        if self.stager:
            return names.ROLE_STAGER
        return names.ROLE_LAUNCHER if self.worker is None else names.ROLE_WORKER

    @property
    def container(self) -> str:
        return names.CONTAINER_OF_ROLE[self.role]

    @property
    def uploaded(self) -> bool:
        """Whether the operator uploads this target's log as the job ends: it uploads the logs of the pods the
        job owns, and the stager's pods are the staging Job's."""
        return not self.stager

    def label_selector(self) -> str:
        selector = {names.JOB_NAME_LABEL: self.job, names.ROLE_LABEL: self.role}
        if self.worker is not None and not self.stager:
            selector[names.WORKER_INDEX_LABEL] = str(self.worker)
        return ",".join(f"{k}={v}" for k, v in selector.items())

    def describe(self) -> str:
        if self.stager:
            return f"the stager (Job {names.staging_job_name(self.job)})"
        return "the launcher" if self.worker is None else f"worker {self.worker}"

    def is_its_log(self, file_name: str) -> bool:
        """Whether an uploaded `<pod>.log` is this target's (a launcher pod that a Job made, in an earlier
        release, has a generated suffix)."""
        if not self.uploaded:
            return False
        if self.worker is None:
            launcher = names.launcher_name(self.job)
            return file_name == f"{launcher}.log" or (
                file_name.startswith(f"{launcher}-") and file_name.endswith(".log")
            )
        return file_name == f"{names.worker_name(self.job, self.worker)}.log"


def attempt_of(pod: Mapping[str, Any]) -> int:
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(names.ATTEMPT_LABEL, "0")
    try:
        return int(raw)
    except ValueError:
        return 0


def newest_pod(pods: Sequence[Mapping[str, Any]], attempt: int | None = None) -> Mapping[str, Any] | None:
    """The pod of the latest world (or of `attempt`), the most recently created first; None if there is none.
    Pods being deleted belong to a world that is going away."""
    live = [
        p
        for p in pods
        if not (p.get("metadata") or {}).get("deletionTimestamp")
        and (attempt is None or attempt_of(p) == attempt)
    ]
    if not live:
        return None
    return max(
        live, key=lambda p: (attempt_of(p), str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    )


def has_ended(pod: Mapping[str, Any]) -> bool:
    return str((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed")


def _staged(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    conditions = (job.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == ConditionType.STAGED), None)


def staging_over(job: Mapping[str, Any]) -> bool:
    """Whether the job's staging has ended: condition Staged True, or the job has finished (a failed staging,
    or a deadline, fails it). Staged False alone is no end: the job says so while a refused pod waits."""
    staged = _staged(job)
    phase = (job.get("status") or {}).get("phase")
    return (staged is not None and staged.get("status") == "True") or phase in FINISHED


def staging_outcome(job: Mapping[str, Any]) -> str:
    """How the job's staging stands, in the job's own words: its Staged condition, else status.staging."""
    status = job.get("status") or {}
    staged = _staged(job)
    if staged is not None:
        said = f"condition Staged={staged.get('status')} ({staged.get('reason') or 'no reason'})"
        return f"{said}: {staged.get('message')}" if staged.get("message") else said
    staging = status.get("staging") or {}
    if staging.get("reason"):
        return f"staging {staging.get('phase') or 'failed'}: {staging['reason']}"
    return f"phase {status.get('phase') or 'Pending'}: {status.get('message') or 'no message'}"


def uploaded_log(target: LogTarget, blob_names: Sequence[str], folder: str) -> str | None:
    """The blob under `folder` (`.../logs/` or `.../logs/attempt-<n>/`) that holds the target's log; the last
    by name when there are several (a launcher Job of an earlier release that ran more than one pod)."""
    mine = sorted(n for n in blob_names if n.startswith(folder) and target.is_its_log(n[len(folder) :]))
    return mine[-1] if mine else None


Stamp = tuple[int, int]  # (seconds since the epoch, nanoseconds): a log line's place in time

_STAMP = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def split_stamp(line: bytes) -> tuple[Stamp | None, bytes]:
    """(its timestamp, the line without it) for a line the API server prefixed with one (`timestamps=true`:
    RFC 3339 with up to nanoseconds, then a space); (None, the line) for any other."""
    head, sep, rest = line.partition(b" ")
    match = _STAMP.fullmatch(head) if sep else None
    if match is None:
        return None, line
    offset = match[3].decode()
    moment = datetime.fromisoformat(match[1].decode() + ("+00:00" if offset == "Z" else offset))
    return (int(moment.timestamp()), int((match[2] or b"0").ljust(9, b"0"))), rest


@dataclass
class LogPosition:
    """How far one pod's log has been printed. Reading it again (the API server closed the stream, or it went
    quiet and was dropped) reads from the start and skips up to the last line printed, placed by its
    timestamp and how many printed lines share it: not by a count of lines, which is wrong once --tail or
    --since left out the log's start, or once the kubelet rotated the file."""

    opened_at: float | None = None  # when the first read that got an answer began (a monotonic clock)
    last: Stamp | None = None  # the timestamp of the last line printed
    same: int = 0  # lines printed that carry `last`
    _skip_to: Stamp | None = field(default=None, repr=False)
    _skip_same: int = field(default=0, repr=False)

    def request(self, tail: int | None, since: int | None, now: float) -> dict[str, int]:
        """The pods/log options of the next read: the first one asks for what --tail and --since ask for;
        a later one before anything was printed, for what came since the first (nothing was there then);
        any other, for the whole log (admit skips what was printed)."""
        if self.opened_at is None:
            first: dict[str, int] = {}
            if tail is not None:
                first["tail_lines"] = tail
            if since is not None:
                first["since_seconds"] = since
            return first
        if self.last is not None or (tail is None and since is None):
            return {}
        return {"since_seconds": (since or 0) + max(1, math.ceil(now - self.opened_at))}

    def opened(self, now: float) -> None:
        """A read got its answer: its lines are admitted from here."""
        if self.opened_at is None:
            self.opened_at = now
        self._skip_to, self._skip_same = self.last, self.same

    def admit(self, stamp: Stamp | None) -> bool:
        """Whether a line read with this timestamp is new (to print), noting it as printed if so. A line
        without a timestamp is printed and ends the skipping: it cannot be placed."""
        if self._skip_to is not None and stamp is not None:
            if stamp < self._skip_to:
                return False
            if stamp == self._skip_to and self._skip_same > 0:
                self._skip_same -= 1
                return False
        self._skip_to = None
        if stamp is not None:
            self.same = self.same + 1 if stamp == self.last else 1
            self.last = stamp
        return True
