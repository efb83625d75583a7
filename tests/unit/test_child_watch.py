"""The children's watch: events handed to the event loop as they come, bookmarks only moving the version, a
410 answered with a new LIST, any other failure with a pause and a watch from the last version seen."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from dtjob.kube.errors import ApiError
from dtjob.runtime import child_watch
from dtjob.runtime.child_watch import ChildWatch, Gone, Watched, children
from dtjob.runtime.handlers import FAILED_CREATE_EVENTS, _readiness

from tests.unit.recording_kube import unused_api


class Loop:
    """The event loop as the watch threads use it: call_soon_threadsafe, run here at once."""

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


def pod(name: str, version: str, namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


POD = children("a=b")[0]
EVENTS = FAILED_CREATE_EVENTS  # the operator's own


def watch(namespaces: tuple[str, ...] = ()) -> tuple[ChildWatch, list[tuple[str, str, bool]]]:
    seen: list[tuple[str, str, bool]] = []
    pods = ChildWatch(
        unused_api(), namespaces, children("a=b"),
        lambda kind, obj, deleted: seen.append((kind, obj["metadata"]["name"], deleted)),
    )  # fmt: skip
    pods._loop = Loop()  # type: ignore[assignment]
    return pods, seen


def test_events_are_delivered_and_bookmarks_only_move_the_version() -> None:
    pods, seen = watch()
    version = pods._event(POD, {"type": "ADDED", "object": pod("w0", "10")}, "9")
    version = pods._event(POD, {"type": "MODIFIED", "object": pod("w0", "11")}, version)
    version = pods._event(POD, {"type": "BOOKMARK", "object": pod("", "15")}, version)
    version = pods._event(POD, {"type": "DELETED", "object": pod("w0", "16")}, version)
    assert seen == [("pods", "w0", False), ("pods", "w0", False), ("pods", "w0", True)]
    assert version == "16"


def test_a_410_asks_for_a_new_list_and_other_errors_fail_the_watch() -> None:
    pods, _ = watch()
    with pytest.raises(Gone):
        pods._event(POD, {"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "9")
    with pytest.raises(RuntimeError, match="500"):
        pods._event(POD, {"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "9")


def test_only_the_namespaces_served_are_delivered() -> None:
    pods, seen = watch(("team-*", "ml"))
    assert pods.whole_cluster, "a glob needs the whole cluster's watch"
    for namespace in ("team-a", "ml", "other"):
        pods._hand_over("pods", pod(namespace, "1", namespace), deleted=False)
    assert [name for _, name, _ in seen] == ["team-a", "ml"]
    literal, _ = watch(("ml", "cv"))
    assert not literal.whole_cluster


class Scripted(ChildWatch):
    """_list and _watch play a script: each step returns a version or raises."""

    def __init__(self, steps: list[Any], namespaces: tuple[str, ...] = ()) -> None:
        super().__init__(unused_api(), namespaces, children("a=b"), lambda *_: None)
        self.steps = steps
        self.calls: list[str] = []

    def _next(self, call: str) -> str:
        self.calls.append(call)
        if not self.steps:
            self.stop()
            return "0"
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return str(step)

    def _list(self, kind: Watched, namespace: str | None) -> str:
        return self._next("list")

    def _watch(self, kind: Watched, namespace: str | None, version: str) -> str:
        """As the real one: a watch the API server accepts says the refusal there is over."""
        ended_at = self._next(f"watch@{version}")
        self._allowed(child_watch._where(kind, namespace))
        return ended_at


def test_the_loop_lists_again_after_a_410_and_watches_on_after_other_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted = Scripted(["5", "7", ConnectionError("reset"), "8", Gone(), "20", "21"])
    monkeypatch.setattr(scripted._stopped, "wait", lambda delay: False)  # no real back-off pause
    thread = threading.Thread(target=scripted._run, args=(POD, None))
    thread.start()
    thread.join(5)
    assert scripted.calls == [
        "list", "watch@5",  # the watch ends at version 7 (a server timeout): watch again from there
        "watch@7",  # the connection breaks: again from the last version seen
        "watch@7", "watch@8",  # the version is gone: a new list
        "list", "watch@20", "watch@21",
    ]  # fmt: skip


def event(name: str, namespace: str, job_uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"e-{name}", "resourceVersion": "3",
                     "managedFields": [{"manager": "kube-controller-manager"}]},
        "involvedObject": {"kind": "Job", "uid": job_uid, "namespace": namespace},
        "reason": "FailedCreate", "message": "exceeded quota", "source": {"component": "job-controller"},
    }  # fmt: skip


def test_a_watch_given_a_listed_callback_hands_over_each_list_at_once_projected_and_served_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The FailedCreate Events' store replaces a namespace's Events from each LIST (those deleted while no
    watch ran go), so it takes a LIST whole; its query is a field selector, not the children's labels."""
    asked: list[tuple[str, str | None, list[tuple[str, str]]]] = []

    def pages(api: Any, kind: str, namespace: str | None, query: list[tuple[str, str]], project: Any) -> Any:
        asked.append((kind, namespace, query))
        return [project(event("a", "team-a", "j1")), project(event("b", "other", "j2"))], "42"

    monkeypatch.setattr(child_watch, "list_pages", pages)
    lists: list[tuple[str, str | None, list[dict[str, Any]]]] = []
    seen: list[Any] = []
    events = ChildWatch(
        unused_api(), ("team-*",), (EVENTS,), lambda *args: seen.append(args),
        listed=lambda plural, scope, items: lists.append((plural, scope, items)),
    )  # fmt: skip
    events._loop = Loop()  # type: ignore[assignment]
    assert events._list(EVENTS, None) == "42"
    assert asked == [("Event", None, [("fieldSelector", "involvedObject.kind=Job,reason=FailedCreate")])]
    assert [(plural, scope, [e["metadata"]["name"] for e in items]) for plural, scope, items in lists] == [
        ("events", None, ["a"])
    ]
    assert "managedFields" not in lists[0][2][0]["metadata"] and not seen
    events._event(EVENTS, {"type": "ADDED", "object": event("c", "team-b", "j3")}, "42")
    assert [(plural, obj["involvedObject"], deleted) for plural, obj, deleted in seen] == [
        ("events", {"uid": "j3"}, False)
    ]


def test_a_watch_the_api_server_refuses_keeps_the_operator_unready_until_it_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RBAC written by hand: the LIST of the one namespace served is refused (403) and retried; meanwhile
    /readyz says not ready and names what was refused (the pod looked Ready while the jobs there waited
    unseen, and a rollout went on), until a watch there is accepted."""
    refused = ApiError(403, "Forbidden")
    ready_while: list[tuple[bool, dict[str, Any]]] = []

    class Watching(Scripted):
        def _next(self, call: str) -> str:
            ready_while.append(_readiness(None, [self]))
            return super()._next(call)

    scripted = Watching([refused, refused, "5", "6"], ("team-a",))
    monkeypatch.setattr(scripted._stopped, "wait", lambda delay: False)  # no real back-off pause
    thread = threading.Thread(target=scripted._run, args=(POD, "team-a"))
    thread.start()
    thread.join(5)
    assert [ready for ready, _ in ready_while] == [True, False, False, False, True]
    assert ready_while[1][1]["watchesRefused"] == {"pods in team-a": "403 Forbidden"}
    assert scripted.refused() == {}


def test_a_refused_watch_after_a_good_list_lists_again_and_is_ready_once_a_watch_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Role taken away between the LIST and the WATCH, a refusal sent inside the stream, or RBAC that
    allows the LIST but not the watch: the loop lists again, and only a watch accepted says the refusal is
    over (a LIST allowed would have flipped readiness at every round)."""
    with pytest.raises(ApiError) as in_stream:
        watch()[0]._event(POD, {"type": "ERROR", "object": {"code": 403, "reason": "Forbidden"}}, "9")
    assert in_stream.value.status == 403
    scripted = Scripted(["5", ApiError(403, "Forbidden"), "6", ApiError(403, "Forbidden"), "8", "9"])
    monkeypatch.setattr(scripted._stopped, "wait", lambda delay: False)  # no real back-off pause
    refused_after: list[dict[str, str]] = []

    def allowed(where: str) -> None:
        refused_after.append(scripted.refused())
        ChildWatch._allowed(scripted, where)

    monkeypatch.setattr(scripted, "_allowed", allowed)
    thread = threading.Thread(target=scripted._run, args=(POD, "team-a"))
    thread.start()
    thread.join(5)
    assert scripted.calls == ["list", "watch@5", "list", "watch@6", "list", "watch@8", "watch@9"]
    assert refused_after == [{"pods in team-a": "403 Forbidden"}, {}]
    assert scripted.refused() == {}


def test_the_real_watch_clears_a_refusal_once_the_api_server_accepts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Stream(list[bytes]):
        def release_conn(self) -> None:
            pass

    answers: list[Any] = [ApiError(403, "Forbidden"), Stream([b'{"type": "BOOKMARK", "object": {"metadata": '
                                                              b'{"resourceVersion": "12"}}}'])]  # fmt: skip

    def api_call(*args: Any, **kwargs: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(child_watch, "api_call", api_call)
    pods, _ = watch(("team-a",))
    pods._refused["pods in team-a"] = "403 Forbidden"
    with pytest.raises(ApiError):
        pods._watch(POD, "team-a", "10")
    assert pods.refused() == {"pods in team-a": "403 Forbidden"}
    assert pods._watch(POD, "team-a", "10") == "12"
    assert pods.refused() == {}


def test_a_refusal_in_some_namespaces_only_is_named_and_leaves_the_replica_ready() -> None:
    """A namespace's admin may delete the operator's RoleBinding there: that namespace's jobs go unseen (named
    in /readyz), but the replica stays ready, or one tenant would take every replica out of the metrics
    Service and hold the cluster's node drains; refused everywhere it is watched, a kind makes it unready."""
    pods = Scripted([], ("team-a", "team-b"))
    pods._refused["pods in team-a"] = "403 Forbidden"
    ready, said = _readiness(None, [pods])
    assert ready and said["watchesRefused"] == {"pods in team-a": "403 Forbidden"}
    pods._refused["pods in team-b"] = "403 Forbidden"
    assert _readiness(None, [pods])[0] is False
    cluster_wide = Scripted([])
    cluster_wide._refused["pods"] = "403 Forbidden"
    assert _readiness(None, [cluster_wide])[0] is False
