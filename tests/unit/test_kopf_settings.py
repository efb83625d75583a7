"""kopf as the operator sets it up: the per-event "succeeded" lines of the watch-only handlers dropped (their
failures and every other line pass), and no object essence built, as no handler registered needs one."""

from __future__ import annotations

import logging

import kopf
from dtjob.runtime import handlers


def record(level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, msg, None, None)


def test_the_filter_covers_every_watch_only_handler_registered() -> None:
    ids = {str(h.id) for h in kopf.get_default_registry()._watching.get_all_handlers()}
    assert ids == set(handlers.EVENT_HANDLERS)


def test_success_lines_are_dropped_and_failures_pass() -> None:
    quiet = handlers.QuietEventHandlers()
    for handler_id in handlers.EVENT_HANDLERS:
        assert not quiet.filter(record(logging.INFO, f"Handler {handler_id!r} succeeded."))
        failed = f"Handler {handler_id!r} failed with an exception and will try again in 60 seconds: boom"
        assert quiet.filter(record(logging.ERROR, failed))
    assert quiet.filter(record(logging.INFO, "Handler 'configure' succeeded."))  # not a watch-only one
    assert quiet.filter(record(logging.INFO, "Timer 'x' succeeded."))


def test_no_handler_needs_the_essence_that_no_essence_leaves_out() -> None:
    registry = kopf.get_default_registry()
    assert not registry._changing.get_all_handlers(), "change handlers need kopf's diff: drop NoEssence"
    assert not registry._spawning.get_all_handlers(), "daemons and timers need kopf's diff: drop NoEssence"
    pod = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": 1}})
    assert handlers.NoEssence(prefix="dtjob.io").build(body=pod) == {}
