"""Which log `dtjob logs` follows: the launcher's (every rank's output) or one worker's, live from its pod or,
once the pods are gone, from the copy the operator uploaded. Pure: it picks among pods and blob names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob import names


@dataclass(frozen=True)
class LogTarget:
    job: str
    worker: int | None = None  # None: the launcher

    @property
    def role(self) -> str:
        return names.ROLE_LAUNCHER if self.worker is None else names.ROLE_WORKER

    @property
    def container(self) -> str:
        return names.CONTAINER_OF_ROLE[self.role]

    def label_selector(self) -> str:
        selector = {names.JOB_NAME_LABEL: self.job, names.ROLE_LABEL: self.role}
        if self.worker is not None:
            selector[names.WORKER_INDEX_LABEL] = str(self.worker)
        return ",".join(f"{k}={v}" for k, v in selector.items())

    def describe(self) -> str:
        return "the launcher" if self.worker is None else f"worker {self.worker}"

    def is_its_log(self, file_name: str) -> bool:
        """Whether an uploaded `<pod>.log` is this target's (the launcher's pod has a generated suffix)."""
        if self.worker is None:
            return file_name.startswith(f"{names.launcher_name(self.job)}-") and file_name.endswith(".log")
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


def uploaded_log(target: LogTarget, blob_names: Sequence[str], folder: str) -> str | None:
    """The blob under `folder` (`.../logs/` or `.../logs/attempt-<n>/`) that holds the target's log; the last
    by name when there are several (a launcher Job that ran more than one pod)."""
    mine = sorted(n for n in blob_names if n.startswith(folder) and target.is_its_log(n[len(folder) :]))
    return mine[-1] if mine else None
