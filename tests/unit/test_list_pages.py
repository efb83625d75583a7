"""LISTs of children come a page at a time, each item cut to what the cache keeps as its page is read: a
namespace of a thousand jobs holds five thousand pods, and decoding them whole was the operator's peak."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from dtjob.kube import rest as kube

from tests.unit.recording_kube import unused_api


@dataclass
class Response:
    data: bytes


def test_every_page_is_read_and_only_what_keep_returns_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    pods = [{"metadata": {"name": f"p{i}"}, "spec": {"big": "x" * 100}} for i in range(7)]
    asked: list[list[tuple[str, str]]] = []

    def api_call(
        api_client: Any, verb: str, kind: str, namespace: str, query: Any = (), accept: str = kube.JSON
    ) -> Response:
        assert (verb, kind, namespace, accept) == ("list", "Pod", "ml", kube.JSON)
        asked.append(list(query))
        params = dict(query)
        start = int(params.get("continue") or 0)
        end = start + int(params["limit"])
        more = {"continue": str(end)} if end < len(pods) else {}
        page = {"metadata": {"resourceVersion": "42", **more}, "items": pods[start:end]}
        return Response(json.dumps(page).encode())

    monkeypatch.setattr(kube, "api_call", api_call)
    monkeypatch.setattr(kube, "LIST_PAGE", 3)
    items, version = kube.list_pages(
        unused_api(), "Pod", "ml", [("labelSelector", "a=b")],
        lambda pod: {"name": pod["metadata"]["name"]},
    )  # fmt: skip
    assert items == [{"name": f"p{i}"} for i in range(7)] and version == "42"
    assert [dict(q).get("continue") for q in asked] == [None, "3", "6"]
    assert all(("labelSelector", "a=b") in q and ("limit", "3") in q for q in asked)
    asked.clear()
    kube.list_pages(unused_api(), "Pod", "ml", [], dict, page_size=5)
    assert [dict(q)["limit"] for q in asked] == ["5", "5"], "a page size of the caller's own"
