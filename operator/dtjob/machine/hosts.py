"""What the job's headless Service publishes: exactly the operator's own MPI hosts of the current world. Pure.

Level-triggered like the rest: the Service's EndpointSlice, as the watch cache holds it, is compared with the
hosts the observed pods make (dtjob.desired.hosts) and written when they differ. A world advancing decides it
before its launcher, so the launcher never starts against a name that does not resolve yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dtjob import names
from dtjob.desired.hosts import mpi_hosts
from dtjob.machine.builder import Builder
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import PublishHosts, RetireSelector
from dtjob.state.observed import Observed, PodState


def world_hosts(
    spec: JobSpec, observed: Observed, workers: Mapping[int, PodState], attempt: int
) -> list[PodState]:
    """The current world's MPI hosts: its workers, and its launcher's pod when the launcher runs ranks. An
    elastic world's worker whose node cannot keep it is left out: Horovod's host discovery drops it, and its
    ranks leave the world at their next commit, before the pod goes (a fixed world restarts instead)."""
    hosts = [p for p in workers.values() if spec.elastic is None or p.node_problem is None]
    if spec.launcher.run_as_worker:
        hosts += [p for p in observed.pods if p.role == names.ROLE_LAUNCHER and p.attempt == attempt]
    return hosts


def publish_hosts(b: Builder, spec: JobSpec, observed: Observed, pods: Iterable[PodState] = ()) -> None:
    """Bring the Service's EndpointSlice to `pods` (none: a world that has ended or is suspended publishes
    nothing, so no name of the job resolves to an address another pod may be given next). A Service that
    Kubernetes' controller still publishes by label has its selector taken off first."""
    published = observed.published
    if published.stale:
        b.actions.append(RetireSelector(published.stale))
    want = mpi_hosts(spec, pods)
    if want != (published.hosts or ()):
        b.actions.append(PublishHosts(want, published=published.hosts is not None))
