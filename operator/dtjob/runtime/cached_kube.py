"""The client as the controller hands it to reconciles: the thin client's verbs (dtjob.kube.client.Kube),
answered from the runtime's caches where they hold a recent answer, and the LIST that corrects the
children's cache. The client itself keeps nothing; these caches are the runtime's:
- the job copies (dtjob.runtime.job_cache): a reconcile reads its job from the watch's copy, and its own
  status patch goes in at once (write-through);
- the node lists (a TtlCache by selector): every new job's preflight reads its pool, and a burst of jobs
  would list (and decode) the same nodes once each;
- the Namespaces' list (their names and dtjob.io annotations): every SAS minted reads every namespace's
  storage lists;
- the log polls' memory (dtjob.runtime.log_polls);
- the API versions served of a group (Kueue's, for its Workloads): an upgrade of Kueue is seen within minutes;
- the children it creates or patches, pods, batch Jobs and EndpointSlices, handed at once to
  `children_written` (the controller puts them in its children cache): the next reconcile of their job sees
  them even when their watch events are still on the way, so it neither creates them again, nor reports them
  missing, nor writes a slice's hosts twice.
"""

from __future__ import annotations

import builtins
import threading
import zlib
from collections.abc import Callable, Generator, Mapping
from datetime import datetime
from typing import Any, Protocol

from dtjob import API_GROUP, KIND
from dtjob.kube.client import Forbidden, Keep, Kube
from dtjob.kube.connect import ApiClient
from dtjob.kube.rest import METADATA_ONLY, Json, list_pages
from dtjob.machine.results_later import HELD_STATE_WARNINGS
from dtjob.reconcile.reads import PollsLogs
from dtjob.runtime.child_cache import CHILD_KINDS, projection
from dtjob.runtime.job_cache import JobCache
from dtjob.runtime.log_polls import LogPolls
from dtjob.runtime.ttl_cache import TtlCache

# How long a node list may be reused: nodes come and go in minutes (the autoscaler), jobs in bursts.
NODE_LIST_TTL_S = 10.0
# Locks that keep a burst of jobs from listing the same pool at once, shared by the selectors of a stripe.
NODE_LIST_LOCK_STRIPES = 64
# How long the Namespaces' list may be reused: a cluster admin's change to a namespace's storage lists reaches
# the other namespaces' checks at most this much later.
NAMESPACE_LIST_TTL_S = 30.0
# How long an API group's served versions are reused: Kueue installed or upgraded is seen this much later.
SERVED_VERSIONS_TTL_S = 120.0
# A Warning of a state that holds (a results record that names another run: HELD_STATE_WARNINGS) the same as
# one posted about the same job within this long is not posted again: the state is decided anew at every
# resync, and would say so every minute, a new Event each time. Every other Event tells of something that
# happened (a worker lost, the world restarted), each time it happens.
EVENT_REPEAT_S = 600.0
EVENTS_REMEMBERED = 10_000
# How long what storage answered a look for a run's results is reused: a new record (another upload) is a
# new look at once; the same one is looked for again this much later.
RESULTS_LOOK_REUSE_S = 300.0
RESULTS_LOOKS_REMEMBERED = 1_000
# How long a job's cached copy serves without a watch event, a write or a LIST confirming it.
JOB_COPY_MAX_AGE_S = 60.0
# How often the copies are confirmed by a LIST of the jobs' metadata: well within their age, so a job
# reconciled at any time finds its copy confirmed.
JOB_COPIES_CONFIRMED_EVERY_S = JOB_COPY_MAX_AGE_S / 3
# A forbidden list is remembered too: asking again would not help.
ListAnswer = builtins.list[Json] | Forbidden


class ControllerKube(Kube, PollsLogs, Protocol):
    """What the controller calls besides what its reconciles call: the LIST that corrects its cache, the
    watch's copies of jobs, and (for the metrics) the spacing of the log polls (PollsLogs)."""

    def list_children(self, namespace: str, label_selector: str) -> builtins.list[tuple[str, Json]]: ...
    def remember_job(self, body: Mapping[str, Any]) -> None:
        """A job as a watch event showed it: a reconcile's read of it may be answered with it."""

    def forget_job(self, namespace: str, name: str) -> None: ...

    def confirm_jobs(self, namespace: str | None) -> builtins.list[tuple[str, str]]:
        """The job copies of `namespace` (None: all) confirmed by one LIST; returns the jobs it found gone."""

    def is_settled(self, namespace: str, name: str, version: str) -> bool:
        """Whether the job at `version` is a status write of a reconcile that left it settled."""

    children_written: Callable[[str, Json], None] | None


class CachedKube:
    """A ControllerKube over `kube` (the client of `api_client`), with the runtime's caches."""

    def __init__(
        self,
        kube: Kube,
        api_client: ApiClient,
        jobs: JobCache | None = None,
        node_lists: TtlCache[str, ListAnswer] | None = None,
        polls: LogPolls | None = None,
        namespace_list: TtlCache[str, ListAnswer] | None = None,
    ) -> None:
        self.kube = kube
        self.api_client = api_client  # the children's LISTs, projected page by page
        # `is None`, not `or`: an empty cache is falsy (it has a length).
        self.jobs = JobCache(JOB_COPY_MAX_AGE_S) if jobs is None else jobs
        self.node_lists: TtlCache[str, ListAnswer] = (
            TtlCache(NODE_LIST_TTL_S) if node_lists is None else node_lists
        )
        self.namespace_list: TtlCache[str, ListAnswer] = (
            TtlCache(NAMESPACE_LIST_TTL_S) if namespace_list is None else namespace_list
        )
        self._namespace_list_lock = threading.Lock()
        self.polls = LogPolls() if polls is None else polls
        self.served: TtlCache[str, builtins.list[str]] = TtlCache(SERVED_VERSIONS_TTL_S, max_entries=8)
        self.events_posted: TtlCache[tuple[str, str, str, str], bool] = TtlCache(
            EVENT_REPEAT_S, max_entries=EVENTS_REMEMBERED
        )
        self.looks: TtlCache[tuple[str, ...], Any] = TtlCache(
            RESULTS_LOOK_REUSE_S, max_entries=RESULTS_LOOKS_REMEMBERED
        )
        # (the cache's kind, the object as written): set by the controller, called in the reconcile's thread.
        self.children_written: Callable[[str, Json], None] | None = None
        # One lock per stripe of selectors, not per selector: selectors come from jobs' specs, and a lock
        # kept for every selector ever seen would grow without end.
        self._node_list_locks = tuple(threading.Lock() for _ in range(NODE_LIST_LOCK_STRIPES))

    # --- served from the caches ----------------------------------------------------------------------

    def get(self, kind: str, namespace: str | None, name: str, api_version: str | None = None) -> Json | None:
        if kind != KIND or namespace is None:
            return self.kube.get(kind, namespace, name, api_version)
        cached = self.jobs.get(namespace, name)
        if cached is not None:
            return cached
        job = self.kube.get(kind, namespace, name, api_version)
        if job is None:
            self.jobs.forget(namespace, name)
        else:
            self.jobs.put(job)
        return job

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, api_version: str | None = None
    ) -> Json | None:
        answer = self.kube.patch(kind, namespace, name, body, api_version)
        if kind == f"{KIND}/status" and answer is not None:
            self.jobs.put(answer)  # the next reconcile decides from this status, not the watch's older one
        self._written(kind, answer)
        return answer

    def list(
        self, kind: str, namespace: str | None, labels: str = "", fields: str = "", limit: int | None = None,
        cached: bool = False, keep: Keep | None = None,
    ) -> builtins.list[Json]:  # fmt: skip
        if kind == "Namespace" and cached and not (labels or fields or limit is not None):
            return self._namespaces()
        if kind != "Node" or namespace is not None or fields or limit is not None or keep is not None:
            return self.kube.list(kind, namespace, labels, fields, limit, cached, keep)
        # One list per selector at a time: a burst of new jobs would otherwise list the same pool once per
        # reconcile thread before the first answer is cached.
        stripe = zlib.crc32(labels.encode()) % len(self._node_list_locks)
        with self._node_list_locks[stripe]:
            if cached and (kept := self.node_lists.get(labels)) is not None:
                return _answer(kept)
            try:
                nodes: ListAnswer = [
                    node_projection(n) for n in self.kube.list("Node", None, labels, cached=cached)
                ]
            except Forbidden as err:
                nodes = err
            self.node_lists.put(labels, nodes)
            return _answer(nodes)

    def _namespaces(self) -> builtins.list[Json]:
        """Every Namespace's name and dtjob.io annotations, listed once per NAMESPACE_LIST_TTL_S."""
        with self._namespace_list_lock:  # a burst of mints lists them once
            kept = self.namespace_list.get("")
            if kept is None:
                try:
                    kept = [namespace_projection(n) for n in self.kube.list("Namespace", None, cached=True)]
                except Forbidden as err:
                    kept = err
                self.namespace_list.put("", kept)
            return _answer(kept)

    def poll_log(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int, every_s: float
    ) -> str | None:
        """read_log()'s tail, or None when this pod's container was polled less than `every_s` ago."""
        if not self.polls.due((namespace, pod, container), every_s):
            return None
        return self.kube.read_log(namespace, pod, container, tail_lines, limit_bytes)

    def remember_job(self, body: Mapping[str, Any]) -> None:
        self.jobs.put(body)

    def forget_job(self, namespace: str, name: str) -> None:
        self.jobs.forget(namespace, name)

    def confirm_jobs(self, namespace: str | None) -> builtins.list[tuple[str, str]]:
        if not len(self.jobs):
            return []
        since = self.jobs.now()
        listed, _ = list_pages(self.api_client, KIND, namespace, (), _job_identity, METADATA_ONLY)
        return self.jobs.confirm(namespace, listed, since)

    def log_read_spacing(self, every_s: float) -> float:
        return self.polls.interval(every_s)

    def log_read_in(self, namespace: str, pod: str, container: str, after_s: float) -> float | None:
        return self.polls.read_in((namespace, pod, container), after_s)

    def job_settled(self, namespace: str, name: str, version: str) -> None:
        self.jobs.settle(namespace, name, version)

    def is_settled(self, namespace: str, name: str, version: str) -> bool:
        return self.jobs.settled(namespace, name, version)

    def list_children(self, namespace: str, label_selector: str) -> builtins.list[tuple[str, Json]]:
        """Every child in `namespace` matching the selector, as (its kind in the cache, the cache's projection
        of it): one consistent read per kind, for the children cache's resync."""
        query = [("labelSelector", label_selector)]
        return [
            (plural, item)
            for kind, plural in CHILD_KINDS.items()
            for item in list_pages(self.api_client, kind, namespace, query, projection)[0]
        ]

    # --- passed through ------------------------------------------------------------------------------

    def create(self, obj: Json) -> Json | None:
        created = self.kube.create(obj)
        self._written(obj["kind"], created)
        return created

    def _written(self, kind: str, answer: Json | None) -> None:
        """A child as the API server answered its create or patch, into the children's cache."""
        plural = CHILD_KINDS.get(kind)
        if answer is not None and plural is not None and self.children_written is not None:
            self.children_written(plural, answer)

    def replace(self, obj: Json, resource_version: str) -> None:
        self.kube.replace(obj, resource_version)

    def delete(
        self, kind: str, namespace: str, name: str, api_version: str | None = None, uid: str | None = None,
        grace_period_s: int | None = None, background: bool = False,
    ) -> bool:  # fmt: skip
        return self.kube.delete(kind, namespace, name, api_version, uid, grace_period_s, background)

    def read_log(
        self, namespace: str, pod: str, container: str, tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:  # fmt: skip
        return self.kube.read_log(namespace, pod, container, tail_lines, limit_bytes)

    def stream_log(self, namespace: str, pod: str, container: str) -> Generator[bytes, None, None]:
        return self.kube.stream_log(namespace, pod, container)

    def served_versions(self, group: str) -> builtins.list[str]:
        versions = self.served.get(group)
        if versions is None:
            versions = self.kube.served_versions(group)
            self.served.put(group, versions)
        return versions

    def emit_event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        if reason not in HELD_STATE_WARNINGS:
            self.kube.emit_event(obj, kind, reason, message, now)
            return
        key = (str((obj.get("metadata") or {}).get("uid") or ""), kind, reason, message)
        if not self.events_posted.get(key):
            self.kube.emit_event(obj, kind, reason, message, now)
            self.events_posted.put(key, True)

    def check_leader(self) -> None:
        self.kube.check_leader()


def _answer(items: ListAnswer) -> builtins.list[Json]:
    if isinstance(items, Forbidden):
        raise items
    return builtins.list(items)  # a copy of the list: callers must not change the items themselves


def _job_identity(job: Mapping[str, Any]) -> Json:
    meta = job.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid", "resourceVersion")}}


def node_projection(node: Mapping[str, Any]) -> Json:
    """Only what the checks read of a node: its name, labels, schedulability, taints, resources and the
    conditions set True (what the node problem detector says), each without its heartbeat."""
    meta, spec, status = (node.get(part) or {} for part in ("metadata", "spec", "status"))
    conditions = [
        {k: c.get(k) for k in ("type", "status", "message", "lastTransitionTime")}
        for c in status.get("conditions") or ()
        if c.get("status") == "True"
    ]
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "capacity": status.get("capacity") or {},
            "conditions": conditions,
        },
    }


def namespace_projection(namespace: Mapping[str, Any]) -> Json:
    """Only what the storage lists read of a Namespace: its name and the dtjob.io annotations."""
    meta = namespace.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    ours = {k: v for k, v in annotations.items() if k.startswith(f"{API_GROUP}/")}
    return {"metadata": {"name": meta.get("name"), "annotations": ours}}
