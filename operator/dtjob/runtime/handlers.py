"""kopf registrations: the operator's lifecycle (login, startup, cleanup), nothing per object.

The startup handler starts the watches (dtjob.runtime.child_watch): of the DistributedTrainingJobs, each
event one copy kept and one enqueue; of the children, pods and Jobs, once for the whole operator with a
server-side label selector (app.kubernetes.io/managed-by=dtjob-operator), so the API server streams only
our children; and of the FailedCreate Events. No per-job watches, no list calls per reconcile; the
controller lists each namespace's children once per resync to heal what the watches missed.

It also starts the leader election loop (when `dtjob operator` asks for it), whose Leadership fences every
write of the Kubernetes client, and the health endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from dtjob import KIND, PLURAL, metrics
from dtjob.azure.clients import Deadlines, set_default_deadlines
from dtjob.config import OperatorConfig, load_config
from dtjob.fence import Fence, Unfenced
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import connect
from dtjob.kube.credentials import Credentials, load_credentials
from dtjob.kube.leases import LeaseClient
from dtjob.reconcile.ensure import PARALLEL_CREATES
from dtjob.runtime import health
from dtjob.runtime.cached_kube import CachedKube
from dtjob.runtime.child_cache import CHILD_KINDS
from dtjob.runtime.child_watch import ChildWatch, Deliver, Watched
from dtjob.runtime.child_watch import children as child_watches
from dtjob.runtime.child_watch import scopes as watch_scopes
from dtjob.runtime.controller import CHILDREN_SELECTOR, Controller, reconcile_threads
from dtjob.runtime.election import Elector
from dtjob.runtime.failed_creates import FIELD_SELECTOR, event_projection
from dtjob.runtime.lease import Leadership
from dtjob.runtime.log_polls import LogPolls
from dtjob.spec.managed_by import handled_here, managed_by

# At shutdown, how long reconciles under way get to end (each ends at its next write once the fence is shut)
# before the Lease is released to the next replica.
SHUTDOWN_GRACE_S = 3.0
log = logging.getLogger(__name__)
# Why admission refused a launcher's or stager's pod, watched rather than read at each job start.
FAILED_CREATE_EVENTS = Watched("Event", "events", ("fieldSelector", FIELD_SELECTOR), event_projection)
# The jobs, whole: a reconcile reads its job from the copy the watch keeps.
JOBS = Watched(KIND, PLURAL, None, dict)


@dataclass(frozen=True)
class RunOptions:
    """What `dtjob operator` hands the startup handler (through kopf's memo, as `options`)."""

    liveness: str | None = None  # the health endpoint's URL; None: no endpoint
    lease_namespace: str | None = None  # leader election in this namespace; None: this replica always leads
    identity: str = ""  # this replica's name in the Lease
    namespaces: tuple[str, ...] = ()  # those served (globs allowed); empty: the whole cluster


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's own calls (the API's discovery at start) with the credentials the operator's client uses
    (dtjob.kube.credentials). kopf asks again after a 401, so a rotated ServiceAccount token is read anew."""
    found = load_credentials()
    username, password = found.basic_auth or (None, None)
    return kopf.ConnectionInfo(
        server=found.server,
        ca_path=found.ca_file,
        ca_data=found.ca_data.encode() if found.ca_data else None,
        insecure=found.insecure,
        token=found.token(),
        username=username,
        password=password,
        certificate_path=found.cert_file,
        private_key_path=found.key_file,
        default_namespace=found.namespace,
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf serves no resource: it need not watch CRDs or Namespaces for ones to serve.
    settings.scanning.disabled = True
    config = load_config()
    # kopf's own requests (the API's discovery at start): the same deadlines as ours.
    settings.networking.connect_timeout = config.kube_connect_timeout_seconds
    settings.networking.request_timeout = 2 * config.kube_timeout_seconds
    # Our own events describe every transition; kopf's chatter would only add noise.
    settings.posting.level = logging.WARNING
    # Blob Storage: the operator's deadlines for every client built in this process.
    set_default_deadlines(
        Deadlines(config.azure_connect_timeout_seconds, config.azure_timeout_seconds, config.azure_retries, 2)
    )
    options: RunOptions = memo.get("options") or RunOptions()
    # A connection for every thread that may call at once: each reconcile thread, and the parallel creates.
    pool = reconcile_threads(config) + PARALLEL_CREATES
    # Read once for the operator's clients: a kubeconfig's inline keys written once, an exec plugin run once.
    credentials = load_credentials()
    api = connect(
        config.kube_connect_timeout_seconds,
        config.kube_timeout_seconds,
        config.kube_retries,
        pool,
        credentials,
    )
    elector = _elector(options, config, credentials)
    fence: Fence = elector.leadership if elector is not None else Unfenced()
    polls = LogPolls(reads_per_second=config.progress_reads_per_second)
    kube = CachedKube(KubeClient(api, fence), api, polls=polls)
    controller = Controller(kube, config, leading=fence.leading, job_scopes=watch_scopes(options.namespaces))
    controller.start()
    memo["controller"] = controller
    memo["watches"] = _watches(options, config, credentials, controller)
    metrics.bind(controller.metrics_snapshot)
    if elector is not None:
        memo["elector"] = elector
        memo["election"] = asyncio.create_task(elector.run(controller.requeue_all), name="leader election")
    if options.liveness:
        try:
            memo["health"] = await health.serve(
                options.liveness, lambda: _liveness(controller), lambda: _readiness(elector, memo["watches"])
            )
        except OSError as err:  # the port is taken, say: no retry would help (kopf stops the operator)
            raise kopf.PermanentError(f"cannot serve health checks at {options.liveness}: {err}") from err


def _watches(
    options: RunOptions, config: OperatorConfig, credentials: Credentials, controller: Controller
) -> list[ChildWatch]:
    """The jobs' watch, the children's and the FailedCreate Events', started: their own connections (each
    watch holds one for minutes), no retries of their own."""
    api = connect(
        config.kube_connect_timeout_seconds, config.kube_timeout_seconds, 0, len(CHILD_KINDS) + 2, credentials
    )
    watches = [
        ChildWatch(api, options.namespaces, (JOBS,), job_seen(controller)),
        ChildWatch(api, options.namespaces, child_watches(CHILDREN_SELECTOR), controller.observe_child),
        ChildWatch(
            api, options.namespaces, (FAILED_CREATE_EVENTS,), controller.observe_failed_create,
            listed=controller.failed_creates_listed,
        ),
    ]  # fmt: skip
    for watch in watches:
        watch.start(asyncio.get_running_loop())
    return watches


def _elector(options: RunOptions, config: OperatorConfig, credentials: Credentials) -> Elector | None:
    if not options.lease_namespace:
        return None
    timings = config.election
    # The Lease's own client: no retries, deadlines within a round, so a slow API server costs one round.
    api = connect(timings.retry_period_s, 2 * timings.retry_period_s, 0, credentials=credentials)
    leases = LeaseClient(api, options.lease_namespace, config.lease_name)
    return Elector(leases, timings, Leadership(options.identity, timings.renew_deadline_s))


def _liveness(controller: Controller) -> dict[str, Any]:
    return {"queue": controller.depth, "reconciles": controller.reconciles, "skipped": controller.skipped}


def _readiness(elector: Elector | None, watches: Sequence[ChildWatch] = ()) -> tuple[bool, dict[str, Any]]:
    """Ready when leading, or standing by with a fresh read of the Lease (knowing who leads), and no kind
    refused by the API server wherever it is watched (RBAC written by hand): the operator would see none of
    its jobs, or of their children, while its pod looked Ready and a rollout went on. A refusal in some
    namespaces only is named here and logged, and leaves the replica ready: a namespace's admin who deletes
    the operator's RoleBinding there would otherwise take every replica out of the metrics Service and hold
    node drains and rollouts for the whole cluster."""
    refused = {where: said for watch in watches for where, said in watch.refused().items()}
    said: dict[str, Any]
    if elector is None:
        ready, said = True, {"leader": True, "leaderElection": False}
    else:
        status = elector.status()
        ready, said = status.leading or status.fresh, {**status.to_dict(), "leaderElection": True}
    if refused:
        said = {**said, "watchesRefused": refused}
    return ready and not any(watch.blind() for watch in watches), said


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    # Stop writing first, let reconciles under way end, and only then hand the Lease over.
    elector: Elector | None = memo.get("elector")
    election: asyncio.Task[None] | None = memo.get("election")
    if elector is not None:
        elector.resign()
    if election is not None:
        election.cancel()
    for watch in memo.get("watches") or ():
        watch.stop()
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        metrics.bind(None)
        await controller.stop(grace_s=SHUTDOWN_GRACE_S if elector is not None else 0.0)
    if elector is not None:
        await elector.release()
    runner = memo.get("health")
    if runner is not None:
        await runner.cleanup()


def job_seen(controller: Controller) -> Deliver:
    """What the jobs' watch hands each job to: the controller's copy of it, and its queue."""

    def seen(_plural: str, body: Mapping[str, Any], deleted: bool) -> None:
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not (namespace and name):
            return
        # A job another controller manages (spec.managedBy, immutable) is, to this operator, one that is not
        # there: never queued, never written, nothing created for it. MultiKueue's jobs are queued: their
        # reconcile creates the Workload (dtjob.reconcile.dispatch).
        foreign = not handled_here(body)
        if foreign and not deleted:
            log.debug("%s/%s is managed by %s: left alone", namespace, name, managed_by(body))
        controller.observe_job(
            (namespace, name), deleted=deleted or foreign, status=body.get("status"), body=body
        )

    return seen
