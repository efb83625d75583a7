"""A job's status as a typed, frozen view, and the one line that reports it while a job is followed. Pure: it
reads the job object as the API server returns it, through the operator's own lenient status reader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dtjob.printable import printable
from dtjob.state.status import Condition, status_from_dict

FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Progress:
    """Rank 0's training progress (status.progress), read from the launcher's log every 30 s."""

    epoch: int
    epochs: int
    step: int
    steps_per_epoch: int
    images_per_sec: float | None  # left out by the operator when rank 0 reported no finite rate
    loss: float | None  # likewise for a NaN or infinite loss
    updated_at: str
    summary: str
    percent: float | None = None  # of the planned steps, floored to 0.1 (100.0 only when finished)
    eta_seconds: int | None = None  # training left at the current world's pace; None while none trains


@dataclass(frozen=True)
class JobStatus:
    name: str
    namespace: str
    uid: str
    phase: str  # Pending until the operator first records one
    message: str
    workers_ready: int
    workers: int
    gpus: int
    restarts: int
    launcher: str  # the launcher's state: Absent, Running, Succeeded...
    progress: Progress | None
    conditions: tuple[Condition, ...]
    output_url: str | None  # where the run's results and logs go (spec.output), None without one

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> JobStatus:
        meta = job.get("metadata") or {}
        recorded = status_from_dict(job.get("status"))
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            phase=recorded.phase or "Pending",
            message=str(recorded.message or ""),
            workers_ready=recorded.workers_ready,
            workers=recorded.workers_total,
            gpus=recorded.total_gpus,
            restarts=recorded.restarts,
            launcher=recorded.launcher_state,
            progress=_progress(recorded.training_progress),
            conditions=recorded.conditions,
            output_url=recorded.output_url,
        )


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _progress(raw: Any) -> Progress | None:
    if not isinstance(raw, Mapping):
        return None
    return Progress(
        epoch=_int(raw.get("epoch")),
        epochs=_int(raw.get("epochs")),
        step=_int(raw.get("step")),
        steps_per_epoch=_int(raw.get("stepsPerEpoch")),
        images_per_sec=_float(raw.get("imagesPerSec")),
        loss=_float(raw.get("loss")),
        updated_at=str(raw.get("updatedAt") or ""),
        summary=str(raw.get("summary") or ""),
        percent=_float(raw.get("percent")),
        eta_seconds=None if raw.get("etaSeconds") is None else _int(raw.get("etaSeconds")),
    )


def progress_line(status: JobStatus) -> str:
    """One line about the job, the facts `kubectl get dtj -o wide` shows: phase, workers, restarts, progress
    and the operator's message."""
    line = f"{status.name}: {status.phase}, workers {status.workers_ready}/{status.workers} ready"
    if status.restarts:
        line += f", {status.restarts} restart(s)"
    if status.progress is not None and status.progress.summary:
        line += f", {status.progress.summary}"
    line = f"{line} ({status.message})" if status.message else line
    return printable(line, keep_newlines=False)
