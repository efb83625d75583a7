"""runPolicy.progressDeadlineSeconds: a running world that shows no training progress for that long is hung (a
rank waiting forever in a collective, a data loader deadlocked), and is restarted, counted against
backoffLimit like any failed world. Pure.

Progress is a record in rank 0's log one step or epoch further than the last one seen. The time is the
operator's own: when it saw that record (status.lastProgressTime), never the record's `updatedAt`, which the
training code writes. The clock also starts when a world starts running, so a restarted world gets the whole
deadline, and it runs only on passes that read the log: a log the API server cannot serve shows no hang,
nor does a tail without a record once the world has printed one (other ranks' lines pushed it out of the
lines read).
It runs while the world trains: not once rank 0's last record says every planned step is done, nor once the
results upload has begun (its retries have their own bound, spec.output.uploadRetrySeconds); a world that
has trained to the end is never restarted into training again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dtjob.machine.builder import Builder
from dtjob.machine.world import WorldFailure
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import LauncherState, Observed
from dtjob.state.status import RUNNING
from dtjob.timefmt import format_time, parse_time_or_none

REASON = "ProgressDeadlineExceeded"


def advanced(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> bool:
    """Whether the record `now` is a step or epoch away from `before` (a first record is progress; so is one
    behind the last, a world resumed from an older checkpoint)."""
    if now is None:
        return False
    return before is None or (now.get("epoch"), now.get("step")) != (before.get("epoch"), before.get("step"))


def note_progress(b: Builder, observed: Observed) -> None:
    """status.lastProgressTime, on the operator's clock, when the log shows training one step further."""
    if advanced(b.prev.training_progress, observed.training_progress):
        b.status = replace(b.status, last_progress_time=format_time(b.now))


def progress_deadline_failure(
    b: Builder, spec: JobSpec, observed: Observed, launcher: LauncherState | None
) -> WorldFailure | None:
    """The world's failure when it has run past runPolicy.progressDeadlineSeconds without progress, as the
    launcher's log read in this pass shows; else None (and the pass to look again is requeued)."""
    deadline = spec.run_policy.progress_deadline_seconds
    running = b.status.condition("Running")
    if deadline is None or b.prev.phase != RUNNING or launcher is None or launcher.finished:
        return None
    if running is None or running.status != "True" or not observed.progress_read:
        return None
    if b.status.results_state is not None or _trained_to_the_end(b.status.training_progress):
        return None
    started = parse_time_or_none(running.last_transition_time)
    if started is None:
        return None
    seen = parse_time_or_none(b.status.last_progress_time)
    seen_in_this_world = seen is not None and seen >= started
    if seen_in_this_world and observed.training_progress is None:
        return None
    since = max(started, seen) if seen is not None else started
    idle = (b.now - since).total_seconds()
    if idle <= deadline:
        b.requeue(deadline - idle + 1)
        return None
    pod = launcher.pod_name or "?"
    if seen_in_this_world and b.status.training_progress is not None:
        last = b.status.training_progress
        at = f"epoch {last.get('epoch')} step {last.get('step')}"
        what = f"its last record ({at}) was seen at {format_time(since)}"
    else:
        what = f"it printed no progress record since the world started running at {format_time(since)}"
    return WorldFailure(
        REASON,
        f"{launcher.role} pod {pod} showed no training progress for {idle:.0f}s "
        f"(runPolicy.progressDeadlineSeconds {deadline}): {what}",
    )


def _trained_to_the_end(progress: Mapping[str, Any] | None) -> bool:
    """Rank 0's last record has every planned step done (status.progress.percent, 100 only then)."""
    return progress is not None and progress.get("percent") == 100
