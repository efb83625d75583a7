"""A work queue of job keys, like controller-runtime's: events enqueue, a few workers reconcile.

Every watch event (the job itself, one of its pods, its staging Job) only enqueues the job's key; the key is
deduplicated while waiting and never reconciled twice at the same time, and a child's event waits a quarter
of a second for the rest of its burst, so a burst of pod events for one job costs one reconcile. A pod turning
Ready that makes every worker of its job Ready puts the job in the queue's urgent lane (dtjob.runtime.lanes)
at once (at most once in ten seconds for a job): a job whose last worker turned Ready gets its launcher
without waiting behind every job created after it. Reconciles read pods and Jobs from the children cache
(dtjob.runtime.child_cache), not from the API: watch
events keep it current, and a LIST of each namespace's children, before its first reconcile and then every
`resync_seconds`, corrects it, so that a missed event (a deletion during a watch outage) heals by the next
resync at the latest.

With leader election, every replica feeds its queue and its cache from the same watches, but only the leader
dispatches: a standby drops each key it takes from the queue, and a reconcile that finds leadership gone part
way (NotLeader from the fenced client) ends quietly, requeueing nothing. A replica that becomes the leader
requeues every job it knows, so jobs mid-flight go on from where the API server says they are.

A watchdog keeps hung jobs from starving the rest: a reconcile still running after `reconcile_slow_seconds`
(a storage endpoint that never answers, an API call waiting out its timeout) is left to finish on its own
thread while its worker takes the next job. Its job stays locked until it ends. Every call it makes has a
deadline, so it does end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from dtjob import metrics, names
from dtjob.config import OperatorConfig
from dtjob.fence import NotLeader
from dtjob.kube.client import Conflict, Kube
from dtjob.reconcile.job import Children, reconcile
from dtjob.reconcile.reads import get_job, progress_read_gap
from dtjob.redaction import redact
from dtjob.runtime import heap, job_copies
from dtjob.runtime.cached_kube import ControllerKube
from dtjob.runtime.child_cache import PODS, ChildCache
from dtjob.runtime.lanes import Lanes

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, job name)
ChildrenOf = Callable[[Key], Children]
# reconcile(kube, config, namespace, name, children) -> seconds until the next look, or None. Injected so that
# the queue's rules can be tested with a stub.
ReconcileFn = Callable[[Kube, OperatorConfig, str, str, Children], float | None]
MAX_BACKOFF_S = 60.0
# How long a child's event waits for the others of its burst (a world's pods are created, scheduled and
# started together) before its job is reconciled: one reconcile and one status write instead of one each.
CHILD_EVENTS_BATCH_S = 0.25
# How many slow reconciles each worker may leave running behind it; past that, workers wait for them.
SLOW_PER_WORKER = 3
# The children the cache holds: what the operator created (the same selector its watches use).
CHILDREN_SELECTOR = f"app.kubernetes.io/managed-by={names.MANAGED_BY},{names.JOB_NAME_LABEL}"


def reconcile_threads(config: OperatorConfig) -> int:
    """The most reconciles running at once: each worker's, and the slow ones it may leave behind."""
    return config.reconcile_workers * (1 + SLOW_PER_WORKER)


def backoff(failures: int) -> float:
    """Seconds before retrying a job whose reconcile failed `failures` times in a row: 2, 4, 8... up to 60."""
    return min(2.0**failures, MAX_BACKOFF_S)


class Controller:
    def __init__(
        self,
        kube: ControllerKube,
        config: OperatorConfig,
        reconcile_fn: ReconcileFn = reconcile,
        leading: Callable[[], bool] = lambda: True,
        job_scopes: Sequence[str | None] = (None,),
    ) -> None:
        self.kube = kube
        # Where the job copies are confirmed by a LIST: the namespaces served, or (None) the whole cluster.
        self.job_scopes = job_scopes
        self.config = config
        self.reconcile_fn = reconcile_fn
        self.leading = leading  # whether this replica may reconcile now (leader election)
        self.known: set[Key] = set()
        # What each known job's status says that the metrics show (phase, progress, staging), from its events.
        self.summaries: dict[Key, metrics.JobSummary] = {}
        self.cache = ChildCache()
        self.children_of: ChildrenOf = self.cache.children
        self._loop: asyncio.AbstractEventLoop | None = None
        kube.children_written = self.child_written
        self._listed: set[str] = set()  # namespaces whose children were listed at least once
        self._list_locks: dict[str, asyncio.Lock] = {}
        self._queue: Lanes[Key] = Lanes()
        self._waiting_since: dict[
            Key, float
        ] = {}  # monotonic time each waiting key (queued or dirty) arrived
        self._active: set[Key] = set()
        self._dirty: dict[Key, bool] = {}  # keys to run once more when their reconcile ends -> urgent
        # Versions of a job that its watch brought while it was reconciled (the reconcile's own status write
        # among them, when the watch was quick): once it ends, any it did not leave settled runs it again.
        self._seen_while_active: dict[Key, list[str]] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._runs: set[asyncio.Task[None]] = set()  # every reconcile under way
        self._slow: set[asyncio.Task[None]] = set()  # those the watchdog left behind
        # Threads of our own: asyncio's default pool has only cpu_count + 4, and slow reconciles hold theirs.
        self._threads = ThreadPoolExecutor(
            max_workers=reconcile_threads(config), thread_name_prefix="reconcile"
        )
        self.reconciles = 0  # completed ones; reported by the liveness endpoint
        self.skipped = 0  # keys dropped while standing by; reported by the liveness endpoint too

    # --- feeding the queue ---------------------------------------------------------------------------

    def enqueue(self, key: Key, delay: float = 0.0, urgent: bool = False) -> None:
        if delay > 0:
            loop = asyncio.get_running_loop()
            old = self._timers.get(key)
            due = loop.time() + delay
            if old is not None and old.when() <= due:
                return  # an earlier wake-up is already set
            if old is not None:
                old.cancel()
            self._timers[key] = loop.call_at(due, self._fire, key)
            return
        # Now supersedes a wake-up set for later: the reconcile sets the next one it needs.
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._waiting_since.setdefault(key, time.monotonic())
        if key in self._active:
            self._dirty[key] = self._dirty.get(key, False) or urgent
        else:
            self._queue.put(key, urgent)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.enqueue(key)

    def observe_child(self, kind: str, body: Mapping[str, Any], deleted: bool) -> None:
        """A watch event of a child (a pod, a batch Job, an EndpointSlice): into the cache, and its job into
        the queue, at once and ahead of the others when it made every worker Ready (the launcher may start),
        else after CHILD_EVENTS_BATCH_S, so that the burst of events a world's pods send costs one
        reconcile."""
        turns_ready = kind == PODS and not deleted and self.cache.turns_ready(body)
        key = self.cache.observe(kind, body, deleted)
        if key is None:
            return
        # Only a job that exists goes ahead: pods labelled with made-up job names get no turns of their own.
        if turns_ready and key in self.known and self.cache.goes_ahead(key):
            self.enqueue(key, urgent=True)
        else:
            self.enqueue(key, CHILD_EVENTS_BATCH_S)

    def observe_failed_create(self, _plural: str, body: Mapping[str, Any], deleted: bool) -> None:
        """A watch event of a batch Job's FailedCreate Event: the job that owns that Job looks again, after
        CHILD_EVENTS_BATCH_S as for a child's event."""
        key = self.cache.observe_failed_create(body, deleted)
        if key is not None:
            self.enqueue(key, CHILD_EVENTS_BATCH_S)

    def failed_creates_listed(self, _plural: str, scope: str | None, listed: list[dict[str, Any]]) -> None:
        """A LIST of the FailedCreate Events of `scope` (a namespace, None: every namespace)."""
        for key in self.cache.replace_failed_creates(scope, listed):
            self.enqueue(key, CHILD_EVENTS_BATCH_S)

    async def relist(self, namespace: str, first: bool = False) -> set[Key]:
        """Correct the cache from a LIST of the namespace's children; returns the jobs whose children
        changed. Only one LIST of a namespace at a time; `first`: none if one was already done."""
        async with self._list_locks.setdefault(namespace, asyncio.Lock()):
            if first and namespace in self._listed:
                return set()
            before = self.cache.uids(namespace)
            listed = await asyncio.get_running_loop().run_in_executor(
                self._threads, self.kube.list_children, namespace, CHILDREN_SELECTOR
            )
            changed = self.cache.replace(namespace, listed, before)
            self._listed.add(namespace)
        if changed:
            log.info("resync of %s: the children of %s changed without a watch event", namespace,
                     ", ".join(sorted(name for _, name in changed)))  # fmt: skip
        return changed

    def observe_job(
        self,
        key: Key,
        deleted: bool,
        status: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """A watch event of a job; `status` is its status as the event carried it, `body` the whole job
        (which reconciles then read from the client's copy instead of the API)."""
        if deleted:
            self.kube.forget_job(*key)
            self.known.discard(key)
            self.summaries.pop(key, None)
            self._failures.pop(key, None)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        else:
            if body is not None:
                self.kube.remember_job(body)
            self.known.add(key)
            self.summaries[key] = metrics.job_summary(status)
            version = _version_of(body)
            if version is not None and key in self._active:
                self._seen_while_active.setdefault(key, []).append(version)
            elif version is None or not self.kube.is_settled(*key, version):
                self.enqueue(key)
            # else: the echo of the operator's own status write, after which the job needed nothing more

    def requeue_all(self) -> None:
        """Every known job into the queue: this replica has just become the leader."""
        log.info("requeueing all %d known job(s)", len(self.known))
        for key in sorted(self.known):
            self.enqueue(key)

    def due_in(self, key: Key) -> float | None:
        """Seconds until the job's timer fires (a requeue, a retry after a failure), None if none is set."""
        timer = self._timers.get(key)
        return None if timer is None else max(0.0, timer.when() - asyncio.get_running_loop().time())

    @property
    def depth(self) -> int:
        return len(self._queue) + len(self._active)

    def metrics_snapshot(self) -> metrics.Snapshot:
        """The state the metrics show; called from the metrics server's thread, so it only copies (a dict's
        copy() is atomic under the GIL, while the event loop may change it meanwhile) or asks what locks."""
        waiting = self._waiting_since.copy()
        oldest = min(waiting.values(), default=None)
        return metrics.Snapshot(
            jobs=self.summaries.copy(),
            queue_waiting=len(waiting),
            queue_active=len(self._active),
            queue_oldest_s=0.0 if oldest is None else max(0.0, time.monotonic() - oldest),
            leading=self.leading(),
            progress_read_spacing_s=self.kube.log_read_spacing(
                progress_read_gap(self.config.progress_seconds)
            ),
        )

    # --- running -------------------------------------------------------------------------------------

    def child_written(self, kind: str, body: Mapping[str, Any]) -> None:
        """A child a reconcile has just created or patched, from its thread: into the cache on the event loop,
        where the watch events go, without enqueueing anything (its watch event will, when it changes
        something)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.cache.observe, kind, dict(body), False)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.config.reconcile_workers)]
        self._tasks.append(asyncio.create_task(self._resync()))
        gone = functools.partial(self.observe_job, deleted=True)  # deleted while its watch was down
        confirming = job_copies.keep_confirmed(self.kube, self.job_scopes, self.leading, self._threads, gone)
        self._tasks.append(asyncio.create_task(confirming))
        if self.config.heap_trim_seconds > 0:
            self._tasks.append(asyncio.create_task(self._trim_heap()))

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop the workers; reconciles under way get up to `grace_s` to end first (after a step-down each
        ends at its next write)."""
        if grace_s > 0 and self._runs:
            await asyncio.wait(set(self._runs), timeout=grace_s)
        tasks = [*self._tasks, *self._runs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for timer in self._timers.values():
            timer.cancel()
        # Threads still in a call end at its deadline; nothing waits for them here.
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _resync(self) -> None:
        # A safety net for missed events: the children listed again, every job reconciled (deadlines and
        # TTLs have their own timers).
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            for namespace in sorted({ns for ns, _ in self.known} | self.cache.namespaces()):
                try:
                    await self.relist(namespace)
                except Exception as error:  # the API is down, say: the next resync tries again
                    log.warning("could not list the children in %s for the resync: %s", namespace, error)
            for key in list(self.known):
                self.enqueue(key)

    async def _trim_heap(self) -> None:
        # After a burst the process keeps the burst's peak resident; once the queue has drained, the freed
        # heap goes back (a few ms; skipped while busy, where it would only grow again).
        while True:
            await asyncio.sleep(self.config.heap_trim_seconds)
            if self.depth == 0 and not self._runs:
                heap.give_back_free_heap()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._waiting_since.pop(key, None)
            if key not in self.known:
                continue
            if not self.leading():
                self.skipped += 1  # standing by: the leader reconciles it; requeue_all() brings it back
                continue
            self._active.add(key)
            run = asyncio.create_task(self._run(key))
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
            done, _ = await asyncio.wait({run}, timeout=self.config.reconcile_slow_seconds)
            if done:
                continue
            if len(self._slow) < SLOW_PER_WORKER * self.config.reconcile_workers:
                log.warning("reconcile of %s/%s still running after %.0fs; its worker moves on to other jobs",
                            *key, self.config.reconcile_slow_seconds)  # fmt: skip
                self._slow.add(run)
                run.add_done_callback(self._slow.discard)
            else:
                await asyncio.wait({run})

    async def _run(self, key: Key) -> None:
        try:
            await self._reconcile(key)
        finally:
            self._active.discard(key)
            urgent = self._dirty.pop(key, None)
            seen = self._seen_while_active.pop(key, ())
            if urgent is None and any(not self.kube.is_settled(*key, version) for version in seen):
                urgent = False
            if urgent is not None:
                self.enqueue(key, urgent=urgent)

    async def _reconcile(self, key: Key) -> None:
        namespace, name = key
        try:
            if namespace not in self._listed:
                await self.relist(namespace, first=True)  # the watch may not have delivered them all yet
            # Snapshot the cache on the event loop: the watch events update it there.
            children = self.children_of(key)
            call = functools.partial(self._timed, namespace, name, children)
            requeue = await asyncio.get_running_loop().run_in_executor(self._threads, call)
            self.reconciles += 1
        except NotLeader:
            log.debug("reconcile of %s/%s stopped: this replica no longer leads", namespace, name)
            return
        except Conflict as conflict:
            metrics.reconcile_failed(conflict)
            self.enqueue(key, 0.2)
            return
        except Exception as error:
            metrics.reconcile_failed(error)
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = backoff(failures)
            log.exception("reconcile of %s/%s failed (attempt %d); retrying in %.0fs", namespace, name,
                          failures, delay)  # fmt: skip
            if failures == 1:  # once per streak: the job's events say why it is stuck, not only our log
                await asyncio.get_running_loop().run_in_executor(
                    self._threads, self._report_error, key, delay, error
                )
            self.enqueue(key, delay)
            return
        self._failures.pop(key, None)
        if requeue is not None:
            self.enqueue(key, requeue)

    def _timed(self, namespace: str, name: str, children: Children) -> float | None:
        """The reconcile, in its worker thread, its duration recorded (failed ones too)."""
        start = time.perf_counter()
        try:
            return self.reconcile_fn(self.kube, self.config, namespace, name, children)
        finally:
            metrics.RECONCILE_DURATION.observe(time.perf_counter() - start)

    def _report_error(self, key: Key, delay: float, error: Exception) -> None:
        try:
            job = get_job(self.kube, *key)
            if job is not None:
                # Storage errors may quote a signed URL: never let a SAS signature into an event.
                text = redact(f"reconcile failed, retrying in {delay:.0f}s: {type(error).__name__}: {error}")
                self.kube.emit_event(job, "Warning", "ReconcileError", text, datetime.now(UTC))
        except Exception:  # reporting is best effort; the retry is what matters
            log.debug("could not report the reconcile error of %s/%s", *key, exc_info=True)


def _version_of(body: Mapping[str, Any] | None) -> str | None:
    version = (body or {}).get("metadata", {}).get("resourceVersion")
    return version if isinstance(version, str) else None
