"""One screen about a DistributedTrainingJob for `dtjob status`: phase, conditions, progress, staging, output,
restarts and the last events. Pure: it renders the job and event objects as the API returns them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dtjob.printable import printable
from dtjob.timefmt import format_span, parse_time

LAST_EVENTS = 8


def _age(stamp: str | None, now: datetime) -> str:
    """kubectl's compact age (`45s`, `12m`, `3h`, `2d`), `-` when unknown."""
    if not stamp:
        return "-"
    try:
        seconds = max(0, int((now - parse_time(stamp)).total_seconds()))
    except ValueError:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _done_line(progress: Mapping[str, Any], now: datetime) -> str:
    """`42.3%, ETA 1h12m (as of 2m ago, 8 ranks at 3.1 steps/s)`; `ETA unknown` until a pace is measured
    and while no world trains (restarting, suspended, failed)."""
    text = f"{progress['percent']:.1f}%"
    if not isinstance(progress.get("etaSeconds"), int):
        return f"{text}, ETA unknown"
    age = _age(progress.get("updatedAt"), now)
    basis = [] if age == "-" else [f"as of {age} ago"]
    pace = progress.get("stepsPerSec")
    if isinstance(pace, int | float):
        ranks = progress.get("worldSize")
        basis.append((f"{ranks} ranks at " if isinstance(ranks, int) else "") + f"{pace:g} steps/s")
    eta = f"{text}, ETA {format_span(progress['etaSeconds'])}"
    return f"{eta} ({', '.join(basis)})" if basis else eta


def _mib(n: Any) -> str:
    return f"{float(n or 0) / 2**20:.1f} MiB"


def _staging_line(staging: Mapping[str, Any]) -> str:
    files = f"{staging.get('filesCompleted', 0)}/{staging.get('filesTotal', 0)} files"
    line = (
        f"{staging.get('phase', '?')}: {files}, "
        f"{_mib(staging.get('bytesCompleted'))}/{_mib(staging.get('bytesTotal'))} at "
        f"{_mib(staging.get('bytesPerSecond'))}/s"
    )
    return f"{line} ({staging['reason']})" if staging.get("reason") else line


def _output_lines(output: Mapping[str, Any]) -> list[str]:
    logs = "uploaded" if output.get("logsUploaded") else "not uploaded yet"
    lines = [f"Output:     {output.get('url')}", f"Logs:       {logs}"]
    if output.get("logsError"):
        lines.append(f"            last upload failed: {output['logsError']}")
    if output.get("logsMissing"):
        lines.append(f"            missing: {', '.join(output['logsMissing'])}")
    truncated = output.get("logsTruncated") or {}
    if truncated.get("pods"):
        lines.append(f"            cut to {_mib(truncated.get('capBytes'))}: {', '.join(truncated['pods'])}")
    return lines


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def _world_line(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """The ranks training now (rank 0's last report) and, for an elastic job, its bounds."""
    ranks = (status.get("progress") or {}).get("worldSize")
    text = f"; {ranks} ranks training" if isinstance(ranks, int) else ""
    elastic = spec.get("elastic")
    if isinstance(elastic, Mapping):
        text += f"; elastic {elastic.get('minWorkers')}..{elastic.get('maxWorkers')} workers"
    return text


def _launcher_line(spec: Mapping[str, Any], launcher: Mapping[str, Any]) -> str:
    """The launcher's state and pod; a torchrun job has none: its workers' agents, rank 0 on worker 0."""
    state = launcher.get("state", "Absent")
    if "torchrun" in spec:
        return f"Torchrun:   {state}" + (f" (rank 0 on pod {launcher['pod']})" if launcher.get("pod") else "")
    return f"Launcher:   {state}" + (f" (pod {launcher['pod']})" if launcher.get("pod") else "")


def render(job: Mapping[str, Any], events: Sequence[Mapping[str, Any]], now: datetime) -> str:
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    launcher = status.get("launcher") or {}
    lines = [
        f"Name:       {meta.get('name')}",
        f"Namespace:  {meta.get('namespace')}",
        f"Framework:  {spec.get('framework', 'custom')}",
        f"Phase:      {status.get('phase') or 'Pending'}"
        + (f" ({status['message']})" if status.get("message") else ""),
        f"Age:        {_age(meta.get('creationTimestamp'), now)}",
        f"Workers:    {status.get('workersReady', '0/0')} ready, {status.get('gpus', 0)} GPUs"
        + _world_line(spec, status),
        _launcher_line(spec, launcher),
        f"Restarts:   {status.get('restarts', 0)}",
    ]
    progress = status.get("progress")
    lines.append(f"Progress:   {progress.get('summary', '-') if progress else '-'}")
    if progress and isinstance(progress.get("percent"), int | float):
        lines.append(f"Done:       {_done_line(progress, now)}")
    if status.get("staging"):
        lines.append(f"Staging:    {_staging_line(status['staging'])}")
    if status.get("output"):
        lines.extend(_output_lines(status["output"]))
    conditions = status.get("conditions") or []
    if conditions:
        lines += ["", "Conditions:", f"  {'TYPE':<20} {'STATUS':<7} {'AGE':<5} REASON: MESSAGE"]
        for c in conditions:
            age = _age(c.get("lastTransitionTime"), now)
            text = f"{c.get('reason', '')}: {c.get('message', '')}".rstrip(": ")
            lines.append(f"  {c.get('type', ''):<20} {c.get('status', ''):<7} {age:<5} {text}")
    recent = sorted(events, key=_event_time)[-LAST_EVENTS:]
    lines += ["", "Events:" if recent else "Events:     none"]
    for e in recent:
        count = int(e.get("count") or 1)
        times = f" (x{count})" if count > 1 else ""
        lines.append(
            f"  {_age(_event_time(e), now):<5} {e.get('type', ''):<8} {e.get('reason', ''):<22} "
            f"{e.get('message', '')}{times}"
        )
    # Status and Events carry what tenants and their code wrote: each line shown as text, never acted on.
    return "\n".join(printable(line, keep_newlines=False) for line in lines)
