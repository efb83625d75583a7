"""Where a job's start went: each job's milestones, as the bench's watch saw them, cut into stages.

A job starts when the last of its pods runs. On the way it passes six stages, each ending at a milestone the
watch stamps: its workers exist (the operator), are on nodes (the scheduler), are Ready (the node), its launch
begins (the operator: mpi-operator makes the launcher Job, dtjob releases the launcher pod it made with the
world), the launcher's pod exists (mpi-operator's: the Job controller), and that pod runs (the scheduler and
the node). dtjob's pod, made with the world, can only be released once it and every worker are there: its two
stages are the operator's time from the later of those to the release, and how long past the workers' Ready
the pod came (none when it was there before, as it is unless the operator falls behind). The median job and
the slowest jobs are compared stage by stage, which says whose queue a tail of slow starts waited in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

STAGES = (
    ("workers created", "operator"),
    ("workers bound", "scheduler"),
    ("workers Ready", "node"),
    ("launch begun", "operator"),
    ("launcher pod", "Job controller; dtjob's"),
    ("launcher Running", "scheduler, node"),
)


@dataclass(frozen=True)
class JobTimeline:
    """One job's milestones, in seconds from the first create: when it was created, then when each stage
    of STAGES ended. `order` is its place among the creates (0 first)."""

    order: int
    created: float
    ends: tuple[float, ...]

    @property
    def start_s(self) -> float:
        return self.ends[-1] - self.created

    def stage_s(self) -> list[float]:
        begins = (self.created, *self.ends[:-1])
        return [end - begin for begin, end in zip(begins, self.ends, strict=True)]


def timelines(
    created: dict[str, float],
    members: dict[str, set[str]],
    pods: dict[str, float],
    bound: dict[str, float],
    ready: dict[str, dict[str, float]],
    launches: dict[str, float],
    running: dict[str, dict[str, float]],
    workers: int,
    origin: float,
) -> dict[str, JobTimeline]:
    """Every job whose every milestone was seen, timed from `origin`. A job's pods are `members[job]`; its
    launcher's pod is the one not named as a worker."""
    found: dict[str, JobTimeline] = {}
    for order, (job, at) in enumerate(created.items()):
        names = members.get(job, set())
        worker_pods = [pod for pod in names if "-worker-" in pod]
        launcher_pods = [pod for pod in names if "-worker-" not in pod]
        if len(worker_pods) < workers or len(launcher_pods) != 1 or len(ready.get(job, {})) < workers:
            continue
        launcher_pod = launcher_pods[0]
        if job not in launches or launcher_pod not in running.get(job, {}):
            continue
        if any(pod not in bound for pod in worker_pods):
            continue
        ready_at, launch, pod_at = max(ready[job].values()), launches[job], pods[launcher_pod]
        begun, made = launch, pod_at
        if pod_at <= launch:  # made before its launch (dtjob's, held): released once it and the workers were
            # there, so the pod's own part is how long past the workers' Ready it came
            made = launch
            begun = ready_at + launch - max(pod_at, ready_at)
        ends = (
            max(pods[pod] for pod in worker_pods),
            max(bound[pod] for pod in worker_pods),
            ready_at,
            begun,
            made,
            running[job][launcher_pod],
        )
        found[job] = JobTimeline(order, at - origin, tuple(end - origin for end in ends))
    return found


def report(jobs: dict[str, JobTimeline], slowest_share: float = 0.01) -> list[str]:
    """Lines comparing the median of each stage over every job with its mean over the slowest
    `slowest_share` of the jobs (at least one), and where those jobs came in the order of the creates."""
    if not jobs:
        return ["no job was seen through every stage"]
    ranked = sorted(jobs.values(), key=lambda job: job.start_s)
    slow = ranked[-max(1, round(len(ranked) * slowest_share)) :]
    stages = [timeline.stage_s() for timeline in ranked]
    slow_stages = [timeline.stage_s() for timeline in slow]
    lines = [f"{'stage (whose)':36s} {'p50 of all':>10s} {f'mean of slowest {len(slow)}':>20s}"]
    for index, (stage, whose) in enumerate(STAGES):
        median = statistics.median(row[index] for row in stages)
        slow_mean = statistics.fmean(row[index] for row in slow_stages)
        lines.append(f"{f'{stage} ({whose})':36s} {median:9.2f}s {slow_mean:19.2f}s")
    start_median = statistics.median(job.start_s for job in ranked)
    slow_start = statistics.fmean(job.start_s for job in slow)
    lines.append(f"{'job start':36s} {start_median:9.2f}s {slow_start:19.2f}s")
    places = sorted(job.order for job in slow)
    lines.append(f"the slowest {len(slow)} were created at places {places} of {len(ranked)}")
    return lines
