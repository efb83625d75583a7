"""The children's watch: events handed to the event loop as they come, bookmarks only moving the version, a
410 answered with a new LIST, any other failure with a pause and a watch from the last version seen."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from dtjob.runtime.child_watch import ChildWatch, Gone

from tests.unit.recording_kube import unused_api


class Loop:
    """The event loop as the watch threads use it: call_soon_threadsafe, run here at once."""

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


def pod(name: str, version: str, namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


def watch(namespaces: tuple[str, ...] = ()) -> tuple[ChildWatch, list[tuple[str, str, bool]]]:
    seen: list[tuple[str, str, bool]] = []
    children = ChildWatch(
        unused_api(), namespaces, "a=b",
        lambda kind, obj, deleted: seen.append((kind, obj["metadata"]["name"], deleted)),
    )  # fmt: skip
    children._loop = Loop()  # type: ignore[assignment]
    return children, seen


def test_events_are_delivered_and_bookmarks_only_move_the_version() -> None:
    children, seen = watch()
    version = children._event("pods", {"type": "ADDED", "object": pod("w0", "10")}, "9")
    version = children._event("pods", {"type": "MODIFIED", "object": pod("w0", "11")}, version)
    version = children._event("pods", {"type": "BOOKMARK", "object": pod("", "15")}, version)
    version = children._event("pods", {"type": "DELETED", "object": pod("w0", "16")}, version)
    assert seen == [("pods", "w0", False), ("pods", "w0", False), ("pods", "w0", True)]
    assert version == "16"


def test_a_410_asks_for_a_new_list_and_other_errors_fail_the_watch() -> None:
    children, _ = watch()
    with pytest.raises(Gone):
        children._event("pods", {"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "9")
    with pytest.raises(RuntimeError, match="500"):
        children._event("pods", {"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "9")


def test_only_the_namespaces_served_are_delivered() -> None:
    children, seen = watch(("team-*", "ml"))
    assert children.whole_cluster, "a glob needs the whole cluster's watch"
    for namespace in ("team-a", "ml", "other"):
        children._hand_over("pods", pod(namespace, "1", namespace), deleted=False)
    assert [name for _, name, _ in seen] == ["team-a", "ml"]
    literal, _ = watch(("ml", "cv"))
    assert not literal.whole_cluster


class Scripted(ChildWatch):
    """_list and _watch play a script: each step returns a version or raises."""

    def __init__(self, steps: list[Any]) -> None:
        super().__init__(unused_api(), (), "a=b", lambda *_: None)
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

    def _list(self, kind: str, namespace: str | None) -> str:
        return self._next("list")

    def _watch(self, kind: str, namespace: str | None, version: str) -> str:
        return self._next(f"watch@{version}")


def test_the_loop_lists_again_after_a_410_and_watches_on_after_other_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    children = Scripted(["5", "7", ConnectionError("reset"), "8", Gone(), "20", "21"])
    monkeypatch.setattr(children._stopped, "wait", lambda delay: False)  # no real back-off pause
    thread = threading.Thread(target=children._run, args=("Pod", None))
    thread.start()
    thread.join(5)
    assert children.calls == [
        "list", "watch@5",  # the watch ends at version 7 (a server timeout): watch again from there
        "watch@7",  # the connection breaks: again from the last version seen
        "watch@7", "watch@8",  # the version is gone: a new list
        "list", "watch@20", "watch@21",
    ]  # fmt: skip
