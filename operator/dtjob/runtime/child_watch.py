"""The operator's watches: of the DistributedTrainingJobs, of its children (pods, batch Jobs and
EndpointSlices) and of the FailedCreate Events of batch Jobs, each a LIST, then a WATCH from the list's
resourceVersion, every object handed to the controller on the event loop.

kopf, which once watched them, runs every event through its handler machinery (per-object memories, patches,
loggers, throttlers, the handler's invocation). Profiled under a burst of jobs, that took two fifths of the
operator's CPU for the children, more than the reconciles themselves, and a tenth for the jobs' own events.
Here an event is decoded and delivered, nothing more; kopf runs only the operator's lifecycle.

One thread per kind and namespace (one per kind when the operator serves the whole cluster), each:
- LISTs the objects (a server-side label or field selector), delivers every item (or the whole list at
  once, to a watch that keeps no resync of its own), and watches from the list's resourceVersion with
  bookmarks, so that an idle watch restarts where it was;
- when the API server answers 410 Gone (the version is too old), LISTs again. Objects deleted meanwhile send
  no event, so the controller's own periodic LIST of each namespace (ChildCache.replace) heals that;
- on any other failure (connection lost, the API server down) waits, backing off up to MAX_BACKOFF_S, and
  watches again from the last version it saw.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob.kube import wire
from dtjob.kube.connect import ApiClient
from dtjob.kube.errors import ApiError
from dtjob.kube.rest import api_call, list_pages
from dtjob.runtime.child_cache import CHILD_KINDS, projection

log = logging.getLogger(__name__)
Json = dict[str, Any]
# deliver(plural, object, deleted): called on the event loop for every object seen.
Deliver = Callable[[str, Json, bool], None]
# listed(plural, namespace or None for the whole cluster, objects): called on the event loop with a LIST's
# objects, all at once, where the watch is given one.
Listed = Callable[[str, str | None, list[Json]], None]
WATCH_SERVER_TIMEOUT_S = 300  # the API server ends each watch by then, and the loop watches again
WATCH_READ_TIMEOUT_S = 330  # a connection silent for this long (no event, no bookmark) is dead
MAX_BACKOFF_S = 30.0
# Events handed to the event loop and not yet taken in: past this many a watch thread waits for it, so that a
# loop behind a burst (a thousand jobs starting) holds a bounded backlog, not every event of the burst.
MAX_IN_FLIGHT = 500


@dataclass(frozen=True)
class Watched:
    """One kind the watch follows: which objects (a labelSelector or a fieldSelector), and the part of each
    that is kept."""

    kind: str
    plural: str
    selector: tuple[str, str] | None  # (the query parameter, its value); None: every object of the kind
    project: Callable[[Mapping[str, Any]], Json]


def children(selector: str) -> tuple[Watched, ...]:
    """The operator's children under a label selector, projected for the children's cache."""
    query = ("labelSelector", selector)
    return tuple(Watched(kind, plural, query, projection) for kind, plural in CHILD_KINDS.items())


class Gone(Exception):
    """410: the resourceVersion is older than the API server keeps; LIST again."""


def _is_pattern(namespace: str) -> bool:
    return any(char in namespace for char in "*?[")


def scopes(namespaces: Sequence[str]) -> list[str | None]:
    """What a watch or LIST of the namespaces served covers: each literal namespace, or (None) the whole
    cluster where none is named or a glob is."""
    return [None] if not namespaces or any(_is_pattern(ns) for ns in namespaces) else list(namespaces)


class ChildWatch:
    """`namespaces`: those served, as `dtjob operator --namespace` names them (globs allowed), or empty for
    the whole cluster. A LIST's objects go to `listed` where one is given, else one by one to `deliver`."""

    def __init__(
        self,
        api_client: ApiClient,
        namespaces: Sequence[str],
        watched: Sequence[Watched],
        deliver: Deliver,
        listed: Listed | None = None,
    ) -> None:
        self.api_client = api_client
        # Literal namespaces get a watch each; a glob needs the whole cluster's, filtered here.
        self.whole_cluster = scopes(namespaces) == [None]
        self.namespaces = list(namespaces)
        self.deliver = deliver
        self.listed = listed
        self.watched = list(watched)
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._loop: asyncio.AbstractEventLoop | None = None
        # What the API server refuses to list or watch (403: RBAC written by hand, a Role missing from a
        # namespace), by where, until a watch there is accepted (dtjob.runtime.handlers reads it).
        self._refused: dict[str, str] = {}
        self._refused_lock = threading.Lock()

    def refused(self) -> dict[str, str]:
        """Where (`pods in team-a`) the API server refuses this watch now, and what it said."""
        with self._refused_lock:
            return dict(self._refused)

    def blind(self) -> bool:
        """Whether some kind is refused everywhere it is watched: the operator sees none of it. A refusal in
        some namespaces only (a Role missing from one, a RoleBinding its admin deleted) is reported, not
        this: one namespace does not take the operator out of service for the others."""
        refused = self.refused()
        return any(
            all(_where(kind, namespace) in refused for namespace in scopes(self.namespaces))
            for kind in self.watched
        )

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for kind in self.watched:
            for namespace in scopes(self.namespaces):
                name = f"watch-{kind.plural}" + (f"-{namespace}" if namespace else "")
                thread = threading.Thread(target=self._run, args=(kind, namespace), name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """No more deliveries; the threads end at their watch's next event or timeout."""
        self._stopped.set()

    def serves(self, namespace: str) -> bool:
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, ns) for ns in self.namespaces)

    # --- one kind in one scope, in its own thread ----------------------------------------------------

    def _run(self, kind: Watched, namespace: str | None) -> None:
        version: str | None = None
        failures = 0
        where = _where(kind, namespace)
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list(kind, namespace)
                version = self._watch(kind, namespace, version)
                failures = 0
            except Gone:
                version = None
            except Exception as error:  # the API server is down, say: back off and go on
                failures += 1
                delay = min(2.0**failures, MAX_BACKOFF_S)
                if isinstance(error, ApiError) and error.status == 403:
                    with self._refused_lock:
                        self._refused[where] = f"{error.status} {error.reason}".strip()
                    version = None  # a LIST again: its success is what says the refusal is over
                log.warning(
                    "watch of %s failed (%s: %s); again in %.0fs", where, type(error).__name__, error, delay
                )
                self._stopped.wait(delay)

    def _allowed(self, where: str) -> None:
        with self._refused_lock:
            self._refused.pop(where, None)

    def _list(self, kind: Watched, namespace: str | None) -> str:
        items, version = list_pages(self.api_client, kind.kind, namespace, _selecting(kind), kind.project)
        if self.listed is not None:
            served = [item for item in items if self.serves(_namespace_of(item))]
            self._send(self.listed, kind.plural, namespace, served)
            return version
        for item in items:  # projected as their page was read
            self._hand_over(kind.plural, item, deleted=False)
        return version

    def _watch(self, kind: Watched, namespace: str | None, version: str) -> str:
        """Deliver events until the API server ends the watch; returns the last version seen."""
        query = [
            *_selecting(kind),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", str(WATCH_SERVER_TIMEOUT_S)),
        ]
        try:
            timeout = (10.0, float(WATCH_READ_TIMEOUT_S))
            response = api_call(self.api_client, "watch", kind.kind, namespace, query=query, timeout=timeout)
        except ApiError as err:
            if err.status == 410:
                raise Gone() from err
            raise
        # Allowed once the WATCH is: RBAC may allow a LIST and refuse the watch after it.
        self._allowed(_where(kind, namespace))
        try:
            for line in response:
                if self._stopped.is_set():
                    break
                if line.strip():
                    version = self._event(kind, wire.loads(line), version)
        finally:
            response.release_conn()
        return version

    def _event(self, kind: Watched, event: Mapping[str, Any], version: str) -> str:
        change, obj = event.get("type"), event.get("object") or {}
        if change == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            if obj.get("code") == 403:  # a refusal sent in the stream counts as one answered at once
                raise ApiError(403, str(obj.get("reason") or "Forbidden"))
            raise RuntimeError(f"the watch answered {obj.get('code')}: {obj.get('message')}")
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if change in ("ADDED", "MODIFIED", "DELETED"):
            self._hand_over(kind.plural, kind.project(obj), deleted=change == "DELETED")
        return new_version

    def _hand_over(self, plural: str, obj: Json, deleted: bool) -> None:
        """To the loop `obj`, the cache's projection of a child: a pod's few fields, not its whole body, wait
        there."""
        if self.serves(_namespace_of(obj)):
            self._send(self.deliver, plural, obj, deleted)

    def _send(self, fn: Callable[..., None], *args: Any) -> None:
        """fn(*args) on the loop, once fewer than MAX_IN_FLIGHT handovers wait there."""
        if self._loop is None:
            return
        while not self._in_flight.acquire(timeout=1.0):
            if self._stopped.is_set():
                return
        if self._stopped.is_set():
            self._in_flight.release()
            return
        self._loop.call_soon_threadsafe(self._take_in, fn, *args)

    def _take_in(self, fn: Callable[..., None], *args: Any) -> None:
        """On the loop."""
        try:
            fn(*args)
        finally:
            self._in_flight.release()


def _selecting(kind: Watched) -> list[tuple[str, str]]:
    return [kind.selector] if kind.selector is not None else []


def _namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _where(kind: Watched, namespace: str | None) -> str:
    return f"{kind.plural} in {namespace}" if namespace else kind.plural
