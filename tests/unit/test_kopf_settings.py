"""kopf as the operator sets it up: its lifecycle only, no resource served (the operator's own watches feed
the controller), and the jobs' watch handing each job to the controller as kopf's handler once did."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from dtjob.runtime import handlers


def test_kopf_serves_no_resource() -> None:
    registry = kopf.get_default_registry()
    for kind in (registry._watching, registry._changing, registry._spawning, registry._indexing):
        assert not kind.get_all_handlers(), "dtjob.runtime.child_watch's watches serve resources"
    assert not registry._webhooks.get_all_handlers()


class Observed:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, str], bool, Any, Any]] = []

    def observe_job(self, key: tuple[str, str], deleted: bool, status: Any = None, body: Any = None) -> None:
        self.calls.append((key, deleted, status, body))


def job(managed_by: str | None = None) -> dict[str, Any]:
    spec = {"managedBy": managed_by} if managed_by else {}
    return {"metadata": {"namespace": "ns", "name": "j"}, "spec": spec, "status": {"phase": "Running"}}


@pytest.mark.parametrize("deleted", [False, True])
def test_a_job_goes_to_the_controller_whole_with_its_status(deleted: bool) -> None:
    controller = Observed()
    body = job()
    handlers.job_seen(controller)("distributedtrainingjobs", body, deleted)  # type: ignore[arg-type]
    assert controller.calls == [(("ns", "j"), deleted, {"phase": "Running"}, body)]


def test_a_job_another_controller_manages_is_one_that_is_not_there() -> None:
    controller = Observed()
    handlers.job_seen(controller)("distributedtrainingjobs", job("example.com/other"), False)  # type: ignore[arg-type]
    assert [(key, deleted) for key, deleted, _, _ in controller.calls] == [(("ns", "j"), True)]


def test_an_object_with_no_name_is_left_alone() -> None:
    controller = Observed()
    handlers.job_seen(controller)("distributedtrainingjobs", {"metadata": {}}, False)  # type: ignore[arg-type]
    assert controller.calls == []
