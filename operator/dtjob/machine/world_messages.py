"""What a world's status message adds while it waits or runs: what keeps its workers (a replacement, old pods
going, Kueue's admission, a topology domain, a pod's own reason), and a MultiKueue copy whose pods this
cluster's Kueue counts a second time. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from dtjob.gang import kueue, placement
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import LauncherState, PodState


def counted_twice(spec: JobSpec, workers: Mapping[int, PodState], launcher: LauncherState) -> str:
    """A MultiKueue copy's pods this cluster's Kueue also admitted (its finalizer is on them): said as the job
    runs on."""
    if not spec.prebuilt_workload:
        return ""
    pods = {p.name: p for p in [*workers.values(), *([launcher.pod] if launcher.pod is not None else [])]}
    taken = sum(1 for p in pods.values() if p.kueue_finalizer)
    return f"; {kueue.counted_twice_message(taken)}" if taken else ""


def waiting_message(
    spec: JobSpec, workers: Mapping[int, PodState], missing: list[int], blocked: set[str]
) -> str:
    """Why a world that is not running yet waits, after how many of its workers are Ready."""
    ready = sum(1 for p in workers.values() if p.ready)
    text = f"{ready}/{spec.workers} workers ready"
    if blocked:
        return f"{text}; waiting for {len(blocked)} old pod(s) to terminate"
    if missing and workers:
        # A replacement. A new world's workers need no word: its Created condition says so, and a message
        # that changed once they exist would cost every job one more status write.
        return f"{text}; creating {len(missing)} worker pod(s)"
    # Required topology: a worker no node can take waits for the domain (Kueue's gate: for its admission).
    domain = placement.domain_wait(spec, spec.workers)
    gated = sum(1 for p in workers.values() if p.gated)
    if gated:
        said = kueue.gated_copy_message(gated) if spec.prebuilt_workload else kueue.gated_message(gated)
        return f"{text}; {said}" + (f"; {domain}" if domain else "")
    if domain and any(p.unschedulable for p in workers.values()):
        placed = sum(1 for p in workers.values() if p.scheduled)
        text = f"{text}; {placed} placed; {domain}"
    for index in sorted(workers):
        pod = workers[index]
        if not pod.ready and pod.reason:
            return f"{text}; {pod.name}: {pod.reason}"
    return text
