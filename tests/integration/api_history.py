"""What the API server saw happen in one namespace during a test, from its own watch streams.

A test that kills the operator mid-step cannot ask the operator what it did; it asks the API server. Each
watched kind (pods, batch Jobs, Secrets, DistributedTrainingJobs) is listed, then watched from that list's
resourceVersion in a thread, so every object created during the test is seen even when it is deleted before a
poll could find it. A hook runs in the watch thread the moment an event matches, which is how a test stops the
operator at a step: it waits for the state that marks the step, not for a fixed time.

resourceVersions are compared as numbers: the test bed has one etcd, whose revision orders every write.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from testbed.operator_harness import GROUP, PLURAL, VERSION

Json = dict[str, Any]
KINDS = ("Pod", "Job", "Secret", "DistributedTrainingJob")


@dataclass(frozen=True)
class Seen:
    kind: str
    type: str  # ADDED | MODIFIED | DELETED (the initial list reports ADDED)
    obj: Json

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    @property
    def revision(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.obj["metadata"].get("labels") or {})


Hook = tuple[Callable[[Seen], bool], Callable[[Seen], None], threading.Event]


class ApiHistory:
    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        self._lists: dict[str, Callable[..., Any]] = {
            "Pod": lambda **kw: core.list_namespaced_pod(namespace, **kw),
            "Job": lambda **kw: batch.list_namespaced_job(namespace, **kw),
            "Secret": lambda **kw: core.list_namespaced_secret(namespace, **kw),
            "DistributedTrainingJob": lambda **kw: custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, **kw
            ),
        }
        self.api_client = api_client
        self.events: list[Seen] = []
        self._lock = threading.Lock()
        self._hooks: list[Hook] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    # --- running -------------------------------------------------------------------------------------

    def start(self) -> None:
        listed = [threading.Event() for _ in KINDS]
        for kind, ready in zip(KINDS, listed, strict=True):
            thread = threading.Thread(target=self._run, args=(kind, ready), daemon=True, name=f"watch-{kind}")
            thread.start()
            self._threads.append(thread)
        for ready in listed:
            assert ready.wait(30), "the initial list of a watched kind did not come back"

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        assert not self.errors, f"a watch failed: {self.errors!r}"

    def _list(self, kind: str) -> str:
        response = self._lists[kind](_preload_content=False)
        data = json.loads(response.data)
        for item in data.get("items") or []:
            self._record(Seen(kind, "ADDED", item))
        return str(data["metadata"]["resourceVersion"])

    def _run(self, kind: str, listed: threading.Event) -> None:
        try:
            version = self._list(kind)
            listed.set()
            while not self._stop.is_set():
                response = self._lists[kind](
                    watch=True, resource_version=version, timeout_seconds=2, allow_watch_bookmarks=True,
                    _preload_content=False,
                )  # fmt: skip
                try:
                    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") != 410:
                                raise AssertionError(f"watch of {kind} failed: {obj}")
                            version = self._list(kind)  # expired: what was missed is in the new list
                            break
                        version = str(obj["metadata"]["resourceVersion"])
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._record(Seen(kind, event["type"], obj))
                        if self._stop.is_set():
                            break
                finally:
                    response.close()
                    response.release_conn()
        except BaseException as err:  # surfaced by stop()
            self.errors.append(err)
            listed.set()

    def _record(self, seen: Seen) -> None:
        with self._lock:
            if seen.type == "ADDED" and any(
                e.uid == seen.uid and e.revision == seen.revision for e in self.events
            ):
                return  # listed again after an expired watch
            self.events.append(seen)
            hooks = [h for h in self._hooks if not h[2].is_set() and h[0](seen)]
        for _, action, done in hooks:
            action(seen)
            done.set()

    # --- hooks ---------------------------------------------------------------------------------------

    def when(self, predicate: Callable[[Seen], bool], action: Callable[[Seen], None]) -> threading.Event:
        """Run `action` in the watch thread at the first event matching `predicate` (or one seen before)."""
        done = threading.Event()
        with self._lock:
            past = next((e for e in self.events if predicate(e)), None)
            if past is None:
                self._hooks.append((predicate, action, done))
        if past is not None:
            action(past)
            done.set()
        return done

    # --- what happened -------------------------------------------------------------------------------

    def of(self, kind: str, match: Callable[[Seen], bool] = lambda _: True) -> list[Seen]:
        with self._lock:
            return [e for e in self.events if e.kind == kind and match(e)]

    def created(self, kind: str, match: Callable[[Seen], bool] = lambda _: True) -> dict[str, str]:
        """uid -> name of every object of `kind` that existed at some point during the test."""
        return {e.uid: e.name for e in self.of(kind, match)}

    def deleted_at(self, kind: str, name: str) -> int | None:
        """The revision at which the last object of that name was deleted (None: never deleted)."""
        found = [e.revision for e in self.of(kind, lambda e: e.name == name and e.type == "DELETED")]
        return max(found) if found else None


def role(name: str) -> Callable[[Seen], bool]:
    return lambda e: e.labels.get("dtjob.io/role") == name


def job_of(name: str) -> Callable[[Seen], bool]:
    return lambda e: e.labels.get("dtjob.io/job-name") == name


@contextmanager
def api_history(api_client: client.ApiClient, namespace: str) -> Iterator[ApiHistory]:
    history = ApiHistory(api_client, namespace)
    history.start()
    try:
        yield history
    finally:
        history.stop()
