"""The controller's queue rules, with a stub in place of the reconcile (as kopf tests its own queueing):
a burst of events costs one reconcile, an event during a reconcile runs it once more afterwards (unless it
is the echo of the reconcile's own status write, after which the job was settled), a job is never reconciled
twice at once, the earliest timer wins, failures back off and conflicts retry at once."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, cast

import pytest
from dtjob.config import OperatorConfig
from dtjob.fence import NotLeader
from dtjob.kube.client import Conflict, Kube
from dtjob.reconcile.job import Children
from dtjob.runtime import controller as controller_module
from dtjob.runtime.cached_kube import ControllerKube
from dtjob.runtime.controller import CHILD_EVENTS_BATCH_S, MAX_BACKOFF_S, Controller, Key, backoff

A: Key = ("ns", "a")
B: Key = ("ns", "b")


class StubReconcile:
    """Records each call (key, start time); `block` holds calls of a key until released; `results` scripts
    what successive calls return or raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[Key, float]] = []
        self.seen: list[Children] = []
        self.running: dict[Key, int] = {}
        self.most_at_once: dict[Key, int] = {}
        self.in_parallel = 0
        self.most_in_parallel = 0
        self.block: dict[Key, threading.Event] = {}
        self.results: list[float | Exception | None] = []
        # The version of the job each call leaves settled, as a reconcile whose status write changed only the
        # status, and whose decision again from it would change nothing, tells its client.
        self.settles: dict[Key, str] = {}
        self._lock = threading.Lock()

    def __call__(
        self, kube: Kube, config: OperatorConfig, namespace: str, name: str, children: Children
    ) -> float | None:
        key = (namespace, name)
        with self._lock:
            self.calls.append((key, time.monotonic()))
            self.seen.append(children)
            self.running[key] = self.running.get(key, 0) + 1
            self.most_at_once[key] = max(self.most_at_once.get(key, 0), self.running[key])
            self.in_parallel += 1
            self.most_in_parallel = max(self.most_in_parallel, self.in_parallel)
            result = self.results.pop(0) if self.results else None
        try:
            gate = self.block.get(key)
            if gate is not None:
                gate.wait(5)
            if isinstance(result, Exception):
                raise result
            if key in self.settles:
                cast(RecordingKube, kube).job_settled(namespace, name, self.settles[key])
            return result
        finally:
            with self._lock:
                self.running[key] -= 1
                self.in_parallel -= 1

    def last_seen(self, key: Key) -> Children:
        """The children the last reconcile of `key` was given."""
        with self._lock:
            return next(
                c for (k, _), c in zip(reversed(self.calls), reversed(self.seen), strict=True) if k == key
            )

    def count(self, key: Key) -> int:
        with self._lock:
            return sum(1 for k, _ in self.calls if k == key)


class RecordingKube:
    """The calls the controller itself makes: the children's LIST, and reporting a failed reconcile."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.children: list[tuple[str, dict[str, Any]]] = []  # what a LIST of children returns
        self.lists = 0
        self.jobs: dict[tuple[str, str], Mapping[str, Any]] = {}  # the copies its reconciles would read
        self.settled: dict[tuple[str, str], str] = {}  # the last settled status write of each job

    def remember_job(self, body: Mapping[str, Any]) -> None:
        self.jobs[body["metadata"]["namespace"], body["metadata"]["name"]] = body

    def forget_job(self, namespace: str, name: str) -> None:
        self.jobs.pop((namespace, name), None)
        self.settled.pop((namespace, name), None)

    def job_settled(self, namespace: str, name: str, version: str) -> None:
        self.settled[namespace, name] = version

    def is_settled(self, namespace: str, name: str, version: str) -> bool:
        return self.settled.get((namespace, name)) == version

    def log_read_spacing(self, every_s: float) -> float:
        return every_s  # no budget stretches it

    def log_read_in(self, namespace: str, pod: str, container: str, after_s: float) -> float | None:
        return None  # no log read

    def list_children(self, namespace: str, label_selector: str) -> list[tuple[str, dict[str, Any]]]:
        self.lists += 1
        return [(kind, obj) for kind, obj in self.children if obj["metadata"]["namespace"] == namespace]

    def get(
        self, kind: str, namespace: str | None, name: str, api_version: str | None = None
    ) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace, "uid": "u"}}

    def emit_event(self, job: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime) -> None:
        self.events.append((reason, message))

    def check_leader(self) -> None:
        return None


def run(
    test: Callable[[Controller, StubReconcile], Awaitable[None]],
    workers: int = 2,
    slow_s: float = 60,
    resync_s: float = 3600,
    kube: RecordingKube | None = None,
    leading: Callable[[], bool] = lambda: True,
) -> RecordingKube:
    kube = kube or RecordingKube()
    stub = StubReconcile()

    async def main() -> None:
        config = OperatorConfig(
            reconcile_workers=workers, resync_seconds=resync_s, reconcile_slow_seconds=slow_s
        )
        controller = Controller(cast(ControllerKube, kube), config, reconcile_fn=stub, leading=leading)
        controller.known.update({A, B})
        try:
            # Only ends a test that hangs: each returns as soon as what it waits for happens.
            await asyncio.wait_for(test(controller, stub), 30)
        finally:
            await controller.stop()

    asyncio.run(main())
    return kube


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Returns once predicate() holds; the timeout only ends a wait for what never happens."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def settle(seconds: float = 0.15) -> None:
    await asyncio.sleep(seconds)


def test_a_burst_of_events_for_one_job_costs_one_reconcile() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        for _ in range(10):
            controller.enqueue(A)
        assert controller.depth == 1
        controller.start()
        await until(lambda: stub.count(A) == 1)
        await settle()
        assert stub.count(A) == 1 and controller.depth == 0

    run(test)


def test_an_event_during_a_reconcile_runs_it_once_more_afterwards_never_at_once() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        gate = stub.block[A] = threading.Event()
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 1)
        for _ in range(5):  # all while the first reconcile runs: marked dirty, not queued beside it
            controller.enqueue(A)
        await settle()
        assert stub.count(A) == 1
        gate.set()
        await until(lambda: stub.count(A) == 2)
        await settle()
        assert stub.count(A) == 2, "the dirty mark runs the job exactly once more"
        assert stub.most_at_once[A] == 1

    run(test, workers=4)


def test_two_jobs_reconcile_side_by_side_up_to_the_worker_count() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        gate = stub.block[A] = stub.block[B] = threading.Event()
        controller.start()
        controller.enqueue(A)
        controller.enqueue(B)
        await until(lambda: stub.in_parallel == 2)
        gate.set()
        await until(lambda: controller.depth == 0)

    run(test, workers=2)


def test_the_earliest_timer_wins() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.enqueue(A, 30)
        controller.enqueue(A, 0.05)  # earlier: replaces the later one
        controller.enqueue(B, 0.05)
        controller.enqueue(B, 30)  # later: ignored
        assert (controller.due_in(A) or 99) <= 0.05 and (controller.due_in(B) or 99) <= 0.05
        # The replaced timers are 30 s away: 5 s tells them apart with room for a busy machine.
        await until(lambda: stub.count(A) == 1 and stub.count(B) == 1, timeout=5)
        assert controller.due_in(A) is None and controller.due_in(B) is None

    run(test)


def test_a_reconcile_asks_for_its_next_look() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        stub.results = [0.1, None]
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 2, timeout=5)
        first, second = (at for key, at in stub.calls if key == A)
        assert second - first >= 0.09
        await settle()
        assert stub.count(A) == 2 and controller.due_in(A) is None

    run(test)


def test_failures_back_off_exponentially_and_a_success_resets_the_streak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert [backoff(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S]
    # Steps far enough apart that a busy machine's scheduling delays cannot blur 1x, 2x and 4x: a retry never
    # comes before its backoff and always before twice it (so each gap is longer than the one before), and
    # the retry after a success comes well before the backoff the streak would have reached (it started over).
    monkeypatch.setattr(controller_module, "backoff", lambda failures: 0.25 * 2**failures)

    async def test(controller: Controller, stub: StubReconcile) -> None:
        down = RuntimeError("API down")
        stub.results = [down, down, down, None, RuntimeError("again"), None]
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 4, timeout=20)
        await settle(0.05)
        controller.enqueue(A)  # an event after the success: fails, and the streak starts over
        await until(lambda: stub.count(A) == 6, timeout=20)
        times = [at for key, at in stub.calls if key == A]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        for gap, step in zip(gaps[:3], (0.5, 1.0, 2.0), strict=True):
            assert step - 0.01 <= gap < 2 * step, gaps
        assert 0.49 <= gaps[4] < 2.0, gaps  # not the 4 s of a fourth failure in a row

    kube = run(test)
    # The job's events say it is stuck once per streak, not on every retry.
    assert [reason for reason, _ in kube.events] == ["ReconcileError", "ReconcileError"]
    assert "API down" in kube.events[0][1] and "again" in kube.events[1][1]


def test_a_conflict_retries_at_once_without_backoff() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        stub.results = [Conflict("changed"), Conflict("changed"), None]
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 3, timeout=1.5)

    kube = run(test)
    assert kube.events == [], "a conflict is routine: no error event"


def test_a_standby_dispatches_nothing_and_on_election_reconciles_every_known_job() -> None:
    leader = [False]

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.enqueue(A)
        controller.enqueue(B)
        controller.enqueue(A, 0.05)  # a timer firing while standing by is dropped too
        await until(lambda: controller.skipped == 3)
        assert stub.calls == [] and controller.depth == 0
        leader[0] = True
        controller.requeue_all()
        await until(lambda: stub.count(A) == 1 and stub.count(B) == 1)
        await settle()
        assert stub.count(A) == 1 and stub.count(B) == 1

    run(test, leading=lambda: leader[0])


def test_a_reconcile_that_loses_the_lease_ends_quietly_and_requeues_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(controller_module, "backoff", lambda failures: 0.05)

    async def test(controller: Controller, stub: StubReconcile) -> None:
        stub.results = [NotLeader("stepped down")]
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 1)
        await settle(0.3)
        assert stub.count(A) == 1, "no retry: the new leader reconciles it"
        assert controller.due_in(A) is None

    kube = run(test)
    assert kube.events == [], "no error event: losing the lease is not a failure of the job"


def test_a_deleted_job_loses_its_timer_and_its_queued_reconcile() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.enqueue(A, 0.05)
        controller.enqueue(B)
        controller.observe_job(A, deleted=True)
        controller.observe_job(B, deleted=True)
        controller.start()
        await settle(0.3)
        assert stub.calls == []
        controller.observe_job(A, deleted=False)  # created again under the same name
        await until(lambda: stub.count(A) == 1)

    run(test)


def test_a_job_event_hands_the_job_to_the_client_and_a_deletion_takes_it_back() -> None:
    body = {"metadata": {"namespace": A[0], "name": A[1], "uid": "u", "resourceVersion": "7"}}

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.observe_job(A, deleted=False, status=None, body=body)
        assert kube.jobs == {A: body}, "reconciles read the watch's copy"
        controller.observe_job(A, deleted=True)
        assert kube.jobs == {}, "a deleted job's copy must not answer a later reconcile"

    kube = RecordingKube()
    run(test, kube=kube)


def job_at(version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": A[0], "name": A[1], "uid": "u", "resourceVersion": version}}


def test_the_echo_of_a_status_write_that_left_its_job_settled_costs_no_reconcile() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        stub.settles[A] = "8"  # the reconcile writes the job's status (version 8), and nothing is left to do
        controller.start()
        controller.observe_job(A, deleted=False, body=job_at("7"))
        await until(lambda: stub.count(A) == 1)
        controller.observe_job(A, deleted=False, body=job_at("8"))  # its watch event, once it ended
        await settle()
        assert stub.count(A) == 1
        stub.settles[A] = "10"
        controller.observe_job(A, deleted=False, body=job_at("9"))  # anyone else's change: reconciled
        await until(lambda: stub.count(A) == 2)
        # A version the job is no longer settled at (a late event) is reconciled, as any other.
        controller.observe_job(A, deleted=False, body=job_at("8"))
        await until(lambda: stub.count(A) == 3)
        await settle()
        assert stub.count(A) == 3

    run(test)


@pytest.mark.parametrize("settles", ["8", "6"])
def test_a_job_event_during_its_reconcile_runs_it_again_unless_the_reconcile_settled_it_there(
    settles: str,
) -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        gate = stub.block[A] = threading.Event()
        stub.settles[A] = settles
        controller.start()
        controller.observe_job(A, deleted=False, body=job_at("7"))
        await until(lambda: stub.count(A) == 1)
        # The watch delivers the reconcile's own write before the reconcile has ended.
        controller.observe_job(A, deleted=False, body=job_at("8"))
        del stub.block[A]
        gate.set()
        await settle()
        assert stub.count(A) == (1 if settles == "8" else 2)

    run(test, workers=4)


def test_a_hung_reconcile_releases_its_worker_but_keeps_its_job_locked() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        gate = stub.block[A] = threading.Event()
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 1)
        controller.enqueue(B)  # the only worker is in A's reconcile, which hangs
        controller.enqueue(A)
        await until(lambda: stub.count(B) == 1, timeout=5)
        assert stub.count(A) == 1, "A is not reconciled beside its own hung reconcile"
        gate.set()
        await until(lambda: stub.count(A) == 2)
        assert stub.most_at_once[A] == 1

    run(test, workers=1, slow_s=0.1)


def pod(name: str, uid: str, job: str = "a") -> dict[str, Any]:
    labels = {"dtjob.io/job-name": job, "dtjob.io/role": "worker"}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1", "labels": labels}
    }


def names_of(children: Children) -> list[str]:
    return [p["metadata"]["name"] for p in children.pods]


def test_a_namespaces_children_are_listed_before_its_first_reconcile() -> None:
    kube = RecordingKube()
    kube.children = [("pods", pod("a-worker-0", "u0"))]

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.enqueue(A)
        controller.enqueue(B)
        await until(lambda: stub.count(A) == 1 and stub.count(B) == 1)
        assert names_of(stub.last_seen(A)) == ["a-worker-0"]

    run(test, kube=kube)
    assert kube.lists == 1, "one LIST per namespace, not per job"


def test_the_resync_forgets_a_child_whose_deletion_no_event_reported() -> None:
    kube = RecordingKube()
    kube.children = [("pods", pod("a-worker-0", "u0")), ("pods", pod("a-worker-1", "u1"))]

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) >= 1)
        assert names_of(stub.last_seen(A)) == ["a-worker-0", "a-worker-1"]
        kube.children = kube.children[:1]  # worker-1 deleted while no watch was open
        await until(lambda: names_of(stub.last_seen(A)) == ["a-worker-0"], timeout=5)

    run(test, kube=kube, resync_s=0.2)


def test_a_child_event_updates_the_cache_and_enqueues_its_job() -> None:
    kube = RecordingKube()

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        kube.children = [("pods", pod("a-worker-0", "u0"))]  # created: the API server has it
        controller.observe_child("pods", pod("a-worker-0", "u0"), deleted=False)
        await until(lambda: stub.count(A) == 1)
        assert names_of(stub.last_seen(A)) == ["a-worker-0"]
        kube.children = []
        controller.observe_child("pods", pod("a-worker-0", "u0"), deleted=True)
        await until(lambda: stub.count(A) == 2)
        assert names_of(stub.last_seen(A)) == []

    run(test, kube=kube)


def test_a_burst_of_child_events_for_one_job_costs_one_reconcile() -> None:
    kube = RecordingKube()

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        for i in range(4):  # a world's pods created, then scheduled
            controller.observe_child("pods", pod(f"a-worker-{i}", f"u{i}"), deleted=False)
        for i in range(4):
            scheduled = pod(f"a-worker-{i}", f"u{i}")
            scheduled["metadata"]["resourceVersion"] = "2"
            controller.observe_child("pods", scheduled, deleted=False)
        await until(lambda: stub.count(A) == 1)
        await settle(CHILD_EVENTS_BATCH_S * 2)
        assert stub.count(A) == 1
        assert len(stub.last_seen(A).pods) == 4

    kube.children = [("pods", pod(f"a-worker-{i}", f"u{i}")) for i in range(4)]
    run(test, kube=kube)


def test_only_the_pod_that_makes_every_worker_ready_is_urgent() -> None:
    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.observe_child("pods", pod("a-worker-0", "u0"), deleted=False)
        controller.observe_child("pods", pod("a-worker-1", "u1"), deleted=False)
        await until(lambda: stub.count(A) == 1)
        controller.observe_child("pods", ready_pod("a-worker-0", "u0", "a", "2"), deleted=False)
        assert controller.due_in(A) is not None, "one of two Ready: batched with the rest"
        controller.observe_child("pods", ready_pod("a-worker-1", "u1", "a", "2"), deleted=False)
        assert controller.depth == 1 and controller.due_in(A) is None  # queued now, the batch's timer gone
        await until(lambda: stub.count(A) == 2)
        await settle(CHILD_EVENTS_BATCH_S * 2)
        assert stub.count(A) == 2

    kube = RecordingKube()
    kube.children = [("pods", pod("a-worker-0", "u0")), ("pods", pod("a-worker-1", "u1"))]
    run(test, kube=kube)


def test_pods_labelled_with_a_job_name_no_job_has_never_go_ahead() -> None:
    """A namespace admin's Ready pods under made-up job names would each get a turn ahead of every job."""
    Z: Key = ("ns", "z")

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.observe_child("pods", ready_pod("z-worker-0", "uz", "z", "2"), deleted=False)
        assert controller.due_in(Z) is not None, "batched with the rest, not ahead"

    run(test)


def ready_pod(name: str, uid: str, job: str, version: str) -> dict[str, Any]:
    body = pod(name, uid, job)
    body["metadata"]["resourceVersion"] = version
    body["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return body


def test_a_pod_turning_ready_puts_its_job_ahead_of_the_jobs_waiting_before_it() -> None:
    C: Key = ("ns", "c")

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.known.add(C)
        gate = stub.block[B] = threading.Event()
        controller.start()
        controller.enqueue(B)  # holds the only worker while the others queue up
        await until(lambda: stub.count(B) == 1)
        controller.enqueue(C)  # a new job, waiting first
        controller.observe_child("pods", pod("a-worker-0", "u0"), deleted=False)  # created: not urgent
        controller.observe_child("pods", ready_pod("a-worker-0", "u0", "a", "2"), deleted=False)  # Ready
        controller.observe_child("pods", ready_pod("a-worker-0", "u0", "a", "3"), deleted=False)  # still
        assert controller.depth == 3  # B running, C and A waiting, each once
        gate.set()
        await until(lambda: stub.count(A) == 1 and stub.count(C) == 1)
        order = [key for key, _ in stub.calls]
        assert order.index(A) < order.index(C), order

    kube = RecordingKube()
    kube.children = [("pods", pod("a-worker-0", "u0"))]
    run(test, workers=1, kube=kube)
